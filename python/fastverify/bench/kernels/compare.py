#!/usr/bin/env python3
"""Regression gate: compare a kernel-benchmark JSON against a stored baseline.

For each kernel of the baseline the ratio is ``current / baseline``, each time normalized by a
reference measured in the same run, so that a uniformly faster or slower machine (or host) does
not read as a regression: ``(cur.us / cur.ref) / (base.us / base.ref)``. Graph-timed entries use
the 64 MiB copy (``reference``: device speed); eager, host-bound entries use ``host_reference``
(host speed) when both files have one, else the copy. ``--absolute`` compares raw times.

Threshold per entry: the one the baseline entry states (``threshold``, ``threshold_why``: format
/2), else the default of its mode (``--threshold`` for graph entries, ``--host-threshold`` for
eager ones: a baseline of format /1 states none). The table prints each entry's limit and why;
the legend under it gives the reasons in full. An entry whose timing mode differs between the two
files (a kernel made graph-safe, say) cannot be compared: it reads REBASELINE and does not fail.
Exit status: 0 all within their limits; 1 a kernel regressed, went missing or became wrong;
2 bad input.

  python benchmark/kernels/compare.py BASELINE.json CURRENT.json [--threshold 0.15]
  python benchmark/kernels/compare.py --extract-allreduce allreduce.json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fastverify.bench import common

FORMAT = "fastverify-kernel-bench/1"     # what --extract-allreduce writes (no host reference)
FORMATS = (FORMAT, "fastverify-kernel-bench/2")   # /2: runs, host_reference, per-entry threshold
DEFAULT_WHY = {"graph": "default for graph entries (the baseline states none)",
               "eager": "default for host-bound entries (the baseline states none)"}


class BenchFileError(ValueError):
    pass


def load(path: str) -> Dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BenchFileError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise BenchFileError(f"{path}: not JSON ({e})") from None
    if data.get("format") not in FORMATS:
        raise BenchFileError(f"{path}: format {data.get('format')!r}, expected "
                             + " or ".join(repr(f) for f in FORMATS))
    ref = data.get("reference") or {}
    if not isinstance(ref.get("us"), (int, float)) or ref["us"] <= 0:
        raise BenchFileError(f"{path}: reference.us must be a positive number")
    if not isinstance(data.get("kernels"), dict):
        raise BenchFileError(f"{path}: 'kernels' must be an object")
    return data


def _host_ref(data: Dict[str, Any]) -> Optional[float]:
    us = (data.get("host_reference") or {}).get("us")
    return us if isinstance(us, (int, float)) and us > 0 else None


def compare(base: Dict[str, Any], cur: Dict[str, Any], threshold: float, absolute: bool = False,
            host_threshold: float = 1.0) -> Tuple[List[Dict[str, Any]], bool]:
    """Rows (kernel, mode, baseline us, current us, ratio, limit, basis, why, status) and whether
    everything passed. ``threshold``/``host_threshold``: for entries whose baseline states none."""
    rows = []
    ok = True
    bref, cref = base["reference"]["us"], cur["reference"]["us"]
    bhost, chost = _host_ref(base), _host_ref(cur)
    for name, b in base["kernels"].items():
        if "us" not in b:
            continue  # the baseline itself had no time for it
        mode = b.get("mode", "graph")
        if "threshold" in b:
            thr, why = float(b["threshold"]), str(b.get("threshold_why", "stated by the baseline"))
        else:
            thr = host_threshold if mode == "eager" else threshold
            why = DEFAULT_WHY.get(mode, DEFAULT_WHY["graph"])
        row = {"kernel": name, "mode": mode, "base_us": b["us"], "cur_us": None, "ratio": None,
               "limit": 1.0 + thr, "basis": "", "why": why}
        rows.append(row)
        c = cur["kernels"].get(name)
        if c is None:
            row["status"] = "MISSING"
            ok = False
            continue
        if "us" not in c:
            row["status"] = "ERROR: " + str(c.get("error", "no time"))
            ok = False
            continue
        row["cur_us"] = c["us"]
        if c.get("mode", "graph") != mode:
            row["status"] = f"REBASELINE (mode {mode} -> {c.get('mode', 'graph')})"
            continue
        if absolute:
            row["ratio"], row["basis"] = c["us"] / b["us"], "absolute"
        elif mode == "eager" and bhost and chost:
            row["ratio"], row["basis"] = (c["us"] / chost) / (b["us"] / bhost), "/host ref"
        else:
            row["ratio"] = (c["us"] / cref) / (b["us"] / bref)
            row["basis"] = "/copy" if mode != "eager" else "/copy (no host ref)"
        row["status"] = "ok" if row["ratio"] <= row["limit"] else "REGRESSED"
        ok = ok and row["status"] == "ok"
    for name in cur["kernels"]:
        if name not in base["kernels"]:
            rows.append({"kernel": name, "mode": cur["kernels"][name].get("mode", "graph"),
                         "base_us": None, "cur_us": cur["kernels"][name].get("us"), "ratio": None,
                         "limit": None, "basis": "", "why": "", "status": "new"})
    return rows, ok


def format_rows(rows: List[Dict[str, Any]]) -> str:
    """The table, then a legend: each distinct reason once, numbered as in the table's why."""
    whys: List[str] = []
    for r in rows:
        if r["why"] and r["why"] not in whys:
            whys.append(r["why"])
    table = common.format_table(
        ["kernel", "mode", "base us", "cur us", "ratio", "limit", "basis", "why", "status"],
        [[r["kernel"], r["mode"], r["base_us"], r["cur_us"], r["ratio"], r["limit"], r["basis"],
          f"[{whys.index(r['why']) + 1}]" if r["why"] else "", r["status"]] for r in rows],
        floatfmt="{:.3f}")
    legend = [f"# [{i + 1}] {w}" for i, w in enumerate(whys)]
    return "\n".join([table, "# why: the reason for the entry's limit"] + legend)


def verdict(rows: List[Dict[str, Any]], ok: bool) -> str:
    """One line: PASS/FAIL, the worst ratio against its limit, what failed and what needs a new
    baseline."""
    timed = [r for r in rows if r["ratio"] is not None]
    worst = max(timed, key=lambda r: r["ratio"] / r["limit"], default=None)
    bad = [f"{r['kernel']} {r['status']}" + (f" {r['ratio']:.2f}x" if r["ratio"] else "")
           for r in rows if r["status"] not in ("ok", "new") and
           not r["status"].startswith("REBASELINE")]
    rebase = sum(r["status"].startswith("REBASELINE") for r in rows)
    line = "PASS" if ok else "FAIL"
    if worst:
        line += (f"; worst {worst['kernel']} {worst['ratio']:.2f}x (limit {worst['limit']:.2f})")
    if bad:
        line += "; " + ", ".join(bad)
    if rebase:
        line += f"; {rebase} entr{'y' if rebase == 1 else 'ies'} need a new baseline (mode changed)"
    return line


def extract_allreduce(ar_json: Dict[str, Any]) -> Dict[str, Any]:
    """Turn an allreduce_vs_compute.py JSON into kernel-bench form: one kernel per backend and
    token count (graph per-call latency, and the add+RMSNorm pass where measured). The reference
    is the default NCCL
    all-reduce of the smallest size in the same run."""
    rows = ar_json.get("summary", {}).get("rows", [])
    good = [r for r in rows if not r.get("error") and r.get("ar_graph_us")]
    ref = next((r for r in sorted(good, key=lambda r: r["tokens"]) if r["backend"] == "nccl"), None)
    if ref is None:
        raise BenchFileError("the all-reduce JSON has no correct default-NCCL row to use as the "
                             "reference")
    kernels: Dict[str, Any] = {}
    for r in good:
        kernels[f"allreduce/{r['backend']}/T={r['tokens']}"] = {"us": r["ar_graph_us"]}
        if r.get("arnorm_pass_us"):
            n = ar_json["plan"]["allreduces_per_pass"]
            kernels[f"allreduce_add_rmsnorm/{r['backend']}/T={r['tokens']}"] = {
                "us": r["arnorm_pass_us"] / n}
    for v in kernels.values():
        v["ref_ratio"] = v["us"] / ref["ar_graph_us"]
    return {"format": FORMAT,
            "reference": {"name": f"allreduce/nccl/T={ref['tokens']}", "us": ref["ar_graph_us"]},
            "kernels": kernels, "source": ar_json.get("repro_command", "")}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="compare kernel benchmarks against a baseline")
    ap.add_argument("baseline", nargs="?")
    ap.add_argument("current", nargs="?")
    ap.add_argument("--threshold", type=float, default=0.15,
                    help="allowed slowdown of graph entries whose baseline states none "
                         "(0.15 = 15%%)")
    ap.add_argument("--host-threshold", type=float, default=1.0,
                    help="the same for eager (host-bound) entries (1.0 = 2x)")
    ap.add_argument("--absolute", action="store_true",
                    help="compare raw times, not reference-normalized ratios")
    ap.add_argument("--extract-allreduce", nargs=2, metavar=("ALLREDUCE_JSON", "OUT_JSON"),
                    help="write the all-reduce kernels of an allreduce_vs_compute.py run in "
                         "kernel-bench form")
    args = ap.parse_args(argv)
    try:
        if args.extract_allreduce:
            src, dst = args.extract_allreduce
            try:
                data = json.loads(Path(src).read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise BenchFileError(f"{src}: {e}") from None
            out = extract_allreduce(data)
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            Path(dst).write_text(json.dumps(out, indent=1) + "\n")
            print(f"wrote {len(out['kernels'])} kernels to {dst}")
            return 0
        if not (args.baseline and args.current):
            ap.error("give BASELINE and CURRENT (or --extract-allreduce)")
        for flag in ("threshold", "host_threshold"):
            if getattr(args, flag) < 0:
                ap.error(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
        base, cur = load(args.baseline), load(args.current)
    except BenchFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, ok = compare(base, cur, args.threshold, args.absolute, args.host_threshold)
    hb, hc = _host_ref(base), _host_ref(cur)
    print(f"# baseline {args.baseline}: {base['format']}, "
          f"reference {base['reference']['us']:.2f} us"
          + (f", host reference {hb:.2f} us" if hb else ", no host reference"))
    print(f"# current {args.current}: {cur['format']}, reference {cur['reference']['us']:.2f} us"
          + (f", host reference {hc:.2f} us" if hc else ", no host reference"))
    print(f"# ratios: {'absolute' if args.absolute else 'normalized by the same run reference'}; "
          "ok when ratio <= limit")
    print(format_rows(rows))
    print("# result: " + verdict(rows, ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
