#!/usr/bin/env bash
# bench/overcommit.sh -- K ranks on this 2-core host: vmfabric's wait policies
# (spin, yield, block, adaptive) vs MPICH vs Open MPI (default and
# mpi_yield_when_idle), for K = 2, 4, 8 and the `ring` and `alltoall` patterns.
#
# Called by bench/run.sh (after the point-to-point part); can be run alone:
#   bash bench/overcommit.sh
# See bench/README.md ("Overcommit sweep").
#
# Environment knobs (all optional):
#   BENCH_OVERCOMMIT=0          skip the whole sweep
#   BENCH_OVERCOMMIT_QUICK=1    10x fewer rounds (a fast check of the plumbing)
#   BENCH_OVERCOMMIT_TIMEOUT=S  per-run time limit in seconds (default 120)
#   BENCH_OVERCOMMIT_KS="2 4 8" rank counts
#   BENCH_OVERCOMMIT_NOISE=0    skip the two --noise runs
#   BENCH_SKIP_VMFABRIC=1 / BENCH_SKIP_MPICH=1 / BENCH_SKIP_OPENMPI=1
#   BENCH_RESULTS_DIR=dir       results go to dir/overcommit (default bench/results)
#   BENCH_VMFABRIC=path         vmfabric binary (default target/release/vmfabric)
#   BENCH_PYTHON=path           python3 (with matplotlib) for overcommit_plot.py
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log()  { printf '[overcommit] %s\n' "$*"; }
warn() { printf '[overcommit] WARNING: %s\n' "$*" >&2; }

if [ "${BENCH_OVERCOMMIT:-1}" = 0 ]; then
    log "BENCH_OVERCOMMIT=0: skipped"
    exit 0
fi

BUILD=bench/build
RESULTS="${BENCH_RESULTS_DIR:-bench/results}"
OUT="$RESULTS/overcommit"
LOGS="$BUILD/logs/overcommit"
STATUS="$OUT/status.tsv"
VMF="${BENCH_VMFABRIC:-target/release/vmfabric}"
TIMEOUT="${BENCH_OVERCOMMIT_TIMEOUT:-120}"
read -r -a KS <<<"${BENCH_OVERCOMMIT_KS:-2 4 8}"
QUICK="${BENCH_OVERCOMMIT_QUICK:-0}"
CFLAGS=(-O2 -Wall -Wextra)

mkdir -p "$BUILD" "$OUT" "$LOGS"

# python3 with matplotlib (the PATH python3 may be a pyenv one without it)
PY="${BENCH_PYTHON:-}"
if [ -z "$PY" ]; then
    for cand in python3 /usr/bin/python3; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import matplotlib' >/dev/null 2>&1; then
            PY="$cand"; break
        fi
    done
    [ -n "$PY" ] || PY=python3
fi

# ---------------------------------------------------------------- build
HAVE_VMF=0; HAVE_MPICH=0; HAVE_OPENMPI=0
if [ "${BENCH_SKIP_VMFABRIC:-0}" != 1 ]; then
    if [ ! -x "$VMF" ] && command -v cargo >/dev/null 2>&1; then
        log "$VMF missing: cargo build --release -p vmfabric"
        cargo build --release -p vmfabric || warn "cargo build --release -p vmfabric failed"
    fi
    if [ -x "$VMF" ]; then HAVE_VMF=1; else warn "$VMF not available: vmfabric rows skipped"; fi
fi
if [ "${BENCH_SKIP_MPICH:-0}" != 1 ]; then
    if command -v mpicc.mpich >/dev/null 2>&1 && command -v mpiexec.mpich >/dev/null 2>&1; then
        if mpicc.mpich "${CFLAGS[@]}" -o "$BUILD/mpi_overcommit.mpich" bench/c/mpi_overcommit.c; then
            HAVE_MPICH=1
        else
            warn "mpi_overcommit.mpich build failed: MPICH rows skipped"
        fi
    else
        warn "mpicc.mpich / mpiexec.mpich not found: MPICH rows skipped"
    fi
fi
OMPI_ARGS=(--allow-run-as-root --oversubscribe)
if [ "${BENCH_SKIP_OPENMPI:-0}" != 1 ]; then
    if command -v mpicc.openmpi >/dev/null 2>&1 && command -v mpirun.openmpi >/dev/null 2>&1; then
        if mpicc.openmpi "${CFLAGS[@]}" -o "$BUILD/mpi_overcommit.openmpi" bench/c/mpi_overcommit.c; then
            HAVE_OPENMPI=1
        else
            warn "mpi_overcommit.openmpi build failed: Open MPI rows skipped"
        fi
        # Open MPI's shared-memory BTL is `vader` in 4.x and `sm` in 5.x.
        btls="$(ompi_info 2>/dev/null | grep -E 'MCA btl:' || true)"
        if grep -qE 'MCA btl: vader ' <<<"$btls"; then
            OMPI_ARGS+=(--mca pml ob1 --mca btl vader,self)
        elif grep -qE 'MCA btl: sm ' <<<"$btls"; then
            OMPI_ARGS+=(--mca pml ob1 --mca btl sm,self)
        fi
    else
        warn "mpicc.openmpi / mpirun.openmpi not found: Open MPI rows skipped"
    fi
fi

# ---------------------------------------------------------------- runs
# Start from a clean slate so a failed run never leaves stale numbers behind.
rm -f "$OUT"/*.json "$OUT"/*.json.tmp
printf 'implementation\twait\tpattern\tranks\tnoise\trounds\tstatus\n' >"$STATUS"
FAILURES=()

# rounds_for PATTERN K : laps / rounds that keep the sweep short on 2 cores
# (spinning ranks at K=8 are 100-1000x slower than at K=2).
rounds_for() {
    local r
    case "$1:$2" in
        ring:2) r=10000 ;; ring:4) r=2000 ;; ring:*) r=400 ;;
        alltoall:2) r=2000 ;; alltoall:4) r=400 ;; alltoall:*) r=100 ;;
    esac
    if [ "$QUICK" = 1 ]; then r=$((r / 10)); fi
    echo "$r"
}

# run_one IMPL WAIT PATTERN K NOISE ROUNDS JSON CMD... : CMD must write JSON
run_one() {
    local impl="$1" wait="$2" pat="$3" k="$4" noise="$5" rounds="$6" out="$7"; shift 7
    local name logf rc=0 status line
    name="$(basename "$out" .json)"
    logf="$LOGS/$name.log"
    rm -f "$out"
    timeout --kill-after=10 "$TIMEOUT" "$@" </dev/null >"$logf" 2>&1 || rc=$?
    if [ "$rc" = 0 ] && [ -s "$out" ] && "$PY" -c 'import json,sys; json.load(open(sys.argv[1]))' "$out" 2>/dev/null; then
        status=ok
        line="$(grep -m1 '^overcommit ' "$logf" || true)"
        log "$name: ${line:-ok}"
    else
        rm -f "$out"
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
            status="timeout-${TIMEOUT}s"
        elif [ "$rc" = 0 ]; then
            status="no-valid-json"
        else
            status="failed-rc$rc"
        fi
        warn "$name: $status (see $logf) -- continuing"
        FAILURES+=("$name ($status)")
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$impl" "$wait" "$pat" "$k" "$noise" "$rounds" "$status" >>"$STATUS"
}

# sweep_one PATTERN K ROUNDS NOISE(0|1) WHICH... ; WHICH in vmfabric:<policy>,
# mpich:default, openmpi:default, openmpi:yield_when_idle
sweep_one() {
    local pat="$1" k="$2" rounds="$3" noise="$4"; shift 4
    local which impl wait suffix="" nflag=() json
    if [ "$noise" = 1 ]; then suffix="-noise"; nflag=(--noise); fi
    local args=(--pattern "$pat" --rounds "$rounds" "${nflag[@]}")
    for which in "$@"; do
        impl="${which%%:*}"; wait="${which#*:}"
        json="$OUT/$impl-$wait-$pat-k$k$suffix.json"
        case "$impl" in
            vmfabric)
                [ "$HAVE_VMF" = 1 ] || continue
                run_one "$impl" "$wait" "$pat" "$k" "$noise" "$rounds" "$json" \
                    "$VMF" run -n "$k" --wait "$wait" "$VMF" bench overcommit "${args[@]}" --json "$json" ;;
            mpich)
                [ "$HAVE_MPICH" = 1 ] || continue
                run_one "$impl" "$wait" "$pat" "$k" "$noise" "$rounds" "$json" \
                    mpiexec.mpich -n "$k" "$BUILD/mpi_overcommit.mpich" "${args[@]}" \
                    --json "$json" --label mpich --wait-label "$wait" ;;
            openmpi)
                [ "$HAVE_OPENMPI" = 1 ] || continue
                local y=()
                [ "$wait" = yield_when_idle ] && y=(--mca mpi_yield_when_idle 1)
                run_one "$impl" "$wait" "$pat" "$k" "$noise" "$rounds" "$json" \
                    mpirun.openmpi "${OMPI_ARGS[@]}" "${y[@]}" -n "$k" \
                    "$BUILD/mpi_overcommit.openmpi" "${args[@]}" \
                    --json "$json" --label openmpi --wait-label "$wait" ;;
        esac
    done
}

ALL=(vmfabric:spin vmfabric:yield vmfabric:block vmfabric:adaptive
     mpich:default openmpi:default openmpi:yield_when_idle)

T0=$SECONDS
log "sweep: K in ${KS[*]}, ring + alltoall, timeout ${TIMEOUT}s per run$([ "$QUICK" = 1 ] && echo ', QUICK (10x fewer rounds)')"
for k in "${KS[@]}"; do
    for pat in ring alltoall; do
        sweep_one "$pat" "$k" "$(rounds_for "$pat" "$k")" 0 "${ALL[@]}"
    done
done
if [ "${BENCH_OVERCOMMIT_NOISE:-1}" != 0 ]; then
    # The seed's noise VM: a CPU burner next to 2 ranks on 2 cores.
    sweep_one alltoall 2 "$(rounds_for alltoall 2)" 1 vmfabric:adaptive mpich:default
fi
log "sweep finished in $((SECONDS - T0)) s"

# ---------------------------------------------------------------- report
PLOT_RC=0
"$PY" bench/overcommit_plot.py "$RESULTS" || PLOT_RC=$?
[ "$PLOT_RC" = 0 ] || warn "overcommit_plot.py failed (rc=$PLOT_RC)"

if [ "${#FAILURES[@]}" -gt 0 ]; then
    warn "${#FAILURES[@]} overcommit run(s) failed or timed out (no JSON):"
    for f in "${FAILURES[@]}"; do warn "  - $f"; done
fi
exit 0
