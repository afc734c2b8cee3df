#!/usr/bin/env bash
# bench/large.sh -- issue 28's side-by-side run: large-message ping-pong and TCP, in interleaved rounds.
#
# Per round, back to back:
#   - the C ping-pong (bench/c/mpi_pingpong.c, latency mode: half round trip; ping-pong bandwidth = size /
#     half round trip) at 16 KiB .. 4 MiB: the MPICH-built binary over vmfabric's libmpich.so.12 with this
#     host's calibration, the same with VMF_CALIBRATION=off (the built-in defaults), MPICH, Open MPI;
#   - TCP on one host: bare sockets (bench/c/tcp_floor.c: busy-recv ping-pong, and --bw spin: the
#     kernel's bandwidth ceiling, nonblocking send and recv retried at once), vmfabric with VMF_SHM=0, Open MPI's tcp BTL (pml ob1, btl tcp,self):
#     8-byte latency and windowed bandwidth at 1 MiB;
#   - TCP between 2 emulated hosts (network namespaces, root only): vmfabric and Open MPI's tcp BTL, same two
#     figures (the two alternate which runs first).
# Writes $BENCH_RESULTS_DIR/large.json: {"rounds": [{"pingpong": {impl: {size: us}}, "tcp": {...}}, ...],
# "calibration": the cache in use}. docs/benchmarks.md shows the medians of within-round ratios.
#
# Called by bench/run.sh (BENCH_LARGE=0 skips it), or alone after a release build: bash bench/large.sh
# (BENCH_LARGE_ROUNDS=R, default 5).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VMF="${BENCH_VMFABRIC:-target/release/vmfabric}"
OUT="${BENCH_RESULTS_DIR:-bench/results}"
PY="${BENCH_PYTHON:-python3}"
BUILD="${BENCH_BUILD_DIR:-bench/build}"
ROUNDS="${BENCH_LARGE_ROUNDS:-5}"
LIB="$ROOT/target/release/lib"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT" "$BUILD"
SZ=16384,65536,262144,1048576,4194304
HAVE_M=0; HAVE_O=0
command -v mpicc.mpich >/dev/null && mpicc.mpich -O2 -o "$BUILD/mpi_pingpong.mpich" bench/c/mpi_pingpong.c && HAVE_M=1
command -v mpicc.openmpi >/dev/null && mpicc.openmpi -O2 -o "$BUILD/mpi_pingpong.openmpi" bench/c/mpi_pingpong.c && HAVE_O=1
gcc -O2 -o "$BUILD/tcp_floor" bench/c/tcp_floor.c
[ "$HAVE_M" = 1 ] || { echo "bench/large.sh: needs mpicc.mpich (the ping-pong binary vmfabric runs)" >&2; exit 1; }
# Make sure this host is calibrated before the first round (vmfabric run would do it too).
"$VMF" info >/dev/null
OMPI=(timeout 600 mpirun.openmpi --allow-run-as-root --oversubscribe)
OTCP=("${OMPI[@]}" --mca pml ob1 --mca btl tcp,self)
# Open MPI between 2 emulated hosts (root only): the topology `vmfabric run --hosts 2` builds (a namespace per
# host, 198.18.0.{1,2}/24 on veths into a bridge in a switch namespace, MTU 65535), built here once for all
# rounds. mpirun runs in the switch namespace with the bridge at 198.18.0.254; each rank is moved into its
# host's namespace by a wrapper before exec, and reaches mpirun's PMIx server over the bridge (PMIx 4 has
# only the TCP rendezvous, so the loopback it would use otherwise is not shared across namespaces). The tcp
# BTL is limited to the hosts' subnet: every MPI byte crosses the two veths and the bridge.
OHOSTS=0
OHNS="vmfbo$$-"
ohosts_cleanup() {
    for n in h0 h1 sw; do ip netns del "$OHNS$n" 2>/dev/null || true; done
}
if [ "$(id -u)" = 0 ] && [ "$HAVE_O" = 1 ]; then
    trap 'ohosts_cleanup; rm -rf "$TMP"' EXIT
    if ip netns add "${OHNS}sw" && ip -n "${OHNS}sw" link add br0 type bridge \
        && ip -n "${OHNS}sw" link set br0 up && ip -n "${OHNS}sw" link set lo up \
        && ip -n "${OHNS}sw" addr add 198.18.0.254/24 dev br0; then
        OHOSTS=1
        for i in 0 1; do
            { ip netns add "${OHNS}h$i" \
                && ip link add "vb$$h$i" mtu 65535 type veth peer name "vb$$s$i" mtu 65535 \
                && ip link set "vb$$h$i" netns "${OHNS}h$i" && ip link set "vb$$s$i" netns "${OHNS}sw" \
                && ip -n "${OHNS}sw" link set "vb$$s$i" master br0 && ip -n "${OHNS}sw" link set "vb$$s$i" up \
                && ip -n "${OHNS}h$i" addr add "198.18.0.$((i + 1))/24" dev "vb$$h$i" \
                && ip -n "${OHNS}h$i" link set "vb$$h$i" up && ip -n "${OHNS}h$i" link set lo up; } || OHOSTS=0
        done
    fi
    [ "$OHOSTS" = 1 ] || echo "bench/large.sh: cannot build the emulated hosts for Open MPI; skipping that column" >&2
    printf '#!/bin/sh\nexec ip netns exec "%sh${OMPI_COMM_WORLD_RANK}" "$@"\n' "$OHNS" >"$TMP/onhost.sh"
    chmod +x "$TMP/onhost.sh"
fi
OHOSTRUN=(timeout 600 ip netns exec "${OHNS}sw" env PMIX_MCA_ptl_tcp_if_include=198.18.0.0/24
    PMIX_MCA_ptl_tcp_remote_connections=1 mpirun.openmpi --allow-run-as-root --oversubscribe
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 198.18.0.0/24 --mca oob_tcp_if_include 198.18.0.0/24
    -x PMIX_MCA_ptl_tcp_if_include -x PMIX_MCA_ptl_tcp_remote_connections -n 2 "$TMP/onhost.sh")
for r in $(seq 1 "$ROUNDS"); do
    d="$TMP/r$r"; mkdir -p "$d"
    timeout 600 env LD_LIBRARY_PATH="$LIB" "$VMF" run --quiet -n 2 "$BUILD/mpi_pingpong.mpich" latency --sizes $SZ \
        --iters 3000 --json "$d/pp-vmfabric-mpi.json" --label vmfabric-mpi >/dev/null
    timeout 600 env VMF_CALIBRATION=off LD_LIBRARY_PATH="$LIB" "$VMF" run --quiet -n 2 "$BUILD/mpi_pingpong.mpich" latency \
        --sizes $SZ --iters 3000 --json "$d/pp-vmfabric-mpi-defaults.json" --label vmfabric-mpi-defaults >/dev/null
    timeout 600 env -u LD_LIBRARY_PATH mpiexec.mpich -n 2 "$BUILD/mpi_pingpong.mpich" latency --sizes $SZ --iters 3000 \
        --json "$d/pp-mpich.json" --label mpich >/dev/null || echo "bench/large.sh: MPICH ping-pong failed" >&2
    if [ "$HAVE_O" = 1 ]; then
        "${OMPI[@]}" -n 2 "$BUILD/mpi_pingpong.openmpi" latency --sizes $SZ --iters 3000 --json "$d/pp-openmpi.json" \
            --label openmpi >/dev/null 2>&1 || echo "bench/large.sh: Open MPI ping-pong failed" >&2
    fi
    # TCP on one host. Latency runs of 30000 round trips (about 0.3 s; 5000 before, 45 ms: this machine's
    # speed flips between states for seconds at a time, and such short runs drew single samples of it).
    # Bandwidth: both ping-pong programs scale --iters 2000 at 1 MiB to 20 windows of 64 messages (1.25 GiB);
    # the bare sockets stream 2000 MiB. The three implementations take turns being first (the first after
    # the ping-pongs runs on a machine still settling).
    tcp_floor_run() {
        "$BUILD/tcp_floor" --sizes 8 --iters 60000 --json "$d/tcplat-kernel-floor.json" >/dev/null
        "$BUILD/tcp_floor" --bw spin --sizes 1048576 --iters 2000 --json "$d/tcpbw-kernel-floor.json" >/dev/null
    }
    tcp_vmfabric_run() {
        VMF_SHM=0 timeout 600 "$VMF" run --quiet -n 2 "$VMF" bench latency --sizes 8 --iters 30000 \
            --json "$d/tcplat-vmfabric.json" >/dev/null
        VMF_SHM=0 timeout 600 "$VMF" run --quiet -n 2 "$VMF" bench bw --sizes 1048576 --iters 2000 \
            --json "$d/tcpbw-vmfabric.json" >/dev/null
    }
    tcp_openmpi_run() {
        [ "$HAVE_O" = 1 ] || return 0
        "${OTCP[@]}" -n 2 "$BUILD/mpi_pingpong.openmpi" latency --sizes 8 --iters 30000 \
            --json "$d/tcplat-openmpi.json" --label openmpi-tcp >/dev/null 2>&1 || echo "bench/large.sh: Open MPI tcp latency failed" >&2
        "${OTCP[@]}" -n 2 "$BUILD/mpi_pingpong.openmpi" bw --sizes 1048576 --iters 2000 \
            --json "$d/tcpbw-openmpi.json" --label openmpi-tcp >/dev/null 2>&1 || echo "bench/large.sh: Open MPI tcp bw failed" >&2
    }
    case $((r % 3)) in
        1) tcp_vmfabric_run; tcp_openmpi_run; tcp_floor_run ;;
        2) tcp_openmpi_run; tcp_floor_run; tcp_vmfabric_run ;;
        0) tcp_floor_run; tcp_vmfabric_run; tcp_openmpi_run ;;
    esac
    hosts_vmfabric_run() {
        [ "$(id -u)" = 0 ] || return 0
        timeout 300 "$VMF" run --quiet --hosts 2 -n 2 "$VMF" bench latency --sizes 8 --iters 30000 \
            --json "$d/tcplat-vmfabric-hosts.json" >/dev/null || echo "bench/large.sh: emulated hosts latency failed" >&2
        timeout 300 "$VMF" run --quiet --hosts 2 -n 2 "$VMF" bench bw --sizes 1048576 --iters 2000 \
            --json "$d/tcpbw-vmfabric-hosts.json" >/dev/null || echo "bench/large.sh: emulated hosts bw failed" >&2
    }
    hosts_openmpi_run() {
        [ "$OHOSTS" = 1 ] || return 0
        "${OHOSTRUN[@]}" "$BUILD/mpi_pingpong.openmpi" latency --sizes 8 --iters 30000 --json "$d/tcplat-openmpi-hosts.json" \
            --label openmpi-tcp-hosts >/dev/null 2>&1 || echo "bench/large.sh: Open MPI emulated hosts latency failed" >&2
        "${OHOSTRUN[@]}" "$BUILD/mpi_pingpong.openmpi" bw --sizes 1048576 --iters 2000 --json "$d/tcpbw-openmpi-hosts.json" \
            --label openmpi-tcp-hosts >/dev/null 2>&1 || echo "bench/large.sh: Open MPI emulated hosts bw failed" >&2
    }
    if [ $((r % 2)) = 1 ]; then hosts_vmfabric_run; hosts_openmpi_run; else hosts_openmpi_run; hosts_vmfabric_run; fi
    echo "bench/large.sh: round $r of $ROUNDS done"
done
CAL="$(VMF_VERBOSE=0 "$VMF" info | sed -n 's/^ *calibrated (\(.*\)): .*/\1/p')"
"$PY" - "$TMP" "$OUT" "$ROUNDS" "$CAL" <<'PYEOF'
import glob, json, os, sys
tmp, out, rounds, cal = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
res = {"benchmark": "large", "rounds": []}
for r in range(1, rounds + 1):
    d = os.path.join(tmp, "r%d" % r)
    rnd = {"pingpong": {}, "tcplat": {}, "tcpbw": {}}
    for f in sorted(glob.glob(os.path.join(d, "*.json"))):
        kind, impl = os.path.basename(f)[:-5].split("-", 1)
        key = "latency_us" if kind in ("pp", "tcplat") else "mb_per_s"
        vals = {str(x["size"]): x[key] for x in json.load(open(f))["results"]}
        rnd["pingpong" if kind == "pp" else kind][impl] = vals
    res["rounds"].append(rnd)
if cal and os.path.exists(cal):
    res["calibration"] = json.load(open(cal))
json.dump(res, open(os.path.join(out, "large.json"), "w"), indent=1)
print("bench/large.sh: %d rounds in %s/large.json" % (rounds, out))
PYEOF
