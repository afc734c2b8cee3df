#!/usr/bin/env python3
"""Turn the output of `python -m mpi4py.bench pingpong --no-header` (read on stdin) into the JSON of the
other benchmarks: {"benchmark": "mpi4py-pp", "results": [{"size": S, "latency_us": T, "mb_per_s": B}]}.
mpi4py reports, per size, the bandwidth and the mean time of one message (half a round trip)."""
import json
import sys

rows = []
for line in sys.stdin:
    # "         8              9.35 | 8.5557485e-07 ± 7.4794e-07    20000"
    left, sep, right = line.partition("|")
    if not sep:
        continue
    try:
        size, bw = (float(x) for x in left.split())
        mean = float(right.split()[0])
    except ValueError:
        continue
    rows.append({"size": int(size), "latency_us": round(mean * 1e6, 4), "mb_per_s": bw})
if not rows:
    sys.exit("mpi4py_pp.py: no result line in the benchmark's output")
with open(sys.argv[1], "w") as f:
    json.dump({"benchmark": "mpi4py-pp", "transport": "mpi", "results": rows}, f)
