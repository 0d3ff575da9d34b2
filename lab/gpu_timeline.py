"""What the GPU does between two CUDA-graph launches of a decode loop, from a torch-profiler trace.

A server's decode step is one CUDA-graph launch (the forward) plus the small kernels and copies
around it (input preparation, sampling, bookkeeping). When the GPU is the bottleneck, every such
kernel adds its time to the step; when the host is, the GPU idles between launches. This reads a
Chrome trace written by SGLang's /start_profile (torch profiler with CPU and GPU activities) and
reports, per step (one graph launch to the next, pauses between requests left out):

  period     graph start to the next graph's start (the step time as the GPU sees it)
  graph      first kernel start to last kernel end of the launch (the forward in the graph)
  around     GPU busy time outside graphs between the two launches (union of
             kernel, copy and set intervals)
  idle       period - graph - around (the GPU waiting for the host)
  ops        how many kernels, copies and sets ran outside graphs in that window
  lead       graph's first kernel start minus the host's launch call (how far the host runs ahead)
  in_graph   busy time of the graph's own kernels (union of their intervals)
  graph_gaps graph - in_graph: the GPU waiting inside the launch (a graph started before the
             host finished submitting it runs with gaps; kernels queued well ahead run back to
             back)

and the outside-graph operations by name (calls per step, mean microseconds), and the graph's
kernels by name (microseconds per step; with several traces, the names whose time differs most from
the baseline's first). Kernels belong to a graph when their correlation id is that of a
cudaGraphLaunch call (or, in a trace without the host calls, when several GPU operations share one
correlation id). A server with several graphs (decode and verify passes: graphs of different kernel
counts) also gets the statistics of each graph's steps.

  python lab/gpu_timeline.py TRACE.json.gz [TRACE2 ...] [--json OUT.json] [--top 15] [--kernel NAME]

``--kernel NAME`` (a part of a kernel's name) also lists that kernel call by call
inside the dominant graph:
the k-th call of each launch (with one call per layer, the layers in order), its median
microseconds per trace, and the launch configurations (grid, block, registers, shared memory) the
trace recorded for it, so two servers whose graphs run the same kernel at different speeds can be
told apart by layer and by launch.

Several traces (say, the same load on a server without speculation and on one with auto) print side
by side in one table, the first as the baseline.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # a checkout
from fastverify.bench import common  # noqa: E402

SCRIPT = "lab/gpu_timeline.py"

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
# a period over this many times the median is a pause between requests, not a step
PAUSE_FACTOR = 3.0
STEP_KEYS = ("period", "graph", "in_graph", "graph_gaps", "around", "idle", "ops", "lead")


def load_events(path) -> list:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data.get("traceEvents", data) if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: no traceEvents list")
    return events


def _corr(ev):
    args = ev.get("args") or {}
    c = args.get("correlation", args.get("correlation id"))
    return None if c is None else int(c)


def _union(intervals) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def analyze(events, pause_factor: float = PAUSE_FACTOR, kernel: str | None = None) -> dict:
    """Per-step statistics of one trace (see the module doc); with ``kernel`` (part of a kernel's
    name) also "kernel_calls": that kernel call by call in the dominant graph (`_kernel_calls`).
    Raises ValueError when the trace has fewer than two graph launches on its busiest device."""
    api = {}
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") in API_CATS:
            c = _corr(ev)
            if c is not None:
                api[c] = (ev.get("name", ""), float(ev["ts"]))
    gpu = [ev for ev in events if ev.get("ph") == "X" and ev.get("cat") in GPU_CATS]
    if not gpu:
        raise ValueError("no GPU activity in the trace (was it recorded with the GPU activity?)")
    per_dev = defaultdict(int)
    for ev in gpu:
        per_dev[_device(ev)] += 1
    dev = max(per_dev, key=per_dev.get)
    gpu = sorted((ev for ev in gpu if _device(ev) == dev), key=lambda ev: float(ev["ts"]))

    # a graph launch: its host call is cudaGraphLaunch, or (a trace without the host calls) several
    # GPU operations share its correlation id, which a single kernel launch never does
    per_corr = defaultdict(int)
    for ev in gpu:
        per_corr[_corr(ev)] += 1
    # correlation -> [start, end, kernels, host launch ts or None, [(start, end, name)], [config]]
    launches = {}
    loose = []  # (start, end, name)
    for ev in gpu:
        s = float(ev["ts"])
        e = s + float(ev.get("dur", 0.0))
        c = _corr(ev)
        call = api.get(c)
        if c is not None and ((call is not None and "GraphLaunch" in call[0])
                              or (call is None and per_corr[c] > 1)):
            g = launches.setdefault(c, [s, e, 0, None if call is None else call[1], [], []])
            g[0], g[1], g[2] = min(g[0], s), max(g[1], e), g[2] + 1
            g[4].append((s, e, ev.get("name", "?")))
            g[5].append(_launch_config(ev))
        else:
            loose.append((s, e, ev.get("name", "?")))
    graphs = sorted(launches.values())
    if len(graphs) < 2:
        raise ValueError(f"{len(graphs)} CUDA-graph launch(es) on device {dev}: need two or more")

    windows = []
    for g, nxt in zip(graphs, graphs[1:]):
        windows.append({"start": g[0], "graph_end": g[1], "next": nxt[0], "kernels": g[2],
                        "lead": None if g[3] is None else g[0] - g[3], "inside": g[4],
                        "configs": g[5]})
    med_period = statistics.median(w["next"] - w["start"] for w in windows)
    steps = [w for w in windows if w["next"] - w["start"] <= pause_factor * med_period]

    # outside-graph operations, assigned to the window they start in (bisect
    # over sorted window ends)
    ends = [w["graph_end"] for w in steps]
    per_step_ops = [[] for _ in steps]
    for s, e, name in loose:
        i = bisect.bisect_right(ends, s) - 1
        if 0 <= i < len(steps) and s < steps[i]["next"]:
            per_step_ops[i].append((s, min(e, steps[i]["next"]), name))

    rows = []
    for w, ops in zip(steps, per_step_ops):
        period = w["next"] - w["start"]
        graph = w["graph_end"] - w["start"]
        around = _union([(s, e) for s, e, _ in ops])
        in_graph = _union([(s, e) for s, e, _ in w["inside"]])
        rows.append({"period": period, "graph": graph, "in_graph": in_graph,
                     "graph_gaps": max(0.0, graph - in_graph), "around": around,
                     "idle": max(0.0, period - graph - around), "ops": len(ops), "lead": w["lead"],
                     "kernels": w["kernels"]})
    n = len(rows)
    if n == 0:
        raise ValueError("no step left after dropping pauses")

    sizes = defaultdict(int)
    for r in rows:
        sizes[r["kernels"]] += 1
    # the same statistics per graph (by kernel count: a server with several graph kinds, e.g. decode
    # and verify passes, mixes steps of different anatomy)
    by_graph = {}
    for size in sorted(sizes):
        sel = [(r, ops) for r, ops in zip(rows, per_step_ops) if r["kernels"] == size]
        inside = [w["inside"] for w, r in zip(steps, rows) if r["kernels"] == size]
        by_graph[size] = {"steps": len(sel), "median_us": _medians([r for r, _ in sel]),
                          "ops_by_name": _ops_by_name([ops for _, ops in sel]),
                          "kernels_by_name": _kernels_by_name(inside)}
    out = {
        "device": dev, "steps": n, "pauses_dropped": len(windows) - n,
        "graph_sizes": dict(sorted(sizes.items())),
        "median_us": _medians(rows),
        "mean_us": {k: sum(r[k] for r in rows) / n
                    for k in ("period", "graph", "around", "idle", "ops")},
        "ops_by_name": _ops_by_name(per_step_ops),
        "by_graph": by_graph,
    }
    if kernel:
        size = max(sizes, key=sizes.get)
        out["kernel_calls"] = _kernel_calls([w for w, r in zip(steps, rows)
                                             if r["kernels"] == size], kernel)
    return out


def _launch_config(ev) -> str:
    """A kernel's launch configuration as the trace records it (grid, block,
    registers, shared memory)."""
    a = ev.get("args") or {}
    return (f"grid {tuple(a['grid']) if 'grid' in a else '?'} block "
            f"{tuple(a['block']) if 'block' in a else '?'} regs "
            f"{a.get('registers per thread', '?')} smem {a.get('shared memory', '?')}")


def _kernel_calls(windows, part: str) -> dict:
    """The kernels whose name contains `part`, call by call over the launches of one graph
    (`windows`, all of the same kernel count): {"name": the names matched, "calls": calls
    per launch, "us": [median microseconds of the k-th call], "configs": {launch
    configuration: calls}}."""
    per_call = defaultdict(list)
    configs = defaultdict(int)
    names = set()
    for w in windows:
        k = 0
        for (s, e, name), cfg in zip(w["inside"], w["configs"]):
            if part in name:
                per_call[k].append(e - s)
                configs[cfg] += 1
                names.add(name)
                k += 1
    calls = len(per_call)
    return {"name": sorted(names), "calls": calls,
            "us": [statistics.median(per_call[k]) for k in range(calls)],
            "configs": dict(sorted(configs.items(), key=lambda kv: -kv[1]))}


def _device(ev):
    return (ev.get("args") or {}).get("device", ev.get("pid"))


def _medians(rows) -> dict:
    """Median of each step statistic over `rows` (None where no row has it:
    `lead` without host calls)."""
    out = {}
    for key in STEP_KEYS:
        vals = [r[key] for r in rows if r[key] is not None]
        out[key] = statistics.median(vals) if vals else None
    return out


def _ops_by_name(op_lists) -> dict:
    """Outside-graph operations of the steps in `op_lists` (one list of (start, end, name) per step)
    by name: calls per step and mean microseconds, heaviest in total first."""
    names = defaultdict(lambda: [0, 0.0])
    for ops in op_lists:
        for s, e, name in ops:
            names[name][0] += 1
            names[name][1] += e - s
    return {name: {"per_step": c / len(op_lists), "mean_us": t / c}
            for name, (c, t) in sorted(names.items(), key=lambda kv: -kv[1][1])}


def _kernels_by_name(kernel_lists) -> dict:
    """A graph's kernels over the steps in `kernel_lists` (one list of (start, end, name) per
    launch) by name: calls per step and microseconds per step (median over the steps of each name's
    summed time: one slow launch does not move it), heaviest first."""
    per_step = defaultdict(lambda: [0.0] * len(kernel_lists))
    calls = defaultdict(int)
    for i, ks in enumerate(kernel_lists):
        for s, e, name in ks:
            per_step[name][i] += e - s
            calls[name] += 1
    out = {name: {"per_step": calls[name] / len(kernel_lists), "us_per_step": statistics.median(t)}
           for name, t in per_step.items()}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us_per_step"]))


def _short(name: str, width: int = 100) -> str:
    name = " ".join(name.split())
    for noise in ("void ", "at::native::", "(anonymous namespace)::", "at_cuda_detail::"):
        name = name.replace(noise, "")
    return name if len(name) <= width else name[:width - 3] + "..."


def _views(results: dict) -> dict:
    """Columns of the table: each trace whole, and, for a trace with several
    graphs, each graph's steps."""
    cols = {}
    for label, r in results.items():
        cols[label] = r
        if len(r["by_graph"]) > 1:
            for size, g in r["by_graph"].items():
                cols[f"{label}/g{size}"] = {**g, "pauses_dropped": 0,
                                            "graph_sizes": {size: g["steps"]}, "mean_us": None}
    return cols


def render(results: dict, top: int = 15) -> str:
    """results: label -> analyze() output. The first label is the baseline of the delta column; a
    trace with several graphs (by kernel count) also gets one column per graph (LABEL/gN)."""
    results = _views(results)
    labels = list(results)
    out = [f"{'per step (median, us)':<24}" + "".join(f"{lb[:22]:>24}" for lb in labels),
           f"{'':<24}" + "".join(f"{'(- ' + labels[0][:18] + ')' if i else '':>24}"
                                 for i in range(len(labels)))]
    for key in STEP_KEYS:
        vals = [results[lb]["median_us"][key] for lb in labels]
        cells = []
        for i, v in enumerate(vals):
            if v is None:
                cells.append(f"{'-':>24}")
            elif i and vals[0] is not None:
                cells.append(f"{f'{v:.1f} ({v - vals[0]:+.1f})':>24}")
            else:
                cells.append(f"{v:>24.1f}")
        out.append(f"{key:<24}" + "".join(cells))
    out.append(f"{'steps (pauses dropped)':<24}" + "".join(
        f"{str(results[lb]['steps']) + ' (' + str(results[lb]['pauses_dropped']) + ')':>24}"
        for lb in labels))
    out.append(f"{'mean period':<24}" + "".join(
        f"{results[lb]['mean_us']['period']:>24.1f}" if results[lb]["mean_us"] else f"{'-':>24}"
        for lb in labels))
    for lb in labels:
        r = results[lb]
        out.append("")
        out.append(f"{lb}: graphs by kernel count {r['graph_sizes']}; outside-graph operations, "
                   "heaviest first")
        out.append(f"  {'calls/step':>10} {'mean us':>8} {'us/step':>8}  name")
        for name, v in list(r["ops_by_name"].items())[:top]:
            out.append(f"  {v['per_step']:>10.2f} {v['mean_us']:>8.2f} "
                       f"{v['per_step'] * v['mean_us']:>8.2f}  {_short(name)}")
    out.extend(_graph_kernels(results, labels, top))
    out.extend(_render_kernel_calls({lb: r for lb, r in results.items() if "/g" not in lb}))
    return "\n".join(out)


def _render_kernel_calls(results: dict) -> list:
    """`--kernel`: the k-th call's median microseconds per trace (the first trace the baseline),
    their sum, and each trace's launch configurations."""
    cols = [lb for lb, r in results.items() if r.get("kernel_calls")]
    if not cols:
        return []
    kc = {lb: results[lb]["kernel_calls"] for lb in cols}
    n = max(v["calls"] for v in kc.values())
    out = ["",
           "kernel call by call in the dominant graph (median us): "
           f"{', '.join(kc[cols[0]]['name']) or '-'}",
           f"  {'call':>6}" + "".join(f"{lb[:16]:>18}" for lb in cols)]

    def cell(i, v, base):
        if v is None:
            return f"{'-':>18}"
        return f"{v:>18.2f}" if i == 0 or base is None else f"{f'{v:.2f} ({v - base:+.2f})':>18}"

    for k in range(n):
        vals = [kc[lb]["us"][k] if k < kc[lb]["calls"] else None for lb in cols]
        out.append(f"  {k:>6}" + "".join(cell(i, v, vals[0]) for i, v in enumerate(vals)))
    sums = [sum(kc[lb]["us"]) for lb in cols]
    out.append(f"  {'sum':>6}" + "".join(cell(i, v, sums[0]) for i, v in enumerate(sums)))
    for lb in cols:
        out.append(f"  {lb}: " + "; ".join(f"{cfg} x{c}" for cfg, c in kc[lb]["configs"].items()))
    return out


def _dominant(r: dict) -> dict:
    """The statistics of the graph (by kernel count) that most of a trace's steps launch."""
    size = max(r["graph_sizes"], key=r["graph_sizes"].get)
    return r["by_graph"][size]


def _graph_kernels(results: dict, labels: list, top: int) -> list:
    """The kernels inside each trace's dominant graph by name (us per step); with several traces,
    the names whose time differs most from the baseline's first, so that a slower graph shows
    which kernels made it so."""
    per = {lb: _dominant(results[lb]).get("kernels_by_name", {}) for lb in labels if "/g" not in lb}
    cols = list(per)
    if not cols or not any(per.values()):
        return []
    names = set().union(*(set(v) for v in per.values()))

    def us(lb, name):
        return per[lb].get(name, {}).get("us_per_step", 0.0)

    key = (lambda n: -max(abs(us(lb, n) - us(cols[0], n)) for lb in cols[1:])) if len(cols) > 1 \
        else (lambda n: -us(cols[0], n))
    out = ["", "inside the graph (most launched per trace): us per step by kernel"
           + (", largest differences from " + cols[0] + " first" if len(cols) > 1 else ""),
           f"  {'calls':>6}" + "".join(f"{lb[:16]:>18}" for lb in cols) + "  name"]
    for name in sorted(names, key=key)[:top]:
        # the first trace that has it
        calls = next(per[lb][name] for lb in cols if name in per[lb])["per_step"]
        cells = []
        for i, lb in enumerate(cols):
            v = us(lb, name)
            cells.append(f"{v:>18.1f}" if i == 0
                         else f"{f'{v:.1f} ({v - us(cols[0], name):+.1f})':>18}")
        out.append(f"  {calls:>6.0f}" + "".join(cells) + f"  {_short(name, 70)}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help="torch-profiler Chrome traces (.json or .json.gz); "
                    "LABEL=PATH names a column")
    ap.add_argument("--json", help="write the statistics here")
    ap.add_argument("--top", type=int, default=15, help="outside-graph operations listed per trace")
    ap.add_argument("--kernel",
                    help="also list the graph's kernels whose name contains this, call by call")
    args = ap.parse_args(argv)
    results = {}
    for spec in args.traces:
        label, path = common.split_label(spec, lambda p: Path(p).name.split(".")[0])
        try:
            results[label] = analyze(load_events(path), kernel=args.kernel)
        except (OSError, ValueError) as e:
            print(f"gpu_timeline: {path}: {e}", file=sys.stderr)
            return 2
    print(render(results, args.top))
    if args.json:
        common.write_json(args.json,
                          {"traces": dict(zip(results, args.traces)), "results": results},
                          common.repro_command(sys.argv[1:] if argv is None
                                               else list(argv), SCRIPT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
