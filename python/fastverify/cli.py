"""The ``fastverify`` command line.

Subcommands live in their own modules, each exposing ``add_parser(subparsers)``: it adds one parser
named like the registry entry and sets ``func`` (called with the parsed args, returns the exit code)
through ``set_defaults``. Modules are imported only when their subcommand runs, so
``fastverify patches ...`` needs the standard library only (no torch, no SGLang).

To add a subcommand, add one line to ``SUBCOMMANDS`` (or call ``register`` before ``main``):

    SUBCOMMANDS["flags"] = Subcommand("fastverify.flags:add_parser",
                                      "list the flags fastverify adds")
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass

from fastverify import __version__


@dataclass(frozen=True)
class Subcommand:
    target: str  # "module:function", the function being add_parser(subparsers)
    help: str  # one line for `fastverify --help` (shown without importing the module)


SUBCOMMANDS: dict[str, Subcommand] = {
    "patches": Subcommand("fastverify.patchtool:add_parser",
                          "apply/revert/check/status of the SGLang patch series"),
    "replay": Subcommand("fastverify.replay:add_parser",
                         "replay recorded greedy outputs through SGLang's n-gram corpus (tree vs "
                         "chain)"),
    "sim": Subcommand("fastverify.sim:add_parser",
                      "simulate the auto verify controller on traces and cost tables"),
    "bench": Subcommand("fastverify.bench.cli:add_parser",
                        "microbenchmarks: all-reduce vs compute of a verify pass, per-kernel "
                        "regressions"),
    "advise": Subcommand("fastverify.advise:add_parser",
                         "will speculation pay on this box, and how?"),
}


def register(name: str, target: str, help: str) -> None:
    if name in SUBCOMMANDS and SUBCOMMANDS[name].target != target:
        raise ValueError(f"subcommand {name!r} is already registered by {SUBCOMMANDS[name].target}")
    SUBCOMMANDS[name] = Subcommand(target, help)


def _load(name: str):
    module, _, func = SUBCOMMANDS[name].target.partition(":")
    return getattr(importlib.import_module(module), func)


def _chosen(argv) -> str | None:
    """The subcommand named on the command line (the first word that is not an option)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in SUBCOMMANDS else None
    return None


def build_parser(argv) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastverify",
        description="Fast verify for speculative decoding in SGLang: patch series, flags, "
                    "benchmarks.")
    parser.add_argument("--version", action="version", version=f"fastverify {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    chosen = _chosen(argv)
    for name, sub in SUBCOMMANDS.items():
        if name == chosen:
            added = _load(name)(subparsers)
            if added is None or added.prog.split()[-1] != name:
                raise RuntimeError(f"{sub.target} must add a parser named {name!r} and return it")
        else:  # listed in --help; the module is not imported
            subparsers.add_parser(name, help=sub.help, add_help=False)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
