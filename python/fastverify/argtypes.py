"""Argument types shared by this project's command-line tools (sim, replay, advise).

Each returns an argparse ``type=`` callable, so that a bad value ends the command with argparse's
usage line, the flag, the value given and what it takes (exit status 2), never with a traceback.
"""
from __future__ import annotations

import argparse
from typing import Callable, List, Optional


def int_list(flag: str, minimum: Optional[int] = None) -> Callable[[str], List[int]]:
    """A comma-separated list of integers (``"1,4,8"``; empty items skipped), at least one, each
    >= ``minimum`` where one is given."""
    takes = "comma-separated integers" + ("" if minimum is None else f" >= {minimum}")

    def parse(text: str) -> List[int]:
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            vals = None
        if not vals or (minimum is not None and min(vals) < minimum):
            raise argparse.ArgumentTypeError(f"{flag} takes {takes}, got {text!r}")
        return vals

    return parse
