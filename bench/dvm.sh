#!/usr/bin/env bash
# bench/dvm.sh -- issue 27's side-by-side run: the distributed virtual machine against the same loops in C,
# and the page protocol's costs, in interleaved rounds.
#
# Per round, back to back (each DASS program runs as `vmfabric dvm run`, one page node and one or two
# compute nodes on this host; bench/c/dvm_native.c built with gcc -O2 is the native side):
#   - iteration: 004_*'s Listing 4.2 (examples/dvm/iteration, 10^6 iterations) / the C loop of Listing 4.3;
#   - volatile: the loop with the sum in the shared space (bench/dvm/volatile) / C's volatile sum;
#   - store N = 1, 16, 128 registers per str: 10 MiB to one address (bench/dvm/store.dass.in, Listing 4.4
#     without the competing node) / memcpy of 8N bytes, as often;
#   - push/pop of 1 and 128 registers: 1 MiB in 16 bursts of 64 KiB (bench/dvm/pushpop.dass.in, Figure
#     4.6) / one x86 push (pop) per loop iteration;
#   - page take: two nodes alternately increment a word (bench/dvm/pingpong), so every increment takes the
#     page from the other node: the median of every contended acquisition (`--stats`), in place (shared
#     memory) and on copies (--copy);
#   - page fetch: a reader takes 255 pages another node wrote, each a 64 KiB copy from its page node
#     (bench/dvm/fetch with --copy): the median fetch;
#   - the store test with competition (examples/dvm/store: Listings 4.4 and 4.5 together): bytes/us.
# The CPU-bound loops (iteration, volatile, store, push/pop) run 3 times each per round, alternating C and
# DVM, and the round keeps each side's best: this VM changes speed by 2-5x from one process to the next,
# and the best of 3 is the loop's own cost.
# Writes $BENCH_RESULTS_DIR/dvm.json: {"rounds": [{"dvm": {bench: value}, "native": {bench: value}}, ...]}
# (microseconds, except the medians in microseconds per page and store_compete in bytes/us).
# docs/benchmarks.md shows the medians of within-round ratios.
#
# Called by bench/run.sh (BENCH_DVM=0 skips it), or alone after a release build: bash bench/dvm.sh
# (BENCH_DVM_ROUNDS=R, default 5).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VMF="${BENCH_VMFABRIC:-target/release/vmfabric}"
OUT="${BENCH_RESULTS_DIR:-bench/results}"
PY="${BENCH_PYTHON:-python3}"
BUILD="${BENCH_BUILD_DIR:-bench/build}"
ROUNDS="${BENCH_DVM_ROUNDS:-5}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT" "$BUILD"
gcc -O2 -mno-red-zone -o "$BUILD/dvm_native" bench/c/dvm_native.c
one_node() { # DIR FILE: nodes.txt with one page node and one compute node running FILE
    printf '[pagenodes]\n1 127.0.0.1 0\n[computenodes]\n2 127.0.0.1 %s 0\n' "$2" > "$1/nodes.txt"
}
for n in 1 16 128; do
    mkdir -p "$TMP/store$n"
    sed -e "s/@N@/$n/g" -e "s/@COUNT@/$((1310720 / n))/g" bench/dvm/store.dass.in > "$TMP/store$n/store.dass"
    one_node "$TMP/store$n" store.dass
done
for n in 1 128; do
    mkdir -p "$TMP/pushpop$n"
    sed -e "s/@N@/$n/g" -e "s/@COUNT@/$((8192 / n))/g" bench/dvm/pushpop.dass.in > "$TMP/pushpop$n/pushpop.dass"
    one_node "$TMP/pushpop$n" pushpop.dass
done
dvm() { timeout 300 "$VMF" dvm run "$@"; }
# the value of `ID: VALUE` line K of a run's output
line() { sed -n "${1}p" | sed 's/^[0-9]*: //'; }
# the median of the take (or fetch) samples over every node's --stats line
stat_median() { grep -o "median $1 [0-9.]* us ([0-9]* samples)" | "$PY" -c '
import sys, re
xs = [(float(m.group(1)), int(m.group(2))) for m in (re.search(r"([0-9.]+) us \((\d+)", l) for l in sys.stdin) if m]
print(max(xs, key=lambda x: x[1])[0] if xs else "null")'; }
# the smallest of each column over lines of numbers
best() { "$PY" -c '
import sys
rows = [[float(x) for x in l.split()] for l in sys.stdin if l.strip()]
print(" ".join("%g" % min(c) for c in zip(*rows)) if rows else "")'; }
for r in $(seq 1 "$ROUNDS"); do
    f="$TMP/round$r.txt"
    : > "$f"
    for t in 1 2 3; do
        echo "iteration $("$BUILD/dvm_native" iteration)" >> "$TMP/n"
        echo "iteration $(dvm examples/dvm/iteration | line 2)" >> "$TMP/d"
        echo "volatile $("$BUILD/dvm_native" volatile)" >> "$TMP/n"
        echo "volatile $(dvm bench/dvm/volatile | line 1)" >> "$TMP/d"
        for n in 1 16 128; do
            echo "store$n $("$BUILD/dvm_native" memcpy $n)" >> "$TMP/n"
            echo "store$n $(dvm "$TMP/store$n" | line 1)" >> "$TMP/d"
        done
        echo "pushpop1 $("$BUILD/dvm_native" pushpop)" >> "$TMP/n"
        for n in 1 128; do
            o="$(dvm "$TMP/pushpop$n")"
            echo "pushpop$n $(echo "$o" | line 1) $(echo "$o" | line 2)" >> "$TMP/d"
        done
    done
    for side in n d; do
        name=$([ $side = n ] && echo native || echo dvm)
        for b in iteration volatile store1 store16 store128; do
            echo "$name $b $(grep "^$b " "$TMP/$side" | cut -d' ' -f2- | best)" >> "$f"
        done
        for n in 1 128; do
            grep -q "^pushpop$n " "$TMP/$side" || continue
            read -r push pop < <(grep "^pushpop$n " "$TMP/$side" | cut -d' ' -f2- | best)
            echo "$name push$n $push" >> "$f"; echo "$name pop$n $pop" >> "$f"
        done
    done
    rm -f "$TMP/n" "$TMP/d"
    echo "dvm take $(dvm --stats bench/dvm/pingpong 2>&1 >/dev/null | stat_median take)" >> "$f"
    echo "dvm take_copy $(dvm --stats --copy bench/dvm/pingpong 2>&1 >/dev/null | stat_median take)" >> "$f"
    echo "dvm fetch $(dvm --stats --copy bench/dvm/fetch 2>&1 >/dev/null | stat_median fetch)" >> "$f"
    echo "dvm store_compete $(dvm examples/dvm/store | line 1)" >> "$f"
    echo "bench/dvm.sh: round $r of $ROUNDS done" >&2
done
"$PY" - "$TMP" "$ROUNDS" "$OUT/dvm.json" <<'PYEOF'
import json, sys
tmp, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
R = []
for r in range(1, rounds + 1):
    d = {"dvm": {}, "native": {}}
    for l in open("%s/round%d.txt" % (tmp, r)):
        side, name, *v = l.split()
        try:
            d[side][name] = float(v[0])
        except (IndexError, ValueError):
            pass
    R.append(d)
json.dump({"rounds": R}, open(out, "w"), indent=1)
PYEOF
echo "bench/dvm.sh: wrote $OUT/dvm.json" >&2
