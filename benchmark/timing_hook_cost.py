"""Host cost of the verify-timing hooks on a pass that is not sampled (the price every pass pays).

    python benchmark/timing_hook_cost.py [--passes 200000] [--repeats 7] [--json OUT]

Times, on the host clock, `timing_hook.pass_scope` around an empty forward (flag on with an interval
so large that nothing is sampled; flag off) and one call through a `timed_collective` wrapper, as
medians of `--repeats` runs of `--passes` iterations. No GPU is involved: this is host Python, the
same code the server runs before and after each forward and around each all-reduce. The baseline
(flag off) runs in the same invocation.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from fastverify.bench.common import time_host_us  # noqa: E402
from fastverify.glue import timing_hook  # noqa: E402
from fastverify.timing import PassTimer, TimingConfig  # noqa: E402


class _NoClock:
    """A device clock that records nothing (no pass is sampled in this benchmark)."""

    def mark(self):
        return None

    def done(self, mark):
        return True

    def elapsed_ms(self, a, b):
        return 0.0

    def hold(self, cycles):
        pass

    def wait(self, mark):
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=200000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    batch = types.SimpleNamespace(
        forward_mode=types.SimpleNamespace(is_target_verify=lambda: False, is_decode=lambda: True),
        input_ids=types.SimpleNamespace(shape=(1,)), batch_size=1)
    on = types.SimpleNamespace()
    cfg = TimingConfig.from_flags(True, 10**9, 30.0, tp_size=2, tp_rank=0)
    on.__dict__[timing_hook._ATTR] = PassTimer(cfg, _NoClock(), exchange=lambda p: [p, p])
    off = types.SimpleNamespace()
    off.__dict__[timing_hook._ATTR] = None
    wrapped = timing_hook.timed_collective("all_reduce")(lambda x: x)

    def scope(runner):
        def run(n):
            for _ in range(n):
                with timing_hook.pass_scope(runner, batch):
                    pass
        return run

    def collective(n):
        for _ in range(n):
            wrapped(1)

    def bare(n):
        f = lambda x: x  # noqa: E731
        for _ in range(n):
            f(1)

    res = {
        "pass_scope_on_us": time_host_us(scope(on), args.passes, args.repeats),
        "pass_scope_off_us": time_host_us(scope(off), args.passes, args.repeats),
        "collective_wrapper_us": time_host_us(collective, args.passes, args.repeats),
        "bare_call_us": time_host_us(bare, args.passes, args.repeats),
    }
    print(f"# host {platform.node()} {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}")
    print(f"# {args.passes} iterations x {args.repeats} repeats, medians; no pass is sampled (host "
          "cost only)")
    print(f"pass_scope, flag on:      {res['pass_scope_on_us']:.2f} us per pass")
    print(f"pass_scope, flag off:     {res['pass_scope_off_us']:.2f} us per pass (baseline)")
    print(f"timed_collective wrapper: {res['collective_wrapper_us']:.3f} us per call "
          f"(a bare Python call: {res['bare_call_us']:.3f} us)")
    if args.json:
        res["repro_command"] = ("python benchmark/timing_hook_cost.py "
                                + " ".join(sys.argv[1:] if argv is None else argv))
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
