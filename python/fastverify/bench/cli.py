"""`fastverify bench ...`: the microbenchmarks behind one subcommand.

    fastverify bench allreduce [ARGS]   -> fastverify.bench.allreduce_vs_compute
    fastverify bench kernels   [ARGS]   -> fastverify.bench.kernels.run
    fastverify bench compare   [ARGS]   -> fastverify.bench.kernels.compare
    fastverify bench gate      [ARGS]   -> fastverify.bench.kernels.gate

The fastverify CLI wires it with ``add_parser(subparsers)``; the handler returns the benchmark's
exit status. Each benchmark module is imported only when its subcommand runs. From a checkout, the
same benchmarks run as ``python benchmark/allreduce_vs_compute.py``,
``python benchmark/kernels/run.py`` and ``python benchmark/kernels/compare.py``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

BENCHMARKS = {
    "allreduce": ("fastverify.bench.allreduce_vs_compute",
                  "all-reduce backends against the compute of a verify pass (2+ GPUs)"),
    "kernels": ("fastverify.bench.kernels.run", "per-kernel regression benchmarks (1 GPU)"),
    "compare": ("fastverify.bench.kernels.compare",
                "compare a kernel-benchmark JSON with a stored baseline"),
    "gate": ("fastverify.bench.kernels.gate",
             "kernel benchmarks + compare N times, one verdict each (stability of the gate)"),
}


def run_benchmark(name: str, argv: Sequence[str]) -> int:
    return int(importlib.import_module(BENCHMARKS[name][0]).main(list(argv)) or 0)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench",
                              help="microbenchmarks: all-reduce vs compute, per-kernel regressions")
    sp = p.add_subparsers(dest="bench_cmd", metavar="{" + ",".join(BENCHMARKS) + "}")
    sp.required = True
    for name, (_, help_) in BENCHMARKS.items():
        q = sp.add_parser(name, help=help_, add_help=False, prefix_chars="\0")
        q.add_argument("args", nargs=argparse.REMAINDER,
                       help="the benchmark's arguments (--help for its own)")
        q.set_defaults(func=lambda a, name=name: run_benchmark(name, a.args))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fastverify")
    add_parser(ap.add_subparsers(dest="cmd"))
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
