"""What one piece of host work costs a decode step, measured inside one server's process.

Two servers' step periods differ by their processes' own offsets: two identical auto servers on one
H200 came out 0.07 ms a step apart (benchmark/results/h200/twins-smollm2-tp1/), as large as the
costs looked for. With ``FASTVERIFY_STEP_TRACE_AB`` (lab/steptrace/steptrace.py) a server's decode
steps alternate in blocks between variant ``a`` (as it runs) and ``b`` (the same plus one piece of
work); this sets each ``b`` block against the ``a`` block right before it, so that what drifts over
minutes (the host's speed, the load's batch sizes) cancels in each pair:

    python lab/ab_within.py [LABEL=]DIR [...] [--kind path] [--json OUT.json]

For every pair of blocks and batch size with at least ``--min-steps`` steady decode steps in both
blocks: the median period of the ``b`` steps less that of the ``a`` steps; a pair's difference is
the mean of its batch sizes' weighted by the smaller count, the estimate the mean over pairs
weighted the same way, with a 95 % bootstrap interval over pairs. ``--kind path`` keeps the steps
of auto's plain decode path only (for a piece of work added to those alone). A server's
medians per variant are printed as well. DIR is a server's ``FASTVERIFY_STEP_TRACE`` folder (or
one file of it); the first process with steps is read, as lab/step_trace.py does.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # lab/step_trace.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # a checkout
import step_trace  # noqa: E402

from fastverify.bench import common  # noqa: E402

SCRIPT = "lab/ab_within.py"
MIN_STEPS = 4  # steps of one batch size a block needs in both blocks of a pair to count
BOOT_REPS = 2000
BOOT_SEED = 0


def blocks(rows) -> list:
    """[(variant, [row, ...]), ...]: runs of consecutive launches of the same variant, in launch
    order (rows without a variant end a run and belong to none)."""
    out, cur, last = [], None, None
    for r in sorted(rows, key=lambda r: r["index"]):
        v = r.get("variant")
        if v is None:
            cur, last = None, None
            continue
        if cur is None or v != last or r["index"] != cur[1][-1]["index"] + 1:
            cur = (v, [])
            out.append(cur)
        cur[1].append(r)
        last = v
    return out


def pair_differences(all_rows, keep, min_steps: int = MIN_STEPS) -> list:
    """[(ms b less a, weight), ...], one per pair of an ``a`` block and the ``b`` block right after
    it that share a batch size with ``min_steps`` steps kept (``keep(row)``) in each. Blocks are cut
    from every launch (``all_rows``), so that a step ``keep`` leaves out still belongs to its block
    and does not join two blocks into one."""
    runs = blocks(all_rows)
    out = []
    for (va, ra), (vb, rb) in zip(runs, runs[1:]):
        if (va, vb) != ("a", "b") or ra[-1]["index"] + 1 != rb[0]["index"]:
            continue
        by_bs: dict = {}
        for variant, rows in (("a", ra), ("b", rb)):
            for r in rows:
                if keep(r):
                    by_bs.setdefault(r["bs"], {"a": [], "b": []})[variant].append(r["period"])
        num = den = 0.0
        for periods in by_bs.values():
            n = min(len(periods["a"]), len(periods["b"]))
            if n < min_steps:
                continue
            diff = statistics.median(periods["b"]) - statistics.median(periods["a"])
            num += n * diff
            den += n
        if den:
            out.append((1000.0 * num / den, den))
    return out


def estimate(pairs, reps: int = BOOT_REPS, seed: int = BOOT_SEED) -> dict:
    """The weighted mean of the pairs' differences (ms) and its 95 % bootstrap interval over
    pairs."""
    if not pairs:
        return {"pairs": 0, "ms": None, "lo": None, "hi": None}

    def mean(sample):
        w = sum(p[1] for p in sample)
        return sum(p[0] * p[1] for p in sample) / w

    rng = random.Random(seed)
    boots = sorted(mean([pairs[rng.randrange(len(pairs))] for _ in pairs]) for _ in range(reps))
    return {"pairs": len(pairs), "ms": mean(pairs), "lo": boots[int(0.025 * (reps - 1))],
            "hi": boots[int(0.975 * (reps - 1))]}


def analyze(records, kind: str | None = None, min_steps: int = MIN_STEPS) -> dict:
    rows = step_trace.steps(records)
    steady = {id(r) for r in step_trace.steady_steps(rows)}

    def keep(r):
        return id(r) in steady and (kind is None or r["kind"] == kind)

    kept = [r for r in rows if keep(r) and r.get("variant") in ("a", "b")]
    per_variant = {}
    for v in ("a", "b"):
        periods = [r["period"] for r in kept if r["variant"] == v]
        per_variant[v] = {"steps": len(periods),
                          "median_ms": 1000.0 * statistics.median(periods) if periods else None}
    est = estimate(pair_differences(rows, keep, min_steps))
    return {"kind": kind, "variants": per_variant, "b_minus_a": est}


def render(results: dict) -> str:
    columns = ["server", "steps a", "steps b", "median a ms", "median b ms", "pairs",
               "b - a ms (paired)", "95 % interval"]
    table = []
    for label, res in results.items():
        a, b, e = res["variants"]["a"], res["variants"]["b"], res["b_minus_a"]

        def ms(x):
            return "-" if x is None else f"{x:.4f}"

        table.append([label, a["steps"], b["steps"], ms(a["median_ms"]), ms(b["median_ms"]),
                      e["pairs"], ms(e["ms"]),
                      "-" if e["lo"] is None else f"[{e['lo']:.4f}, {e['hi']:.4f}]"])
    kinds = {res["kind"] for res in results.values()}
    what = "steady decode steps"
    if kinds != {None}:
        what += f" of kind {', '.join(map(str, sorted(kinds, key=str)))}"
    return (f"# within-process A/B: variant b less variant a, {what} (adjacent blocks paired)\n"
            + common.format_table(columns, table))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("servers", nargs="+", help="[LABEL=]DIR (a server's FASTVERIFY_STEP_TRACE "
                    "folder) or [LABEL=]FILE")
    ap.add_argument("--kind", help="only steps of this kind (path: auto's plain decode path)")
    ap.add_argument("--min-steps", type=int, default=MIN_STEPS,
                    help="steps of one batch size each block of a pair needs (default %(default)s)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args(argv)
    if args.min_steps < 1:
        ap.error("--min-steps must be >= 1")
    results, sources = {}, {}
    for spec in args.servers:
        label, path = common.split_label(spec, lambda p: Path(p).name)
        try:
            f, records = step_trace.load_server(path)
        except (OSError, ValueError) as e:
            print(f"ab_within: {e}", file=sys.stderr)
            return 2
        if not any(r[0] == "R" and len(r) > 10 and r[10] in ("a", "b") for r in records):
            print(f"ab_within: {f}: no step carries a variant (was FASTVERIFY_STEP_TRACE_AB "
                  "set for this server?)", file=sys.stderr)
            return 2
        sources[label] = str(f)
        results[label] = analyze(records, args.kind, args.min_steps)
    print(render(results))
    if args.json:
        common.write_json(args.json, {"files": sources, "results": results},
                          common.repro_command(sys.argv[1:] if argv is None else argv, SCRIPT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
