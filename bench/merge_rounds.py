#!/usr/bin/env python3
"""Merge the per-round JSON files of one implementation/benchmark into one.

usage: python3 bench/merge_rounds.py OUT.json ROUND1.json [ROUND2.json ...]

bench/run.sh runs every benchmark BENCH_ROUNDS times, interleaved with the
other implementations, and keeps the BEST round per message size: the
lowest latency_us when the records have it (latency, cacheline), else the
highest mb_per_s.  This removes most of the run-to-run noise of a shared
2-vCPU machine (whose core placement can change in the middle of a run).

The output has the usual shape plus two extra top-level keys:
  "rounds": number of rounds merged,
  "rounds_<metric>": {"<size>": [value of each round, ...]}.
Unreadable inputs are skipped; exit 1 if none is usable.
"""

import json
import math
import sys


def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out_path, inputs = argv[1], argv[2:]
    docs = []
    for p in inputs:
        try:
            with open(p) as f:
                d = json.load(f)
            if isinstance(d, dict) and isinstance(d.get("results"), list):
                docs.append(d)
        except (OSError, ValueError) as e:
            print("merge_rounds.py: skipping %s: %s" % (p, e), file=sys.stderr)
    if not docs:
        print("merge_rounds.py: no usable input for %s" % out_path, file=sys.stderr)
        return 1

    has_lat = any(num(r.get("latency_us")) for d in docs for r in d["results"] if isinstance(r, dict))
    metric = "latency_us" if has_lat else "mb_per_s"
    better = (lambda a, b: a < b) if has_lat else (lambda a, b: a > b)

    best, seen, per_round = {}, [], {}
    for d in docs:
        for r in d["results"]:
            if not isinstance(r, dict) or not num(r.get("size")) or not num(r.get(metric)):
                continue
            s = r["size"]
            per_round.setdefault(s, []).append(r[metric])
            if s not in best:
                seen.append(s)
                best[s] = r
            elif better(r[metric], best[s][metric]):
                best[s] = r

    out = {"benchmark": docs[0].get("benchmark"),
           "transport": docs[0].get("transport"),
           "results": [best[s] for s in seen],
           "rounds": len(docs),
           "rounds_" + metric: {str(s): per_round[s] for s in seen}}
    with open(out_path, "w") as f:
        json.dump(out, f)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
