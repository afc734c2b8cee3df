#!/usr/bin/env bash
# bench/vm.sh -- issue 24's side-by-side run: ranks in two QEMU guests (`vmfabric vm`), over their shared
# ivshmem region against TCP between the same guests, beside two processes on the host; and the failover
# pause when a guest's ivshmem device is unplugged and plugged back under traffic.
#
# Per round (BENCH_VM_ROUNDS, default 3), interleaved:
#   - `vmfabric vm run -n 2 vmfabric bench latency --sizes 8` and `bench bw --sizes 4M`: one rank per guest,
#     over ivshmem, then over TCP (VMF_SHM=0) between the same guests;
#   - the same two benchmarks between two processes on the host (`vmfabric run -n 2`), for reference;
#   - `bench wakeup` (a rank asleep in a blocking receive, woken by its peer after 2 and 20 ms) between
#     the guests, woken through the ivshmem doorbell, and between two host processes (futex);
#   - issue 26's emulated hardware (VMF_TRANSPORT=mphw) in the guests' shared BAR: 8-byte latency and the
#     wake-up after 20 ms, its sleeping node rung through the doorbell (mphw_lat8, mphw_wake20_us/_cpu);
#   - Open MPI's TCP between the same guests (bench/c/mpi_pingpong.c built with mpicc.openmpi; mpirun in
#     vm0 reaches vm1 through `vmfabric vm rsh` as its plm_rsh_agent).
# Then BENCH_VM_CYCLES (default 10) unplug/plug cycles of vm0 while 4 ranks (2 per guest) run
# mpi/tests/migstress.c (every message checked), and as many with 2 ranks (one per guest, so no two ranks
# share a vCPU): per cycle the time the ranks of vm0 took to move off the region and back (each rank's
# switch, from the request until every peer answered, and its phases).
# Writes $BENCH_RESULTS_DIR/vm.json: {"accel": "tcg"|"kvm", "accel_why": .., "boot_s": [..],
# "rounds": [{"ivshmem_lat8": us, "tcp_lat8": us, "host_lat8": us, "ivshmem_bw4m": MB/s, "tcp_bw4m": ..,
# "host_bw4m": .., "ompi_tcp_lat8": .., "ompi_tcp_bw4m": .., "ivshmem_wake2_us": .., "ivshmem_wake2_cpu": ..,
# "host_wake2_us": .., (and _wake20_)}], "failover": {"ranks": 4, "leave_ms": [..], "join_ms": [..], "rank_ms": [..], "phases_ms": {"settle": [..], ..},
# "device_del_ms": [..], "migstress": "PASS ..."}, "failover_one_per_guest": {the same with 2 ranks}}.
#
# Called by bench/run.sh (BENCH_VM=0 skips it), or alone after a release build: bash bench/vm.sh.
# Needs root, qemu-system-x86_64, a guest kernel (linux-image-amd64) and busybox-static (`make deps`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VMF="$(realpath "${BENCH_VMFABRIC:-target/release/vmfabric}")"
OUT="$(realpath -m "${BENCH_RESULTS_DIR:-bench/results}")"
PY="${BENCH_PYTHON:-python3}"
ROUNDS="${BENCH_VM_ROUNDS:-3}"
CYCLES="${BENCH_VM_CYCLES:-10}"
LIB="$(dirname "$VMF")/lib"
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TMP="$(mktemp -d /tmp/vmf-vm-bench.XXXXXX)"
mkdir -p "$OUT"
cleanup() { "$VMF" vm down >/dev/null 2>&1 || true; rm -rf "$TMP"; }
trap cleanup EXIT
if [ "$(id -u)" != 0 ] || ! command -v qemu-system-x86_64 >/dev/null || ! command -v mpicc.mpich >/dev/null; then
    echo "vm bench: skipped (needs root, qemu-system-x86_64 and mpicc.mpich)"
    echo '{"rounds": []}' > "$OUT/vm.json"; exit 0
fi
mpicc.mpich -O2 -o "$TMP/migstress" mpi/tests/migstress.c
# Open MPI's TCP between the same guests: mpirun in vm0 starts its daemons in both through `vmfabric vm rsh`.
OMPI=0
if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null \
    && mpicc.openmpi -O2 -o "$TMP/pp.ompi" bench/c/mpi_pingpong.c; then
    OMPI=1
    cat > "$TMP/ompi.sh" <<'SHEOF'
#!/bin/sh
unset PMI_PORT PMI_ID PMI_RANK PMI_SIZE PMI_JOBID
export LD_LIBRARY_PATH=
# The guests see the host's /tmp over 9p, where Open MPI cannot make its session FIFOs and PMIx segments:
# its session directory goes to the guests' own tmpfs.
export TMPDIR=/dev/shm
exec mpirun.openmpi --allow-run-as-root --host 10.79.0.10,10.79.0.11 -np 2 \
  --mca orte_tmpdir_base /dev/shm \
  --mca plm_rsh_agent "vmfabric vm rsh" --mca pml ob1 --mca btl tcp,self \
  --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "$@"
SHEOF
    chmod +x "$TMP/ompi.sh"
fi
"$VMF" vm down >/dev/null 2>&1 || true
"$VMF" vm up --vms 2 --doorbell > "$TMP/up.txt"
"$VMF" vm ls --json > "$TMP/ls.json"
cd "$TMP"
one() { # one <out.json> <launcher...> -- runs a bench with --json
    local out=$1; shift
    "$@" --json "$out" >/dev/null 2>"$out.err" || { cat "$out.err" >&2; return 1; }
}
for r in $(seq 1 "$ROUNDS"); do
    echo "vm bench: round $r/$ROUNDS"
    one "r$r-ivl.json" "$VMF" vm run -n 2 --quiet vmfabric bench latency --sizes 8 --iters 20000
    one "r$r-tcl.json" env VMF_SHM=0 "$VMF" vm run -n 2 --quiet vmfabric bench latency --sizes 8 --iters 2000
    one "r$r-hol.json" "$VMF" run --quiet -n 2 "$VMF" bench latency --sizes 8 --iters 20000
    one "r$r-ivb.json" "$VMF" vm run -n 2 --quiet vmfabric bench bw --sizes 4M --window 8 --iters 20
    one "r$r-tcb.json" env VMF_SHM=0 "$VMF" vm run -n 2 --quiet vmfabric bench bw --sizes 4M --window 8 --iters 10
    one "r$r-hob.json" "$VMF" run --quiet -n 2 "$VMF" bench bw --sizes 4M --window 8 --iters 50
    # Issue 26's emulated hardware in the guests' shared BAR, its nodes signalled through the doorbell.
    one "r$r-mpl.json" env VMF_TRANSPORT=mphw "$VMF" vm run -n 2 --quiet vmfabric bench latency --sizes 8 --iters 20000
    one "r$r-mpw20.json" env VMF_TRANSPORT=mphw "$VMF" vm run -n 2 --quiet vmfabric bench wakeup --iters 60 --gap-ms 20
    for gap in 2 20; do
        one "r$r-ivw$gap.json" "$VMF" vm run -n 2 --quiet vmfabric bench wakeup --iters 60 --gap-ms $gap
        one "r$r-how$gap.json" "$VMF" run --quiet -n 2 "$VMF" bench wakeup --iters 60 --gap-ms $gap
    done
    if [ "$OMPI" = 1 ]; then
        one "r$r-oml.json" "$VMF" vm run -n 1 --quiet ./ompi.sh ./pp.ompi latency --sizes 8 --iters 2000
        one "r$r-omb.json" "$VMF" vm run -n 1 --quiet ./ompi.sh ./pp.ompi bw --sizes 4194304 --window 8 --iters 10
    fi
done
cycles() { # cycles <ranks> <suffix>: CYCLES unplug/plug cycles of vm0 while <ranks> ranks run migstress
    echo "vm bench: $CYCLES unplug/plug cycles under migstress, $1 ranks"
    rm -f stop
    "$VMF" vm run -n "$1" --ranks-per-vm $(($1 / 2)) --quiet "$TMP/migstress" "$TMP/stop" 900 no-rma > "migstress$2.out" 2>&1 &
    MS=$!
    sleep 3
    : > "cycles$2.txt"
    for c in $(seq 1 "$CYCLES"); do
        "$VMF" vm unplug vm0 >> "cycles$2.txt"
        "$VMF" vm plug vm0 >> "cycles$2.txt"
    done
    touch stop
    wait $MS || { cat "migstress$2.out" >&2; echo "vm bench: migstress ($1 ranks) failed" >&2; exit 1; }
}
# 2 ranks per guest (the ranks of a guest share its one vCPU), then one rank per guest.
cycles 4 ""
cycles 2 "-1"
"$PY" - "$ROUNDS" "$OUT/vm.json" <<'PYEOF'
import json, re, sys
rounds, out = int(sys.argv[1]), sys.argv[2]
def first(path, key):
    return json.load(open(path))["results"][0][key]
R = []
for r in range(1, rounds + 1):
    R.append({
        "ivshmem_lat8": first("r%d-ivl.json" % r, "latency_us"),
        "tcp_lat8": first("r%d-tcl.json" % r, "latency_us"),
        "host_lat8": first("r%d-hol.json" % r, "latency_us"),
        "ivshmem_bw4m": first("r%d-ivb.json" % r, "mb_per_s"),
        "tcp_bw4m": first("r%d-tcb.json" % r, "mb_per_s"),
        "host_bw4m": first("r%d-hob.json" % r, "mb_per_s"),
        "mphw_lat8": first("r%d-mpl.json" % r, "latency_us"),
        "mphw_wake20_us": first("r%d-mpw20.json" % r, "latency_us"),
        "mphw_wake20_cpu": json.load(open("r%d-mpw20.json" % r))["cpu_fraction"],
    })
    for gap in (2, 20):
        for k, f in (("ivshmem", "ivw"), ("host", "how")):
            w = json.load(open("r%d-%s%d.json" % (r, f, gap)))
            R[-1]["%s_wake%d_us" % (k, gap)] = w["results"][0]["latency_us"]
            R[-1]["%s_wake%d_cpu" % (k, gap)] = w["cpu_fraction"]
    try:
        R[-1]["ompi_tcp_lat8"] = first("r%d-oml.json" % r, "latency_us")
        R[-1]["ompi_tcp_bw4m"] = first("r%d-omb.json" % r, "mb_per_s")
    except (OSError, KeyError, IndexError):
        pass
ls = json.load(open("ls.json"))
up = open("up.txt").read()
m = re.search(r"\((tcg|kvm): (.*)\), booted in", up)
def failover(sfx, ranks):
    cyc = open("cycles%s.txt" % sfx).read()
    ms = open("migstress%s.out" % sfx).read().strip().splitlines()
    phases = {}
    for m in re.finditer(r"ok [0-9.]+ ms \(([^)]*)\)", cyc):
        for name, v in re.findall(r"([a-z]+) ([0-9.]+)", m.group(1)):
            phases.setdefault(name, []).append(float(v))
    return {"ranks": ranks,
            "leave_ms": [float(x) for x in re.findall(r"ranks off the region in ([0-9.]+) ms", cyc)],
            "join_ms": [float(x) for x in re.findall(r"ranks back on the region in ([0-9.]+) ms", cyc)],
            "rank_ms": [float(x) for x in re.findall(r"ok ([0-9.]+) ms", cyc)],
            "phases_ms": phases,
            "device_del_ms": [float(x) for x in re.findall(r"device removed after ([0-9.]+) ms", cyc)],
            "migstress": next((l for l in ms if "PASS" in l), "FAIL")}
json.dump({
    "accel": m.group(1) if m else "?", "accel_why": m.group(2) if m else "",
    "boot_s": [g["boot_s"] for g in ls["guests"]],
    "rounds": R,
    "failover": failover("", 4),
    "failover_one_per_guest": failover("-1", 2),
}, open(out, "w"), indent=1)
print("vm bench: wrote", out)
PYEOF
