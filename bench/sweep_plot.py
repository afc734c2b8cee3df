#!/usr/bin/env python3
"""bench/sweep_plot.py -- plots of a `vmfabric sweep` parameter sweep, in the
shape of 003_*'s Figures 33-39.

    python3 bench/sweep_plot.py RESULTS.csv OUTDIR

Input: the CSV written by `vmfabric sweep` (header row, comma-separated):

    run,kind,nodes,ranks,mtu,params,benchmark,bytes,repetitions,t_usec,
    t_min_usec,t_max_usec,mbytes_per_sec

  kind       "smn" (the emulated hardware's virtual NIC) or "baseline" (the
             same benchmark over a veth/bridge);
  params     the other swept parameters, "key=value;key=value" (may be empty);
  benchmark  an IMB-MPI1 name (PingPong, PingPing, Sendrecv, Bcast, Allgather,
             Allgatherv, Gather, Gatherv, Scatter, Scatterv, Alltoall,
             Alltoallv, Reduce, ...);
  t_usec     t[usec] for PingPong/PingPing, t_avg[usec] for the others;
  mbytes_per_sec  empty when the benchmark reports none (IMB's Mbytes/sec,
             2^20 bytes per second); t_min/t_max empty for PingPong/PingPing.

A curve is one (kind, params): labelled "smn" or "baseline", followed by the
params ("smn vlb=true irq_cost_ns=20000") when there are any. Where several
rows share one x on one curve (repeated runs), the median is plotted. When the
rows of one line would still mix several node counts, rank counts or MTUs
that the figure does not name, the line is split by them and the label says so
(e.g. PingPong over 1 and 2 nodes).

Output: PNG files in OUTDIR (created if missing); the path of each file written
is printed, one per line. A figure whose benchmark has no rows is skipped.

  fig33_pingping.png         PingPing: bandwidth and latency vs MTU, for the
                             smallest nonzero, a middle and the largest size
  fig34_pingpong.png         the same for PingPong
  fig35_pingpong_scaling.png PingPong bandwidth vs message size per (MTU, curve)
  fig36_sendrecv.png         Sendrecv bandwidth vs message size per (MTU,
                             curve); bandwidth vs MTU at the largest size
  fig37_bcast.png            Bcast latency vs ranks at the largest size per
                             (MTU, curve); latency vs message size per (ranks,
                             curve) at each curve's largest MTU
  fig38_alltoall.png         Alltoall latency vs message size per (ranks,
                             curve) at each curve's largest MTU; latency vs MTU
                             at the largest size per (ranks, curve)
  fig39_reduce.png           Reduce latency vs MTU per (ranks, curve) and vs
                             ranks per (MTU, curve), at the size closest to
                             16384 bytes
  fig_<name>.png             every other benchmark present (Allgather, Gather,
                             Scatter, their v variants, ...): latency vs
                             message size per (ranks, MTU, curve)

Message-size axes are logarithmic (base 2), so 0-byte rows are left out of
them. Needs matplotlib (Agg backend); without it this exits with status 2.
"""
import csv
import os
import statistics
import sys

USAGE = "usage: python3 bench/sweep_plot.py RESULTS.csv OUTDIR"

KNOWN = [
    "PingPong", "PingPing", "Sendrecv", "Exchange", "Bcast", "Allgather",
    "Allgatherv", "Gather", "Gatherv", "Scatter", "Scatterv", "Alltoall",
    "Alltoallv", "Reduce", "Allreduce", "Reduce_scatter", "Barrier",
]
CANON = {n.lower(): n for n in KNOWN}
DEDICATED = {"PingPong", "PingPing", "Sendrecv", "Bcast", "Alltoall", "Reduce"}

LAT = "latency t [usec]"
BW = "bandwidth [MB/s]"
SIZE = "message size [bytes]"
MTU = "MTU [bytes]"
RANKS = "number of ranks"


# --------------------------------------------------------------- input

def _int(s):
    return int(float(s))


def _float(s):
    s = (s or "").strip()
    if s == "":
        return None
    v = float(s)
    return v if v == v else None  # drop NaN


def load(path):
    """Rows of the CSV as dicts with typed fields; bad rows are reported."""
    rows = []
    bad = 0
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"kind", "nodes", "ranks", "mtu", "params", "benchmark", "bytes",
                "t_usec", "mbytes_per_sec"}
        missing = need - set(reader.fieldnames or [])
        if missing:
            raise ValueError("missing column(s): " + ", ".join(sorted(missing)))
        for r in reader:
            try:
                name = (r.get("benchmark") or "").strip()
                params = (r.get("params") or "").strip()
                rows.append({
                    "run": (r.get("run") or "").strip(),
                    "kind": (r.get("kind") or "").strip(),
                    "nodes": _int(r["nodes"]),
                    "ranks": _int(r["ranks"]),
                    "mtu": _int(r["mtu"]),
                    "params": params,
                    "benchmark": CANON.get(name.lower(), name),
                    "bytes": _int(r["bytes"]),
                    "t": _float(r.get("t_usec")),
                    "t_min": _float(r.get("t_min_usec")),
                    "t_max": _float(r.get("t_max_usec")),
                    "bw": _float(r.get("mbytes_per_sec")),
                })
            except (KeyError, TypeError, ValueError):
                bad += 1
    if bad:
        print(f"sweep_plot: skipped {bad} malformed row(s) of {path}", file=sys.stderr)
    return rows


# --------------------------------------------------------------- grouping

def curve_of(r):
    return (r["kind"], r["params"])


def curve_label(c):
    kind, params = c
    parts = [p.strip() for p in params.split(";") if p.strip()]
    return " ".join([kind or "?"] + parts)


def curve_order(c):
    kind, params = c
    rank = {"smn": 0, "baseline": 1}.get(kind, 2)
    return (rank, kind, params)


def fmt_bytes(n):
    n = int(n)
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def name_value(key, v):
    if key == "bytes":
        return fmt_bytes(v)
    if key == "mtu":
        return f"mtu={v}"
    if key == "ranks":
        return f"{v} ranks"
    if key == "nodes":
        return f"{v} node" + ("" if v == 1 else "s")
    return f"{key}={v}"


def extra_splits(rows, keys, x):
    """Of nodes/ranks/mtu not already named, those needed so that no line
    mixes rows that differ in them at one x (a median would mix them). Added
    one at a time, so a field that follows from another (ranks from nodes)
    is not added twice."""
    extra = []
    for k in ("nodes", "ranks", "mtu"):
        if k in keys or k == x:
            continue
        named = list(keys) + extra
        seen = {}
        for r in rows:
            ident = (curve_of(r),) + tuple(r[j] for j in named) + (r[x],)
            seen.setdefault(ident, set()).add(r[k])
        if any(len(v) > 1 for v in seen.values()):
            extra.append(k)
    return extra


def lines(rows, keys, x, y):
    """{(curve, key values...): [(x, median y), ...]} sorted by x.
    keys: row fields that, with the curve, make one line. Fields that would
    still be mixed (see extra_splits) are appended to keys."""
    keys = list(keys) + extra_splits(rows, keys, x)
    acc = {}
    for r in rows:
        yv = r[y]
        if yv is None:
            continue
        if x == "bytes" and r["bytes"] <= 0:
            continue  # log axis
        ident = (curve_of(r),) + tuple((k, r[k]) for k in keys)
        acc.setdefault(ident, {}).setdefault(r[x], []).append(yv)
    out = {}
    for ident, pts in acc.items():
        out[ident] = sorted((xv, statistics.median(ys)) for xv, ys in pts.items())
    return out


# --------------------------------------------------------------- drawing

class Style:
    """Colour per curve, marker/linestyle per the other key values."""

    MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h"]
    DASHES = ["-", "--", ":", "-."]

    def __init__(self, curves):
        self.colours = {}
        for i, c in enumerate(sorted(set(curves), key=curve_order)):
            self.colours[c] = f"C{i % 10}"
        self.groups = {}

    def of(self, curve, group):
        if group not in self.groups:
            self.groups[group] = len(self.groups)
        g = self.groups[group]
        return dict(color=self.colours.get(curve, "k"),
                    marker=self.MARKERS[g % len(self.MARKERS)],
                    linestyle=self.DASHES[(g // len(self.MARKERS)) % len(self.DASHES)])


def draw(ax, data, style, xlabel, ylabel, title, logx=False, logy=False, int_x=False):
    """Plot lines(); returns the number of lines drawn. logy: True, False or
    "auto" (log when the values span more than two decades)."""
    n = 0
    allpos = True
    lo, hi = float("inf"), 0.0

    def order(item):
        ident, _ = item
        return (curve_order(ident[0]),) + tuple(v for _, v in ident[1:])

    for ident, pts in sorted(data.items(), key=order):
        if not pts:
            continue
        curve, rest = ident[0], ident[1:]
        label = ", ".join([curve_label(curve)] + [name_value(k, v) for k, v in rest])
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        allpos = allpos and all(v > 0 for v in ys)
        lo, hi = min([lo] + ys), max([hi] + ys)
        ax.plot(xs, ys, label=label, markersize=4, linewidth=1.2,
                **style.of(curve, rest))
        n += 1
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)
    if n == 0:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        return 0
    if logx:
        ax.set_xscale("log", base=2)
        from matplotlib.ticker import FuncFormatter, LogLocator
        ax.xaxis.set_major_locator(LogLocator(base=4))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: short_bytes(v)))
    if logy == "auto":  # log only when the values span over two decades
        logy = lo > 0 and hi / lo > 100
    if logy and allpos:
        ax.set_yscale("log")
    if int_x:
        from matplotlib.ticker import MaxNLocator
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if n <= 6:
        ax.legend(fontsize="x-small", loc="best")
    else:  # below the axes, so that it hides no data
        ax.legend(fontsize="x-small", loc="upper center", ncol=2,
                  bbox_to_anchor=(0.5, -0.2))
    return n


def short_bytes(v):
    if v <= 0:
        return ""
    v = int(round(v))
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if v >= scale and v % scale == 0:
            return f"{v // scale}{unit}"
    return str(v)


# --------------------------------------------------------------- figures

def pick_sizes(rows):
    """smallest nonzero, a middle and the largest size present"""
    sizes = sorted({r["bytes"] for r in rows if r["bytes"] > 0})
    if not sizes:
        return []
    picked = [sizes[0], sizes[len(sizes) // 2], sizes[-1]]
    return sorted(set(picked))


def largest_mtu_rows(rows):
    """rows at each curve's largest MTU"""
    top = {}
    for r in rows:
        c = curve_of(r)
        top[c] = max(top.get(c, r["mtu"]), r["mtu"])
    return [r for r in rows if r["mtu"] == top[curve_of(r)]]


def closest_size(rows, target):
    sizes = sorted({r["bytes"] for r in rows})
    return min(sizes, key=lambda s: (abs(s - target), s)) if sizes else None


def p2p_vs_mtu(plt, rows, name, fig_no, path):
    sizes = pick_sizes(rows)
    sel = [r for r in rows if r["bytes"] in sizes]
    if not sel:
        return False
    style = Style(curve_of(r) for r in rows)
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    draw(a, lines(sel, ["bytes"], "mtu", "bw"), style, MTU, BW,
         "bandwidth vs MTU", logy="auto")
    draw(b, lines(sel, ["bytes"], "mtu", "t"), style, MTU, LAT,
         "latency vs MTU", logy="auto")
    return finish(fig, f"{name} (cf. 003_* Figure {fig_no})", path)


def fig35(plt, rows, path):
    style = Style(curve_of(r) for r in rows)
    fig, ax = plt.subplots(1, 1, figsize=(8, 5.5))
    n = draw(ax, lines(rows, ["mtu"], "bytes", "bw"), style, SIZE, BW,
             "bandwidth vs message size", logx=True, logy=True)
    if n == 0:
        plt.close(fig)
        return False
    return finish(fig, "PingPong scaling (cf. 003_* Figure 35)", path)


def fig36(plt, rows, path):
    style = Style(curve_of(r) for r in rows)
    big = max(r["bytes"] for r in rows)
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    draw(a, lines(rows, ["mtu"], "bytes", "bw"), style, SIZE, BW,
         "bandwidth vs message size", logx=True, logy=True)
    draw(b, lines([r for r in rows if r["bytes"] == big], [], "mtu", "bw"), style,
         MTU, BW, f"bandwidth vs MTU, {fmt_bytes(big)}")
    return finish(fig, "Sendrecv (cf. 003_* Figure 36)", path)


def fig37(plt, rows, path):
    style = Style(curve_of(r) for r in rows)
    big = max(r["bytes"] for r in rows)
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    draw(a, lines([r for r in rows if r["bytes"] == big], ["mtu"], "ranks", "t"),
         style, RANKS, LAT, f"latency vs ranks, {fmt_bytes(big)}", int_x=True)
    draw(b, lines(largest_mtu_rows(rows), ["ranks", "mtu"], "bytes", "t"), style, SIZE, LAT,
         "latency vs message size, largest MTU", logx=True, logy=True)
    return finish(fig, "Bcast (cf. 003_* Figure 37)", path)


def fig38(plt, rows, path):
    style = Style(curve_of(r) for r in rows)
    big = max(r["bytes"] for r in rows)
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    draw(a, lines(largest_mtu_rows(rows), ["ranks", "mtu"], "bytes", "t"), style, SIZE, LAT,
         "latency vs message size, largest MTU", logx=True, logy=True)
    draw(b, lines([r for r in rows if r["bytes"] == big], ["ranks"], "mtu", "t"),
         style, MTU, LAT, f"latency vs MTU, {fmt_bytes(big)}")
    return finish(fig, "Alltoall (cf. 003_* Figure 38)", path)


def fig39(plt, rows, path):
    style = Style(curve_of(r) for r in rows)
    size = closest_size(rows, 16384)
    sel = [r for r in rows if r["bytes"] == size]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    draw(a, lines(sel, ["ranks"], "mtu", "t"), style, MTU, LAT,
         f"latency vs MTU, {fmt_bytes(size)}")
    draw(b, lines(sel, ["mtu"], "ranks", "t"), style, RANKS, LAT,
         f"latency vs ranks, {fmt_bytes(size)}", int_x=True)
    return finish(fig, "Reduce (cf. 003_* Figure 39)", path)


def generic(plt, rows, name, path):
    style = Style(curve_of(r) for r in rows)
    fig, ax = plt.subplots(1, 1, figsize=(8, 5.5))
    n = draw(ax, lines(rows, ["ranks", "mtu"], "bytes", "t"), style, SIZE, LAT,
             "latency vs message size", logx=True, logy=True)
    if n == 0:
        plt.close(fig)
        return False
    return finish(fig, name, path)


def finish(fig, title, path):
    import matplotlib.pyplot as plt
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def safe_name(name):
    return "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in name.lower())


def main(argv):
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if len(argv) != 2 else sys.stdout)
        return 0 if len(argv) == 2 and argv[1] in ("-h", "--help") else 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("sweep_plot: matplotlib is not installed for this python3 "
              f"({sys.executable}); install it (pip install matplotlib, or "
              "apt-get install python3-matplotlib and use /usr/bin/python3)",
              file=sys.stderr)
        return 2
    csv_path, outdir = argv[1], argv[2]
    try:
        rows = load(csv_path)
    except (OSError, ValueError, csv.Error) as e:
        print(f"sweep_plot: cannot read {csv_path}: {e}", file=sys.stderr)
        return 1
    os.makedirs(outdir, exist_ok=True)

    by_bench = {}
    for r in rows:
        by_bench.setdefault(r["benchmark"], []).append(r)

    written = []

    def emit(ok, path):
        if ok:
            written.append(path)
            print(path, flush=True)

    def out(fname):
        return os.path.join(outdir, fname)

    if by_bench.get("PingPing"):
        emit(p2p_vs_mtu(plt, by_bench["PingPing"], "PingPing", 33,
                        out("fig33_pingping.png")), out("fig33_pingping.png"))
    if by_bench.get("PingPong"):
        emit(p2p_vs_mtu(plt, by_bench["PingPong"], "PingPong", 34,
                        out("fig34_pingpong.png")), out("fig34_pingpong.png"))
        emit(fig35(plt, by_bench["PingPong"], out("fig35_pingpong_scaling.png")),
             out("fig35_pingpong_scaling.png"))
    if by_bench.get("Sendrecv"):
        emit(fig36(plt, by_bench["Sendrecv"], out("fig36_sendrecv.png")),
             out("fig36_sendrecv.png"))
    if by_bench.get("Bcast"):
        emit(fig37(plt, by_bench["Bcast"], out("fig37_bcast.png")),
             out("fig37_bcast.png"))
    if by_bench.get("Alltoall"):
        emit(fig38(plt, by_bench["Alltoall"], out("fig38_alltoall.png")),
             out("fig38_alltoall.png"))
    if by_bench.get("Reduce"):
        emit(fig39(plt, by_bench["Reduce"], out("fig39_reduce.png")),
             out("fig39_reduce.png"))
    order = {n: i for i, n in enumerate(KNOWN)}
    for name in sorted(by_bench, key=lambda n: (order.get(n, len(order)), n)):
        if name in DEDICATED or not by_bench[name]:
            continue
        path = out(f"fig_{safe_name(name)}.png")
        emit(generic(plt, by_bench[name], name, path), path)

    if not written:
        print(f"sweep_plot: no rows to plot in {csv_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
