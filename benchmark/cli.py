"""`fastverify bench ...`: the microbenchmarks behind one subcommand.

    fastverify bench allreduce [ARGS]   -> benchmark/allreduce_vs_compute.py
    fastverify bench kernels   [ARGS]   -> benchmark/kernels/run.py
    fastverify bench compare   [ARGS]   -> benchmark/kernels/compare.py

The fastverify CLI wires it with ``add_parser(subparsers)``; the handler returns the script's exit status.
The scripts live in the repository's benchmark/ folder (not in the installed package), so this module loads
them by path.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Sequence

BENCH_DIR = Path(__file__).resolve().parent
SCRIPTS = {
    "allreduce": ("allreduce_vs_compute.py", "all-reduce backends against the compute of a verify pass (2+ GPUs)"),
    "kernels": ("kernels/run.py", "per-kernel regression benchmarks (1 GPU)"),
    "compare": ("kernels/compare.py", "compare a kernel-benchmark JSON with a stored baseline"),
}


def run_script(name: str, argv: Sequence[str]) -> int:
    rel = SCRIPTS[name][0]
    for p in (str(BENCH_DIR), str(BENCH_DIR.parent / "python")):
        if p not in sys.path:
            sys.path.insert(0, p)
    spec = importlib.util.spec_from_file_location(f"fastverify_bench_{name}", BENCH_DIR / rel)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return int(mod.main(list(argv)) or 0)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", help="microbenchmarks: all-reduce vs compute, per-kernel regressions")
    sp = p.add_subparsers(dest="bench_cmd", metavar="{" + ",".join(SCRIPTS) + "}")
    sp.required = True
    for name, (_, help_) in SCRIPTS.items():
        q = sp.add_parser(name, help=help_, add_help=False, prefix_chars="\0")
        q.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script (--help for its own)")
        q.set_defaults(func=lambda a, name=name: run_script(name, a.args))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fastverify")
    add_parser(ap.add_subparsers(dest="cmd"))
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
