"""`fastverify bench`: the microbenchmarks live in the repository's benchmark/ folder, not in the package.

This module finds benchmark/cli.py next to the source tree (a checkout, or an editable install) and hands it the
subparsers; outside a checkout the subcommand says where to get the scripts.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH_CLI = Path(__file__).resolve().parents[2] / "benchmark" / "cli.py"


def add_parser(subparsers):
    if not BENCH_CLI.is_file():
        p = subparsers.add_parser("bench", help="microbenchmarks (needs a checkout of sglang-fastverify)")
        p.set_defaults(func=lambda args: _missing())
        return p
    spec = importlib.util.spec_from_file_location("fastverify_benchmark_cli", BENCH_CLI)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.add_parser(subparsers)


def _missing() -> int:
    print(f"error: the benchmark scripts are not installed with the package; expected {BENCH_CLI}. "
          "Run `fastverify bench` from a checkout of sglang-fastverify (pip install -e .).")
    return 2
