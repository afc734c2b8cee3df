#!/usr/bin/env bash
# bench/neighbours.sh -- two jobs sharing this host's CPUs (issue 23): a 2-rank ping-pong (the `ring`
# pattern of `vmfabric bench overcommit` at 2 ranks: an 8-byte token back and forth) alone, beside a
# copy of itself, and beside an MPICH job; and MPICH's twin (bench/c/mpi_overcommit.c) alone and beside
# a copy of itself. Interleaved rounds; the table gives microseconds per round trip (median of rounds)
# and the ratios the issue's targets name.
#
# Called by bench/run.sh (BENCH_NEIGHBOURS=0 skips it); can be run alone after `make bench` built
# bench/build/mpi_overcommit.mpich:   bash bench/neighbours.sh
#   BENCH_NEIGHBOURS_ROUNDS=N  rounds (default 3)      BENCH_RESULTS_DIR=dir (default bench/results)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VMF="${BENCH_VMFABRIC:-target/release/vmfabric}"
MPICH_BIN="${VMF_BENCH_MPICH_OVERCOMMIT:-bench/build/mpi_overcommit.mpich}"
OUT="${BENCH_RESULTS_DIR:-bench/results}/neighbours.json"
ROUNDS="${BENCH_NEIGHBOURS_ROUNDS:-3}"
# vmfabric runs 1e6 laps (about 0.25 s alone); two MPICH jobs on 2 CPUs take about 200 us per lap,
# so theirs run 20000 laps (about 4 s together) and the comparison is per lap.
VL=1000000
ML=20000
us() { grep -o '[0-9.]* us/round' | head -1 | cut -d' ' -f1; }
declare -A R
add() { R[$1]="${R[$1]:-} $2"; }
for r in $(seq "$ROUNDS"); do
    add ours_alone "$("$VMF" run --quiet -n 2 "$VMF" bench overcommit --pattern ring --rounds $VL | us)"
    add ours_beside_ours "$("$VMF" run --quiet -n 2 "$VMF" bench overcommit --pattern ring --rounds $VL --neighbours vmfabric | us)"
    if [ -x "$MPICH_BIN" ] && command -v mpiexec.mpich >/dev/null; then
        VMF_BENCH_MPICH_OVERCOMMIT="$MPICH_BIN" add ours_beside_mpich \
            "$("$VMF" run --quiet -n 2 "$VMF" bench overcommit --pattern ring --rounds $VL --neighbours mpich | us)"
        add mpich_alone "$(mpiexec.mpich -n 2 "$MPICH_BIN" --pattern ring --rounds $VL | us)"
        a=$(mktemp); b=$(mktemp)
        timeout 600 mpiexec.mpich -n 2 "$MPICH_BIN" --pattern ring --rounds $ML >"$a" &
        timeout 600 mpiexec.mpich -n 2 "$MPICH_BIN" --pattern ring --rounds $ML >"$b"
        wait
        add mpich_beside_mpich "$(us <"$a")"
        add mpich_beside_mpich "$(us <"$b")"
        rm -f "$a" "$b"
    fi
done
python3 - "$OUT" "${R[ours_alone]}" "${R[ours_beside_ours]}" "${R[ours_beside_mpich]:-}" \
    "${R[mpich_alone]:-}" "${R[mpich_beside_mpich]:-}" <<'EOF'
import json, statistics, sys
names = ["ours_alone", "ours_beside_ours", "ours_beside_mpich", "mpich_alone", "mpich_beside_mpich"]
vals = {n: [float(x) for x in v.split()] for n, v in zip(names, sys.argv[2:])}
med = {n: statistics.median(v) for n, v in vals.items() if v}
doc = {"benchmark": "neighbours", "pattern": "2-rank ping-pong (8 B)", "us_per_round_median": med,
       "rounds": vals}
if "ours_alone" in med and "ours_beside_ours" in med:
    doc["slowdown_beside_ours"] = med["ours_beside_ours"] / med["ours_alone"]
if "ours_beside_mpich" in med:
    doc["slowdown_beside_mpich"] = med["ours_beside_mpich"] / med["ours_alone"]
if "mpich_beside_mpich" in med and "ours_beside_ours" in med:
    doc["mpich_pair_vs_ours_pair"] = med["mpich_beside_mpich"] / med["ours_beside_ours"]
json.dump(doc, open(sys.argv[1], "w"), indent=1)
print(json.dumps(doc, indent=1))
EOF
