"""Summarise a py-spy raw profile (`py-spy record --format raw`): each function's
inclusive and self share.

    python lab/gpu/pyspy_top.py PROFILE.txt [--top 40]

A raw profile has one line per distinct stack, "frame;frame;...;frame COUNT". A function's inclusive
share is the fraction of samples whose stack contains it (counted once per stack), its self share
the fraction where it is the innermost frame.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys

FRAME = re.compile(r"(.*?) \((.*?):(\d+)\)$")


def name(frame: str) -> str:
    m = FRAME.match(frame)
    return f"{m.group(1)} ({m.group(2).rsplit('/', 1)[-1]})" if m else frame


def summarise(lines):
    total, incl, own = 0, collections.Counter(), collections.Counter()
    for line in lines:
        line = line.rstrip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = [name(f) for f in stack.split(";")]
        for f in set(frames):
            incl[f] += n
        own[frames[-1]] += n
    return total, incl, own


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    with open(args.profile, encoding="utf-8") as fh:
        total, incl, own = summarise(fh)
    if not total:
        print(f"{args.profile}: no samples", file=sys.stderr)
        return 1
    print(f"# {args.profile}: {total} samples; inclusive share (function and its callees)")
    for f, n in incl.most_common(args.top):
        print(f"{100 * n / total:5.1f}%  {f}")
    print("# self share (innermost frame)")
    for f, n in own.most_common(12):
        print(f"{100 * n / total:5.1f}%  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
