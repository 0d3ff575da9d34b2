"""Summarise a py-spy raw profile (`py-spy record --format raw`): each function's
inclusive and self share.

    python lab/gpu/pyspy_top.py PROFILE.txt [--top 40]
    python lab/gpu/pyspy_top.py PROFILE.txt --against BASE.txt --rate 200 [--steps N --base-steps M]
    python lab/gpu/pyspy_top.py PROFILE.txt --against BASE.txt --steptrace ST.json --names THIS,BASE
    python lab/gpu/pyspy_top.py PROFILE.txt --under "_probe (plain_path.py)" [--rate 1000 --calls N]

A raw profile has one line per distinct stack, "frame;frame;...;frame COUNT". A function's inclusive
share is the fraction of samples whose stack contains it (counted once per stack), its self share
the fraction where it is the innermost frame.

With --against, two profiles of servers that did the same work (the same requests, sampled at the
same rate over the whole of it) are compared function by function: the host time each spent in the
function and its callees (samples / rate), largest differences first; with the decode steps each
server ran, as microseconds per step: given as numbers, or read from `lab/step_trace.py --json`'s
output for the two servers named (their decode steps over the whole life of each server, of which
a measurement sampled over its rounds holds nearly all).

With --under, one function's samples (those whose stack holds it, from its outermost call) split by
the calls it made: the callee, and the callee's own next two calls; with --rate and --calls (how
many times the function ran, e.g. a server's probe count) also in microseconds per call.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys

FRAME = re.compile(r"(.*?) \((.*?):(\d+)\)$")


def name(frame: str) -> str:
    m = FRAME.match(frame)
    return f"{m.group(1)} ({m.group(2).rsplit('/', 1)[-1]})" if m else frame


def records(lines):
    """(stack, count) of each record of a raw profile. A frame's name may hold a line break (py-spy
    writes it as it is): a line that does not end in a count goes on on the next line."""
    held = ""
    for line in lines:
        line = held + line.rstrip("\n")
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit():
            held = line + " " if line.strip() else ""
            continue
        held = ""
        yield stack, int(count)
    if held.strip():
        raise ValueError(f"a raw profile's last record has no count: {held[-80:]!r}")


def summarise(lines):
    total, incl, own = 0, collections.Counter(), collections.Counter()
    for stack, n in records(lines):
        total += n
        frames = [name(f) for f in stack.split(";")]
        for f in set(frames):
            incl[f] += n
        own[frames[-1]] += n
    return total, incl, own


def under(lines, function: str, depth: int = 3) -> tuple:
    """(samples of ``function``, Counter by its callee, Counter by its next ``depth`` calls): each
    sample whose stack holds ``function`` (a frame as `name` writes it), counted from the outermost
    call; "(self)" where it was the innermost frame."""
    total, first, paths = 0, collections.Counter(), collections.Counter()
    for stack, n in records(lines):
        frames = [name(f) for f in stack.split(";")]
        if function not in frames:
            continue
        i = frames.index(function)
        total += n
        below = frames[i + 1:i + 1 + depth]
        first[below[0] if below else "(self)"] += n
        paths[" > ".join(below) if below else "(self)"] += n
    return total, first, paths


def compare(this, base, rate: float, steps=None, base_steps=None, top: int = 40):
    """Lines comparing two summaries (`summarise`'s results) function by function: host ms in
    each (inclusive) and the difference, or microseconds per step where both step counts are
    given; largest absolute differences first, the whole process first of all."""
    (t_total, t_incl, _), (b_total, b_incl, _) = this, base
    per_step = bool(steps and base_steps)
    unit = "us/step" if per_step else "ms"

    def val(n, k):
        return 1e6 * n / rate / k if per_step else 1e3 * n / rate

    rows = [(f, val(t_incl.get(f, 0), steps), val(b_incl.get(f, 0), base_steps))
            for f in set(t_incl) | set(b_incl)]
    rows.sort(key=lambda r: -abs(r[1] - r[2]))
    head = [("(all samples)", val(t_total, steps), val(b_total, base_steps))]
    out = [f"# inclusive host time, {unit}: this, base, this - base"]
    for f, t, b in head + rows[:top]:
        out.append(f"{t:10.2f} {b:10.2f} {t - b:+10.2f}  {f}")
    return out


def steps_of(steptrace: str, names: str) -> tuple:
    """(this server's decode steps, the baseline's) from a step-trace summary (`lab/step_trace.py
    --json`), ``names`` "THIS,BASE" as the servers are named there."""
    parts = names.split(",")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"--names takes THIS,BASE, not {names!r}")
    with open(steptrace, encoding="utf-8") as fh:
        results = json.load(fh).get("results", {})
    counts = []
    for n in parts:
        steps = results.get(n, {}).get("decode", {}).get("steps")
        if not steps:
            raise ValueError(f"{steptrace}: no decode steps of server {n!r} "
                             f"(servers: {', '.join(sorted(results)) or 'none'})")
        counts.append(int(steps))
    return tuple(counts)


def _read(path, reader, *args):
    """``reader`` (`summarise` or `under`) over the raw profile at ``path``."""
    with open(path, encoding="utf-8") as fh:
        return reader(fh, *args)


def _print_under(args, result) -> int:
    total, first, paths = result
    if not total:
        print(f"{args.profile}: no samples under {args.under!r}", file=sys.stderr)
        return 1
    per = f", {1e6 * total / args.rate / args.calls:.1f} us a call" if args.calls else ""
    print(f"# {args.profile}: {total} samples under {args.under}{per}")
    for label, counts in (("its calls", first), ("its next calls, three deep", paths)):
        print(f"# {label}: share, samples" + (", us a call" if args.calls else ""))
        for f, n in counts.most_common(args.top):
            us = f" {1e6 * n / args.rate / args.calls:8.1f}" if args.calls else ""
            print(f"{100 * n / total:5.1f}% {n:7d}{us}  {f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--against", help="a baseline profile of the same work: compare with it")
    ap.add_argument("--rate", type=float, default=200.0, help="samples per second (py-spy --rate)")
    ap.add_argument("--steps", type=int, help="decode steps this profile's server ran")
    ap.add_argument("--base-steps", type=int, help="decode steps the baseline's server ran")
    ap.add_argument("--steptrace", help="lab/step_trace.py --json output: the step counts from it")
    ap.add_argument("--names", help="THIS,BASE: the two servers' names in --steptrace")
    ap.add_argument("--under", metavar="FUNCTION",
                    help="one function's samples by the calls it made, e.g. "
                         "'_probe (plain_path.py)'")
    ap.add_argument("--calls", type=int, help="with --under: how many times the function ran")
    args = ap.parse_args(argv)
    if args.calls is not None and (not args.under or args.calls < 1):
        ap.error("--calls goes with --under and must be >= 1")
    if args.under and (args.against or args.steptrace or args.steps is not None):
        ap.error("--under reads one profile: no --against, --steptrace or --steps")
    if (args.steps is None) != (args.base_steps is None):
        ap.error("--steps and --base-steps go together")
    if (args.steptrace is None) != (args.names is None):
        ap.error("--steptrace and --names go together")
    if args.steptrace and args.steps is not None:
        ap.error("the step counts come from --steps/--base-steps or from --steptrace, not both")
    try:
        if args.steptrace:
            args.steps, args.base_steps = steps_of(args.steptrace, args.names)
        if args.under:
            return _print_under(args, _read(args.profile, under, args.under))
        total, incl, own = _read(args.profile, summarise)
        base = _read(args.against, summarise) if args.against else None
    except (OSError, ValueError) as e:
        print(f"pyspy_top.py: {e}", file=sys.stderr)
        return 1
    if not total:
        print(f"{args.profile}: no samples", file=sys.stderr)
        return 1
    if args.against:
        if not base[0]:
            print(f"{args.against}: no samples", file=sys.stderr)
            return 1
        print(f"# {args.profile} ({total} samples) against {args.against} ({base[0]} samples)")
        for line in compare((total, incl, own), base, args.rate, args.steps, args.base_steps,
                            args.top):
            print(line)
        return 0
    print(f"# {args.profile}: {total} samples; inclusive share (function and its callees)")
    for f, n in incl.most_common(args.top):
        print(f"{100 * n / total:5.1f}%  {f}")
    print("# self share (innermost frame)")
    for f, n in own.most_common(12):
        print(f"{100 * n / total:5.1f}%  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
