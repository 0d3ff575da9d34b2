#!/usr/bin/env python3
"""The kernel gate, N times over: is it stable on an unchanged tree?

Runs the kernel benchmarks (`run.py`, each invocation already the median of ``--runs`` runs)
``--times`` times in one process and compares each result with the baseline (`compare.py`),
printing one verdict per time, then a line "passes K of N", and per entry its N ratios against
its limit (the spread a threshold must cover). Files under ``--out-dir``: kernels_<i>.json and
compare_<i>.txt per time, gate.json (verdicts and ratios), gate.txt (what was printed).

  fastverify bench gate benchmark/results/h200/kernels.json --times 5 --out-dir OUT [--runs 3]
  fastverify bench gate BASELINE --write-baseline OUT/new.json --times 5 ...   measure a new
      baseline first (written to the path) and compare the N times against it
  fastverify bench gate BASELINE --rehearse --times 5 ...   on a CPU: the same loop with the
      kernels run by CPU torch on the host clock (no graphs, no Triton kernel), against a
      baseline measured first in the same way; the stored BASELINE is only loaded and checked.
      It proves the plumbing (files, verdicts, exit status), not the H200 numbers.

Arguments not listed here go to the benchmark (--runs, --calls, --replays, --shapes, ...).
Exit status: 0 every time passed; 1 some time failed; 2 bad input or no GPU.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from fastverify.bench import common
from fastverify.bench.kernels import compare as cmp
from fastverify.bench.kernels import run as krun

SCRIPT = "benchmark/kernels/gate.py"


def gate_loop(measure: Callable[[], Dict[str, Any]], base: Dict[str, Any], times: int,
              compare_args: Dict[str, Any], out_dir: Optional[Path] = None,
              say: Callable[[str], None] = print) -> Dict[str, Any]:
    """``times`` measurements, each compared with ``base``; the verdicts and per-entry ratios."""
    verdicts: List[Dict[str, Any]] = []
    ratios: Dict[str, List[Optional[float]]] = {}
    limits: Dict[str, Any] = {}
    for i in range(1, times + 1):
        cur = measure()
        rows, ok = cmp.compare(base, cur, **compare_args)
        line = cmp.verdict(rows, ok)
        if out_dir is not None:
            (out_dir / f"kernels_{i}.json").write_text(json.dumps(cur, indent=1) + "\n")
            (out_dir / f"compare_{i}.txt").write_text(cmp.format_rows(rows) + "\n# result: "
                                                      + line + "\n")
        for r in rows:
            if r["limit"] is not None:
                ratios.setdefault(r["kernel"], []).append(r["ratio"])
                limits[r["kernel"]] = (r["mode"], r["limit"], r["basis"], r["why"])
        verdicts.append({"time": i, "ok": ok, "verdict": line})
        say(f"time {i}/{times}: {line}")
    passed = sum(v["ok"] for v in verdicts)
    say(f"# gate: passes {passed} of {times}")
    return {"times": times, "passed": passed, "verdicts": verdicts,
            "entries": {k: {"mode": m, "limit": lim, "basis": basis, "why": why,
                            "ratios": ratios[k]}
                        for k, (m, lim, basis, why) in limits.items()}}


def spread_table(res: Dict[str, Any]) -> str:
    rows = []
    for k, e in res["entries"].items():
        got = [r for r in e["ratios"] if r is not None]
        rows.append([k, e["mode"], e["limit"], max(got) if got else None,
                     " ".join("-" if r is None else f"{r:.2f}" for r in e["ratios"]), e["basis"]])
    return common.format_table(["kernel", "mode", "limit", "max ratio", "ratios", "basis"], rows,
                               floatfmt="{:.2f}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description="the kernel gate run N times (stability check)",
                                 epilog="other arguments go to the benchmark (run.py --help)")
    ap.add_argument("baseline", help="stored baseline JSON (benchmark/results/h200/kernels.json)")
    ap.add_argument("--times", type=int, default=5, help="benchmark + compare this many times")
    ap.add_argument("--out-dir", default="benchmark/results/local/gate")
    ap.add_argument("--write-baseline", default=None, metavar="PATH",
                    help="measure a new baseline first, write it here, compare against it")
    ap.add_argument("--rehearse", action="store_true",
                    help="CPU rehearsal: CPU torch on the host clock, baseline measured first")
    ap.add_argument("--threshold", type=float, default=0.15,
                    help="compare: graph entries whose baseline states no threshold")
    ap.add_argument("--host-threshold", type=float, default=1.0,
                    help="compare: eager entries whose baseline states no threshold")
    args, rest = ap.parse_known_args(argv)
    if args.times < 1:
        ap.error(f"--times must be >= 1, got {args.times}")
    bench_args = krun.parse_args(rest)
    try:
        base = cmp.load(args.baseline)
    except cmp.BenchFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.rehearse:
        import torch

        timer, dev = krun.host_timer, torch.device("cpu")
    else:
        try:
            common.require_gpus(1, "bench gate")
        except common.NoGpuError as e:
            return common.exit_no_gpu(e)
        common.enforce_no_multicast()
        timer, dev = krun.gpu_timer, None
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    printed = io.StringIO()

    def say(line: str) -> None:
        print(line, flush=True)
        printed.write(line + "\n")

    info = common.collect_env()
    say(common.format_preamble(info, {"argv": " ".join(argv)},
                               [f"baseline {args.baseline}: {base['format']}",
                                "rehearsal on CPU: host clock, CPU torch, no graphs"
                                if args.rehearse else "GPU: CUDA graphs where graph-safe"]))

    def measure() -> Dict[str, Any]:
        return krun.run(bench_args, timer=timer, dev=dev)

    if args.write_baseline or args.rehearse:
        path = Path(args.write_baseline or out_dir / "baseline.json")
        new = measure()
        new["env"] = info
        common.write_json(path, new, common.repro_command(rest, krun.SCRIPT))
        say(f"# new baseline: {path} ({len(new['kernels'])} entries, {new['runs']} run(s) each)")
        base = cmp.load(str(path))
    res = gate_loop(measure, base, args.times,
                    {"threshold": args.threshold, "host_threshold": args.host_threshold},
                    out_dir, say)
    say(spread_table(res))
    res.update(env=info, baseline=args.baseline, rehearsal=args.rehearse)
    common.write_json(out_dir / "gate.json", res, common.repro_command(argv, SCRIPT))
    (out_dir / "gate.txt").write_text(printed.getvalue())
    return 0 if res["passed"] == res["times"] else 1


if __name__ == "__main__":
    sys.exit(main())
