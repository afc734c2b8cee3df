#!/usr/bin/env python3
"""bench/overcommit_plot.py -- tables, target checks and plots for the
overcommit sweep (bench/overcommit.sh).

    python3 bench/overcommit_plot.py [RESULTS_DIR]     (default bench/results)

Reads RESULTS_DIR/overcommit/*.json (and status.tsv for runs that timed out or
failed), writes RESULTS_DIR/overcommit.md, RESULTS_DIR/overcommit_wall.png and
RESULTS_DIR/overcommit_cpu.png, and prints the markdown. Missing files are
shown as "--"; matplotlib missing only skips the plots.
"""
import csv
import glob
import json
import os
import sys

ROWS = [
    ("vmfabric", "spin"),
    ("vmfabric", "yield"),
    ("vmfabric", "block"),
    ("vmfabric", "adaptive"),
    ("mpich", "default"),
    ("openmpi", "default"),
    ("openmpi", "yield_when_idle"),
]
PATTERNS = ["ring", "alltoall"]
KS = [2, 4, 8]
FIXED = ["spin", "yield", "block"]


def load(d):
    runs = {}
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        try:
            with open(path) as f:
                j = json.load(f)
            key = (j["implementation"], j["wait"], j["pattern"], int(j["ranks"]), bool(j.get("noise", False)))
            rounds = float(j["rounds"])
            runs[key] = {
                "us": float(j["us_per_round"]),
                "cpu_us": float(j["cpu_s"]) * 1e6 / rounds,
                "rounds": int(rounds),
                "wall_s": float(j["wall_s"]),
                "cpu_s": float(j["cpu_s"]),
            }
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"overcommit_plot: skipping {path}: {e}", file=sys.stderr)
    status = {}
    try:
        with open(os.path.join(d, "status.tsv")) as f:
            for r in csv.DictReader(f, delimiter="\t"):
                try:
                    key = (r["implementation"], r["wait"], r["pattern"], int(r["ranks"]), r["noise"] == "1")
                    status[key] = (r["status"], int(r["rounds"]))
                except (KeyError, ValueError):
                    pass
    except OSError:
        pass
    return runs, status


def fmt(v):
    if v is None:
        return "--"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def cell(runs, status, key, field):
    r = runs.get(key)
    if r is not None:
        return fmt(r[field])
    st = status.get(key)
    if st and st[0] != "ok":
        return st[0]
    return "--"


def timeout_floor(status, key):
    """Lower bound on us/round for a run that timed out, else None."""
    st = status.get(key)
    if st and st[0].startswith("timeout-"):
        try:
            secs = float(st[0][len("timeout-"):].rstrip("s"))
            return secs * 1e6 / st[1]
        except ValueError:
            return None
    return None


def table(runs, status, pat, noise=False):
    out = [f"### {pat}" + (" (with a CPU-burner process)" if noise else ""), ""]
    head = ["implementation / wait"]
    for k in KS:
        head += [f"K={k} us/round", f"K={k} CPU us/round"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for impl, wait in ROWS:
        keys = [(impl, wait, pat, k, noise) for k in KS]
        if not any(k in runs or k in status for k in keys):
            continue
        row = [f"{impl} / {wait}"]
        for key in keys:
            row += [cell(runs, status, key, "us"), cell(runs, status, key, "cpu_us")]
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    return out


def checks(runs, status):
    out = ["## Target checks (wall time per round)", ""]
    out.append("| pattern | K | check | value | result |")
    out.append("|---|---|---|---|---|")
    n_pass = n_miss = 0
    for pat in PATTERNS:
        for k in (4, 8):
            a = runs.get(("vmfabric", "adaptive", pat, k, False))
            # adaptive >= 3x faster than spin
            sk = ("vmfabric", "spin", pat, k, False)
            s = runs.get(sk)
            if a is None:
                res, val = "n/a", "adaptive missing"
            elif s is not None:
                ratio = s["us"] / a["us"]
                val = f"spin {fmt(s['us'])} / adaptive {fmt(a['us'])} = {ratio:.1f}x"
                res = "PASS" if ratio >= 3 else "MISS"
            elif timeout_floor(status, sk):
                ratio = timeout_floor(status, sk) / a["us"]
                val = f"spin timed out (> {fmt(timeout_floor(status, sk))}) / adaptive {fmt(a['us'])} > {ratio:.1f}x"
                res = "PASS" if ratio >= 3 else "n/a"
            else:
                res, val = "n/a", "spin missing"
            n_pass += res == "PASS"
            n_miss += res == "MISS"
            out.append(f"| {pat} | {k} | adaptive >= 3x faster than spin | {val} | {res} |")
            # adaptive within 1.2x of the best fixed policy
            fixed = {w: runs[("vmfabric", w, pat, k, False)]["us"]
                     for w in FIXED if ("vmfabric", w, pat, k, False) in runs}
            if a is None or not fixed:
                res, val = "n/a", "adaptive or all fixed policies missing"
            else:
                bw = min(fixed, key=fixed.get)
                ratio = a["us"] / fixed[bw]
                val = f"adaptive {fmt(a['us'])} / best fixed ({bw}) {fmt(fixed[bw])} = {ratio:.2f}x"
                res = "PASS" if ratio <= 1.2 else "MISS"
            n_pass += res == "PASS"
            n_miss += res == "MISS"
            out.append(f"| {pat} | {k} | adaptive within 1.2x of best fixed policy | {val} | {res} |")
            # informational: adaptive vs the best MPI
            mpi = {f"{i}/{w}": runs[(i, w, pat, k, False)]["us"]
                   for i, w in ROWS if i != "vmfabric" and (i, w, pat, k, False) in runs}
            if a is None or not mpi:
                val = "adaptive or all MPI runs missing"
            else:
                bm = min(mpi, key=mpi.get)
                val = f"adaptive {fmt(a['us'])} / best MPI ({bm}) {fmt(mpi[bm])} = {a['us'] / mpi[bm]:.2f}x"
            out.append(f"| {pat} | {k} | adaptive vs best of MPICH / Open MPI (info) | {val} | -- |")
    out.append("")
    out.append(f"{n_pass} PASS, {n_miss} MISS (in the '(info)' rows a ratio < 1 means vmfabric adaptive is faster than the best MPI).")
    out.append("")
    return out


def noise_section(runs, status):
    keys = sorted(k for k in set(runs) | set(status) if k[4])
    if not keys:
        return []
    out = ["## With noise (`--noise`: a CPU-burner process during the run)", ""]
    out.append("| implementation / wait | pattern | K | us/round | CPU us/round |")
    out.append("|---|---|---|---|---|")
    for key in keys:
        impl, wait, pat, k, _ = key
        out.append(f"| {impl} / {wait} | {pat} | {k} | {cell(runs, status, key, 'us')} | "
                   f"{cell(runs, status, key, 'cpu_us')} |")
    out.append("")
    return out


def plots(runs, res_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("overcommit_plot: matplotlib unavailable: plots skipped", file=sys.stderr)
        return
    for field, fname, ylabel in (("us", "overcommit_wall.png", "wall time per round (us)"),
                                 ("cpu_us", "overcommit_cpu.png", "CPU time per round, all ranks (us)")):
        fig, axes = plt.subplots(1, len(PATTERNS), figsize=(12, 4.8))
        for ax, pat in zip(axes, PATTERNS):
            for impl, wait in ROWS:
                xs = [k for k in KS if (impl, wait, pat, k, False) in runs]
                if not xs:
                    continue
                ys = [runs[(impl, wait, pat, k, False)][field] for k in xs]
                style = "-" if impl == "vmfabric" else "--"
                ax.plot(xs, ys, style, marker="o", label=f"{impl} / {wait}")
            ax.set_yscale("log")
            ax.set_xscale("log", base=2)
            ax.set_xticks(KS)
            ax.set_xticklabels([str(k) for k in KS])
            ax.set_xlabel("ranks K on 2 cores")
            ax.set_ylabel(ylabel)
            ax.set_title(pat)
            ax.grid(True, which="both", alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        if not handles:
            handles, labels = axes[-1].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
        fig.suptitle(f"overcommit: {ylabel} (log scale; lower is better)")
        fig.tight_layout(rect=(0, 0.1, 1, 0.95))
        path = os.path.join(res_dir, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"overcommit_plot: wrote {path}", file=sys.stderr)


def main():
    res_dir = sys.argv[1] if len(sys.argv) > 1 else "bench/results"
    runs, status = load(os.path.join(res_dir, "overcommit"))
    md = ["# Overcommit: K ranks on this host's CPUs", ""]
    md.append(f"{os.cpu_count()} CPUs. us/round = wall time of rank 0 between two barriers / rounds "
              "(ring: one lap of the token; alltoall: one exchange + ~50 us of compute). "
              "CPU us/round = user+sys CPU of all ranks / rounds. Rounds differ per K "
              "(bench/overcommit.sh). \"timeout-…\" = the run hit the per-run limit.")
    md.append("")
    if not runs and not status:
        md.append("No results (bench/results/overcommit/ is empty or missing).")
        md.append("")
    else:
        md.append("## Results")
        md.append("")
        for pat in PATTERNS:
            md += table(runs, status, pat)
        md += checks(runs, status)
        md += noise_section(runs, status)
    text = "\n".join(md)
    os.makedirs(res_dir, exist_ok=True)
    with open(os.path.join(res_dir, "overcommit.md"), "w") as f:
        f.write(text)
    print(text)
    if runs:
        plots(runs, res_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
