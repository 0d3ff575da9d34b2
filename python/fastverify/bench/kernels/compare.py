#!/usr/bin/env python3
"""Regression gate: compare a kernel-benchmark JSON against a stored baseline.

For each kernel of the baseline the ratio is ``current / baseline``, normalized by the reference measured in
the same run (``(cur.us / cur.ref_us) / (base.us / base.ref_us)``) so that a uniformly faster or slower
machine of the same kind does not read as a regression; ``--absolute`` compares raw times instead.
Exit status: 0 all within ``1 + threshold``; 1 a kernel regressed, went missing or became wrong; 2 bad input.

  python benchmark/kernels/compare.py BASELINE.json CURRENT.json [--threshold 0.15]
  python benchmark/kernels/compare.py --extract-allreduce allreduce.json OUT.json   # all-reduce kernels
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fastverify.bench import common

FORMAT = "fastverify-kernel-bench/1"


class BenchFileError(ValueError):
    pass


def load(path: str) -> Dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BenchFileError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise BenchFileError(f"{path}: not JSON ({e})") from None
    if data.get("format") != FORMAT:
        raise BenchFileError(f"{path}: format {data.get('format')!r}, expected {FORMAT!r}")
    ref = data.get("reference") or {}
    if not isinstance(ref.get("us"), (int, float)) or ref["us"] <= 0:
        raise BenchFileError(f"{path}: reference.us must be a positive number")
    if not isinstance(data.get("kernels"), dict):
        raise BenchFileError(f"{path}: 'kernels' must be an object")
    return data


def compare(base: Dict[str, Any], cur: Dict[str, Any], threshold: float, absolute: bool = False
            ) -> Tuple[List[Dict[str, Any]], bool]:
    """Rows (kernel, baseline us, current us, ratio, status) and whether everything passed."""
    rows = []
    ok = True
    bref, cref = base["reference"]["us"], cur["reference"]["us"]
    for name, b in base["kernels"].items():
        if "us" not in b:
            continue  # the baseline itself had no time for it
        c = cur["kernels"].get(name)
        if c is None:
            rows.append({"kernel": name, "base_us": b["us"], "cur_us": None, "ratio": None, "status": "MISSING"})
            ok = False
            continue
        if "us" not in c:
            rows.append({"kernel": name, "base_us": b["us"], "cur_us": None, "ratio": None,
                         "status": "ERROR: " + str(c.get("error", "no time"))})
            ok = False
            continue
        ratio = c["us"] / b["us"] if absolute else (c["us"] / cref) / (b["us"] / bref)
        status = "ok" if ratio <= 1.0 + threshold else "REGRESSED"
        ok = ok and status == "ok"
        rows.append({"kernel": name, "base_us": b["us"], "cur_us": c["us"], "ratio": ratio, "status": status})
    for name in cur["kernels"]:
        if name not in base["kernels"]:
            rows.append({"kernel": name, "base_us": None, "cur_us": cur["kernels"][name].get("us"), "ratio": None,
                         "status": "new"})
    return rows, ok


def extract_allreduce(ar_json: Dict[str, Any]) -> Dict[str, Any]:
    """Turn an allreduce_vs_compute.py JSON into kernel-bench form: one kernel per backend and token count
    (graph per-call latency, and the add+RMSNorm pass where measured). The reference is the default NCCL
    all-reduce of the smallest size in the same run."""
    rows = ar_json.get("summary", {}).get("rows", [])
    good = [r for r in rows if not r.get("error") and r.get("ar_graph_us")]
    ref = next((r for r in sorted(good, key=lambda r: r["tokens"]) if r["backend"] == "nccl"), None)
    if ref is None:
        raise BenchFileError("the all-reduce JSON has no correct default-NCCL row to use as the reference")
    kernels: Dict[str, Any] = {}
    for r in good:
        kernels[f"allreduce/{r['backend']}/T={r['tokens']}"] = {"us": r["ar_graph_us"]}
        if r.get("arnorm_pass_us"):
            n = ar_json["plan"]["allreduces_per_pass"]
            kernels[f"allreduce_add_rmsnorm/{r['backend']}/T={r['tokens']}"] = {"us": r["arnorm_pass_us"] / n}
    for v in kernels.values():
        v["ref_ratio"] = v["us"] / ref["ar_graph_us"]
    return {"format": FORMAT, "reference": {"name": f"allreduce/nccl/T={ref['tokens']}", "us": ref["ar_graph_us"]},
            "kernels": kernels, "source": ar_json.get("repro_command", "")}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="compare kernel benchmarks against a baseline")
    ap.add_argument("baseline", nargs="?")
    ap.add_argument("current", nargs="?")
    ap.add_argument("--threshold", type=float, default=0.15, help="allowed slowdown (0.15 = 15%%)")
    ap.add_argument("--absolute", action="store_true", help="compare raw times, not reference-normalized ratios")
    ap.add_argument("--extract-allreduce", nargs=2, metavar=("ALLREDUCE_JSON", "OUT_JSON"),
                    help="write the all-reduce kernels of an allreduce_vs_compute.py run in kernel-bench form")
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
        if args.threshold < 0:
            ap.error("--threshold must be >= 0")
        base, cur = load(args.baseline), load(args.current)
    except BenchFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, ok = compare(base, cur, args.threshold, args.absolute)
    print(f"# baseline {args.baseline} (reference {base['reference']['us']:.2f} us), current {args.current} "
          f"(reference {cur['reference']['us']:.2f} us); {'absolute' if args.absolute else 'reference-normalized'} "
          f"ratios; threshold {1 + args.threshold:.2f}")
    print(common.format_table(["kernel", "base us", "cur us", "ratio", "status"],
                              [[r["kernel"], r["base_us"], r["cur_us"], r["ratio"], r["status"]] for r in rows],
                              floatfmt="{:.3f}"))
    print("# result: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
