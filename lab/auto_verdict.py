"""Does auto verify meet its goal in a run of lab/gpu/auto_check.sh? Reads the client
JSONs, prints the verdict.

    python lab/auto_verdict.py DIR [--json OUT] [--goal 0.98] [--auto m_auto]

DIR holds the serving client's results named <server>_<load>_r<round>.json (m_plain_sampled_r1.json,
...), as auto_check.sh writes them. For every load (greedy = repetitive, sampled = non-repetitive)
and concurrency it takes each server's median output tok/s over its rounds (the range next to it)
and compares auto with no speculation (m_plain) and with the best server of that column. The goal
(issue: auto >= 0.98x the best mode on each load and never below no speculation) is judged per
column: "met" only when auto's median is at least `--goal` times the best and at least no
speculation's. Servers other than m_plain and m_auto (m_tree, m_chain, m_chain_w, ...) are listed
and count as candidates for the best; other auto servers (m_auto_sp, m_auto_pf, m_auto_sync: the
same mode with other settings) are listed and do not. `--auto NAME` judges another of them as auto
instead (m_auto then is listed as a variant). A second server without speculation (m_plain2, the
same flags in another process) measures the floor of the comparison: the column then shows how far
apart two identical servers are, and auto is held to the faster of them. No GPU: it reads files.

Paired per request: both servers serve the same prompts in the same order, so each request of auto's
round can be set against the same request of m_plain's round (same prompt, same position, same
number of output tokens): its speed ratio is m_plain's latency over auto's. The mean over the
requests and a 95 % bootstrap interval (resampled requests, fixed seed) say whether auto is below no
speculation beyond the spread of the requests themselves: "below" when the whole interval is under
1, "above" when it is over 1, "level" otherwise. Next to it the same ratio per output token (TPOT)
and the mean difference in time to first token. The interval holds the requests' spread, not the
spread between two server processes: two identical servers without speculation came out "above" each
other in 2 of 8 such comparisons on the 2x H200 (results/h200x2/auto/run28 r1, c=1 and c=4).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
from pathlib import Path

NAME = re.compile(r"^(?P<server>m_\w+?)_(?P<load>greedy|sampled)_r(?P<round>\d+)\.json$")
LOADS = {"greedy": "repetitive (greedy)", "sampled": "non-repetitive (temperature 1)"}
AUTO = "m_auto"
PLAIN = "m_plain"
# m_plain and its twins (m_plain2, ...): servers without speculation
PLAINS = re.compile(r"^m_plain\d*$")
BOOTSTRAP = 2000  # resamples of the paired requests
SEED = 0


def result_files(folder: Path) -> dict:
    """{(server, load, round): path} of the client results in `folder`, in file-name order."""
    found = {}
    for path in sorted(folder.iterdir()):
        m = NAME.match(path.name)
        if m:
            found[(m["server"], m["load"], int(m["round"]))] = path
    return found


def _levels(path: Path) -> list:
    """The concurrency levels of one client result."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))["levels"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"error: {path}: not a serving-client result ({e})") from None


def collect(folder: Path) -> dict:
    """{(load, concurrency): {server: [tok/s per round]}} from the client JSONs in `folder`."""
    found: dict = {}
    for (server, load, _rnd), path in result_files(folder).items():
        for lv in _levels(path):
            rate = (lv.get("summary") or {}).get("output_tok_per_s")
            if rate:
                key = (load, int(lv["concurrency"]))
                found.setdefault(key, {}).setdefault(server, []).append(rate)
    return found


def _requests(path: Path) -> dict:
    """{concurrency: [request records]} of one client result (levels without
    per-request records: none)."""
    return {int(lv["concurrency"]): lv.get("requests") or [] for lv in _levels(path)}


def paired_ratio(auto_reqs: list, plain_reqs: list) -> dict | None:
    """The same requests on both servers (prompt, position and output tokens alike): mean of
    m_plain's latency over auto's and its 95 % bootstrap interval, the same per output token
    (TPOT), and the mean difference in time to first token (auto - m_plain, ms). None without
    two requests to pair."""
    def key(r):
        return r.get("prompt_id"), r.get("index"), r.get("output_tokens")

    plain = {key(r): r for r in plain_reqs if r.get("latency_s")}
    pairs = [(plain[key(r)], r) for r in auto_reqs if r.get("latency_s") and key(r) in plain]
    if len(pairs) < 2:
        return None
    speed = [p["latency_s"] / a["latency_s"] for p, a in pairs]
    rng = random.Random(SEED)
    means = sorted(statistics.fmean(rng.choices(speed, k=len(speed))) for _ in range(BOOTSTRAP))
    lo, hi = means[int(0.025 * BOOTSTRAP)], means[int(0.975 * BOOTSTRAP) - 1]
    tpot = [p["tpot_s"] / a["tpot_s"] for p, a in pairs if p.get("tpot_s") and a.get("tpot_s")]
    ttft = [1000.0 * (a["ttft_s"] - p["ttft_s"]) for p, a in pairs
            if p.get("ttft_s") is not None and a.get("ttft_s") is not None]
    mean = statistics.fmean(speed)
    return {"n": len(pairs), "speed": round(mean, 4), "lo": round(lo, 4), "hi": round(hi, 4),
            "side": "below" if hi < 1.0 else "above" if lo > 1.0 else "level",
            "tpot": round(statistics.fmean(tpot), 4) if tpot else None,
            "ttft_ms": round(statistics.fmean(ttft), 1) if ttft else None}


def paired(folder: Path, auto: str = AUTO) -> dict:
    """{(load, concurrency): {round: paired_ratio}} for every round in which both
    ``auto`` and m_plain ran."""
    out: dict = {}
    files = result_files(folder)
    for (server, load, rnd), path in sorted(files.items()):
        other = files.get((PLAIN, load, rnd))
        if server != auto or other is None:
            continue
        a, p = _requests(path), _requests(other)
        for conc in sorted(set(a) & set(p)):
            res = paired_ratio(a[conc], p[conc])
            if res is not None:
                out.setdefault((load, conc), {})[f"r{rnd}"] = res
    return out


def is_variant(server: str, auto: str) -> bool:
    """Another auto server than the one judged (m_auto_sp, m_auto_pf, ... or m_auto itself
    when another is judged): the same mode with other settings, listed but not a
    competitor for the best."""
    return server != auto and server.startswith(AUTO)


def verdict(found: dict, goal: float = 0.98, auto: str = AUTO) -> list:
    """One row per (load, concurrency): medians and ranges per server, ``auto``'s ratios and whether
    the goal holds (against the best of the other servers, auto variants left out)."""
    rows = []
    for (load, conc), servers in sorted(found.items()):
        med = {s: statistics.median(v) for s, v in servers.items()}
        best = max((s for s in med if not is_variant(s, auto)), key=med.get, default=None)
        if best is None:
            continue
        row = {"load": load, "concurrency": conc, "servers": {
            s: {"median": round(med[s], 1), "min": round(min(v), 1), "max": round(max(v), 1),
                "rounds": len(v)}
            for s, v in sorted(servers.items())}, "best": best, "auto": auto,
            "variants": sorted(s for s in med if is_variant(s, auto))}
        plains = [s for s in med if PLAINS.match(s)]
        if len(plains) > 1:  # identical servers: how far apart two processes of the same flags land
            row["plain_spread"] = round(min(med[s] for s in plains)
                                        / max(med[s] for s in plains), 3)
        if auto in med:
            row["auto_vs_best"] = round(med[auto] / med[best], 3)
            plain = max(plains, key=med.get) if plains else None
            row["auto_vs_plain"] = round(med[auto] / med[plain], 3) if plain else None
            row["met"] = row["auto_vs_best"] >= goal and (row["auto_vs_plain"] is None
                                                          or row["auto_vs_plain"] >= 1.0)
        rows.append(row)
    return rows


def format_rows(rows: list, goal: float) -> str:
    out = []
    for r in rows:
        out.append(f"{LOADS.get(r['load'], r['load'])}, c={r['concurrency']}: best {r['best']}")
        for s, v in r["servers"].items():
            tag = "  (auto, other settings: not a competitor)" if s in r.get("variants", ()) else ""
            out.append(f"  {s:14s} {v['median']:9.1f} tok/s  [{v['min']:.1f} .. {v['max']:.1f}, "
                       f"{v['rounds']} round(s)]{tag}")
        if "plain_spread" in r:
            out.append(f"  servers without speculation: the slower at {r['plain_spread']:.3f}x the "
                       "faster (the noise floor between identical processes)")
        if "met" in r:
            plain = "-" if r["auto_vs_plain"] is None else f"{r['auto_vs_plain']:.3f}"
            out.append(f"  auto ({r['auto']}): {r['auto_vs_best']:.3f}x the best, {plain}x no "
                       f"speculation -> goal (>= {goal}x best, >= 1x no speculation) "
                       f"{'MET' if r['met'] else 'NOT MET'}")
        for rnd, v in (r.get("paired") or {}).items():
            extra = ", ".join(x for x in (
                None if v["tpot"] is None else f"per token {v['tpot']:.4f}x",
                None if v["ttft_ms"] is None else f"first token {v['ttft_ms']:+.1f} ms") if x)
            out.append(f"  paired per request, {rnd}: auto {v['speed']:.4f}x no speculation "
                       f"[{v['lo']:.4f}, {v['hi']:.4f}] ({v['n']} "
                       f"requests{'; ' + extra if extra else ''}): {v['side']}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("folder", type=Path,
                    help="a run's folder of <server>_<load>_r<round>.json files")
    ap.add_argument("--goal", type=float, default=0.98,
                    help="auto's required share of the best server (0.98)")
    ap.add_argument("--json", dest="json_out", type=Path, default=None,
                    help="write the rows as JSON here")
    ap.add_argument("--auto", default=AUTO,
                    help="the server judged as auto (default m_auto; e.g. m_auto_sp); "
                    "the other m_auto* servers are listed, not counted for the best")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"error: {args.folder}: not a folder", file=sys.stderr)
        return 2
    found = collect(args.folder)
    if not found:
        print(f"error: {args.folder}: no <server>_<load>_r<round>.json client results",
              file=sys.stderr)
        return 2
    rows = verdict(found, args.goal, args.auto)
    pairs = paired(args.folder, args.auto)
    for r in rows:
        if (r["load"], r["concurrency"]) in pairs:
            r["paired"] = pairs[(r["load"], r["concurrency"])]
    print(f"# {args.folder}: median output tok/s over rounds")
    print(format_rows(rows, args.goal))
    judged = [r for r in rows if "met" in r]
    if judged:
        print(f"# goal met in {sum(r['met'] for r in judged)} of {len(judged)} columns")
    for load, name in LOADS.items():
        sides = [v["side"] for r in rows if r["load"] == load
                 for v in (r.get("paired") or {}).values()]
        if sides:
            print(f"# {name}, paired per request (95 % interval): auto below no speculation in "
                  f"{sides.count('below')}, level in {sides.count('level')}, above in "
                  f"{sides.count('above')} of {len(sides)} round columns")
    if args.json_out:
        args.json_out.write_text(json.dumps({"folder": str(args.folder), "goal": args.goal,
                                             "rows": rows},
                                            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
