"""The within-process A/B: the step recorder's variants (lab/steptrace/steptrace.py, on a stand-in
scheduler driven by a fake clock) and lab/ab_within.py on records whose difference is known by
construction, with the drift and batch-size mix that make two servers' periods hard to compare."""

import gc
import json
import random
import types

import ab_within  # lab/ and lab/steptrace/ are on sys.path (tests/conftest.py)
import pytest
import steptrace
from test_step_trace import Clock  # (the step recorder's tests' fake clock)


class Algo:
    def __init__(self, none):
        self.none = none

    def is_none(self):
        return self.none


def path_batch(mode="DECODE", on_path=True):
    return types.SimpleNamespace(forward_mode=types.SimpleNamespace(name=mode), reqs=[1, 2],
                                 spec_algorithm=Algo(on_path), req_pool_indices="rows",
                                 seq_lens=10)


class AutoScheduler:
    """A stand-in scheduler of an auto-mode n-gram server whose worker has run no step yet (what
    the step recorder reads of it); each test adds its own run_batch."""

    def __init__(self):
        self.draft_worker = types.SimpleNamespace(_fv_auto=types.SimpleNamespace(last_step=None))


def test_variants_alternate_in_blocks_of_decode_steps_and_b_adds_its_work(tmp_path):
    clock = Clock()
    extras = []

    class Scheduler(AutoScheduler):
        def run_batch(self, batch):
            clock.advance(0.001)
            return "result"

    def extra(scheduler, batch, mode, on_path):
        extras.append((mode, on_path))
        clock.advance(0.00002)

    path = tmp_path / "steps-1.jsonl"
    trace = steptrace.StepTrace(str(path), clock=clock)
    trace.ab = steptrace.WithinAB(extra, block=2)
    Scheduler.run_batch = trace.wrap_run_batch(Scheduler.run_batch)
    s = Scheduler()
    modes = ["DECODE", "DECODE", "EXTEND", "DECODE", "DECODE", "DECODE"]
    for m in modes:
        s.run_batch(path_batch(m, on_path=m == "DECODE"))  # (a prefill reads as speculative)
    trace.flush()
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    # blocks of two decode steps, "a" first; the prefill takes the variant of the block it is in
    assert [r[-1] for r in recs] == ["a", "a", "b", "b", "b", "a"]
    assert extras == [("EXTEND", False), ("DECODE", True), ("DECODE", True)]
    # the extra work is inside the step: the launch record ends after it
    assert [round(1000 * (r[2] - r[1]), 3) for r in recs] == [1.0, 1.0, 1.02, 1.02, 1.02, 1.0]
    # without an A/B the records keep their length
    trace.ab = None
    s.run_batch(path_batch())
    assert len(trace.records[-1]) == 10


def test_spin_waits_its_microseconds_on_decode_steps():
    clock = Clock()
    ticks = []

    def tick():
        clock.advance(0.000004)
        ticks.append(1)
        return clock()

    spin = steptrace.spinner(20, clock=tick)
    t0 = clock()
    spin(None, None, "DECODE", False)
    assert clock() - t0 >= 0.00002 and len(ticks) == 6
    spin(None, None, "EXTEND", False)
    assert len(ticks) == 6


@pytest.mark.parametrize("env, error", [
    ({"FASTVERIFY_STEP_TRACE_AB": "put_frist"}, "one of put_first or spin:US"),
    ({"FASTVERIFY_STEP_TRACE_AB": "spin:0"}, "microseconds > 0"),
    ({"FASTVERIFY_STEP_TRACE_AB": "spin:x"}, "microseconds > 0"),
    ({"FASTVERIFY_STEP_TRACE_AB": "spin:5", "FASTVERIFY_STEP_TRACE_AB_BLOCK": "0"}, ">= 1"),
    ({"FASTVERIFY_STEP_TRACE_AB": "put_first", "FASTVERIFY_STEP_TRACE_AB_BLOCK": "0"}, ">= 1"),
    ({"FASTVERIFY_STEP_TRACE_AB": "put_first", "FASTVERIFY_STEP_TRACE_AB_BLOCK": "x"}, "integer"),
])
def test_a_misnamed_ab_stops_the_launch_with_what_it_accepts(env, error):
    with pytest.raises(ValueError, match=error):
        steptrace.install_import_hook({"FASTVERIFY_STEP_TRACE": "/tmp/x", **env})


def test_the_ab_env_picks_the_variant_and_block():
    assert steptrace.within_ab({}) is None
    ab = steptrace.within_ab({"FASTVERIFY_STEP_TRACE_AB": "put_first",
                              "FASTVERIFY_STEP_TRACE_AB_BLOCK": "8"})
    assert ab.extra is None and isinstance(ab.policy, steptrace.Swap) and ab.block == 8
    assert steptrace.within_ab({"FASTVERIFY_STEP_TRACE_AB": "spin:15"}).block == steptrace.AB_BLOCK


def test_a_policy_variant_runs_each_step_with_the_policy_of_its_block(tmp_path):
    """``put_first``: the plain path's leave is the variant's for every step of a "b" block and its
    own in an "a" block, set before each step's path choice (the end of the step before), and no
    extra work is added."""
    from fastverify.glue import plain_path

    own = plain_path.leave
    seen = []

    class Scheduler(AutoScheduler):
        def run_batch(self, batch):
            seen.append(plain_path.leave is own)  # what the step's own path logic calls
            return "result"

    ab = steptrace.within_ab({"FASTVERIFY_STEP_TRACE_AB": "put_first",
                              "FASTVERIFY_STEP_TRACE_AB_BLOCK": "2"})
    assert ab.extra is None
    trace = steptrace.StepTrace(str(tmp_path / "steps-1.jsonl"), clock=Clock())
    trace.span_targets = ()  # (a span would wrap leave itself)
    trace.ab = ab
    Scheduler.run_batch = trace.wrap_run_batch(Scheduler.run_batch)
    s = Scheduler()
    try:
        for _ in range(6):
            s.run_batch(path_batch())
            # the next step's path choice (before its run_batch) sees the next step's policy
            seen.append(("choice", plain_path.leave is own))
    finally:
        plain_path.leave = own
    assert [r[-1] for r in trace.records] == ["a", "a", "b", "b", "a", "a"]
    assert seen == [True, ("choice", True), True, ("choice", False), False, ("choice", False),
                    False, ("choice", True), True, ("choice", True), True, ("choice", False)]


def test_the_put_first_variant_puts_a_stretchs_last_output_as_it_leaves(monkeypatch):
    """``put_first`` (variant "b"): the stretch's held-back output goes to the corpus right after
    `plain_path.leave`, before the worker's lookup; variant "a" leaves it held back."""
    from fastverify.glue import plain_path

    calls = []
    monkeypatch.setattr(plain_path, "leave",
                        lambda sched, batch, state, why="": calls.append(("leave", why)))
    monkeypatch.setattr(plain_path, "put_pending",
                        lambda worker, state: calls.append(("put", worker)))
    swap = steptrace.Swap(*steptrace.AB_POLICIES["put_first"])
    sched = types.SimpleNamespace(model_worker="w")
    swap("b")
    plain_path.leave(sched, None, None, "a lookup is due")
    swap("a")
    plain_path.leave(sched, None, None, "request joined")
    assert calls == [("leave", "a lookup is due"), ("put", "w"), ("leave", "request joined")]


def synthetic(n=6000, block=32, extra_ms=0.02, seed=1, kind="path"):
    """Launch and processing records of ``n`` decode steps: periods of ~1.8 ms that drift upwards
    by half over the run, batch sizes 1 then 4 (each with its own base), noise of 0.15 ms, and
    ``extra_ms`` more on each step of variant "b" (blocks of ``block`` decode steps). Every 50th
    step is of another kind (a probe of the worker: 3 ms)."""
    rng = random.Random(seed)
    recs, t = [], 0.0
    for i in range(n):
        variant = "b" if (i // block) % 2 else "a"
        bs = 1 if i < n // 2 else 4
        step_kind = "lean" if i % 50 == 49 else kind
        base = (1.8 if bs == 1 else 2.1) * (1.0 + 0.5 * i / n)
        if step_kind != kind:
            base = 3.0
        period = base + rng.gauss(0.0, 0.15) + (extra_ms if variant == "b" else 0.0)
        recs.append(["R", t, t + 0.0005, "DECODE", bs, step_kind, 1, False, {}, "greedy",
                     variant])
        recs.append(["P", t + 0.0006, t + 0.0008, 0.0])
        t += period / 1000.0
    recs.append(["R", t, t + 0.0005, "EXTEND", 1, None, None, None, {}, "greedy", "a"])
    return recs


def test_the_paired_blocks_recover_a_known_cost_under_drift_and_a_batch_size_change():
    res = ab_within.analyze(synthetic(), kind="path")
    est = res["b_minus_a"]
    assert est["pairs"] >= 90
    assert est["lo"] < 0.02 < est["hi"] and est["lo"] > 0.0
    assert abs(est["ms"] - 0.02) < 0.01
    # the medians per variant alone carry the drift and the batch-size mix
    assert res["variants"]["a"]["steps"] > 2500 and res["variants"]["b"]["steps"] > 2500


def test_no_cost_gives_an_interval_around_zero_and_other_kinds_are_left_out():
    est = ab_within.analyze(synthetic(extra_ms=0.0, seed=2), kind="path")["b_minus_a"]
    assert est["lo"] < 0.0 < est["hi"]
    # the 3 ms steps of another kind, kept, would add their noise to both sides but no bias
    lean = ab_within.analyze(synthetic(extra_ms=0.0, seed=2), kind="lean")["b_minus_a"]
    assert lean["pairs"] == 0 and lean["ms"] is None  # (one step of a kind per block: too few)


def test_blocks_are_cut_by_variant_and_broken_by_steps_without_one():
    rows = [{"index": i, "variant": v} for i, v in enumerate("aabbxab") if v != "x"]
    rows[4]["variant"] = None  # a launch of the trace without a variant
    got = [(v, [r["index"] for r in rs]) for v, rs in ab_within.blocks(rows)]
    assert got == [("a", [0, 1]), ("b", [2, 3]), ("b", [6])]


def test_main_prints_writes_json_and_refuses_a_trace_without_variants(tmp_path, capsys):
    f = tmp_path / "steps-7.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in synthetic(n=2000)))
    out = tmp_path / "ab.json"
    assert ab_within.main([f"auto_never={f}", "--kind", "path", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "within-process A/B" in printed and "auto_never" in printed
    data = json.loads(out.read_text())
    assert data["results"]["auto_never"]["b_minus_a"]["pairs"] > 20
    assert data["repro_command"].startswith("python lab/ab_within.py auto_never=")
    plain = tmp_path / "steps-8.jsonl"
    plain.write_text(json.dumps(["R", 0.0, 0.001, "DECODE", 1, None, None, None, {}, None]) + "\n")
    assert ab_within.main([str(plain)]) == 2
    assert "no step carries a variant" in capsys.readouterr().err


def test_the_recorder_with_spin_and_the_analysis_agree(tmp_path):
    """The recorder's own records, a stand-in scheduler whose steps take 1.8 ms plus noise, and
    spin:30 on a fake clock: the analysis finds the 0.03 ms."""
    clock = Clock()
    rng = random.Random(3)

    class Scheduler:
        def __init__(self):
            self.draft_worker = None

        def run_batch(self, batch):
            clock.advance(0.0018 + rng.gauss(0.0, 0.0001))
            return "result"

    def tick():
        clock.advance(0.000001)
        return clock()

    path = tmp_path / "steps-9.jsonl"
    trace = steptrace.StepTrace(str(path), clock=clock)
    trace.ab = steptrace.WithinAB(steptrace.spinner(30, clock=tick), block=16)
    Scheduler.run_batch = trace.wrap_run_batch(Scheduler.run_batch)
    s = Scheduler()
    try:
        for _ in range(3000):
            s.run_batch(path_batch(on_path=False))
    finally:
        gc.collect()
    trace.flush()
    est = ab_within.analyze(ab_within.step_trace.load_records(path))["b_minus_a"]
    assert est["lo"] < 0.030 < est["hi"] and abs(est["ms"] - 0.030) < 0.005


def test_the_evaluation_prices_the_ab_of_the_servers_started_with_one(tmp_path):
    """evaluate.sh's within_ab, run on its own: only the server whose ENV_SERVER_<name> sets an A/B
    gets an analysis of all its decode steps, with its last line logged."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = (root / "lab/gpu/evaluate.sh").read_text()
    start = script.index("within_ab() {")
    body = script[start:script.index("\n}\n", start) + 3]
    w, r = tmp_path / "w", tmp_path / "r"
    for name in ("A", "auto_never_b", "P", "auto_w_b"):
        d = w / "steps" / f"none.{name}"
        d.mkdir(parents=True)
        (d / "steps-1.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in synthetic(n=2000, kind="path")))
    r.mkdir()
    shell = (f"set -u\nlog() {{ echo \"LOG $*\"; }}\n"  # (evaluate.sh runs under set -u)
             "servers_of() { printf 'A|plain|30000|x\\nauto_never_b|auto|30010|y\\n"
             "P|plain|30020|z\\nauto_w_b|auto|30030|v\\n'; }\n"
             f"W={w} R={r} ROOT={root}\n{body}\nwithin_ab none 0\n")
    env = dict(os.environ, ENV_SERVER_auto_never_b="FASTVERIFY_STEP_TRACE_AB=put_first",
               ENV_SERVER_P="FASTVERIFY_STEP_TRACE_AB=spin:20",
               ENV_SERVER_auto_w_b="FASTVERIFY_STEP_TRACE_AB=put_first")
    out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in r.iterdir()) == [
        "ab_none.P.json", "ab_none.P.txt", "ab_none.auto_never_b.json", "ab_none.auto_never_b.txt",
        "ab_none.auto_w_b.json", "ab_none.auto_w_b.txt"]
    # every variant left changes steps of every kind: no kind kept apart
    for name in ("auto_never_b", "P", "auto_w_b"):
        data = json.loads((r / f"ab_none.{name}.json").read_text())
        assert data["results"][name]["kind"] is None and "--kind" not in data["repro_command"]
    assert data["results"][name]["b_minus_a"]["pairs"] > 20
    assert "LOG profile none: within-process A/B of auto_never_b (rc=0): auto_never_b" in out.stdout


def test_the_step_statistics_compare_servers_without_the_b_steps(tmp_path, capsys):
    """lab/step_trace.py on an A/B server's trace: its statistics keep the steps of variant a
    only (the server as it runs), and it says how many it left out."""
    import step_trace

    recs = synthetic(n=2000, extra_ms=0.5, kind="path")
    res = step_trace.analyze(recs)
    kept = res["decode"]["steps"]
    assert res["ab_b_steps_left_out"] > 900 and kept + res["ab_b_steps_left_out"] > 1990
    # the 0.5 ms of the b steps is not in the median period of what is kept: that is the median
    # of the a steps' own periods, and all steps' median lies well above it
    runs = [r for r in recs if r[0] == "R"]
    periods = {"a": [], "all": []}
    for cur, nxt in zip(runs, runs[1:]):
        if cur[3] == nxt[3] == "DECODE" and cur[4] == nxt[4]:
            ms = 1000.0 * (nxt[1] - cur[1])
            periods["all"].append(ms)
            if cur[10] == "a":
                periods["a"].append(ms)
    median_a, median_all = (sorted(v)[len(v) // 2] for v in (periods["a"], periods["all"]))
    assert abs(res["decode"]["period_median"] - median_a) < 0.01 < median_all - median_a - 0.1
    f = tmp_path / "steps-3.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert step_trace.main([f"auto_never_b={f}"]) == 0
    assert "variant b left out of the statistics above" in capsys.readouterr().out
