"""Per-step statistics of SGLang's scheduler loop, from the traces of ``FASTVERIFY_STEP_TRACE``.

``lab/steptrace/steptrace.py`` records every iteration of a server's scheduler (the host
launching a step, the host processing the last step's result and how long it waited there for
the GPU, garbage collections). This turns a server's records into per-step numbers, the
distribution and not only the mean:

  period   one ``run_batch`` start to the next (the step time: with the overlap scheduler
           the host launches step N+1 while the GPU runs step N, so this is the GPU's step
           unless the host is late)
  wait     time the host waited for the step in flight (CUDA event synchronize
           in process_batch_result)
  busy     period - wait: the host's own work per step
  late     share of steps with wait < 0.2 ms: the host was the bottleneck for those
  gc       garbage collections: per 1000 steps, mean ms per step, longest pause
  in X     mean ms per step spent in each function the recorder times (steptrace.SPANS: the forward,
           sampling, the n-gram worker, the auto glue's pieces, batch selection)

over the steady decode steps (a decode step followed by another of the same batch size; gaps longer
than 0.5 s between two steps are pauses and left out; for a server started with a within-process
A/B, its steps of variant a only: lab/ab_within.py prices variant b), per kind of step for a
server in auto verify mode (``lean``: no lookup, ``lean probe``: drafts looked up behind only to
learn from, ``plain path``: a step on SGLang's own decode path, patch 0012, ``path probe``: one
that probed there, ``spec``: drafts
verified), for
the steps right after each prefill (the time to first token and the next
tokens), the time of every step (steady or not) summed by category (prefills, the three steps after
each, the other decode steps by kind), so that two servers' difference on one load splits into where
it arose, and per batch size, sampling and kind, each row against the baseline's steps at the same
batch size and sampling (a step's GPU time depends on the batch size, its sampler's host and GPU
time on whether the batch samples greedily, and two servers' loads mix them in different shares: an
auto server speculates on a greedy repetitive load and runs plain steps on a sampled one, so its
plain steps are compared with the plain server's sampled ones).

  python lab/step_trace.py m_plain=DIR m_auto=DIR [--json OUT.json]

`--segments` lists each trace's busy stretches (one per load a client ran), `--segment [LABEL:]I`
keeps one of them, so that two servers are compared on the same load. Decode steps longer than
`--long-ms` (50) are listed one by one, with where their time went, the Triton kernels compiled in
them, and whether each was the first step of its kind in the trace (those after which the
scheduler went idle, waiting for requests, are only counted); every kernel compiled while serving
is listed by name with its time.

DIR is the FASTVERIFY_STEP_TRACE folder of one server (one file per process, steps-<pid>.jsonl,
optionally gzipped; the scheduler of the lowest process id with steps, TP rank 0 in a plain start,
is read) or one of its files. The first server is the baseline the others are compared with.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # a checkout
from fastverify.bench import common  # noqa: E402

SCRIPT = "lab/step_trace.py"
PAUSE_S = 0.5  # a longer period between two launches is a pause between requests, not a step
# a step whose host waited less than this for the GPU had the host as its bottleneck
LATE_S = 0.0002
DECODE_MODES = ("DECODE", "TARGET_VERIFY", "IDLE")
PREFILL_MODES = ("EXTEND", "MIXED", "SPLIT_PREFILL")
AFTER_PREFILL = 4  # the prefill's own iteration and the next three
# --segments: a longer gap between two launches starts a new busy stretch (a client's next load)
SPLIT_S = 0.15
LONG_MS = 50.0  # decode steps longer than this are listed one by one (stalls)
GPU_PARTS = ("forward", "sample")  # the labels of steptrace.GPU_SPANS
# a device gap longer than this between two steps: the forward stream waited for the host
GAP_MS = 0.005
SLOW_WINDOW = 50  # steps per window when looking for stretches of slow steps
# a window whose steps average this much over their median period is part of a slow stretch
SLOW_OVER = 0.05
# a (batch size, sampling, kind) group with fewer steady steps is left out of
# the per-batch-size table
MIN_GROUP = 100
AFTER_LABEL = f"{AFTER_PREFILL - 1} steps after each prefill"  # time_by_category's categories
OTHER_LABEL = "other decode steps"


def trace_files(path) -> list:
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise OSError(f"{path}: no such file or folder")
    files = sorted(p.glob("steps-*.jsonl*"), key=lambda f: int(f.name.split("-")[1].split(".")[0]))
    if not files:
        raise ValueError(f"{path}: no steps-<pid>.jsonl files (was FASTVERIFY_STEP_TRACE set for "
                         "this server?)")
    return files


def load_records(path) -> list:
    records = []
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON record ({e.msg})") from None
            if not isinstance(rec, list) or not rec or rec[0] not in ("R", "P", "G", "I", "C", "E"):
                raise ValueError(f"{path}:{n}: not a step-trace record: {line[:80]}")
            records.append(rec)
    return records


def load_server(path) -> tuple:
    """(file, records) of the first process of a server's folder that ran steps."""
    for f in trace_files(path):
        records = load_records(f)
        if any(r[0] == "R" for r in records):
            return f, records
    raise ValueError(f"{path}: no scheduler steps recorded")


def steps(records, pause_s: float = PAUSE_S) -> list:
    """One row per launch that has a next launch within pause_s: its period
    and what happened in it."""
    runs = sorted((r for r in records if r[0] == "R"), key=lambda r: r[1])
    procs = sorted((r for r in records if r[0] == "P"), key=lambda r: r[1])
    gcs = sorted((r for r in records if r[0] == "G"), key=lambda r: r[2])
    idles = sorted(r[1] for r in records if r[0] == "I")
    compiles = sorted((r for r in records if r[0] == "C"), key=lambda r: r[1])
    device = {r[1]: r for r in records if r[0] == "E"}  # the device side of a launch, by its start
    rows, pi, gi, ii, ci = [], 0, 0, 0, 0
    for i in range(len(runs) - 1):
        cur, nxt = runs[i], runs[i + 1]
        start, end = cur[1], nxt[1]
        wait = proc = gc_s = 0.0
        n_gc = 0
        while pi < len(procs) and procs[pi][1] < end:
            if procs[pi][1] >= start:
                wait += procs[pi][3]
                proc += procs[pi][2] - procs[pi][1] - procs[pi][3]
            pi += 1
        while gi < len(gcs) and gcs[gi][2] < end:
            if gcs[gi][2] >= start:
                gc_s += gcs[gi][3]
                n_gc += 1
            gi += 1
        idle = False
        while ii < len(idles) and idles[ii] < end:
            idle = idle or idles[ii] >= start
            ii += 1
        compiled = []  # (kernel, ms) compiled within this step's period
        while ci < len(compiles) and compiles[ci][1] < end:
            if compiles[ci][1] >= start:
                compiled.append((str(compiles[ci][3]), 1000.0 * compiles[ci][2]))
            ci += 1
        period = end - start
        if period > pause_s:
            continue
        kind, width, probe = (cur[5:8] + [None, None, None])[:3]
        spans = cur[8] if len(cur) > 8 and isinstance(cur[8], dict) else {}
        # None: older traces
        sampling = cur[9] if len(cur) > 9 and cur[9] in ("greedy", "sampled") else None
        # a within-process A/B's variant (steptrace's FASTVERIFY_STEP_TRACE_AB), else None
        variant = cur[10] if len(cur) > 10 and cur[10] in ("a", "b") else None
        dev = device.get(start)
        rows.append({"spans": spans, "start": start, "period": period, "launch": cur[2] - cur[1],
                     "wait": wait,
                     "busy": period - wait, "proc": proc, "gc": gc_s, "n_gc": n_gc,
                     "mode": cur[3], "bs": cur[4],
                     "next_mode": nxt[3], "next_bs": nxt[4], "next_kind": (nxt[5:6] or [None])[0],
                     "kind": kind, "width": width,
                     "probe": bool(probe),
                     "index": i, "sampling": sampling, "variant": variant, "idle": idle,
                     "compiled": compiled,
                     # ms on the forward stream: first to last mark of this launch, last
                     # mark to the next's first
                     "gpu_span": dev[2] if dev else None, "gpu_gap": dev[3] if dev else None,
                     # ms between the events around the model's forward and the
                     # sampler (traces that have them)
                     "gpu_parts": dev[4] if dev and len(dev) > 4
                     and isinstance(dev[4], dict) else None})
    return rows


def segments(records, split_s: float = SPLIT_S) -> list:
    """The busy stretches of a trace: (first launch, last launch, launches), split
    wherever two launches are more than split_s apart (a client starting its next load, a
    pause between requests)."""
    starts = sorted(r[1] for r in records if r[0] == "R")
    out = []
    for t in starts:
        if out and t - out[-1][1] <= split_s:
            out[-1][1] = t
            out[-1][2] += 1
        else:
            out.append([t, t, 1])
    return [tuple(x) for x in out]


def in_window(records, first: float, last: float) -> list:
    """The records of the launches first..last (inclusive) and what happened up to
    the launch after last."""
    runs = sorted(r[1] for r in records if r[0] == "R")
    after = next((t for t in runs if t > last), float("inf"))
    when = {"R": 1, "P": 1, "G": 2, "I": 1, "C": 1, "E": 1}  # the field that holds each kind's time
    return [r for r in records if first <= r[when[r[0]]] < after and (r[0] != "R" or r[1] <= last)
            or (r[0] == "R" and r[1] == after)]


def _pct(values, q: float) -> float:
    vals = sorted(values)
    if not vals:
        return float("nan")
    pos = q * (len(vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def summarize(rows) -> dict:
    """Statistics of a group of steps, times in ms."""
    if not rows:
        return {"steps": 0}
    ms = lambda key: [1000.0 * r[key] for r in rows]  # noqa: E731
    period, busy, wait = ms("period"), ms("busy"), ms("wait")
    gc_ms = ms("gc")
    n = len(rows)
    span = [r["gpu_span"] for r in rows if r.get("gpu_span") is not None]
    gap = [r["gpu_gap"] for r in rows if r.get("gpu_gap") is not None]
    device = {} if not span else {
        # the device side (E records): the step's time on the forward stream, and the forward stream
        # idle between it and the next step (0 while the host launches ahead of the GPU)
        "gpu_steps": len(span), "gpu_span_median": statistics.median(span),
        "gpu_span_mean": statistics.fmean(span),
        "gpu_gap_median": statistics.median(gap), "gpu_gap_mean": statistics.fmean(gap),
        "gpu_gap_share": sum(1 for g in gap if g > GAP_MS) / len(gap),
    }
    parted = [r for r in rows if r.get("gpu_parts") and r.get("gpu_span") is not None]
    if parted:
        # the span split: each part's median, and the rest of the span (the glue's and the
        # scheduler's kernels and copies, waits on other streams) per step
        for label in GPU_PARTS:
            vals = [r["gpu_parts"][label] for r in parted if label in r["gpu_parts"]]
            if vals:
                device[f"gpu_{label}_median"] = statistics.median(vals)
        rest = [r["gpu_span"] - sum(r["gpu_parts"].values()) for r in parted]
        device["gpu_rest_median"] = statistics.median(rest)
        device["gpu_rest_mean"] = statistics.fmean(rest)
    return {
        **device,
        "steps": n,
        "period_median": statistics.median(period), "period_mean": statistics.fmean(period),
        "period_p90": _pct(period, 0.9), "period_p99": _pct(period, 0.99),
        "period_max": max(period),
        "busy_median": statistics.median(busy), "busy_mean": statistics.fmean(busy),
        "busy_p90": _pct(busy, 0.9), "busy_p99": _pct(busy, 0.99),
        "wait_median": statistics.median(wait), "wait_mean": statistics.fmean(wait),
        "launch_median": 1000.0 * statistics.median(r["launch"] for r in rows),
        "proc_median": 1000.0 * statistics.median(r["proc"] for r in rows),
        "late_share": sum(1 for r in rows if r["wait"] < LATE_S) / n,
        "gc_per_1000": 1000.0 * sum(r["n_gc"] for r in rows) / n,
        "gc_ms_per_step": statistics.fmean(gc_ms), "gc_max_ms": max(gc_ms),
        "spans_mean_ms": {label: 1000.0 * sum(r["spans"].get(label, 0.0) for r in rows) / n
                          for label in sorted({k for r in rows for k in r["spans"]})},
    }


def _kind_label(row) -> str:
    if row["kind"] is None:
        return "plain"
    if row["kind"] == "lean":
        return "lean probe" if row["probe"] else "lean"
    if row["kind"] == "path":
        return "path probe" if row["probe"] else "plain path"
    return f"spec w{row['width']}"


def long_steps(rows, min_ms: float = LONG_MS, limit: int = 20) -> dict:
    """Decode steps longer than ``min_ms`` (any batch-size change included; periods over the pause
    threshold are not steps): when, how long, what kind, where the time went (the recorded functions
    over 1 ms, the wait for the GPU, garbage collection), and whether that kind of step (mode, batch
    size, auto kind and width) was the first of its kind in the trace, as a step that pays for
    something done once would be. A step after which the scheduler went idle (an ``I`` record: it
    waited for new requests) is counted apart, not listed."""
    if not rows:
        return {"count": 0, "idle_ended": 0, "steps": []}
    t0 = rows[0]["start"]
    seen, found, idle_ended = set(), [], 0
    for r in rows:
        key = (r["mode"], r["bs"], _kind_label(r))
        first = key not in seen
        seen.add(key)
        if r["mode"] in DECODE_MODES and 1000.0 * r["period"] > min_ms and r["idle"]:
            idle_ended += 1
        elif r["mode"] in DECODE_MODES and 1000.0 * r["period"] > min_ms:
            spans = {k: round(1000.0 * v, 1)
                     for k, v in sorted(r["spans"].items(), key=lambda kv: -kv[1])
                     if 1000.0 * v > 1.0}
            found.append({"at_s": round(r["start"] - t0, 3), "ms": round(1000.0 * r["period"], 1),
                          "mode": r["mode"], "bs": r["bs"], "kind": _kind_label(r),
                          "first_of_kind": first,
                          "wait_ms": round(1000.0 * r["wait"], 1),
                          "gc_ms": round(1000.0 * r["gc"], 1),
                          "spans_ms": spans,
                          "compiled": [[k, round(ms, 1)] for k, ms in r["compiled"]]})
    return {"count": len(found), "first_of_kind": sum(1 for f in found if f["first_of_kind"]),
            "idle_ended": idle_ended, "steps": found[:limit]}


def steady_steps(rows) -> list:
    """The steady decode steps: a decode step followed by another of the same batch size."""
    return [r for r in rows if r["mode"] in DECODE_MODES and r["next_mode"] in DECODE_MODES
            and r["bs"] == r["next_bs"]]


def slow_stretches(steady, t0: float, window: int = SLOW_WINDOW, over: float = SLOW_OVER,
                   limit: int = 10) -> dict:
    """Stretches of steady decode steps that run slow together (a host or a device slowed for a
    while, which a median hides and a list of single long steps misses): every run of ``window``
    consecutive steady steps whose periods average more than ``over`` above their medians (each step
    against the median of its batch size and sampling) belongs to one; overlapping runs merge.
    Returns the load's total time over the medians, the part of it inside such stretches, and each
    stretch (start, steps, ms over, the share of late steps, the median host launch and, with device
    marks, the median device span); ``steady``: the load's steady decode steps (`steady_steps`),
    ``t0``: the time stretch starts are counted from."""
    groups: dict = {}
    for r in steady:
        groups.setdefault((r["bs"], r["sampling"]), []).append(r["period"])
    med = {k: statistics.median(v) for k, v in groups.items()}
    excess = [r["period"] - med[(r["bs"], r["sampling"])] for r in steady]
    base = [med[(r["bs"], r["sampling"])] for r in steady]
    marked = [False] * len(steady)
    if len(steady) >= window:
        ex, ba = sum(excess[:window]), sum(base[:window])
        for i in range(len(steady) - window + 1):
            if i:
                ex += excess[i + window - 1] - excess[i - 1]
                ba += base[i + window - 1] - base[i - 1]
            if ex > over * ba:
                for j in range(i, i + window):
                    marked[j] = True
    found, i = [], 0
    while i < len(steady):
        if not marked[i]:
            i += 1
            continue
        j = i
        while j < len(steady) and marked[j]:
            j += 1
        part = steady[i:j]
        spans = [r["gpu_span"] for r in part if r.get("gpu_span") is not None]
        found.append({"at_s": round(part[0]["start"] - t0, 3), "steps": j - i,
                      "over_ms": round(1000.0 * sum(excess[i:j]), 1),
                      "late_share":
                          round(sum(1 for r in part if r["wait"] < LATE_S) / len(part), 3),
                      "launch_median_ms":
                          round(1000.0 * statistics.median(r["launch"] for r in part), 3),
                      "gpu_span_median": round(statistics.median(spans), 3) if spans else None})
        i = j
    return {"window": window, "over": over, "count": len(found),
            "total_over_ms": round(1000.0 * sum(excess), 1),
            "in_stretches_ms": round(sum(f["over_ms"] for f in found), 1),
            "stretches": sorted(found, key=lambda f: -f["over_ms"])[:limit]}


def analyze(records, pause_s: float = PAUSE_S, long_ms: float = LONG_MS) -> dict:
    rows = steps(records, pause_s)
    # a within-process A/B's variant "b" steps carry a piece of work the server does not do
    # (lab/ab_within.py prices it): the statistics compare servers as they run, without them
    all_steady = steady_steps(rows)
    steady = [r for r in all_steady if r.get("variant") != "b"]
    kinds, by_bs = {}, {}
    for r in steady:
        kinds.setdefault(_kind_label(r), []).append(r)
        by_bs.setdefault((r["bs"], r["sampling"] or "", _kind_label(r)), []).append(r)
    after = [[] for _ in range(AFTER_PREFILL)]
    # the decode step right after each prefill: its host launch (ms) and its kind (auto: spec, lean)
    first = []
    for run in prefill_runs(rows):
        for k, nxt in enumerate(run):
            after[k].append(1000.0 * nxt["period"])
            if k == 1 and nxt["mode"] in DECODE_MODES:
                first.append((1000.0 * nxt["launch"], nxt["kind"]))
    return {
        "decode": summarize(steady),
        "by_kind": {k: summarize(v) for k, v in sorted(kinds.items())} if len(kinds) > 1 else {},
        # steady decode steps per batch size, sampling and kind: a step's GPU time depends on the
        # batch size and on whether it samples (temperature > 0: softmax and a draw over the
        # vocabulary, several times the host work of an argmax), so two servers are compared at the
        # same batch size and sampling (kinds of a server without auto: "plain"; sampling "" in
        # traces that did not record it)
        "by_bs_kind": [dict(bs=bs, sampling=how, kind=kind, **summarize(v))
                       for (bs, how, kind), v in sorted(by_bs.items()) if len(v) >= MIN_GROUP],
        "after_prefill_ms": [statistics.median(a) if a else None for a in after],
        "prefills": len(after[0]),
        # a new request's first decode step: how long the host took to launch it (a lookup for
        # the new request, a verify pass) and, for an auto server, the share of them run as
        # verify passes (None otherwise)
        "first_decode_launch_ms": statistics.median(x for x, _ in first) if first else None,
        "first_decode_spec_share": (sum(1 for _, k in first if k == "spec") / len(first)
                                    if any(k is not None for _, k in first) else None),
        "gc_total": {str(g): sum(1 for r in records if r[0] == "G" and r[1] == g)
                     for g in (0, 1, 2)},
        "gc_longest_ms": max((1000.0 * r[3] for r in records if r[0] == "G"), default=0.0),
        "long_steps": long_steps(rows, long_ms),
        "slow_stretches": slow_stretches(steady, rows[0]["start"] if rows else 0.0),
        "time_by_category": time_by_category(rows),
        "compiled": compiled_kernels(records),
        "ab_b_steps_left_out": len(all_steady) - len(steady),
    }


def prefill_runs(rows) -> list:
    """Per prefill step: it and the steps after it, up to AFTER_PREFILL in all, ending before the
    next prefill or a step left out (a pause)."""
    by_index = {r["index"]: r for r in rows}
    runs = []
    for r in rows:
        if r["mode"] in PREFILL_MODES:
            run = [r]
            for k in range(1, AFTER_PREFILL):
                nxt = by_index.get(r["index"] + k)
                if nxt is None or nxt["mode"] in PREFILL_MODES:
                    break
                run.append(nxt)
            runs.append(run)
    return runs


def time_by_category(rows) -> dict:
    """Every step of the trace (steady or not, pauses left out) by where its period went: the
    prefills, the three decode steps after each prefill (the time to first token and the first
    tokens, while the pipeline fills again), and the other decode steps by kind. {category:
    {"steps": n, "ms": sum of periods}}: two servers on the same load differ in total time by the
    sum of the categories' differences."""
    after = {nxt["index"] for run in prefill_runs(rows) for nxt in run[1:]}
    out: dict = {}
    for r in rows:
        if r["mode"] in PREFILL_MODES:
            cats = ("prefills",)
        elif r["index"] in after:
            cats = (AFTER_LABEL,)
        else:  # and, apart, by kind (a server without auto: "plain")
            cats = (OTHER_LABEL, f"{OTHER_LABEL}: {_kind_label(r)}")
        for cat in cats:
            c = out.setdefault(cat, {"steps": 0, "ms": 0.0})
            c["steps"] += 1
            c["ms"] += 1000.0 * r["period"]
    return {k: {"steps": v["steps"], "ms": round(v["ms"], 3)} for k, v in out.items()}


def compiled_kernels(records) -> dict:
    """Triton kernels compiled (or loaded from the on-disk cache) while the trace ran (``C``
    records): per kernel, how often, the milliseconds in all, the compile-time constants of each
    time and the argument types met (older traces have none)."""
    out = {}
    for r in records:
        if r[0] != "C":
            continue
        k = out.setdefault(str(r[3]), {"count": 0, "ms": 0.0, "constexprs": [], "signatures": []})
        k["count"] += 1
        k["ms"] = round(k["ms"] + 1000.0 * r[2], 1)
        if len(r) > 4 and r[4] and len(k["constexprs"]) < 8:
            k["constexprs"].append(r[4])
        if len(r) > 5 and r[5] and r[5] not in k["signatures"]:
            k["signatures"].append(r[5])
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))


ROWS = [("period_median", "period median"), ("period_mean", "period mean"),
        ("period_p90", "period p90"),
        ("period_p99", "period p99"), ("period_max", "period max"), ("busy_median", "busy median"),
        ("busy_mean", "busy mean"), ("busy_p99", "busy p99"), ("wait_median", "wait median"),
        ("launch_median", "launch median"), ("proc_median", "process median"),
        ("late_share", "late (share)"),
        ("gc_per_1000", "gc per 1000 steps"), ("gc_ms_per_step", "gc ms per step"),
        ("gc_max_ms", "gc longest")]
# rows of traces with E records (FASTVERIFY_STEP_TRACE_GPU=1): the device side of each step
GPU_ROWS = [("gpu_span_median", "gpu span median"), ("gpu_span_mean", "gpu span mean"),
            ("gpu_gap_median", "gpu gap median"), ("gpu_gap_mean", "gpu gap mean"),
            ("gpu_gap_share", "gpu gap > 5 us (share)"),
            ("gpu_forward_median", "gpu in forward median"),
            ("gpu_sample_median", "gpu in sample median"),
            ("gpu_rest_median", "gpu rest of span median"),
            ("gpu_rest_mean", "gpu rest of span mean")]


def _cell(value, base, fmt: str = "{:.3f}") -> str:
    if value is None or value != value:
        return "-"
    text = fmt.format(value)
    if base is not None and base == base:
        text += f" ({value - base:+.3f})"
    return text


def render(results: dict) -> str:
    labels = list(results)
    base = labels[0]
    width = 26
    out = ["decode steps (ms; steady: same batch size before and after)".ljust(34)
           + "".join(lab.rjust(width) for lab in labels)]
    out.append("steps".ljust(34) + "".join(str(results[lab]["decode"].get("steps", 0)).rjust(width)
                                         for lab in labels))
    device = any("gpu_span_median" in results[lab]["decode"] for lab in labels)
    for key, name in ROWS + (GPU_ROWS if device else []):
        b = results[base]["decode"].get(key)
        out.append(name.ljust(34) + "".join(
            _cell(results[lab]["decode"].get(key), None if lab == base else b).rjust(width)
            for lab in labels))
    for k in range(AFTER_PREFILL):
        b = results[base]["after_prefill_ms"][k]
        name = "prefill step (median period)" if k == 0 else f"prefill + {k} (median period)"
        out.append(name.ljust(34) + "".join(
            _cell(results[lab]["after_prefill_ms"][k], None if lab == base else b).rjust(width)
            for lab in labels))
    out.append("prefills".ljust(34) + "".join(str(results[lab]["prefills"]).rjust(width)
                                              for lab in labels))
    b = results[base].get("first_decode_launch_ms")
    out.append("prefill + 1: launch (median ms)".ljust(34) + "".join(
        _cell(results[lab].get("first_decode_launch_ms"), None if lab == base else b).rjust(width)
        for lab in labels))
    shares = [results[lab].get("first_decode_spec_share") for lab in labels]
    if any(v is not None for v in shares):
        out.append("prefill + 1: verify passes".ljust(34) + "".join(
            ("-" if v is None else f"{100.0 * v:.0f} %").rjust(width) for v in shares))
    span_labels = sorted({k for lab in labels
                          for k in results[lab]["decode"].get("spans_mean_ms", {})})
    for label in span_labels:
        vals = [results[lab]["decode"].get("spans_mean_ms", {}).get(label) for lab in labels]
        out.append(f"in {label} (mean ms)".ljust(34)
                   + "".join(_cell(v, None).rjust(width) for v in vals))
    for lab in labels:
        stalls = results[lab].get("long_steps") or {}
        if not stalls.get("count") and not stalls.get("idle_ended"):
            continue
        out.append("")
        out.append(f"{lab}: {stalls['count']} decode steps over the long-step threshold, "
                   f"{stalls['first_of_kind']} of them the first of their kind (mode, batch size, "
                   f"kind); {stalls.get('idle_ended', 0)} more ended in an idle wait for requests")
        for f in stalls["steps"]:
            where = ", ".join(f"{k} {v}" for k, v in f["spans_ms"].items())
            built = ", ".join(f"{k} {ms}" for k, ms in f.get("compiled", []))
            out.append(f"  at {f['at_s']:8.2f} s  {f['ms']:7.1f} ms  {f['mode']} bs {f['bs']} "
                       f"{f['kind']}{'  (first)' if f['first_of_kind'] else ''}  wait "
                       f"{f['wait_ms']} gc "
                       f"{f['gc_ms']}{'  in: ' + where if where else ''}"
                       f"{'  compiled: ' + built if built else ''}")
    for lab in labels:
        slow = results[lab].get("slow_stretches") or {}
        if not slow.get("count"):
            continue
        out.append("")
        out.append(f"{lab}: {slow['count']} slow stretch{'es' if slow['count'] > 1 else ''} "
                   f"({slow['window']}-step windows over their median period by more than "
                   f"{100.0 * slow['over']:.0f} %): {slow['in_stretches_ms']} ms over the medians "
                   f"in them, of {slow['total_over_ms']} ms over the medians in all steady decode "
                   "steps")
        for f in slow["stretches"]:
            span = (f"  device span median {f['gpu_span_median']:.3f}"
                    if f["gpu_span_median"] is not None else "")
            out.append(f"  at {f['at_s']:8.2f} s  {f['steps']:5d} steps  {f['over_ms']:7.1f} ms "
                       f"over  late {f['late_share']:.2f}  launch median "
                       f"{f['launch_median_ms']:.3f}{span}")
    for lab in labels:
        if results[lab].get("ab_b_steps_left_out"):
            out.append("")
            out.append(f"{lab}: {results[lab]['ab_b_steps_left_out']} steady decode steps of a "
                       "within-process A/B's variant b left out of the statistics above "
                       "(lab/ab_within.py prices that variant; the time by category counts them)")
    out.extend(_render_time_by_category(results, labels, width))
    for lab in labels:
        kernels = results[lab].get("compiled") or {}
        if kernels:
            out.append("")
            out.append(f"{lab}: Triton kernels compiled while serving (ms in all): "
                       + ", ".join(f"{k} x{v['count']} ({v['ms']})" for k, v in kernels.items()))
    for lab in labels:
        kinds = results[lab]["by_kind"]
        if not kinds:
            continue
        out.append("")
        out.append(f"{lab}: decode steps by kind".ljust(34) + "".join(k.rjust(16) for k in kinds))
        for key, name in [("steps", "steps")] + ROWS[:9] + [ROWS[11], ROWS[13]]:
            vals = [kinds[k].get(key) for k in kinds]
            out.append(name.ljust(34) + "".join(
                ("-" if v is None else (str(v) if isinstance(v, int) else f"{v:.3f}")).rjust(16)
                for v in vals))
        for label in sorted({k for v in kinds.values() for k in v.get("spans_mean_ms", {})}):
            vals = [kinds[k].get("spans_mean_ms", {}).get(label, 0.0) for k in kinds]
            out.append(f"in {label} (mean ms)".ljust(34)
                       + "".join(f"{v:.3f}".rjust(16) for v in vals))
    out.extend(_render_by_bs(results, labels))
    return "\n".join(out)


def _render_time_by_category(results: dict, labels: list, width: int) -> list:
    """Where each server's time went (ms summed over the steps of each category; steps in
    brackets), against the baseline: on the same load, the differences add up to the
    difference in total time."""
    tables = [results[lab].get("time_by_category") or {} for lab in labels]
    if not any(tables):
        return []
    out = ["",
           "time by step category (ms [steps])".ljust(34)
           + "".join(lab.rjust(width) for lab in labels)]
    main = ("prefills", AFTER_LABEL, OTHER_LABEL)
    kinds = sorted({c for t in tables for c in t if c not in main})

    def row(name, cat, diff: bool) -> str:
        cells = []
        for i, t in enumerate(tables):
            if cat is None:  # all steps
                ms, n = (sum(t[c]["ms"] for c in main if c in t),
                         sum(t[c]["steps"] for c in main if c in t))
                b = sum(tables[0][c]["ms"] for c in main if c in tables[0])
            else:
                ms, n = (t[cat]["ms"], t[cat]["steps"]) if cat in t else (0.0, 0)
                b = tables[0][cat]["ms"] if cat in tables[0] else 0.0
            cell = f"{ms:.1f} [{n}]" + (f" ({ms - b:+.1f})" if diff and i else "")
            cells.append(cell.rjust(width))
        return name.ljust(34) + "".join(cells)

    out += [row(c, c, True) for c in main]
    out += [row("  " + c[len(OTHER_LABEL) + 2:], c, False) for c in kinds]
    out.append(row("all steps but pauses", None, True))
    return out


def _render_by_bs(results: dict, labels: list) -> list:
    """Steady decode steps per (batch size, sampling, kind) of every server, each row against the
    baseline's steps of the same batch size and sampling (its first kind: a server without
    speculation has only "plain")."""
    base = {}
    for g in results[labels[0]].get("by_bs_kind", []):
        base.setdefault((g["bs"], g.get("sampling", "")), g)
    rows = [(lab, g) for lab in labels for g in results[lab].get("by_bs_kind", [])]
    if not rows:
        return []
    device = any("gpu_span_median" in g for _, g in rows)
    parts = any("gpu_rest_median" in g for _, g in rows)
    out = ["",
           f"decode steps by batch size, sampling and kind (steady, {MIN_GROUP}+ steps; vs "
           f"{labels[0]} at that batch size and sampling)",
           f"  {'server':<14}{'bs':>4}  "
           f"{'sampling':<9}{'kind':<11}{'steps':>7}{'period median':>22}{'period mean':>22}"
           f"{'busy median':>13}{'wait median':>13}{'late':>7}"
           + (f"{'gpu span median':>24}{'gpu gap mean':>14}" if device else "")
           + (f"{'forward':>9}{'sample':>8}{'rest':>8}" if parts else "")]
    for lab, g in sorted(rows,
                         key=lambda x: (x[1]["bs"], x[1].get("sampling", ""), labels.index(x[0]))):
        b = base.get((g["bs"], g.get("sampling", ""))) if lab != labels[0] else None

        def rel(key):
            v = g[key]
            if b is None or key not in b:
                return f"{v:.3f}"
            return f"{v:.3f} ({100.0 * (v / b[key] - 1.0):+.1f} %)"
        out.append(f"  {lab[:14]:<14}{g['bs']:>4}  "
                   f"{g.get('sampling') or '-':<9}{g['kind']:<11}{g['steps']:>7}"
                   f"{rel('period_median'):>22}"
                   f"{rel('period_mean'):>22}{g['busy_median']:>13.3f}{g['wait_median']:>13.3f}"
                   f"{g['late_share']:>7.3f}"
                   + ((f"{rel('gpu_span_median'):>24}{g['gpu_gap_mean']:>14.3f}"
                       if "gpu_span_median" in g else f"{'-':>24}{'-':>14}") if device else "")
                   + ("".join(f"{_cell(g.get(key), None):>{w}}" for key, w in
                              (("gpu_forward_median", 9), ("gpu_sample_median", 8),
                               ("gpu_rest_median", 8)))
                      if parts else ""))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("servers", nargs="+",
                    help="LABEL=DIR (a server's FASTVERIFY_STEP_TRACE folder) or "
                    "LABEL=FILE; the first is the baseline")
    ap.add_argument("--pause-s", type=float, default=PAUSE_S,
                    help="longer gaps between launches are pauses " "(default %(default)s)")
    ap.add_argument("--segments", action="store_true",
                    help="list each server's busy stretches (split at "
                    "gaps longer than --split-s: each load a client ran) instead of the statistics")
    ap.add_argument("--split-s", type=float, default=SPLIT_S,
                    help="gap that separates two stretches " "(default %(default)s)")
    ap.add_argument("--segment", action="append", default=[], metavar="[LABEL:]I",
                    help="only stretch I (0-based, as --segments lists them) of LABEL's trace, or "
                    "of every trace without a label; repeatable")
    ap.add_argument("--long-ms", type=float, default=LONG_MS,
                    help="list the decode steps longer than this "
                    "one by one (default %(default)s)")
    ap.add_argument("--json", help="write the statistics here")
    args = ap.parse_args(argv)
    chosen = {}
    for spec in args.segment:
        label, _, idx = spec.rpartition(":")
        try:
            chosen[label] = int(idx)
        except ValueError:
            ap.error(f"--segment {spec!r}: expected [LABEL:]INDEX")
    results, sources = {}, {}
    for spec in args.servers:
        label, path = common.split_label(spec, lambda p: Path(p).name)
        try:
            f, records = load_server(path)
        except (OSError, ValueError) as e:
            print(f"step_trace: {e}", file=sys.stderr)
            return 2
        segs = segments(records, args.split_s)
        if args.segments:
            t0 = segs[0][0]
            print(f"{label}: {len(segs)} stretches ({f})")
            for i, (a, b, n) in enumerate(segs):
                print(f"  {i:3d}  at {a - t0:8.2f} s  {n:6d} launches  {b - a:7.2f} s")
            continue
        idx = chosen.get(label, chosen.get(""))
        if idx is not None:
            if not -len(segs) <= idx < len(segs):
                print(f"step_trace: {label}: no stretch {idx} (it has {len(segs)})",
                      file=sys.stderr)
                return 2
            records = in_window(records, segs[idx][0], segs[idx][1])
            sources[label] = f"{f} stretch {idx}"
        else:
            sources[label] = str(f)
        results[label] = analyze(records, args.pause_s, args.long_ms)
    if args.segments:
        return 0
    print(render(results))
    if args.json:
        common.write_json(args.json, {"files": sources, "results": results},
                          common.repro_command(sys.argv[1:] if argv is None
                                               else list(argv), SCRIPT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
