"""The offline answer against the emulated server: `fastverify advise` per cell and server of an
evaluation summary (lab/gpu/evaluate.sh), next to the measured decode tok/s, with the error.

    python lab/predict_vs_measured.py SUMMARY.json [--logs DIR --raw RAW.json ...] [--profile NAME]
                                      [--json OUT] [--txt OUT]

For every group (profile) and cell of the summary, each server's measured accept length is typed
into advise with the run's profile (`--emulate-pass-cost NAME` of the group's flags, or
`--profile`): plain -> the plain row; stock tree D -> `treeD=A`; chain -> `chain{D-1}=A`; chain with
verify widths -> `chain{D-1}+widths=A@M`, M the share of steps that verified (width > 1), from the
server's "n-gram verify widths: steps by width {...}" log lines (`--logs DIR` holding
<group>.<server>.log; each line is placed in the cell whose pass window in `--raw` holds its time
stamp) or from a `widths_steps` entry of the summary's cell; auto -> advise's auto row from
`chain{D-1}=A` (the controller's rate of that chain, plain's where it gates it off).

A cell of concurrency c > 1 is asked with `--concurrency c` (c requests per pass, in steady state
and each in the cell's shape: a pass of n tokens per request is one of c x n; tok/s per request),
which leaves out that requests join and leave and that a batch's widths follow its longest draft.
The prediction is the emulated wait alone: the emulator adds its wait to the real
pass of the served model and the host's per-step work, which the prediction leaves out (see NOTE).
Ratios: predicted tok/s over advise's plain; measured, the summary's paired decode ratio against
the group's baseline (the ratio of medians when a cell has none). Errors: (pred - meas) / meas.
"""
from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import re
import shlex
import sys
import textwrap
from pathlib import Path

from fastverify import advise

NOTE = ("advise predicts the emulated wait alone (the profile's pass costs; at c > 1 with "
        "--concurrency c, every request in the same shape each step). The "
        "emulator's rule is additive: its wait comes on top of the real pass of the served model "
        "on this GPU (SmolLM2-135M at TP=1: ~1.05 ms for a decode pass, ~1.9-2.7 ms for a verify "
        "pass, the servers' 'sampled pass = real + wait' log lines) and of the host's per-step "
        "work (scheduling; for speculation the n-gram lookup, tree or chain building, "
        "acceptance), which the prediction leaves out (the +ms/st column). The ratios to plain "
        "cancel part of it. Chain + widths: advise prices every "
        "verified step at the widest width (the profile's 4-token pass is 30.0 ms, its 8-token "
        "pass 33.1 ms).")
WIDTHS_LINE = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] n-gram verify widths: "
                         r"steps by width (?P<hist>\{[^}]*\})")


class PredictError(ValueError):
    """A bad input file or flag; the message names it."""


def _load_json(path, what: str):
    p = Path(path)
    if not p.is_file():
        raise PredictError(f"{what} {path}: file not found")
    try:
        return json.loads(p.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise PredictError(f"{what} {path}: not JSON ({e})") from None


def group_profile(group: dict, override) -> tuple:
    """(profile name or None, why not) from the group's server flags."""
    flags = shlex.split(group.get("group_flags") or "")
    if override:
        return override, ""
    if "--emulate-pass-cost" not in flags:
        return None, "no pass-cost emulation in this group (nothing to predict against)"
    i = flags.index("--emulate-pass-cost")
    if i + 1 >= len(flags):
        raise PredictError(f"group {group.get('group')}: --emulate-pass-cost without a profile")
    if "--emulate-pass-cost-compute" not in flags:
        return None, ("the group emulates communication only; advise prices the profile's "
                      "compute too (give --profile to predict anyway)")
    return flags[i + 1], ""


def shape_of(args: dict) -> tuple:
    """(kind, advise shape name or None, why not) from a server's recorded server_args."""
    algo = args.get("speculative_algorithm")
    if not algo:
        return "plain", "plain", ""
    if algo != "NGRAM":
        return algo.lower(), None, f"{algo}: advise needs the drafter's ms per step (not recorded)"
    d = args.get("speculative_num_draft_tokens")
    if not isinstance(d, int) or d < 2:
        return "ngram", None, f"speculative_num_draft_tokens {d!r}: not a width"
    mode = args.get("speculative_ngram_verify_mode") or "tree"
    widths = args.get("speculative_ngram_verify_widths")
    if mode == "tree":
        return "tree", f"tree{d}", ""
    if mode == "auto":
        return "auto", f"chain{d - 1}", ""
    if mode == "chain":
        return ("chain+widths", f"chain{d - 1}+widths", "") if widths else \
            ("chain", f"chain{d - 1}", "")
    return mode, None, f"verify mode {mode!r}: unknown to this script"


def widths_from_logs(logs: Path, group: str, server: str, passes: list) -> dict:
    """{(set, c): {width: steps}} from a server's log lines, each placed in the pass of that
    server whose window [t_start - 1 s, t_end] holds its time stamp (1-second stamps); lines
    outside every pass (warm-up) are counted under None."""
    path = logs / f"{group}.{server}.log"
    if not path.is_file():
        return {}
    mine = [p for p in passes if p.get("server") == server and p.get("duration_s", 0) > 0]
    out: dict = {}
    for line in path.read_text(errors="replace").splitlines():
        m = WIDTHS_LINE.match(line)
        if not m:
            continue
        ts = dt.datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S").replace(
            tzinfo=dt.timezone.utc).timestamp()
        hist = {int(k): int(v) for k, v in ast.literal_eval(m["hist"]).items()}
        hits = [p for p in mine if p["t_start"] - 1.0 <= ts <= p["t_start"] + p["duration_s"]]
        key = (hits[0]["set"], hits[0]["c"]) if len(hits) == 1 else None
        acc = out.setdefault(key, {})
        for w, n in hist.items():
            acc[w] = acc.get(w, 0) + n
    return out


def _cell_hist(by_cell: dict, cell: dict):
    """The cell's {width: steps}; the summary's merged set "all" sums the sets of its c."""
    keys = [k for k in by_cell if k is not None and k[1] == cell["c"]
            and (cell["set"] == "all" or k[0] == cell["set"])]
    if not keys:
        return None
    out: dict = {}
    for k in keys:
        for w, n in by_cell[k].items():
            out[w] = out.get(w, 0) + n
    return out


def verified_share(hist: dict) -> float:
    total = sum(hist.values())
    return sum(n for w, n in hist.items() if int(w) > 1) / total if total else float("nan")


def ask_advise(profile: str, accept: str, concurrency: int = 1) -> tuple:
    """advise through its own parser and build(): (Advice, argv as a command line)."""
    argv = ["--profile", profile, "--accept", accept]
    if concurrency > 1:
        argv += ["--concurrency", str(concurrency)]
    p = argparse.ArgumentParser()
    advise._fill_parser(p)
    args = p.parse_args(argv)
    adv = advise.build(args, say=lambda _msg: None)
    return adv, advise.repro_command(args)


def predict_row(profile: str, kind: str, shape: str, accept, share, c: int = 1) -> dict:
    """advise's tok/s and ratio to plain for one server at concurrency ``c`` (per request), or why
    it was not asked."""
    if kind == "plain":
        adv, cmd = ask_advise(profile, "chain1=1", c)  # any shape: the plain row is the profile's
        return {"pred_tok_s": adv.plain_tok_s, "pred_vs_plain": 1.0, "advise": cmd}
    if accept is None:
        return {"why_not": "no accept length measured"}
    if kind == "chain+widths":
        if share is None or not share == share or share <= 0:
            return {"why_not": "no share of verified steps (give --logs and --raw)"}
        typed = f"{shape}={accept:.4f}@{min(share, 1.0):.4f}"
    else:
        typed = f"{shape}={accept:.4f}"
    adv, cmd = ask_advise(profile, typed, c)
    label = "auto" if kind == "auto" else shape
    row = next(r for r in adv.rows if r.label == label)
    n = adv.profile.allreduces_per_pass
    tok = row.tok_s(n)[0]
    return {"pred_tok_s": tok, "pred_vs_plain": tok / adv.plain_tok_s, "advise": cmd}


def _err(pred, meas):
    return None if pred is None or not meas else 100.0 * (pred - meas) / meas


def compare(summary: dict, logs=None, raw=None, profile_override=None) -> dict:
    """``raw``: one raw record or a list of them (one per group: each group reads the passes of
    the records of its own name, or of a record that names no group)."""
    raws = raw if isinstance(raw, list) else ([raw] if raw else [])
    groups = []
    for g in summary.get("groups", []):
        passes = [p for r in raws if r.get("group") in (None, g.get("group"))
                  for p in r.get("passes", [])]
        prof, prof_why = group_profile(g, profile_override)
        servers = {s["name"]: s for s in g.get("servers", [])}
        base = g.get("baseline")
        widths = {name: widths_from_logs(Path(logs), g["group"], name, passes)
                  for name in servers} if logs else {}
        rows = []
        for cell in g.get("cells", []):
            cs = cell.get("servers", {})
            base_tps = (cs.get(base) or {}).get("decode_tps_median")
            for name, m in cs.items():
                kind, shape, why = shape_of(servers.get(name, {}).get("server_args", {}))
                hist = m.get("widths_steps") or _cell_hist(widths.get(name, {}), cell)
                share = verified_share(hist) if hist and kind == "chain+widths" else None
                meas = m.get("decode_tps_median")
                meas_ratio = (m.get("decode") or {}).get("ratio")
                if meas_ratio is None and meas and base_tps:
                    meas_ratio = meas / base_tps
                row = {"set": cell["set"], "c": cell["c"], "ignore_eos": cell.get("ignore_eos"),
                       "server": name, "kind": kind, "shape": shape if kind != "auto" else
                       f"auto (from {shape})", "requests": m.get("requests"),
                       "accept_length": m.get("accept_length"), "verified_share": share,
                       "widths_steps": {str(k): v for k, v in sorted(hist.items())}
                       if hist else None, "meas_tok_s": meas, "meas_vs_plain": meas_ratio}
                if prof is None:
                    row["why_not"] = prof_why
                elif shape is None:
                    row["why_not"] = why
                else:
                    row.update(predict_row(prof, kind, shape, m.get("accept_length"), share,
                                           int(cell["c"])))
                row["err_tok_s_pct"] = _err(row.get("pred_tok_s"), meas)
                acc = {"plain": 1.0, "auto": None}.get(kind, m.get("accept_length"))
                if row.get("pred_tok_s") and meas and acc:  # ms per step, and what is left out
                    row["step_ms_pred"] = 1000.0 * acc / row["pred_tok_s"]
                    row["step_ms_meas"] = 1000.0 * acc / meas
                    row["step_ms_left_out"] = row["step_ms_meas"] - row["step_ms_pred"]
                row["err_vs_plain_pct"] = _err(row.get("pred_vs_plain"), meas_ratio)
                rows.append(row)
        unplaced = {name: sum(w.get(None, {}).values()) for name, w in widths.items()
                    if w.get(None)}
        groups.append({"group": g.get("group"), "profile": prof, "baseline": base,
                       "widths_steps_outside_passes": unplaced, "rows": rows})
    return {"groups": groups, "note": NOTE}


def _f(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def format_table(result: dict) -> str:
    out = []
    for g in result["groups"]:
        out.append(f"## group {g['group']}  profile {g['profile'] or '-'}  "
                   f"(predicted: fastverify advise, per request at the cell's concurrency; "
                   f"measured: emulated server, "
                   f"decode tok/s median)")
        out.append(f"{'cell':<12} {'server':<8} {'shape':<20} {'n':>3} {'accept':>6} {'verif':>6} "
                   f"{'pred':>7} {'meas':>7} {'err %':>7} {'pred/A':>7} {'meas/A':>7} "
                   f"{'err %':>7} {'+ms/st':>6}")
        for r in g["rows"]:
            cell = f"{r['set'][:8]} c={r['c']}"
            head = (f"{cell:<12} {r['server']:<8} {str(r['shape']):<20} "
                    f"{_f(r['requests'], 'd'):>3} {_f(r['accept_length'], '.2f'):>6} "
                    f"{_f(r['verified_share'], '.0%'):>6} ")
            if "why_not" in r:
                out.append(head + f"{'-':>7} {_f(r['meas_tok_s'], '.1f'):>7} {'-':>7} {'-':>7} "
                           f"{_f(r['meas_vs_plain'], '.3f'):>7} {'-':>7}  {r['why_not']}")
                continue
            out.append(head + f"{r['pred_tok_s']:>7.1f} {_f(r['meas_tok_s'], '.1f'):>7} "
                       f"{_f(r['err_tok_s_pct'], '+.1f'):>7} {r['pred_vs_plain']:>7.3f} "
                       f"{_f(r['meas_vs_plain'], '.3f'):>7} {_f(r['err_vs_plain_pct'], '+.1f'):>7} "
                       f"{_f(r.get('step_ms_left_out'), '+.1f'):>6}")
    legend = ("n: requests measured; verif: share of steps that verified (width > 1), chain + "
              "widths only; auto: advise's auto row (the controller's rate of the chain at the "
              "measured accept length); err %: (pred - meas) / meas; +ms/st: measured minus "
              "predicted ms per step (accept length / tok/s), what the prediction leaves out")
    for text in (legend, result["note"]):
        out += ["# " + t for t in textwrap.wrap(text, 96)]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python lab/predict_vs_measured.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("summary", help="an evaluation summary.json (lab/gpu/evaluate.sh)")
    p.add_argument("--logs", help="folder of the servers' logs (<group>.<server>.log)")
    p.add_argument("--raw", action="append", default=None,
                   help="the evaluation's raw per-pass records (<group>.json), to place "
                   "the log lines in cells (once per group of the summary)")
    p.add_argument("--profile", help="predict with this profile instead of the group's")
    p.add_argument("--json", dest="json_out", help="write the comparison as JSON here")
    p.add_argument("--txt", help="write the table here")
    args = p.parse_args(argv)
    try:
        if args.logs and not Path(args.logs).is_dir():
            raise PredictError(f"--logs {args.logs}: not a folder")
        if args.logs and not args.raw:
            raise PredictError("--logs needs --raw (the pass windows that place its lines)")
        summary = _load_json(args.summary, "summary")
        raw = [_load_json(r, "--raw") for r in args.raw] if args.raw else None
        result = compare(summary, args.logs, raw, args.profile)
    except (PredictError, advise.AdviseError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cmd = ["python", "lab/predict_vs_measured.py", args.summary]
    for flag, val in (("--logs", args.logs), ("--raw", args.raw), ("--profile", args.profile),
                      ("--json", args.json_out), ("--txt", args.txt)):
        for v in (val if isinstance(val, list) else [val] if val else []):
            cmd += [flag, v]
    result = {"repro_command": " ".join(shlex.quote(c) for c in cmd), **result}
    table = format_table(result)
    print(table)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    if args.txt:
        Path(args.txt).write_text(f"# {result['repro_command']}\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
