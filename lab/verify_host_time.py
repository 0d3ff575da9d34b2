"""Host time of auto's per-step work in a verify step on this machine, against chain mode's, with
the CPU tests' stand-ins (tests/test_glue_auto.py: a worker with captured widths 1,2,4,8, 8 draft
tokens, the auto controller), so that what is measured is the glue's own Python.

    python lab/verify_host_time.py [--bs 1,4] [--steps 600] [--json out.json]

The load is the steady memorised one, where auto's verify steps lost to chain + widths' on the GPU
(one H100, SmolLM2 at TP=1: 2.60-2.63 ms median at batch size 1 against 2.45 ms): every request's
drafts are the next 7 tokens of its output, accepted in full. Each step, as the n-gram worker runs
it after a verify: auto's own `plain_step` (the step's period to the costs, `_tick`; the output
scored, `_sync_requests`; `Controller.plan_lookup` on the last features; it returns None: the step
speculates), then `auto.step_drafts` records the new drafts, decides, cuts them to the narrowest
captured width and checks them. The host clock `_tick` reads advances 2.6 ms a step, the verify
step the costs hold, whatever this host takes. Where the controller's cold start chooses a step
without speculation (the stand-ins cannot decode one) the step is counted and timed as a verify all
the same. Chain mode's step is
`verify_runtime.step_drafts` (its width from the drafts' lengths), timed on the same drafts in the
same invocation as the baseline. Printed: the median per step over the steps after the first
quarter (the controller's start), and auto's pieces; for the two totals also the mean, which holds
the decision's fresh evaluations (one step in `controller.EVAL_REUSE_STEPS` here) that the median
leaves out. Absolute times are this host's only; the GPU
machine's host ran the same work ~3x slower in py-spy's samples. The controller decides on
whole-step costs like those measured there (a step on the path 1.3 ms, a plain step in the worker
2.3, verify steps 2.6-2.9). As the baseline of the controller's skipped question
(`Controller._still_verifying`), auto's step is timed again with every lookup asking.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests"), str(ROOT / "tests" / "stubs"),
                str(Path(__file__).resolve().parent)]

K = 8  # --speculative-num-draft-tokens of the server's configuration
WIDTHS = "1,2,4,8"
PIECES = ("plain_step", "_tick", "_sync_requests", "_record_drafts", "_narrowest",
          "checked_drafts")
TOTAL_AUTO = "auto: plain_step, step_drafts"
TOTAL_CHAIN = "chain: verify_runtime.step_drafts"


class _PlainChosen(Exception):
    """plain_step chose a step without speculation (the stand-ins cannot decode one)."""


def _streams(bs: int, length: int) -> list:
    return [list(range(100 + 10000 * i, 100 + 10000 * i + length)) for i in range(bs)]


def measure(bs: int, steps: int, ask_each_step: bool = False, miss: float = 0.0,
            seed: int = 0) -> dict:
    """{what: median us per step} for `steps` steady verify steps at batch size `bs`.
    ``ask_each_step``: every lookup asks the controller (`Controller._still_verifying` off, as
    before it: the baseline of that change). ``miss``: the share of drafts that diverge from the
    output at a uniformly drawn token (the rest accepted in full; ``seed`` draws them)."""
    import random

    import numpy as np
    import test_glue_auto as harness
    import torch

    from fastverify import controller as ctl_mod
    from fastverify.costs import LEAN, PATH, SPEC
    from fastverify.glue import auto, verify_runtime
    from fastverify.widths import parse_widths

    times: dict = {}

    def timed(owner, name, label):
        real = getattr(owner, name)

        def wrapper(*a, **kw):
            t0 = time.perf_counter_ns()
            try:
                return real(*a, **kw)
            finally:
                times.setdefault(label, []).append((time.perf_counter_ns() - t0) / 1e3)
        setattr(owner, name, wrapper)
        return real

    saved = [(harness, "K", harness.K)]  # (the harness' stand-ins read it when called)
    harness.K = K
    saved += [(auto, n, timed(auto, n, n)) for n in PIECES]
    saved.append((ctl_mod, "CLEAR_MARGIN", ctl_mod.CLEAR_MARGIN))
    if ask_each_step:
        ctl_mod.CLEAR_MARGIN = float("inf")
    for name in ("plan_lookup", "decide"):
        saved.append((ctl_mod.Controller, name,
                      timed(ctl_mod.Controller, name, "Controller." + name)))
    fresh = [0]
    evaluate_now = ctl_mod.Controller._evaluate_now

    def counted(self, *a, **kw):
        fresh[0] += 1
        return evaluate_now(self, *a, **kw)
    saved.append((ctl_mod.Controller, "_evaluate_now", evaluate_now))
    ctl_mod.Controller._evaluate_now = counted
    rng = random.Random(seed)
    try:
        streams = _streams(bs, steps * (K + 1) + 16)
        # where a draft diverges (None: it holds), drawn per request and step
        misses = [[rng.randrange(K - 1) if rng.random() < miss else None for _ in range(bs)]
                  for _ in range(steps)]
        worker = harness._worker(widths=(1, 2, 4, 8))
        auto.setup(worker, harness._spec(Path(tempfile.mkdtemp()), harness.CHEAP,
                                         speculative_ngram_verify_widths=WIDTHS),
                   plain=harness.PLAIN)
        worker.model_runner.model_config = type("C", (), {"vocab_size": 50000})()
        state = worker._fv_auto
        for _ in range(4):  # the whole steps measured while serving (one H100, SmolLM2, TP=1)
            state.costs.record(PATH, bs, 1, 1.3)
            state.costs.record(LEAN, bs, 1, 2.3)
            state.costs.record(SPEC, bs, 1, 2.9)
            state.costs.record(SPEC, bs, 8, 2.6)
        state.controller.costs = state.costs.snapshot()
        chain = harness._worker(widths=(1, 2, 4, 8))
        chain._fv_widths.config = parse_widths(WIDTHS, K, "chain")
        reqs = [type("R", (), {"rid": f"r{i}", "output_ids": list(s[:1])})()
                for i, s in enumerate(streams)]
        # the host clock as _tick reads it: every step takes the 2.6 ms the costs above hold,
        # whatever this host takes, so that the costs the controller reads stay the server's
        now = [0.0]
        state.clock = lambda: now[0]
        worker._fv = type("Hook", (), {"expect_no_drafts": lambda self, n: None})()
        saved.append((auto, "run_plain_decode", auto.run_plain_decode))

        def no_plain_decode(*a, **kw):  # (the stand-ins have no target to decode with)
            raise _PlainChosen
        auto.run_plain_decode = no_plain_decode
        decode = type("Mode", (), {"is_decode": staticmethod(lambda: True)})()
        plain_chosen = 0
        for step in range(steps):
            now[0] += 0.0026
            batch = type("B", (), {"reqs": reqs, "has_grammar": False, "forward_mode": decode})()
            rows = [streams[i][len(r.output_ids):len(r.output_ids) + K - 1]
                    for i, r in enumerate(reqs)]
            for i, at in enumerate(misses[step]):
                if at is not None:  # (a token no output holds)
                    rows[i] = rows[i][:at] + [7] + rows[i][at + 1:]
            toks, mask = harness._drafts(rows)
            t0 = time.perf_counter_ns()
            if all(r.rid in state.features for r in reqs):
                try:  # the worker's step, as the server runs it: auto's plain_step first
                    auto.plain_step(worker, batch)  # (None: the step speculates)
                except _PlainChosen:  # (the cold start: timed as a verify all the same)
                    plain_chosen += 1
            else:  # the first step (no features yet: the server's plain_step looks them up itself)
                auto._sync_requests(state, batch)
                state.synced = True
            out_t, _ = auto.step_drafts(worker, batch, toks, mask, bs)
            t2 = time.perf_counter_ns()
            verify_runtime.step_drafts(chain, np.array(toks), np.array(mask), bs)
            t3 = time.perf_counter_ns()
            times.setdefault(TOTAL_AUTO, []).append((t2 - t0) / 1e3)
            times.setdefault(TOTAL_CHAIN, []).append((t3 - t2) / 1e3)
            width = worker.draft_token_num
            for i, r in enumerate(reqs):  # the verify accepts every draft token kept, and a bonus
                kept = out_t.reshape(bs, width)[i, 1:]
                n = len(r.output_ids)
                acc = 0
                while acc < len(kept) and kept[acc] == streams[i][n + acc]:
                    acc += 1
                r.output_ids = list(streams[i][:n + acc + 1])
            verify_runtime.finish_step(worker, torch.zeros(bs * width, dtype=torch.int64), bs)
            verify_runtime.finish_step(chain, torch.zeros(bs * K, dtype=torch.int64), bs)
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)
    skip = steps // 4
    out = {k: round(statistics.median(v[skip:] if len(v) > skip else v), 2)
           for k, v in times.items()}
    # the decision's fresh evaluations (one step in `EVAL_REUSE_STEPS` on this load) sit in the
    # tail that a median leaves out; a server's throughput pays the mean
    for k in (TOTAL_AUTO, TOTAL_CHAIN):
        v = times[k][skip:] if len(times[k]) > skip else times[k]
        out[k + " (mean)"] = round(statistics.fmean(v), 2)
    out["auto verify steps at the widest width"] = state.controller.steps_by_mode.get(
        f"chain{K - 1}", 0)
    out["steps plain_step chose to run plain"] = plain_chosen
    out["decisions evaluated afresh"] = fresh[0]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bs", default="1,4", help="batch sizes, comma-separated (default 1,4)")
    ap.add_argument("--steps", type=int, default=600, help="verify steps a batch size (600)")
    ap.add_argument("--miss", type=float, default=0.0,
                    help="share of drafts that diverge at a uniformly drawn token (default 0: "
                         "every draft accepted in full)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in a.bs.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--bs: comma-separated integers, got {a.bs!r}")
    if not sizes or min(sizes) < 1 or a.steps < 8:
        ap.error("--bs must name batch sizes >= 1 and --steps must be >= 8")
    if not 0.0 <= a.miss <= 1.0:
        ap.error(f"--miss must be within [0, 1], got {a.miss}")
    from path_host_time import cpu_name

    rows = {bs: measure(bs, a.steps, miss=a.miss) for bs in sizes}
    for bs in sizes:
        before = measure(bs, a.steps, ask_each_step=True, miss=a.miss)
        rows[bs]["auto, asking at every lookup"] = before[
            TOTAL_AUTO]
    print(f"# host: {cpu_name()}; {a.steps} steady memorised verify steps a batch size "
          f"({a.miss:.0%} of the drafts diverging), medians of the last "
          f"{a.steps - a.steps // 4} (us a step)")
    counts = ("auto verify steps at the widest width", "steps plain_step chose to run plain",
              "decisions evaluated afresh")
    keys = [k for k in rows[sizes[0]] if k not in counts]
    print(f"{'':46s}" + "".join(f"{'bs ' + str(bs):>10s}" for bs in sizes))
    for k in keys:
        print(f"{k:46s}" + "".join(f"{rows[bs][k]:>10.1f}" for bs in sizes))
    gap = {bs: round(rows[bs][TOTAL_AUTO] - rows[bs][TOTAL_CHAIN], 2) for bs in sizes}
    gap_mean = {bs: round(rows[bs][TOTAL_AUTO + " (mean)"] - rows[bs][TOTAL_CHAIN + " (mean)"], 2)
                for bs in sizes}
    print(f"{'auto - chain':46s}" + "".join(f"{gap[bs]:>10.1f}" for bs in sizes))
    print(f"{'auto - chain (mean)':46s}" + "".join(f"{gap_mean[bs]:>10.1f}" for bs in sizes))
    for k in counts:
        print(f"{k:46s}" + "".join(f"{rows[bs][k]:>10d}" for bs in sizes))
    if a.json:
        Path(a.json).write_text(json.dumps({
            "environment": {"host": cpu_name(), "steps": a.steps, "bs": sizes, "k": K,
                            "widths": WIDTHS, "miss": a.miss},
            "us_per_step": {str(bs): rows[bs] for bs in sizes},
            "auto_minus_chain_us": {str(bs): gap[bs] for bs in sizes},
            "auto_minus_chain_mean_us": {str(bs): gap_mean[bs] for bs in sizes},
            "repro_command": "python lab/verify_host_time.py "
                             + " ".join(sys.argv[1:] if argv is None else argv)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
