#!/usr/bin/env bash
# bench/run.sh -- vmfabric vs MPICH vs Open MPI, side by side on this machine.
#
# Invoked by `make bench` from the repo root as `bash bench/run.sh`.
# See bench/README.md for what is measured and where results go.
#
# Environment knobs (all optional):
#   BENCH_SIZES=8,64,...      message sizes for every implementation
#   BENCH_ITERS=N             base iteration count (scaled down for big sizes)
#   BENCH_MODES="latency bw bibw"
#   BENCH_CACHELINE_ITERS=N   round trips for the cache-line floor (1000000)
#   BENCH_SKIP_VMFABRIC=1 / BENCH_SKIP_MPICH=1 / BENCH_SKIP_OPENMPI=1 /
#   BENCH_SKIP_CACHELINE=1 /
#   BENCH_SKIP_IDEAL=1        leave one column out (ideal-shm: the no-MPI alltoall floor)
#   BENCH_ROUNDS=R            interleaved rounds; best round kept (default 3)
#   BENCH_TIMEOUT=SECONDS     per-run time limit (default 600)
#   BENCH_MPICH_ARGS / BENCH_OPENMPI_ARGS / BENCH_VMFABRIC_ARGS
#                             extra launcher arguments (word-split)
#   BENCH_PYTHON=path         python3 to run compare.py with
#   BENCH_RESULTS_DIR=dir     where results go (default bench/results)
#   BENCH_VMFABRIC=path       vmfabric binary (default target/release/vmfabric)
#   BENCH_STRICT=1            exit 1 if any run failed (default: warn, exit 0)
#   BENCH_HOSTS=0             skip TCP-between-hosts and migration benchmarks (need root)
#   BENCH_RMA=0               skip the one-sided benchmarks (BENCH_RMA_ROUNDS=R rounds, default 3)
#   BENCH_IO=0                skip the MPI-IO benchmarks (BENCH_IO_ROUNDS=R, BENCH_IO_MB=file size in MiB)
#   BENCH_MPI4PY=0            skip mpi4py's ping-pong (BENCH_MPI4PY_ROUNDS=R, default 5)
#   BENCH_OVERCOMMIT=0        skip the overcommit sweep (bench/overcommit.sh, which
#                             has its own knobs: BENCH_OVERCOMMIT_QUICK=1, ...)
#   BENCH_NEIGHBOURS=0        skip the two-jobs-sharing-CPUs comparison (bench/neighbours.sh)
#   BENCH_LARGE=0             skip the large-message and TCP rounds of issue 28 (bench/large.sh;
#                             BENCH_LARGE_ROUNDS=R, default 5)
#   BENCH_DVM=0               skip the distributed virtual machine rounds of issue 27 (bench/dvm.sh;
#                             BENCH_DVM_ROUNDS=R, default 5)
#   BENCH_VM=0                skip the QEMU guests of issue 24 (bench/vm.sh; BENCH_VM_ROUNDS, BENCH_VM_CYCLES)
#   BENCH_VNIC=0              skip the virtual NIC rounds of issue 26 (bench/vnic.sh; BENCH_VNIC_ROUNDS=R,
#                             default 3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BUILD=bench/build
RESULTS="${BENCH_RESULTS_DIR:-bench/results}"
LOGS="$BUILD/logs"
STATUS="$RESULTS/status.tsv"
VMF="${BENCH_VMFABRIC:-target/release/vmfabric}"
read -r -a MODES <<<"${BENCH_MODES:-latency bw bibw}"
TIMEOUT="${BENCH_TIMEOUT:-600}"
ROUNDS="${BENCH_ROUNDS:-5}"
ROUNDS_DIR="$BUILD/rounds"
FAILURES=()
FAILED_ROUNDS=()

log()  { printf '[bench] %s\n' "$*"; }
warn() { printf '[bench] WARNING: %s\n' "$*" >&2; }

# ---------------------------------------------------------------- packages
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
fi
APT_UPDATED=0
apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        warn "apt-get not available; cannot install: $*"
        return 1
    fi
    if [ "$APT_UPDATED" = 0 ]; then
        log "apt-get update"
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq || warn "apt-get update failed"
        APT_UPDATED=1
    fi
    log "apt-get install -y $*"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" </dev/null
}

# need COMMAND PACKAGE... : install PACKAGEs only if COMMAND is missing
need() {
    local cmd="$1"; shift
    if ! command -v "$cmd" >/dev/null 2>&1; then
        apt_install "$@" || warn "could not install $* (for $cmd)"
    fi
    command -v "$cmd" >/dev/null 2>&1
}

HAVE_GCC=1; HAVE_MPICH=1; HAVE_OPENMPI=1
need gcc gcc || HAVE_GCC=0
if [ "${BENCH_SKIP_MPICH:-0}" != 1 ]; then
    { need mpicc.mpich mpich libmpich-dev && need mpiexec.mpich mpich; } || HAVE_MPICH=0
fi
if [ "${BENCH_SKIP_OPENMPI:-0}" != 1 ]; then
    { need mpicc.openmpi openmpi-bin libopenmpi-dev && need mpirun.openmpi openmpi-bin; } || HAVE_OPENMPI=0
    # openmpi-bin alone (installed with slurm-wlm's or scalapack's dependencies) has mpicc.openmpi but no
    # mpi.h: the compiler wrapper then fails on every program.
    if [ "$HAVE_OPENMPI" = 1 ] && ! echo 'int main(void){return 0;}' | mpicc.openmpi -x c -include mpi.h -o /dev/null - >/dev/null 2>&1; then
        apt_install libopenmpi-dev || warn "could not install libopenmpi-dev (Open MPI's headers)"
    fi
fi
command -v timeout >/dev/null 2>&1 || need timeout coreutils || true

# python3 with matplotlib (the PATH python3 may be a pyenv one without it)
PY="${BENCH_PYTHON:-}"
if [ -z "$PY" ]; then
    for cand in python3 /usr/bin/python3; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import matplotlib' >/dev/null 2>&1; then
            PY="$cand"; break
        fi
    done
fi
if [ -z "$PY" ]; then
    apt_install python3 python3-matplotlib || warn "could not install python3-matplotlib"
    if /usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1; then
        PY=/usr/bin/python3
    else
        PY=python3
        warn "matplotlib unavailable: plots will be skipped"
    fi
fi

# ---------------------------------------------------------------- build
mkdir -p "$BUILD" "$RESULTS" "$LOGS"
CFLAGS=(-O2 -Wall -Wextra)

if [ "$HAVE_GCC" = 1 ]; then
    gcc "${CFLAGS[@]}" -o "$BUILD/cacheline" bench/c/cacheline.c || { warn "cacheline build failed"; HAVE_GCC=0; }
    gcc "${CFLAGS[@]}" -o "$BUILD/tcp_floor" bench/c/tcp_floor.c || warn "tcp_floor build failed"
    gcc "${CFLAGS[@]}" -o "$BUILD/alltoall_floor" bench/c/alltoall_floor.c || warn "alltoall_floor build failed"
fi
if [ "${BENCH_SKIP_MPICH:-0}" != 1 ] && [ "$HAVE_MPICH" = 1 ]; then
    mpicc.mpich "${CFLAGS[@]}" -o "$BUILD/mpi_pingpong.mpich" bench/c/mpi_pingpong.c \
        || { warn "mpi_pingpong.mpich build failed"; HAVE_MPICH=0; }
fi
if [ "${BENCH_SKIP_OPENMPI:-0}" != 1 ] && [ "$HAVE_OPENMPI" = 1 ]; then
    mpicc.openmpi "${CFLAGS[@]}" -o "$BUILD/mpi_pingpong.openmpi" bench/c/mpi_pingpong.c \
        || { warn "mpi_pingpong.openmpi build failed"; HAVE_OPENMPI=0; }
fi
# Collective latency (one source, built with both wrappers; the MPICH build also runs over vmfabric).
if [ "${BENCH_SKIP_MPICH:-0}" != 1 ] && [ "$HAVE_MPICH" = 1 ]; then
    mpicc.mpich "${CFLAGS[@]}" -o "$BUILD/mpi_coll.mpich" bench/c/mpi_coll.c || warn "mpi_coll.mpich build failed"
fi
if [ "${BENCH_SKIP_OPENMPI:-0}" != 1 ] && [ "$HAVE_OPENMPI" = 1 ]; then
    mpicc.openmpi "${CFLAGS[@]}" -o "$BUILD/mpi_coll.openmpi" bench/c/mpi_coll.c || warn "mpi_coll.openmpi build failed"
fi
read -r -a COLLS <<<"${BENCH_COLLS:-barrier bcast allreduce alltoall}"
COLL_SIZES="${BENCH_COLL_SIZES:-8,64,512,4096,32768,262144,1048576}"
COLL_ROUNDS="${BENCH_COLL_ROUNDS:-5}"

HAVE_VMF=1
if [ "${BENCH_SKIP_VMFABRIC:-0}" != 1 ] && [ ! -x "$VMF" ]; then
    if command -v cargo >/dev/null 2>&1; then
        log "$VMF missing: cargo build --release -p vmfabric"
        cargo build --release -p vmfabric || warn "cargo build --release -p vmfabric failed"
    else
        warn "cargo not found and $VMF missing"
    fi
fi
[ -x "$VMF" ] || HAVE_VMF=0

# Open MPI's shared-memory BTL is `vader` in 4.x and `sm` in 5.x.
OMPI_ARGS=(--allow-run-as-root --oversubscribe)
if [ "${BENCH_SKIP_OPENMPI:-0}" != 1 ] && [ "$HAVE_OPENMPI" = 1 ]; then
    btls="$(ompi_info 2>/dev/null | grep -E 'MCA btl:' || true)"
    if grep -qE 'MCA btl: vader ' <<<"$btls"; then
        OMPI_ARGS+=(--mca pml ob1 --mca btl vader,self)
    elif grep -qE 'MCA btl: sm ' <<<"$btls"; then
        OMPI_ARGS+=(--mca pml ob1 --mca btl sm,self)
    else
        warn "Open MPI has neither btl vader nor sm; using its defaults"
    fi
fi

# ---------------------------------------------------------------- runs
COMMON=()
[ -n "${BENCH_SIZES:-}" ] && COMMON+=(--sizes "$BENCH_SIZES")
[ -n "${BENCH_ITERS:-}" ] && COMMON+=(--iters "$BENCH_ITERS")
read -r -a X_MPICH <<<"${BENCH_MPICH_ARGS:-}"
read -r -a X_OMPI <<<"${BENCH_OPENMPI_ARGS:-}"
read -r -a X_VMF <<<"${BENCH_VMFABRIC_ARGS:-}"

# Start from a clean slate so a failed run never leaves stale numbers behind.
for impl in vmfabric mpich openmpi; do
    for mode in latency bw bibw "${MODES[@]}"; do
        rm -f "$RESULTS/$impl-$mode.json" "$RESULTS/$impl-$mode.json.tmp"
    done
done
rm -f "$RESULTS"/*-coll-*.json "$RESULTS"/*-rma-*.json "$RESULTS"/*-io-write.json "$RESULTS"/*-io-read.json
rm -f "$RESULTS"/*-tcplat.json "$RESULTS"/*-tcpbw.json "$RESULTS/cacheline.json" "$RESULTS/summary.md" "$RESULTS/summary.json" \
      "$RESULTS"/*.png "$STATUS"
rm -rf "$ROUNDS_DIR"
mkdir -p "$ROUNDS_DIR"
printf 'impl\tbenchmark\tstatus\n' >"$STATUS"

record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$STATUS"; }

# run_one IMPL BENCH ROUND CMD... : CMD must write $ROUNDS_DIR/IMPL-BENCH.rROUND.json
run_one() {
    local impl="$1" bench="$2" round="$3"; shift 3
    local out="$ROUNDS_DIR/$impl-$bench.r$round.json" logf="$LOGS/$impl-$bench.r$round.log" rc=0
    log "round $round/$ROUNDS: $impl $bench: $*"
    # pipefail: rc is the launcher's status (or tee's, if only tee failed)
    timeout --kill-after=10 "$TIMEOUT" "$@" </dev/null 2>&1 | tee "$logf" || rc=$?
    if [ "$rc" = 0 ] && [ -s "$out" ] && "$PY" -c 'import json,sys; json.load(open(sys.argv[1]))' "$out" 2>/dev/null; then
        return 0
    fi
    rm -f "$out"
    [ "$rc" = 0 ] && rc="no-valid-json"
    [ "$rc" = 124 ] && rc="timeout-${TIMEOUT}s"
    warn "$impl $bench round $round FAILED (rc=$rc); see $logf -- continuing"
    FAILED_ROUNDS+=("$impl $bench round $round (rc=$rc)")
    return 0
}

# merge IMPL BENCH OUTFILE : best-of-rounds into bench/results
merge() {
    local impl="$1" bench="$2" outf="$3" n
    local files=("$ROUNDS_DIR/$impl-$bench".r*.json)
    if [ ! -e "${files[0]}" ]; then
        record "$impl" "$bench" "FAILED (all $ROUNDS rounds)"
        FAILURES+=("$impl $bench (all rounds failed)")
        return 0
    fi
    n="${#files[@]}"
    if "$PY" bench/merge_rounds.py "$outf" "${files[@]}"; then
        if [ "$n" = "$ROUNDS" ]; then
            record "$impl" "$bench" ok
        else
            record "$impl" "$bench" "ok ($n/$ROUNDS rounds)"
        fi
    else
        record "$impl" "$bench" "FAILED (merge)"
        FAILURES+=("$impl $bench (merge failed)")
    fi
}

skip_reason() { # IMPL -> prints why it is skipped, or nothing
    case "$1" in
        vmfabric)
            if [ "${BENCH_SKIP_VMFABRIC:-0}" = 1 ]; then echo "BENCH_SKIP_VMFABRIC=1"
            elif [ "$HAVE_VMF" != 1 ]; then echo "$VMF not built"; fi ;;
        mpich)
            if [ "${BENCH_SKIP_MPICH:-0}" = 1 ]; then echo "BENCH_SKIP_MPICH=1"
            elif [ "$HAVE_MPICH" != 1 ]; then echo "MPICH not available"; fi ;;
        openmpi)
            if [ "${BENCH_SKIP_OPENMPI:-0}" = 1 ]; then echo "BENCH_SKIP_OPENMPI=1"
            elif [ "$HAVE_OPENMPI" != 1 ]; then echo "Open MPI not available"; fi ;;
        cacheline)
            if [ "${BENCH_SKIP_CACHELINE:-0}" = 1 ]; then echo "BENCH_SKIP_CACHELINE=1"
            elif [ "$HAVE_GCC" != 1 ]; then echo "no C compiler"; fi ;;
        ideal-shm)
            if [ "${BENCH_SKIP_IDEAL:-0}" = 1 ]; then echo "BENCH_SKIP_IDEAL=1"
            elif [ ! -x "$BUILD/alltoall_floor" ]; then echo "alltoall_floor not built"; fi ;;
    esac
}

# coll_impls COLL -> the implementations a collective runs with: the alltoall also has its no-MPI floor
# (bench/c/alltoall_floor.c), a reference column.
coll_impls() {
    local l="vmfabric-mpi mpich openmpi"
    [ "$1" = alltoall ] && [ -z "$(skip_reason ideal-shm)" ] && l="$l ideal-shm"
    echo "$l"
}

CL=()
[ -n "${BENCH_CACHELINE_ITERS:-}" ] && CL+=(--iters "$BENCH_CACHELINE_ITERS")

T0=$SECONDS
for round in $(seq 1 "$ROUNDS"); do
    # (d) the cache-line floor, once per round
    if [ -z "$(skip_reason cacheline)" ]; then
        run_one cacheline cacheline "$round" "$BUILD/cacheline" "${CL[@]}" \
            --json "$ROUNDS_DIR/cacheline-cacheline.r$round.json"
    fi
    for mode in "${MODES[@]}"; do
        # (a) vmfabric
        if [ -z "$(skip_reason vmfabric)" ]; then run_one vmfabric "$mode" "$round" \
            "$VMF" run -n 2 "${X_VMF[@]}" "$VMF" bench "$mode" \
            "${COMMON[@]}" --json "$ROUNDS_DIR/vmfabric-$mode.r$round.json"
        fi
        # (a2) vmfabric through its MPI library: the very binary built with mpicc.mpich
        if [ -z "$(skip_reason vmfabric)" ] && [ -f "$ROOT/target/release/lib/libmpich.so.12" ]; then
            run_one vmfabric-mpi "$mode" "$round" env LD_LIBRARY_PATH="$ROOT/target/release/lib" \
                "$VMF" run -n 2 "${X_VMF[@]}" "$BUILD/mpi_pingpong.mpich" "$mode" \
                "${COMMON[@]}" --json "$ROUNDS_DIR/vmfabric-mpi-$mode.r$round.json" --label vmfabric-mpi
        fi
        # (b) MPICH
        if [ -z "$(skip_reason mpich)" ]; then run_one mpich "$mode" "$round" \
            mpiexec.mpich -n 2 "${X_MPICH[@]}" "$BUILD/mpi_pingpong.mpich" "$mode" \
            "${COMMON[@]}" --json "$ROUNDS_DIR/mpich-$mode.r$round.json" --label mpich
        fi
        # (c) Open MPI
        if [ -z "$(skip_reason openmpi)" ]; then run_one openmpi "$mode" "$round" \
            mpirun.openmpi "${OMPI_ARGS[@]}" -n 2 "${X_OMPI[@]}" \
            "$BUILD/mpi_pingpong.openmpi" "$mode" \
            "${COMMON[@]}" --json "$ROUNDS_DIR/openmpi-$mode.r$round.json" --label openmpi
        fi
    done
    # Collectives at 2 and 4 ranks, only the first BENCH_COLL_ROUNDS rounds. 4 ranks on 2 cores are
    # oversubscribed: 1000 iterations (OSU's default) for vmfabric and Open MPI, whose calls take
    # microseconds, but 200 for MPICH, which busy-polls and takes milliseconds per call there. With 200,
    # start-up effects dominate the small sizes (a bare C barrier of 4 pinned processes: 2.2-2.9 us over
    # 220 iterations against 1.6-1.75 us over 100 000).
    if [ "$round" -le "$COLL_ROUNDS" ]; then
    for np in 2 4; do
        it="${BENCH_COLL_ITERS:-2000}"; itm="$it"
        if [ "$np" = 4 ]; then it="${BENCH_COLL_ITERS4:-1000}"; itm="${BENCH_COLL_ITERS4_MPICH:-200}"; fi
        for coll in "${COLLS[@]}"; do
            b="coll-$coll-$np"; CA=(--coll "$coll" --sizes "$COLL_SIZES" --iters "$it")
            CAM=(--coll "$coll" --sizes "$COLL_SIZES" --iters "$itm")
            # Each round starts with a different implementation, so that none always runs first (right
            # after the point-to-point runs) or last: on a shared machine a slow stretch then lands on
            # each in turn, and the medians of the within-round ratios do not carry an order bias.
            read -r -a order <<<"$(coll_impls "$coll")"
            for s in $(seq 1 $(( (round - 1) % ${#order[@]} ))); do order=("${order[@]:1}" "${order[0]}"); done
            # The cache-line floor right before and after this collective's runs: the host may move the
            # VM's CPUs between rounds (a floor 4-5x higher than usual was seen), and compare.py leaves
            # rounds run at such a floor out of the collective verdicts (bench/README.md).
            floor_probe() {
                [ -z "$(skip_reason cacheline)" ] && "$BUILD/cacheline" "${CL[@]}" \
                    --json "$ROUNDS_DIR/floor-$b.r$round.$1.json" >/dev/null 2>&1 || true
            }
            floor_probe pre
            for impl in "${order[@]}"; do case "$impl" in
            vmfabric-mpi)
                if [ -z "$(skip_reason vmfabric)" ] && [ -f "$ROOT/target/release/lib/libmpich.so.12" ] && [ -x "$BUILD/mpi_coll.mpich" ]; then
                    run_one vmfabric-mpi "$b" "$round" env LD_LIBRARY_PATH="$ROOT/target/release/lib" \
                        "$VMF" run -n "$np" "${X_VMF[@]}" "$BUILD/mpi_coll.mpich" "${CA[@]}" \
                        --json "$ROUNDS_DIR/vmfabric-mpi-$b.r$round.json" --label vmfabric
                fi ;;
            mpich)
                if [ -z "$(skip_reason mpich)" ] && [ -x "$BUILD/mpi_coll.mpich" ]; then
                    run_one mpich "$b" "$round" mpiexec.mpich -n "$np" "${X_MPICH[@]}" "$BUILD/mpi_coll.mpich" "${CAM[@]}" \
                        --json "$ROUNDS_DIR/mpich-$b.r$round.json" --label mpich
                fi ;;
            openmpi)
                if [ -z "$(skip_reason openmpi)" ] && [ -x "$BUILD/mpi_coll.openmpi" ]; then
                    run_one openmpi "$b" "$round" mpirun.openmpi "${OMPI_ARGS[@]}" -n "$np" "${X_OMPI[@]}" \
                        "$BUILD/mpi_coll.openmpi" "${CA[@]}" --json "$ROUNDS_DIR/openmpi-$b.r$round.json" --label openmpi
                fi ;;
            ideal-shm)
                run_one ideal-shm "$b" "$round" "$BUILD/alltoall_floor" --ranks "$np" --sizes "$COLL_SIZES" \
                    --iters "$it" --json "$ROUNDS_DIR/ideal-shm-$b.r$round.json" --label ideal-shm ;;
            esac; done
            floor_probe post
        done
    done
    fi
done
log "runs finished in $((SECONDS - T0)) s"

# best-of-rounds into bench/results/
why="$(skip_reason cacheline)"
if [ -z "$why" ]; then
    merge cacheline cacheline "$RESULTS/cacheline.json"
else
    record cacheline cacheline "skipped: $why"
fi
for mode in "${MODES[@]}"; do
    for impl in vmfabric vmfabric-mpi mpich openmpi; do
        why="$(skip_reason "${impl%-mpi}")"
        if [ "$impl" = vmfabric-mpi ] && [ ! -f "$ROOT/target/release/lib/libmpich.so.12" ]; then
            why="MPI library not built"
        fi
        if [ -z "$why" ]; then
            merge "$impl" "$mode" "$RESULTS/$impl-$mode.json"
        else
            record "$impl" "$mode" "skipped: $why"
            case "$why" in BENCH_SKIP_*) ;; *) FAILURES+=("$impl $mode ($why)") ;; esac
        fi
    done
done

for np in 2 4; do for coll in "${COLLS[@]}"; do
    for impl in $(coll_impls "$coll"); do
    why="$(skip_reason "${impl%-mpi}")"
    [ "$impl" = vmfabric-mpi ] && [ ! -x "$BUILD/mpi_coll.mpich" ] && why="${why:-mpi_coll.mpich not built}"
    if [ -z "$why" ]; then
        merge "$impl" "coll-$coll-$np" "$RESULTS/$impl-coll-$coll-$np.json"
        # Name the benchmark with its rank count, so each (collective, ranks) gets its own table.
        [ -f "$RESULTS/$impl-coll-$coll-$np.json" ] && "$PY" -c 'import json,sys; p=sys.argv[1]; d=json.load(open(p)); d["benchmark"]=sys.argv[2]; json.dump(d, open(p,"w"), indent=1)' \
            "$RESULTS/$impl-coll-$coll-$np.json" "coll-$coll-$np"
    else record "$impl" "coll-$coll-$np" "skipped: $why"; fi
done; done; done

# Run a part of the benchmark that has its own script (NAME SCRIPT VAR=VALUE...): a failure is warned
# about and recorded, the run goes on.
sub_bench() {
    local name=$1 script=$2 rc=0
    shift 2
    env "$@" bash "$script" || rc=$?
    if [ "$rc" != 0 ]; then
        warn "$script failed (rc=$rc)"
        FAILURES+=("$name (rc=$rc)")
    fi
}

# ---------------------------------------------------------------- overcommit
# K = 2, 4, 8 ranks on this host: vmfabric's wait policies vs MPICH / Open MPI
# (results in $RESULTS/overcommit/ and $RESULTS/overcommit.md).
if [ "${BENCH_OVERCOMMIT:-1}" != 0 ]; then
    sub_bench "overcommit sweep" bench/overcommit.sh \
        BENCH_PYTHON="$PY" BENCH_RESULTS_DIR="$RESULTS" BENCH_VMFABRIC="$VMF"
else
    log "BENCH_OVERCOMMIT=0: overcommit sweep skipped"
fi

# ---------------------------------------------------------------- neighbours
# Two jobs sharing the CPUs: a 2-rank ping-pong alone, beside a copy of itself and beside MPICH, and
# MPICH's twin alone and beside itself (results in $RESULTS/neighbours.json).
if [ "${BENCH_NEIGHBOURS:-1}" != 0 ]; then
    if [ ! -x "$BUILD/mpi_overcommit.mpich" ] && command -v mpicc.mpich >/dev/null; then
        mpicc.mpich -O2 -o "$BUILD/mpi_overcommit.mpich" bench/c/mpi_overcommit.c || true
    fi
    sub_bench "neighbours" bench/neighbours.sh \
        BENCH_RESULTS_DIR="$RESULTS" BENCH_VMFABRIC="$VMF" VMF_BENCH_MPICH_OVERCOMMIT="$BUILD/mpi_overcommit.mpich"
else
    log "BENCH_NEIGHBOURS=0: neighbours skipped"
fi

# ---------------------------------------------------------------- minitransactions and barriers
# Issue 25: increment counters (spin lock, minitransactions, MPI RMA on MPICH and Open MPI) and barriers
# (spin/block/adaptive, MPI_Barrier of MPICH and Open MPI) at 2, 4, 8 ranks (results in $RESULTS/mtx.json
# and barrier.json). BENCH_MTX=0 skips it.
if [ "${BENCH_MTX:-1}" != 0 ]; then
    sub_bench "minitransactions and barriers" bench/mtx.sh \
        BENCH_PYTHON="$PY" BENCH_RESULTS_DIR="$RESULTS" BENCH_VMFABRIC="$VMF" BENCH_BUILD_DIR="$BUILD"
else
    log "BENCH_MTX=0: minitransactions and barriers skipped"
fi

# ---------------------------------------------------------------- large messages and TCP
# Issue 28: the C ping-pong at 16 KiB-4 MiB (calibrated vmfabric, vmfabric with the built-in defaults,
# MPICH, Open MPI) and TCP latency/bandwidth (bare sockets, vmfabric, Open MPI's tcp BTL, emulated hosts)
# in interleaved rounds (results in $RESULTS/large.json). BENCH_LARGE=0 skips it.
if [ "${BENCH_LARGE:-1}" != 0 ]; then
    sub_bench "large messages and TCP" bench/large.sh \
        BENCH_PYTHON="$PY" BENCH_RESULTS_DIR="$RESULTS" BENCH_VMFABRIC="$VMF" BENCH_BUILD_DIR="$BUILD"
else
    log "BENCH_LARGE=0: large messages and TCP skipped"
fi

# ---------------------------------------------------------------- distributed virtual machine
# Issue 27: DASS programs (compiled) against the same loops in C, and the page protocol's costs, in
# interleaved rounds (results in $RESULTS/dvm.json). BENCH_DVM=0 skips it.
if [ "${BENCH_DVM:-1}" != 0 ]; then
    sub_bench "distributed virtual machine" bench/dvm.sh \
        BENCH_PYTHON="$PY" BENCH_RESULTS_DIR="$RESULTS" BENCH_VMFABRIC="$VMF" BENCH_BUILD_DIR="$BUILD"
else
    log "BENCH_DVM=0: distributed virtual machine skipped"
fi

# ---------------------------------------------------------------- virtual NIC
# Issue 26: iperf3 over `vmfabric vnic` against a veth pair at MTU 1500 and 65520, and VLB against none with
# a slow receiver, in interleaved rounds (results in $RESULTS/vnic.json). BENCH_VNIC=0 skips it.
if [ "${BENCH_VNIC:-1}" != 0 ]; then
    sub_bench "virtual NIC" bench/vnic.sh \
        BENCH_PYTHON="$PY" BENCH_RESULTS_DIR="$RESULTS" BENCH_VMFABRIC="$VMF"
else
    log "BENCH_VNIC=0: virtual NIC skipped"
fi

# ---------------------------------------------------------------- real VMs
# Issue 24: ranks in two QEMU guests over their ivshmem region against TCP between them and against two
# host processes, and the failover pause of unplug/plug cycles under traffic (results in $RESULTS/vm.json).
# BENCH_VM=0 skips it.
if [ "${BENCH_VM:-1}" != 0 ]; then
    sub_bench "QEMU guests" bench/vm.sh \
        BENCH_PYTHON="$PY" BENCH_RESULTS_DIR="$RESULTS" BENCH_VMFABRIC="$VMF"
else
    log "BENCH_VM=0: QEMU guests skipped"
fi

# ---------------------------------------------------------------- one-sided (RMA)
# bench/c/mpi_rma.c (lock_all, one operation, MPI_Win_flush, on an MPI_Win_allocate window): the MPICH
# build runs over vmfabric and over MPICH, the Open MPI build over Open MPI, in BENCH_RMA_ROUNDS
# interleaved rounds (each round starts with another implementation). Also over TCP on one host
# (vmfabric with VMF_SHM=0 against Open MPI's tcp BTL) and with a target that computes without calling
# MPI (a truly passive target; --target-busy caps the computation, after which the target calls MPI).
# BENCH_RMA=0 skips it.
if [ "${BENCH_RMA:-1}" != 0 ]; then
    [ "$HAVE_MPICH" = 1 ] && { mpicc.mpich "${CFLAGS[@]}" -o "$BUILD/mpi_rma.mpich" bench/c/mpi_rma.c || warn "mpi_rma.mpich build failed"; }
    [ "$HAVE_OPENMPI" = 1 ] && { mpicc.openmpi "${CFLAGS[@]}" -o "$BUILD/mpi_rma.openmpi" bench/c/mpi_rma.c || warn "mpi_rma.openmpi build failed"; }
    RSZ="${BENCH_RMA_SIZES:-8,64,4096,65536}"; BSZ="65536,1048576,4194304"
    # osc pt2pt: the one-sided component that runs over the BTL (osc sm and ucx would take shared memory).
    OMPI_TCP=(--allow-run-as-root --oversubscribe --mca pml ob1 --mca btl tcp,self --mca osc pt2pt)
    RMA_BENCHES=()
    rma_run() { # IMPL BENCH ROUND MODE ITERS [extra args...]
        local impl="$1" b="$2" rnd="$3" m="$4" it="$5"; shift 5
        local j="$ROUNDS_DIR/$impl-$b.r$rnd.json"
        case "$impl" in
        vmfabric-mpi) [ -x "$BUILD/mpi_rma.mpich" ] && [ -z "$(skip_reason vmfabric)" ] && run_one "$impl" "$b" "$rnd" \
            env LD_LIBRARY_PATH="$ROOT/target/release/lib" "$VMF" run -n 2 "${X_VMF[@]}" "$BUILD/mpi_rma.mpich" "$m" \
            --iters "$it" --json "$j" --label vmfabric "$@" ;;
        vmfabric-tcp) [ -x "$BUILD/mpi_rma.mpich" ] && [ -z "$(skip_reason vmfabric)" ] && run_one vmfabric-mpi "$b" "$rnd" \
            env VMF_SHM=0 LD_LIBRARY_PATH="$ROOT/target/release/lib" "$VMF" run -n 2 "${X_VMF[@]}" "$BUILD/mpi_rma.mpich" "$m" \
            --iters "$it" --json "$ROUNDS_DIR/vmfabric-mpi-$b.r$rnd.json" --label vmfabric-tcp "$@" ;;
        mpich) [ -x "$BUILD/mpi_rma.mpich" ] && [ -z "$(skip_reason mpich)" ] && run_one mpich "$b" "$rnd" \
            mpiexec.mpich -n 2 "${X_MPICH[@]}" "$BUILD/mpi_rma.mpich" "$m" --iters "$it" --json "$j" --label mpich "$@" ;;
        openmpi) [ -x "$BUILD/mpi_rma.openmpi" ] && [ -z "$(skip_reason openmpi)" ] && run_one openmpi "$b" "$rnd" \
            mpirun.openmpi "${OMPI_ARGS[@]}" -n 2 "${X_OMPI[@]}" "$BUILD/mpi_rma.openmpi" "$m" --iters "$it" --json "$j" --label openmpi "$@" ;;
        openmpi-tcp) [ -x "$BUILD/mpi_rma.openmpi" ] && [ -z "$(skip_reason openmpi)" ] && run_one openmpi "$b" "$rnd" \
            mpirun.openmpi "${OMPI_TCP[@]}" -n 2 "${X_OMPI[@]}" "$BUILD/mpi_rma.openmpi" "$m" --iters "$it" \
            --json "$ROUNDS_DIR/openmpi-$b.r$rnd.json" --label openmpi-tcp "$@" ;;
        esac
        return 0
    }
    for round in $(seq 1 "${BENCH_RMA_ROUNDS:-3}"); do
        order=(vmfabric-mpi mpich openmpi)
        for s in $(seq 1 $(( (round - 1) % 3 ))); do order=("${order[@]:1}" "${order[0]}"); done
        for m in put get fop cas putbw; do
            sz="$RSZ"; [ "$m" = putbw ] && sz="$BSZ"; [ "$m" = fop ] || [ "$m" = cas ] && sz=8
            for impl in "${order[@]}"; do
                it=20000
                # MPICH's fetch-and-op and compare-and-swap wait for the target's progress: milliseconds each.
                [ "$impl" = mpich ] && { [ "$m" = fop ] || [ "$m" = cas ]; } && it=200
                rma_run "$impl" "rma-$m" "$round" "$m" "$it" --sizes "$sz"
            done
        done
        # Over TCP on one host: vmfabric's agents against Open MPI's tcp BTL.
        for m in get put; do
            rma_run vmfabric-tcp "rma-tcp$m" "$round" "$m" 5000 --sizes 8,4096
            rma_run openmpi-tcp "rma-tcp$m" "$round" "$m" 5000 --sizes 8,4096
        done
        # A target that computes without calling MPI, over shared memory and over TCP.
        for impl in "${order[@]}"; do
            it=20000; [ "$impl" = mpich ] && it=2000
            rma_run "$impl" rma-busyget "$round" get "$it" --sizes 8 --target-busy 20
        done
        rma_run vmfabric-tcp rma-tcpbusyget "$round" get 5000 --sizes 8 --target-busy 20
        rma_run openmpi-tcp rma-tcpbusyget "$round" get 5000 --sizes 8 --target-busy 20
    done
    ALL_ROUNDS="$ROUNDS"; ROUNDS="${BENCH_RMA_ROUNDS:-3}" # what merge expects
    for b in rma-put rma-get rma-fop rma-cas rma-putbw rma-tcpget rma-tcpput rma-busyget rma-tcpbusyget; do
        for impl in vmfabric-mpi mpich openmpi; do
            ls "$ROUNDS_DIR/$impl-$b".r*.json >/dev/null 2>&1 && merge "$impl" "$b" "$RESULTS/$impl-$b.json"
        done
    done
    ROUNDS="$ALL_ROUNDS"
    # Open MPI 4.1 crashes in MPI_Compare_and_swap on shared memory (osc/sm); its missing column is that.
    if ! ls "$ROUNDS_DIR/openmpi-rma-cas".r*.json >/dev/null 2>&1; then
        record openmpi rma-cas "FAILED: crashed in every round (Open MPI 4.1's osc/sm compare-and-swap)"
    fi
else
    log "BENCH_RMA=0: one-sided benchmarks skipped"
fi

# ---------------------------------------------------------------- MPI-IO
# bench/c/mpi_io.c: 4 ranks write and read one file of BENCH_IO_MB MiB (default 1024) collectively through a
# strided vector view (16 KiB blocks; MPI_File_write_at_all / MPI_File_read_at_all), the best of 2
# repetitions per run. The MPICH build runs over vmfabric and over MPICH (ROMIO), the Open MPI build over
# Open MPI (OMPIO), in BENCH_IO_ROUNDS interleaved rounds (default 3). BENCH_IO=0 skips it.
if [ "${BENCH_IO:-1}" != 0 ]; then
    [ "$HAVE_MPICH" = 1 ] && { mpicc.mpich "${CFLAGS[@]}" -o "$BUILD/mpi_io.mpich" bench/c/mpi_io.c || warn "mpi_io.mpich build failed"; }
    [ "$HAVE_OPENMPI" = 1 ] && { mpicc.openmpi "${CFLAGS[@]}" -o "$BUILD/mpi_io.openmpi" bench/c/mpi_io.c || warn "mpi_io.openmpi build failed"; }
    IODIR="$BUILD/io-files"; mkdir -p "$IODIR"
    IOARGS=(--mb "${BENCH_IO_MB:-1024}" --block 16384 --reps 2 --dir "$IODIR")
    io_run() { # IMPL ROUND
        local impl="$1" rnd="$2" w="$ROUNDS_DIR/$1-io-write.r$2.json" r="$ROUNDS_DIR/$1-io-read.r$2.json"
        case "$impl" in
        vmfabric-mpi) [ -x "$BUILD/mpi_io.mpich" ] && [ -z "$(skip_reason vmfabric)" ] && run_one "$impl" io-write "$rnd" \
            env LD_LIBRARY_PATH="$ROOT/target/release/lib" "$VMF" run -n 4 "${X_VMF[@]}" "$BUILD/mpi_io.mpich" \
            "${IOARGS[@]}" --json-write "$w" --json-read "$r" --label vmfabric ;;
        mpich) [ -x "$BUILD/mpi_io.mpich" ] && [ -z "$(skip_reason mpich)" ] && run_one mpich io-write "$rnd" \
            mpiexec.mpich -n 4 "${X_MPICH[@]}" "$BUILD/mpi_io.mpich" "${IOARGS[@]}" --json-write "$w" --json-read "$r" --label mpich-romio ;;
        openmpi) [ -x "$BUILD/mpi_io.openmpi" ] && [ -z "$(skip_reason openmpi)" ] && run_one openmpi io-write "$rnd" \
            mpirun.openmpi "${OMPI_ARGS[@]}" -n 4 "${X_OMPI[@]}" "$BUILD/mpi_io.openmpi" "${IOARGS[@]}" --json-write "$w" \
            --json-read "$r" --label openmpi-ompio ;;
        esac
        return 0
    }
    for round in $(seq 1 "${BENCH_IO_ROUNDS:-3}"); do
        order=(vmfabric-mpi mpich openmpi)
        for s in $(seq 1 $(( (round - 1) % 3 ))); do order=("${order[@]:1}" "${order[0]}"); done
        for impl in "${order[@]}"; do io_run "$impl" "$round"; done
    done
    rm -rf "$IODIR"
    ALL_ROUNDS="$ROUNDS"; ROUNDS="${BENCH_IO_ROUNDS:-3}"
    for b in io-write io-read; do
        for impl in vmfabric-mpi mpich openmpi; do
            ls "$ROUNDS_DIR/$impl-$b".r*.json >/dev/null 2>&1 && merge "$impl" "$b" "$RESULTS/$impl-$b.json"
        done
    done
    ROUNDS="$ALL_ROUNDS"
else
    log "BENCH_IO=0: MPI-IO benchmarks skipped"
fi

# ---------------------------------------------------------------- mpi4py
# `python -m mpi4py.bench pingpong` (mpi4py's own benchmark, 8-byte messages, 200000 iterations) with the
# mpi4py that scripts/mpi4py-testsuite.sh builds against Debian's MPICH, over vmfabric and over MPICH, in
# BENCH_MPI4PY_ROUNDS interleaved rounds (default 5). BENCH_MPI4PY=0 skips it.
if [ "${BENCH_MPI4PY:-1}" != 0 ] && [ "$HAVE_MPICH" = 1 ]; then
    if M4PY="$(bash scripts/mpi4py-testsuite.sh --setup 2>/dev/null | tail -1)" && [ -x "$M4PY" ]; then
        pp_run() { # IMPL ROUND
            local impl="$1" rnd="$2" out="$ROUNDS_DIR/$1-mpi4py-pp.r$2.json"
            local cmd=(env -u LD_LIBRARY_PATH mpiexec.mpich -n 2 "${X_MPICH[@]}")
            [ "$impl" = vmfabric-mpi ] && cmd=(env LD_LIBRARY_PATH="$ROOT/target/release/lib" "$VMF" run --quiet -n 2 "${X_VMF[@]}")
            [ -n "$(skip_reason "${impl%-mpi}")" ] && return 0
            run_one "$impl" mpi4py-pp "$rnd" bash -c 'set -o pipefail; py=$1 out=$2; shift 2; "$@" | "$py" bench/mpi4py_pp.py "$out"' _ "$PY" "$out" \
                "${cmd[@]}" "$M4PY" -m mpi4py.bench pingpong -m 8 -n 8 -s 10000 -l 200000 --no-header
            return 0
        }
        for round in $(seq 1 "${BENCH_MPI4PY_ROUNDS:-5}"); do
            order=(vmfabric-mpi mpich)
            [ $((round % 2)) = 0 ] && order=(mpich vmfabric-mpi)
            for impl in "${order[@]}"; do pp_run "$impl" "$round"; done
        done
        ALL_ROUNDS="$ROUNDS"; ROUNDS="${BENCH_MPI4PY_ROUNDS:-5}"
        for impl in vmfabric-mpi mpich; do
            ls "$ROUNDS_DIR/$impl-mpi4py-pp".r*.json >/dev/null 2>&1 && merge "$impl" mpi4py-pp "$RESULTS/$impl-mpi4py-pp.json"
        done
        ROUNDS="$ALL_ROUNDS"
    else
        warn "mpi4py could not be built (scripts/mpi4py-testsuite.sh --setup): its ping-pong is skipped"
    fi
else
    log "BENCH_MPI4PY=0 (or no MPICH): mpi4py ping-pong skipped"
fi

# ---------------------------------------------------------------- hosts: TCP and live migration
# vmfabric across 2 emulated hosts (TCP over veth + bridge) vs Open MPI's TCP BTL (loopback), and the
# migration benchmark on 3 hosts. Needs root for the network namespaces; BENCH_HOSTS=0 skips it.
if [ "${BENCH_HOSTS:-1}" != 0 ] && [ "$(id -u)" = 0 ]; then
    TSZ="8,1024,65536,1048576"
    # Latency and bandwidth over TCP, interleaved in BENCH_TCP_ROUNDS rounds (the VM changes speed within minutes, so only
    # ratios within a round are compared): a bare-socket busy-recv ping-pong (a reference row: the kernel
    # path with no message layer), vmfabric over TCP on one host (VMF_SHM=0: the same kernel path as Open
    # MPI's TCP BTL), and Open MPI's TCP BTL.
    for round in $(seq 1 "${BENCH_TCP_ROUNDS:-3}"); do
        if [ -x "$BUILD/tcp_floor" ]; then
            run_one kernel-floor tcplat "$round" "$BUILD/tcp_floor" --sizes 8,1024 --iters 30000 \
                --json "$ROUNDS_DIR/kernel-floor-tcplat.r$round.json"
        fi
        run_one vmfabric tcplat "$round" env VMF_SHM=0 "$VMF" run -n 2 "$VMF" bench latency --sizes "$TSZ" \
            --iters 3000 --json "$ROUNDS_DIR/vmfabric-tcplat.r$round.json"
        run_one vmfabric tcpbw "$round" env VMF_SHM=0 "$VMF" run -n 2 "$VMF" bench bw --sizes "$TSZ" \
            --iters 500 --json "$ROUNDS_DIR/vmfabric-tcpbw.r$round.json"
        if command -v mpirun.openmpi >/dev/null 2>&1; then
            run_one openmpi tcplat "$round" mpirun.openmpi --allow-run-as-root --oversubscribe --mca pml ob1 \
                --mca btl tcp,self -n 2 "$BUILD/mpi_pingpong.openmpi" latency --sizes "$TSZ" --iters 3000 \
                --json "$ROUNDS_DIR/openmpi-tcplat.r$round.json" --label openmpi-tcp
            run_one openmpi tcpbw "$round" mpirun.openmpi --allow-run-as-root --oversubscribe --mca pml ob1 \
                --mca btl tcp,self -n 2 "$BUILD/mpi_pingpong.openmpi" bw --sizes "$TSZ" --iters 500 \
                --json "$ROUNDS_DIR/openmpi-tcpbw.r$round.json" --label openmpi-tcp
        fi
    done
    for b in tcplat tcpbw; do
        for impl in kernel-floor vmfabric openmpi; do
            ls "$ROUNDS_DIR/$impl-$b".r*.json >/dev/null 2>&1 && merge "$impl" "$b" "$RESULTS/$impl-$b.json"
        done
    done
    timeout 300 "$VMF" run --hosts 2 -n 2 "$VMF" bench latency --sizes "$TSZ" --iters 3000 \
        --json "$RESULTS/vmfabric-hosts-tcplat.json" || FAILURES+=("vmfabric hosts tcp latency")
    timeout 300 "$VMF" run --hosts 2 -n 2 "$VMF" bench bw --sizes "$TSZ" --iters 500 \
        --json "$RESULTS/vmfabric-hosts-tcpbw.json" || FAILURES+=("vmfabric hosts tcp bw")
    # The programs write "latency"/"bw": retag so these land in their own tables.
    for f in vmfabric-tcplat vmfabric-tcpbw vmfabric-hosts-tcplat vmfabric-hosts-tcpbw openmpi-tcplat openmpi-tcpbw; do
        [ -f "$RESULTS/$f.json" ] && "$PY" -c 'import json,sys; p=sys.argv[1]; d=json.load(open(p)); d["benchmark"]=sys.argv[2]; json.dump(d, open(p,"w"), indent=1)' \
            "$RESULTS/$f.json" "${f##*-}"
    done
    # 100 migrations (enough samples for a p99) under the three traffic shapes in turn.
    timeout 300 "$VMF" run --hosts 3 -n 4 "$VMF" bench migrate --migrations 100 --traffic mixed \
        --json "$RESULTS/migrate.json" || FAILURES+=("vmfabric migrate")
else
    log "hosts benchmarks skipped (BENCH_HOSTS=0 or not root)"
fi

# ---------------------------------------------------------------- report
CMP_RC=0
"$PY" bench/compare.py "$RESULTS" || CMP_RC=$?
[ "$RESULTS" = "$ROOT/bench/results" ] || [ "$RESULTS" = "bench/results" ] && "$PY" bench/publish.py || true
if [ "$CMP_RC" != 0 ]; then
    warn "compare.py failed (rc=$CMP_RC)"
fi

if [ "${#FAILED_ROUNDS[@]}" -gt 0 ]; then
    warn "${#FAILED_ROUNDS[@]} individual round(s) failed:"
    for f in "${FAILED_ROUNDS[@]}"; do warn "  - $f"; done
fi
if [ "${#FAILURES[@]}" -gt 0 ]; then
    warn "================================================================"
    warn "${#FAILURES[@]} benchmark run(s) FAILED or were unavailable:"
    for f in "${FAILURES[@]}"; do warn "  - $f"; done
    warn "their columns are missing from $RESULTS/summary.md (logs: $LOGS/)"
    warn "================================================================"
    if [ "${BENCH_STRICT:-0}" = 1 ]; then exit 1; fi
fi
exit "$CMP_RC"
