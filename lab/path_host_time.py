"""Host time of the plain path's per-step work on this machine, with the CPU tests' stand-ins
(tests/test_plain_path.py: a scheduler, a batch of ``--bs`` requests in the middle of a stretch, a
target whose forward returns at once), so that what is measured is the glue's own Python.

    python lab/path_host_time.py [--bs 4] [--number 20000] [--json out.json]

Per call, the best of five repeats (timeit): `plain_path.choose_path` in the middle of a stretch
(what every step on the path pays before its decode preparation), `plain_path.step` around the
stand-in forward, and, as the baseline run in the same invocation, the two constructs those
functions used before: an import statement run inside the function, and the swap of the runner's
algorithm through `verify_runtime.plain_algorithm` (a generator context manager) instead of one
try/finally. Last, the median of ``--asks`` of what a stretch pays once per lookup due on top of
that (`ask_us`): the controller counting the stretch's steps and answering whether the lookup is a
real one, a probe or held, with the server's configuration (8 draft tokens, widths 1,2,4,8), each
ask after a probe's worth of news (its drafts' features, resolved drafts observed, a new snapshot of
the measured costs), so that none of the controller's kept answers still holds, and again where the
costs' copy stays (a probe renews it once `cost_sync_steps` of the controller's steps have passed).
Absolute times are this host's only; on the GPU machine the step tracer (lab/step_trace.py)
measures the step itself.
"""
import argparse
import json
import os
import platform
import sys
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests")]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ask_us(bs: int, asks: int, seed: int = 0, renew: bool = True) -> float:
    """Median host time (us) of `plain_path._lookup_due`'s controller calls at a lookup due:
    `Controller.note_plain_path` for the stretch's steps, `steps_without_lookup` (more steps where
    a probe is held for want of credit), and where it gives 0, `lookup_on_plain_path`. The
    server's configuration from its flags (8 draft tokens, verify widths 1,2,4,8, auto); before
    each ask, what a probe brings: new features for every request (`note_probe`), resolved drafts
    observed, and (``renew``) a new snapshot of the measured costs, which a probe makes once
    `cost_sync_steps` of the controller's steps have passed (`plain_path._probe`)."""
    import json as _json
    import random
    import statistics
    from types import SimpleNamespace

    from fastverify.controller import Controller, RequestView
    from fastverify.costs import PATH, PATH_PROBE, StepCosts, load_cost_table
    from fastverify.gains import DraftFeatures
    from fastverify.glue.config import verify_config
    from fastverify.glue.plain_path import MAX_STRETCH

    table = Path(tempfile.mkdtemp()) / "costs.json"  # one H200 at TP=1's shape, roughly
    table.write_text(_json.dumps({"decode_ms": {"1": 1.9, "64": 2.2},
                                  "verify_ms": {"1": 1.9, "8": 2.4, "32": 2.8, "64": 3.3}}))
    spec = SimpleNamespace(speculative_ngram_verify_mode="auto", speculative_num_draft_tokens=8,
                           speculative_ngram_match_type="BFS",
                           speculative_ngram_verify_widths="1,2,4,8",
                           speculative_ngram_auto_cost_table=str(table),
                           speculative_ngram_auto_hysteresis=0.03)
    cfg = verify_config(spec).auto
    costs = StepCosts(load_cost_table(str(table), "--speculative-ngram-auto-cost-table"))
    ctl = Controller(cfg, costs.snapshot())
    rng = random.Random(seed)
    rids = [f"r{i}" for i in range(bs)]
    for r in rids:
        ctl.note_sampling(r, False)
    times = []
    for _ in range(asks):
        feats = {r: DraftFeatures(rng.choice((0, 1, 2, 3)), rng.choice((0, 1, 2))) for r in rids}
        ctl.note_probe([RequestView(r, feats[r]) for r in rids])
        for r in rids:
            ctl.observe(r, DraftFeatures(rng.choice((1, 2, 3)), 1), 0)
        for _ in range(4):
            costs.record(PATH, bs, 1, 1.9 + 0.1 * rng.random())
        costs.record(PATH_PROBE, bs, 1, 0.6)
        if renew:
            ctl.costs = costs.snapshot()
        n = ctl.steps_without_lookup(cfg.probe_max, MAX_STRETCH, rids, bs)
        views = [RequestView(r, feats[r]) for r in rids]
        t0 = time.perf_counter()
        ctl.note_plain_path(bs, n, ends=False)
        if ctl.steps_without_lookup(cfg.probe_max, MAX_STRETCH, rids, bs) == 0:
            ctl.lookup_on_plain_path(views, cfg.probe_max)
        times.append(1e6 * (time.perf_counter() - t0))
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bs", type=int, default=4, help="requests in the batch (default 4)")
    ap.add_argument("--number", type=int, default=20000, help="calls per repeat (default 20000)")
    ap.add_argument("--asks", type=int, default=300,
                    help="lookups due timed for the controller's ask (default 300)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)
    if a.bs < 1 or a.number < 1 or a.asks < 1:
        ap.error("--bs, --number and --asks must be >= 1")

    import test_plain_path as harness
    from types import SimpleNamespace

    from fastverify.glue import plain_path
    from fastverify.glue.verify_runtime import plain_algorithm

    w, state = harness._state(Path(tempfile.mkdtemp()), stretch_from_now=10 ** 6)
    books = harness.Books([[1, 2, 3]] * a.bs, "0.5.16")
    harness._run_steps(w, state, books, 3)
    sched, batch = harness._scheduler(w, books), books.batch
    assert batch.spec_algorithm.is_none(), "the stand-in batch did not reach the plain path"
    state.stretch_len = 10 ** 12  # no lookup comes due: the middle of a stretch
    w.target_worker = SimpleNamespace(forward_batch_generation=lambda b: "result")
    mr = w.model_runner

    def in_function_import():
        from fastverify.glue.auto import _plain_capable  # noqa: F401

    def generator_swap():
        with plain_algorithm(mr):
            pass

    def inline_swap():
        saved = mr.spec_algorithm
        mr.spec_algorithm = type(saved).NONE
        try:
            pass
        finally:
            mr.spec_algorithm = saved

    def module_name():
        return plain_path._plain_capable

    cases = [
        ("choose_path, middle of a stretch", lambda: plain_path.choose_path(sched, batch)),
        ("step around the forward", lambda: plain_path.step(w, batch, state)),
        ("baseline: import statement in a function", in_function_import),
        ("  now: a module-level name", module_name),
        ("baseline: plain_algorithm (generator)", generator_swap),
        ("  now: one try/finally", inline_swap),
    ]
    rows = []
    for name, fn in cases:
        best = min(timeit.repeat(fn, number=a.number, repeat=5)) / a.number * 1e6
        rows.append({"what": name, "us_per_call": round(best, 3)})
    rows.append({"what": f"the controller's ask at a lookup due (median of {a.asks})",
                 "us_per_call": round(ask_us(a.bs, a.asks), 3)})
    rows.append({"what": "  the same where the costs' copy stays (no renewal at the probe before)",
                 "us_per_call": round(ask_us(a.bs, a.asks, renew=False), 3)})
    env = {"cpu": cpu_name(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "bs": a.bs, "number": a.number, "asks": a.asks}
    print(f"# plain path host time per call (best of 5 x {a.number}), {env['cpu']}, "
          f"Python {env['python']}, bs {a.bs}")
    for r in rows:
        print(f"{r['us_per_call']:9.3f} us  {r['what']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"environment": env, "rows": rows,
                       "repro_command": "python lab/path_host_time.py " + " ".join(
                           sys.argv[1:] if argv is None else argv)}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
