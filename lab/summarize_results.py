"""Compact summaries of GPU run folders: the numbers a run's raw files held, as JSON and a table.

    python lab/summarize_results.py auto   RESULTS/h200x2/auto   --out RESULTS/h200x2/auto/summary
    python lab/summarize_results.py client RESULTS/h200x2/e2e    --out RESULTS/h200x2/e2e/summary

`auto`: every `run*` folder made by lab/gpu/auto_check.sh: its commit, GPUs and versions
(env.txt), the servers with their launch flags (commands.txt), and auto_verdict.py's reading per
load and concurrency (median tok/s per server over rounds, auto against no speculation and the
best fixed mode, the goal, each round paired per request against no speculation). A run with
several auto servers (m_auto_op, m_auto_pl, ...) is judged once per auto server. `client`: any
folder tree of serving-client results (`*.json` with `levels`, or the printed table where the
JSON was not kept): per result file and level the request count, output tok/s, median TTFT and
TPOT, accept length.

Writes OUT.json (with `repro_command`) and OUT.txt. Made to keep the findings of runs whose raw
files left the tree; to remake them, check out the commit that still holds those files
(docs/journal.md names it).
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for where in (HERE, HERE.parent / "benchmark"):  # auto_verdict.py: in lab/ or in benchmark/
    if (where / "auto_verdict.py").exists():
        sys.path.insert(0, str(where))
        break
import auto_verdict as av  # noqa: E402

COMMIT = re.compile(r"\bcommit ([0-9a-f]{7,40})\b")
RUN = re.compile(r"^run(\d+)")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def environment(folder: Path) -> list:
    """env.txt's lines (GPUs and driver, torch / CUDA / NCCL / SGLang versions, NCCL variables)."""
    return [ln.strip() for ln in _read(folder / "env.txt").splitlines() if ln.strip()]


def servers(folder: Path) -> dict:
    """{server: its FASTVERIFY_* variables and its flags after launch_server} from commands.txt."""
    out = {}
    for ln in _read(folder / "commands.txt").splitlines():
        name, sep, cmd = ln.partition(": ")
        if not sep or "launch_server" not in cmd or not name.startswith("m_"):
            continue
        env, _, args = cmd.partition("sglang.launch_server")
        tracer = ("FASTVERIFY_STEP_TRACE=", "FASTVERIFY_STEP_TRACE_GPU=")
        switches = sorted(w for w in env.split()
                          if w.startswith("FASTVERIFY_") and not w.startswith(tracer))
        flags = [w for w in shlex.split(args) if not re.match(r"^/", w)]
        keep = []
        for i, w in enumerate(flags):  # the flags that tell servers apart; ports and paths left out
            if w in ("--port", "--nccl-port") or (i and flags[i - 1] in ("--port", "--nccl-port")):
                continue
            keep.append(w)
        out[name] = {"env": switches, "flags": " ".join(keep)}
    return out


def commit(folder: Path) -> str | None:
    """The run's library commit (timeline.txt's first 'commit X'; None where not recorded)."""
    m = COMMIT.search(_read(folder / "timeline.txt"))
    return m.group(1) if m else None


def judge(folder: Path, auto: str) -> list:
    """auto_verdict.py's rows for ``auto``, each with its paired per-request rounds."""
    rows = av.verdict(av.collect(folder), 0.98, auto)
    pairs = av.paired(folder, auto)
    for r in rows:
        if (r["load"], r["concurrency"]) in pairs:
            r["paired"] = pairs[(r["load"], r["concurrency"])]
    return rows


def auto_run(folder: Path) -> dict:
    names = sorted({s for s, _, _ in av.result_files(folder)})
    autos = [s for s in names if s.startswith(av.AUTO)]
    run = {"commit": commit(folder), "environment": environment(folder), "servers": servers(folder)}
    if not names:
        run["note"] = "no client results: " + ", ".join(sorted(p.name for p in folder.iterdir()))
        return run
    run["verdicts"] = {a: judge(folder, a) for a in (autos or [av.AUTO])}
    return run


def summarize_auto(root: Path) -> dict:
    folders = sorted((p for p in root.iterdir() if p.is_dir() and RUN.match(p.name)),
                     key=lambda p: int(RUN.match(p.name).group(1)))
    return {"runs": {p.name: auto_run(p) for p in folders}}


def _fmt_col(r: dict) -> str:
    load = "rep" if r["load"] == "greedy" else "non-rep"
    meds = " ".join(f"{s}={v['median']:.1f}" for s, v in r["servers"].items())
    text = f"  {load:7s} c={r['concurrency']}: {meds} tok/s; best {r['best']}"
    if "plain_spread" in r:
        text += f"; plain spread {r['plain_spread']:.3f}"
    if "met" in r:
        plain = "-" if r["auto_vs_plain"] is None else f"{r['auto_vs_plain']:.3f}"
        text += (f"; {r['auto']} {plain}x plain, {r['auto_vs_best']:.3f}x best: "
                 f"{'met' if r['met'] else 'NOT met'}")
    for rnd, v in (r.get("paired") or {}).items():
        text += f"; paired {rnd} {v['speed']:.4f} [{v['lo']:.4f}, {v['hi']:.4f}] {v['side']}"
    return text


def auto_text(data: dict) -> str:
    out = ["# auto verify against every fixed mode, per run: median output tok/s over rounds "
           "(rep = repetitive greedy load, non-rep = temperature 1);",
           "# goal: auto >= 0.98x the best server and >= 1x no speculation (m_plain); paired = "
           "per request against m_plain, mean and 95 % bootstrap interval"]
    for name, run in data["runs"].items():
        flags = "; ".join(f"{s}{' ' + ' '.join(v['env']) if v['env'] else ''}"
                          for s, v in run["servers"].items())
        out.append(f"{name} (commit {run['commit'] or '-'}){': ' + flags if flags else ''}")
        if "note" in run:
            out.append(f"  {run['note']}")
        for auto, rows in run.get("verdicts", {}).items():
            if len(run["verdicts"]) > 1:
                out.append(f"  judged as auto: {auto}")
            out.extend(_fmt_col(r) for r in rows)
    return "\n".join(out) + "\n"


def client_levels(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "levels" not in data:
        return None
    out = {}
    for lv in data["levels"]:
        s = lv.get("summary") or {}
        out[lv.get("name") or f"c={lv.get('concurrency')}"] = {
            k: (round(s[k], 3) if isinstance(s.get(k), float) else s.get(k))
            for k in ("requests", "errors", "output_tok_per_s", "ttft_ms_median", "tpot_ms_median",
                      "accept_length_mean", "verify_steps")}
    return {"levels": out, "repro_command": data.get("repro_command")}


TABLE_ROW = re.compile(r"^\s+c=(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+"
                       r"\s+([\d.]+)\s+[\d.]+\s+(\S+)\s+(\S+)\s*$")


def client_table(path: Path) -> dict | None:
    """The same numbers from a client's printed table (where its JSON was not kept)."""
    text = _read(path)
    if not text.startswith("# serving benchmark"):
        return None
    out = {}
    for ln in text.splitlines():
        m = TABLE_ROW.match(ln)
        if m:
            c, reqs, errs, _tok, rate, ttft, tpot, acc, steps = m.groups()
            out[f"c={c}"] = {"requests": int(reqs), "errors": int(errs),
                             "output_tok_per_s": float(rate),
                             "ttft_ms_median": float(ttft), "tpot_ms_median": float(tpot),
                             "accept_length_mean": None if acc == "-" else float(acc),
                             "verify_steps": None if steps == "-" else int(steps)}
    return {"levels": out, "repro_command": None, "from": "printed table"} if out else None


def summarize_client(root: Path) -> dict:
    results = {}
    for path in sorted(root.rglob("*.json")):
        got = client_levels(path)
        if got is not None:
            results[str(path.relative_to(root))] = got
    for path in sorted(root.rglob("*.txt")):
        if path.with_suffix(".json").exists():
            continue
        got = client_table(path)
        if got is not None:
            results[str(path.relative_to(root))] = got
    envs = {str(p.parent.relative_to(root)): environment(p.parent)
            for p in sorted(root.rglob("env.txt"))}
    return {"results": results, "environment": envs}


def client_text(data: dict) -> str:
    out = ["# serving-client results: requests, output tok/s, median TTFT / TPOT (ms), "
           "accept length"]
    for name, res in data["results"].items():
        out.append(name)
        for c, v in res["levels"].items():
            acc = "-" if v["accept_length_mean"] is None else f"{v['accept_length_mean']:.2f}"
            ttft = "-" if v["ttft_ms_median"] is None else f"{v['ttft_ms_median']:.1f}"
            tpot = "-" if v["tpot_ms_median"] is None else f"{v['tpot_ms_median']:.3f}"
            out.append(f"  {c:5s} {v['requests']} req  {v['output_tok_per_s']:9.1f} tok/s  "
                       f"TTFT {ttft}  TPOT {tpot}  accept {acc}")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=("auto", "client"))
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="OUT: writes OUT.json and OUT.txt")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"error: {args.folder}: not a folder", file=sys.stderr)
        return 2
    data = summarize_auto(args.folder) if args.kind == "auto" else summarize_client(args.folder)
    data["repro_command"] = "python lab/summarize_results.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    text = auto_text(data) if args.kind == "auto" else client_text(data)
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    args.out.with_suffix(".txt").write_text(text, encoding="utf-8")
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
