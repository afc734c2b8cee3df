#!/usr/bin/env bash
# mpi4py's own test suite (mpi4py 4.1.2 from PyPI, built against Debian's MPICH with mpicc.mpich, as a
# user would: `MPICC=mpicc.mpich pip install mpi4py`) run over vmfabric with our libmpich.so.12, at 1 and
# 2 ranks under `vmfabric run`. Part of `make test`.
#
#   scripts/mpi4py-testsuite.sh              run the suite over vmfabric (the MPICH reference first, once)
#   scripts/mpi4py-testsuite.sh --reference  run it under Debian's MPICH (mpiexec.mpich) and record the
#                                            numbers of tests and skips
#   scripts/mpi4py-testsuite.sh --setup      only build (prints the venv's python; `make bench` uses it)
#   VMF_MPI4PY=0 make test                   skip it
#
# Passes when every run reports OK (no failure, no error) and skips no more tests than MPICH at the same
# number of ranks. Under MPICH, test_util_sync hangs at 2 ranks, so the reference leaves it out there;
# over vmfabric it runs. The venv, the sdist and the reference numbers are cached in
# $VMF_CACHE/mpi4py-4.1.2 (default ~/.cache/vmfabric): only the first run downloads and builds (about
# 3 minutes); logs of the last runs are kept there.
set -uo pipefail
[ "${VMF_MPI4PY:-1}" = 0 ] && { echo "mpi4py suite skipped (VMF_MPI4PY=0)"; exit 0; }
here="$(cd "$(dirname "$0")/.." && pwd)"
ver=4.1.2
cache="${VMF_CACHE:-$HOME/.cache/vmfabric}/mpi4py-$ver"
vmf="$here/target/release/vmfabric"
lib="$here/target/release/lib"
[ -x "$vmf" ] && [ -e "$lib/libmpich.so.12" ] || { echo "mpi4py-testsuite: build first (make build)" >&2; exit 1; }
mkdir -p "$cache"

setup() {
  [ -f "$cache/.vmf-built" ] && return 0
  # Python's venv and headers, and MPICH's compiler wrapper (idempotent: only what is missing).
  need=()
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
  [ -n "$(python3 -c 'import sysconfig, os; p = sysconfig.get_paths()["include"]; print(p if os.path.exists(p + "/Python.h") else "")' 2>/dev/null)" ] || need+=(python3-dev)
  command -v mpicc.mpich >/dev/null 2>&1 || need+=(mpich libmpich-dev)
  if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" || return 1
  fi
  echo "mpi4py-testsuite: building mpi4py $ver against MPICH (once; cached in $cache)"
  rm -rf "$cache/venv" "$cache/mpi4py-$ver"
  python3 -m venv "$cache/venv" >"$cache/build.log" 2>&1 || return 1
  (cd "$cache" && venv/bin/pip download --no-binary :all: --no-deps "mpi4py==$ver" -d . >>build.log 2>&1) || return 1
  tar xzf "$cache/mpi4py-$ver.tar.gz" -C "$cache" || return 1
  # The test suite lives in the sdist's test/; it imports the package built in place (build/lib*).
  (cd "$cache" && MPICC=mpicc.mpich venv/bin/pip install "./mpi4py-$ver" >>build.log 2>&1) || return 1
  touch "$cache/.vmf-built"
}

# summarize LOG NP: "tests skipped failures errors ok" over every rank's unittest summary (the worst; the
# ranks' lines may be interleaved, so the numbers are searched anywhere). ok: NP summaries and no FAILED.
summarize() {
  python3 - "$1" "$2" <<'EOF'
import re, sys
t = open(sys.argv[1], errors="replace").read()
ran = [int(x) for x in re.findall(r"Ran (\d+) tests? in", t)]
num = lambda k: max([int(x) for x in re.findall(k + r"=(\d+)", t)] or [0])
ok = int(len(ran) == int(sys.argv[2]) and "FAILED" not in t and t.count("OK") >= len(ran))
print(min(ran or [0]), num("skipped"), num("failures"), num("errors"), ok)
EOF
}

run_suite() { # LABEL NP LOG COMMAND...
  local label=$1 np=$2 log=$3; shift 3
  (cd "$cache/mpi4py-$ver" && timeout 900 "$@" "$cache/venv/bin/python" test/main.py "${extra[@]}") >"$log" 2>&1
  local rc=$?
  read -r tests skip fail errs ok < <(summarize "$log" "$np")
  echo "$label $np rank(s): $tests tests, $skip skipped, $fail failures, $errs errors (exit $rc)"
  [ "$rc" = 0 ] && [ "$ok" = 1 ] && [ "$tests" -gt 0 ]
}

reference() {
  for np in 1 2; do
    extra=()
    [ "$np" = 2 ] && extra=(-e test_util_sync)
    run_suite "MPICH" "$np" "$cache/mpich-$np.log" env -u LD_LIBRARY_PATH mpiexec.mpich -n "$np" ||
      { echo "mpi4py-testsuite: the suite fails under MPICH itself (see $cache/mpich-$np.log)" >&2; return 1; }
    read -r tests skip _ < <(summarize "$cache/mpich-$np.log" "$np")
    echo "$np $tests $skip" >"$cache/reference-$np"
  done
}

setup || { echo "mpi4py-testsuite: could not build mpi4py (see $cache/build.log)" >&2; tail -20 "$cache/build.log" >&2; exit 1; }
if [ "${1:-}" = --setup ]; then
  echo "$cache/venv/bin/python"; exit 0
fi
if [ "${1:-}" = --reference ]; then
  reference; exit $?
fi
[ -f "$cache/reference-1" ] && [ -f "$cache/reference-2" ] || reference || exit 1
bad=0
for np in 1 2; do
  extra=()
  log="$cache/vmfabric-$np.log"
  if ! run_suite "vmfabric" "$np" "$log" env LD_LIBRARY_PATH="$lib" "$vmf" run --quiet -n "$np"; then
    echo "mpi4py-testsuite: FAILED at $np rank(s); the end of $log:"
    grep -E "^(FAIL|ERROR):" "$log" | sort -u | head -20
    tail -30 "$log"
    bad=1
    continue
  fi
  read -r _ skip _ < <(summarize "$log" "$np")
  read -r _ _ ref_skip <"$cache/reference-$np"
  if [ "$skip" -gt "$ref_skip" ]; then
    echo "mpi4py-testsuite: $skip tests skipped at $np rank(s), MPICH skips $ref_skip"
    bad=1
  fi
done
[ $bad = 0 ] && echo "mpi4py-testsuite: passed (skips within MPICH's: $(cat "$cache/reference-1" | cut -d' ' -f3) and $(cat "$cache/reference-2" | cut -d' ' -f3) under MPICH at 1 and 2 ranks)"
exit $bad
