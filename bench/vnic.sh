#!/usr/bin/env bash
# bench/vnic.sh -- issue 26's side-by-side run: TCP over the virtual NIC (vmfabric vnic) against the kernel's
# veth, and Valiant load balancing against none, in interleaved rounds.
#
# Per round:
#   - iperf3 (TCP, one stream, BENCH_VNIC_SECONDS s) from node 0 to node 1 over `vmfabric vnic up --nodes 2`
#     and over a veth pair between two namespaces (vmfbench0/1, 10.78.0.1-2), at MTU 1500 and 65520
#     (the vnic with its default offload: TCP segments of up to 64 KiB cross the hardware, as over veth;
#     its default 8 buffers per link, and with --slots 1, 003_*'s one buffer per link, for reference);
#   - VLB: 4 nodes, MTU 1500 without offload (frames of MTU size, as 003_*'s sm_nic), one buffer per link
#     (--slots 1, 003_*'s hardware, where a busy buffer is what VLB evades), a slow receiver
#     (servicing a signal costs BENCH_VNIC_IRQ_NS ns, default 100000: the emulated interrupt cost, within the
#     response times up to 1 ms that 003_* section 2.6 cites under load; there the receiver's interrupts bound
#     the link, the case VLB is for), iperf3 from node 0 to node 3 with VLB off and on (--vlb-max-evade-ratio
#     8), and the performance values of each run (VLB_AveragePacketsPerIRQ at the receiver, indirect
#     packets); the same pair at 20 us per signal for reference (vlb20_*: there the eight daemon threads'
#     CPU on two vCPUs bounds the link, not the receiver);
#   - 003_*'s chapter-6 extensions, one at a time against the plain configuration (4 nodes, MTU 1500 without
#     offload, one buffer per link, iperf3 from node 0 to node 3): unidirectional status words (and the remote status reads they
#     remove), a 2x2 mesh with 2 us per extra hop (0 and 3 are diagonal), the link 0-3 broken with VLB, and
#     evade-to-a-free-slot against plain VLB with a slow receiver;
#   - the mphw transport under MPI: `vmfabric run -n 2 vmfabric bench latency` (8 bytes) and `bench bw`
#     (64 KiB) with VMF_TRANSPORT=mphw and with the default shared-memory transport, alternating.
# Writes $BENCH_RESULTS_DIR/vnic.json: {"rounds": [{"vnic_1500": Gbit/s, "veth_1500": .., "vnic_65520": ..,
# "veth_65520": .., "vnic1_1500": .., "vnic1_65520": .. (--slots 1), "vlb_off": .., "vlb_on": .., "vlb_off_ppi": .., "vlb_on_ppi": .., "vlb_on_indirect": ..,
# "vlb20_off": .., "vlb20_on": .., "vlb20_on_ppi": .., "irq_ns": ns,
# "mphw_lat8": us, "shm_lat8": us, "mphw_bw64k": MB/s, "shm_bw64k": MB/s}]}
#
# Called by bench/run.sh (BENCH_VNIC=0 skips it), or alone after a release build: bash bench/vnic.sh
# (BENCH_VNIC_ROUNDS=R, default 3). Needs root, /dev/net/tun and iperf3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VMF="${BENCH_VMFABRIC:-target/release/vmfabric}"
OUT="${BENCH_RESULTS_DIR:-bench/results}"
PY="${BENCH_PYTHON:-python3}"
ROUNDS="${BENCH_VNIC_ROUNDS:-3}"
SECS="${BENCH_VNIC_SECONDS:-4}"
IRQ_NS="${BENCH_VNIC_IRQ_NS:-100000}"
TMP="$(mktemp -d)"
mkdir -p "$OUT"
veth_down() { ip netns del vmfbench0 2>/dev/null || true; ip netns del vmfbench1 2>/dev/null || true; }
cleanup() { "$VMF" vnic down --quiet >/dev/null 2>&1 || true; veth_down; rm -rf "$TMP"; }
trap cleanup EXIT
if [ "$(id -u)" != 0 ] || [ ! -e /dev/net/tun ] || ! command -v iperf3 >/dev/null; then
    echo "vnic bench: skipped (needs root, /dev/net/tun and iperf3)"; echo '{"rounds": []}' > "$OUT/vnic.json"; exit 0
fi

veth_up() { # MTU
    veth_down
    ip netns add vmfbench0; ip netns add vmfbench1
    ip link add vmfb0 type veth peer name vmfb1
    ip link set vmfb0 netns vmfbench0; ip link set vmfb1 netns vmfbench1
    ip -n vmfbench0 addr add 10.78.0.1/24 dev vmfb0; ip -n vmfbench1 addr add 10.78.0.2/24 dev vmfb1
    ip -n vmfbench0 link set vmfb0 mtu "$1" up; ip -n vmfbench1 link set vmfb1 mtu "$1" up
    ip -n vmfbench0 link set lo up; ip -n vmfbench1 link set lo up
}

iperf() { # CLIENT-PREFIX SERVER-PREFIX ADDRESS -> Gbit/s (receiver side)
    local c="$1" s="$2" a="$3"
    $s iperf3 -s -1 -D -p 5201 >/dev/null
    sleep 0.3
    $c iperf3 -c "$a" -p 5201 -t "$SECS" -J > "$TMP/iperf.json"
    "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(round(d["end"]["sum_received"]["bits_per_second"]/1e9, 3))' "$TMP/iperf.json"
}

stat() { # NODE NAME
    "$VMF" vnic stats --json | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["nodes"][int(sys.argv[1])][sys.argv[2]])' "$1" "$2"
}

echo '[]' > "$TMP/rounds.json"
for r in $(seq 1 "$ROUNDS"); do
    declare -A R=()
    for mtu in 1500 65520; do
        # alternate which goes first
        for which in $( [ $((r % 2)) = 1 ] && echo "vnic veth vnic1" || echo "vnic1 veth vnic"); do
            if [ "$which" = vnic ]; then
                "$VMF" vnic up --nodes 2 --mtu "$mtu" >/dev/null
                R[vnic_$mtu]=$(iperf "$VMF vnic exec 0 --" "$VMF vnic exec 1 --" 10.77.0.2)
                "$VMF" vnic down --quiet
            elif [ "$which" = vnic1 ]; then
                "$VMF" vnic up --nodes 2 --mtu "$mtu" --slots 1 >/dev/null
                R[vnic1_$mtu]=$(iperf "$VMF vnic exec 0 --" "$VMF vnic exec 1 --" 10.77.0.2)
                "$VMF" vnic down --quiet
            else
                veth_up "$mtu"
                R[veth_$mtu]=$(iperf "ip netns exec vmfbench0" "ip netns exec vmfbench1" 10.78.0.2)
                veth_down
            fi
        done
    done
    R[irq_ns]=$IRQ_NS
    for cost in "$IRQ_NS" 20000; do
        key=vlb; [ "$cost" = "$IRQ_NS" ] || key=vlb20
        for vlb in $( [ $((r % 2)) = 1 ] && echo "off on" || echo "on off"); do
            opts=(--nodes 4 --mtu 1500 --no-offload --slots 1 --irq-cost-ns "$cost")
            [ "$vlb" = on ] && opts+=(--vlb --vlb-max-evade-ratio 8)
            "$VMF" vnic up "${opts[@]}" >/dev/null
            R[${key}_$vlb]=$(iperf "$VMF vnic exec 0 --" "$VMF vnic exec 3 --" 10.77.0.4)
            R[${key}_${vlb}_ppi]=$(stat 3 VLB_AveragePacketsPerIRQ)
            R[${key}_${vlb}_indirect]=$(stat 3 VLB_RX_Indirect)
            "$VMF" vnic down --quiet
        done
        [ "$IRQ_NS" = 20000 ] && break
    done
    ext() { # NAME OPTIONS... : iperf3 0 -> 3 and the counters that tell what changed
        local name=$1; shift
        "$VMF" vnic up --nodes 4 --mtu 1500 --no-offload --slots 1 "$@" >/dev/null
        R[ext_$name]=$(iperf "$VMF vnic exec 0 --" "$VMF vnic exec 3 --" 10.77.0.4)
        R[ext_${name}_remote_reads]=$(stat 0 RemoteStatusReads)
        R[ext_${name}_indirect]=$(stat 3 VLB_RX_Indirect)
        R[ext_${name}_ppi]=$(stat 3 VLB_AveragePacketsPerIRQ)
        "$VMF" vnic down --quiet
    }
    ext plain
    ext unidirectional --unidirectional
    ext mesh --topology mesh:2 --hop-cost-ns 2000
    ext broken --broken-links 0-3 --vlb
    ext vlb_slow --vlb --vlb-max-evade-ratio 8 --irq-cost-ns "$IRQ_NS"
    ext freeslot_slow --vlb --vlb-max-evade-ratio 8 --vlb-evade-free-slot --irq-cost-ns "$IRQ_NS"
    for t in $( [ $((r % 2)) = 1 ] && echo "mphw shm" || echo "shm mphw"); do
        tr=auto; [ "$t" = mphw ] && tr=mphw
        R[${t}_lat8]=$(VMF_TRANSPORT=$tr "$VMF" run -n 2 "$VMF" bench latency --sizes 8 --iters 20000 | awk '$1 == 8 {print $2}')
        R[${t}_bw64k]=$(VMF_TRANSPORT=$tr "$VMF" run -n 2 "$VMF" bench bw --sizes 64K | awk '$1 == 65536 {print $2}')
    done
    line=$(for k in "${!R[@]}"; do echo "$k=${R[$k]}"; done | sort | tr '\n' ' ')
    echo "vnic round $r: $line"
    "$PY" - "$TMP/rounds.json" $line <<'PYEOF'
import json, sys
p = sys.argv[1]; rounds = json.load(open(p))
rounds.append({k: float(v) for k, v in (a.split("=", 1) for a in sys.argv[2:])})
json.dump(rounds, open(p, "w"))
PYEOF
    unset R
done
"$PY" - "$TMP/rounds.json" "$OUT/vnic.json" <<'PYEOF'
import json, statistics, sys
rounds = json.load(open(sys.argv[1]))
json.dump({"rounds": rounds}, open(sys.argv[2], "w"), indent=1)
def med(f):
    v = [f(r) for r in rounds]
    return statistics.median(v) if v else float("nan")
print("vnic/veth at MTU 1500:  %.2fx (median of rounds; vnic %.2f, veth %.2f Gbit/s)" % (
    med(lambda r: r["vnic_1500"] / r["veth_1500"]), med(lambda r: r["vnic_1500"]), med(lambda r: r["veth_1500"])))
print("vnic/veth at MTU 65520: %.2fx (vnic %.2f, veth %.2f Gbit/s)" % (
    med(lambda r: r["vnic_65520"] / r["veth_65520"]), med(lambda r: r["vnic_65520"]), med(lambda r: r["veth_65520"])))
print("with one buffer per link (--slots 1): %.2fx / %.2fx of veth at MTU 1500 / 65520" % (
    med(lambda r: r["vnic1_1500"] / r["veth_1500"]), med(lambda r: r["vnic1_65520"] / r["veth_65520"])))
print("VLB on/off, slow receiver (%d us per signal): %.2fx (on %.3f, off %.3f Gbit/s); packets per IRQ at the receiver on %.2f, off %.2f" % (
    med(lambda r: r.get("irq_ns", 20000)) / 1000,
    med(lambda r: r["vlb_on"] / r["vlb_off"]), med(lambda r: r["vlb_on"]), med(lambda r: r["vlb_off"]),
    med(lambda r: r["vlb_on_ppi"]), med(lambda r: r["vlb_off_ppi"])))
if all("vlb20_on" in r for r in rounds):
    print("VLB on/off at 20 us per signal (the daemons' CPU bounds the link): %.2fx (on %.3f, off %.3f Gbit/s); packets per IRQ on %.2f" % (
        med(lambda r: r["vlb20_on"] / r["vlb20_off"]), med(lambda r: r["vlb20_on"]), med(lambda r: r["vlb20_off"]),
        med(lambda r: r["vlb20_on_ppi"])))
print("mphw transport under MPI: 8 B latency %.3f us (shm %.3f, %.2fx), 64 KiB bandwidth %.0f MB/s (shm %.0f, %.2fx)" % (
    med(lambda r: r["mphw_lat8"]), med(lambda r: r["shm_lat8"]), med(lambda r: r["mphw_lat8"] / r["shm_lat8"]),
    med(lambda r: r["mphw_bw64k"]), med(lambda r: r["shm_bw64k"]), med(lambda r: r["mphw_bw64k"] / r["shm_bw64k"])))
PYEOF
