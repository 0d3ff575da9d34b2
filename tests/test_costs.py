"""Cost tables (parse, load, calibrate, interpolation, the replay tool's one-stream view) and
whole-step costs measured while serving (fastverify/costs.py). Pure Python; runs in both CPU
environments."""
import json

import pytest

from fastverify.costs import CostTable, CostTableError, calibrate, load_cost_table, parse_cost_table

# 1 ms per token + 9
LINEAR = CostTable(((1, 10.0), (8, 17.0)), ((1, 10.0), (8, 17.0), (64, 73.0)), "linear")


# -------------------------------------------------------------------------------------- cost tables
def test_cost_table_interpolates_and_extrapolates():
    assert LINEAR.verify_ms(4) == pytest.approx(13.0)
    assert LINEAR.verify_ms(128) == pytest.approx(137.0)  # linear from the last two points
    assert LINEAR.verify_ms(0) == 10.0  # flat below the first point
    assert LINEAR.decode_ms(2) == pytest.approx(11.0)


def test_parse_cost_table_forms(tmp_path):
    t = parse_cost_table({"decode_ms": {"1": 12.2, "8": 13}, "verify_ms": {"2": 14.8, "8": 30.0}})
    assert t.decode == ((1, 12.2), (8, 13.0)) and t.verify_ms(8) == 30.0
    # the replay tool's single-stream form
    t1 = parse_cost_table({"decode_ms": 12.2, "verify_ms": {"8": 30.0}})
    assert t1.decode_ms(1) == 12.2
    wrapped = parse_cost_table({"gpu": "H200",
                                "cost_table": {"decode_ms": {"1": 1}, "verify_ms": {"1": 2}}})
    assert wrapped.verify_ms(1) == 2.0
    p = tmp_path / "c.json"
    p.write_text(json.dumps(t.to_json()))
    assert load_cost_table(p).verify == t.verify


@pytest.mark.parametrize("obj, match", [
    ([], "expected a JSON object"),
    ({"verify_ms": {"1": 1}}, "missing key 'decode_ms'"),
    ({"decode_ms": {"1": 1}, "verify_ms": {}}, "'verify_ms' must be a non-empty object"),
    ({"decode_ms": {"1": 1}, "verify_ms": {"x": 1}}, "key 'x' is not an integer"),
    ({"decode_ms": {"1": 1}, "verify_ms": {"0": 1}}, "must be an integer >= 1"),
    ({"decode_ms": {"1": -1}, "verify_ms": {"1": 1}}, "positive number of milliseconds"),
    ({"decode_ms": {"1": 1}, "verify_ms": {"1": float("nan")}}, "positive number of milliseconds"),
])
def test_bad_cost_tables(obj, match):
    with pytest.raises(CostTableError, match=match):
        parse_cost_table(obj)


def test_bad_cost_table_files(tmp_path):
    with pytest.raises(CostTableError,
                       match="--speculative-ngram-auto-cost-table .*file not found"):
        load_cost_table(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(CostTableError, match="not valid JSON"):
        load_cost_table(bad)


def test_one_stream_view_never_leaves_the_measured_range():
    """The replay tool's predictions: the same table, but a pass outside the verify entries is an
    error where `verify_ms` extrapolates, and 1 token is a decode of one request."""
    obj = {"decode_ms": 10.0, "verify_ms": {"2": 11.0, "8": 14.0}}
    t = parse_cost_table(obj, "c.json").single_stream()
    assert t.measured_pass_ms(1) == 10.0 and t.measured_pass_ms(8) == 14.0
    assert t.measured_pass_ms(5) == pytest.approx(12.5) == t.verify_ms(5)
    assert t.verify_ms(16) == pytest.approx(18.0)  # the controller's view extrapolates
    with pytest.raises(CostTableError, match=r"c.json: no verify time for 16 tokens \(table"):
        t.measured_pass_ms(16)
    with pytest.raises(CostTableError, match=r"one request \(the smallest decode entry is 4\)"):
        CostTable(((4, 1.0),), ((4, 1.0),), "t").single_stream()

def test_calibrate_takes_medians_and_respects_budget():
    calls = []

    def time_pass(kind, n):
        calls.append((kind, n))
        k = sum(1 for c in calls if c == (kind, n))
        return {1: 5.0, 2: 1.0, 3: 100.0}[k] + n  # median of (5, 1, 100) is 5

    logs = []
    t = calibrate(time_pass, [1, 4], [2, 8], repeats=3, log=logs.append)
    assert t.decode == ((1, 6.0), (4, 9.0)) and t.verify == ((2, 7.0), (8, 13.0))
    assert logs and "2 decode + 2 verify points" in logs[0]
    clock = iter(range(100)).__next__  # each clock() call advances one second
    t2 = calibrate(lambda k, n: 1.0, [1, 2, 4, 8], [1, 2, 4, 8], repeats=1, budget_s=3, clock=clock)
    assert len(t2.decode) + len(t2.verify) < 8  # stopped by the budget, kept the small points
    with pytest.raises(CostTableError, match="time budget"):
        calibrate(lambda k, n: 1.0, [1], [1], budget_s=-1)


def test_microbenchmark_json_form(tmp_path):
    rows = [{"backend": "nccl", "tokens": 1, "pass_us": 2400.0},
            {"backend": "nccl", "tokens": 8, "pass_us": 2500.0},
            {"backend": "oneshot", "tokens": 1, "pass_us": 900.0},
            {"backend": "nccl", "tokens": 64, "error": "oom"}]
    p = tmp_path / "mb.json"
    p.write_text(json.dumps({"summary": {"rows": rows}}))
    with pytest.raises(CostTableError,
                       match="several all-reduce backends; name one as PATH#backend"):
        load_cost_table(p)
    t = load_cost_table(f"{p}#nccl")
    assert t.verify == ((1, 2.4), (8, 2.5)) and t.decode_ms(1) == 2.4
    with pytest.raises(CostTableError, match="backend 'ring' not in the file"):
        load_cost_table(f"{p}#ring")


# --------------------------------------------------------------------- whole-step costs, lean steps
def test_step_costs_table_then_host_part_then_medians():
    from fastverify.costs import LEAN, SPEC, StepCosts

    table = CostTable(((1, 1.0), (4, 1.2)), ((1, 1.0), (8, 1.1), (32, 1.5)), "t")
    c = StepCosts(table, window=5, min_samples=3)
    # nothing measured: the table
    assert c.decode_ms(1) == 1.0 and c.verify_step_ms(1, 8, 8) == pytest.approx(1.1)
    # one whole step at width 8: 5.0 ms of host time on top of the 1.1 ms graph
    c.record(SPEC, 1, 8, 6.1)
    assert c.host_ms(SPEC) == pytest.approx(5.0)
    # an unmeasured size: table + the kind's host part
    assert c.verify_step_ms(4, 8, 32) == pytest.approx(1.5 + 5.0)
    assert c.decode_ms(1) == 1.0  # the other kind has its own host part (none measured yet)
    # a period that contained a prefill is an outlier; medians ignore it
    for ms in (6.0, 6.2, 60.0):
        c.record(SPEC, 1, 8, ms)
    assert c.step_ms(SPEC, 1, 8) == pytest.approx(6.15)
    for ms in (3.7, 3.6, 3.8):
        c.record(LEAN, 1, 5, ms)  # a lean step is width 1 whatever is passed
    assert c.samples(LEAN, 1, 1) == 3 and c.decode_ms(1) == pytest.approx(3.7)
    for ms in (1.0, 1.0, 1.0, 1.0, 1.0):  # the window keeps the last 5
        c.record(LEAN, 1, 1, ms)
    assert c.decode_ms(1) == pytest.approx(1.0)
    c.record(LEAN, 1, 1, float("nan"))  # ignored
    assert c.samples(LEAN, 1, 1) == 5
    with pytest.raises(ValueError, match="step kind"):
        c.record("decode", 1, 1, 1.0)


def test_a_steps_table_pass_is_read_once_per_size_and_is_the_tables():
    # every record asks for the table's pass of its step (the host part is measured - pass): kept
    # per (bs, width), the same numbers as asking the table, width 1 for every kind but SPEC
    from fastverify.costs import LEAN, PATH, SPEC, StepCosts

    calls = []

    class Counting(CostTable):
        def decode_ms(self, bs):
            calls.append(("decode", bs))
            return super().decode_ms(bs)

        def verify_ms(self, tokens):
            calls.append(("verify", tokens))
            return super().verify_ms(tokens)

    c = StepCosts(Counting(LINEAR.decode, LINEAR.verify, "t"))
    for _ in range(3):
        for kind, bs, width in ((SPEC, 2, 8), (SPEC, 2, 1), (LEAN, 3, 4), (PATH, 3, 1)):
            c.record(kind, bs, width, 30.0)
    assert sorted(calls) == [("decode", 2), ("decode", 3), ("verify", 16)]
    assert c.graph_ms(SPEC, 2, 8) == LINEAR.verify_ms(16)
    assert c.graph_ms(LEAN, 3, 4) == c.graph_ms(SPEC, 3, 1) == LINEAR.decode_ms(3)
    assert c.snapshot().graph_ms(SPEC, 2, 8) == LINEAR.verify_ms(16)


def test_medians_by_batch_size_of_one_kind():
    """What the plain path's log line reports of its probes: per batch size, the median of the
    recent periods of one kind, no other kind's and no width but 1."""
    from fastverify.costs import PATH, PATH_PROBE, SPEC, StepCosts

    c = StepCosts(LINEAR, window=3, min_samples=3)
    assert c.medians_by_bs(PATH_PROBE) == {}
    for ms in (0.9, 0.4, 0.5, 0.6):  # the window keeps the last 3
        c.record(PATH_PROBE, 4, 1, ms)
    c.record(PATH_PROBE, 1, 1, 0.3)  # one sample is enough for a median here
    c.record(PATH, 1, 1, 2.0)
    c.record(SPEC, 1, 8, 5.0)
    assert c.medians_by_bs(PATH_PROBE) == {1: 0.3, 4: 0.5}
    assert c.medians_by_bs(SPEC) == {} and c.medians_by_bs(PATH) == {1: 2.0}


def test_a_period_is_kept_only_between_two_steps_of_one_class():
    from fastverify.costs import LEAN, PROBE, SPEC, steady_period

    assert steady_period((LEAN, 2, 1), (LEAN, 2, 1))
    assert steady_period((LEAN, 2, 1), (PROBE, 2, 1))  # a probe: a plain step, a lookup beside
    assert steady_period((SPEC, 1, 8), (SPEC, 1, 8))
    assert not steady_period((LEAN, 1, 1), (SPEC, 1, 8))  # a trial among plain steps
    assert not steady_period((SPEC, 1, 8), (LEAN, 1, 1))  # the step after it
    assert not steady_period((SPEC, 1, 4), (SPEC, 1, 8))
    assert not steady_period((LEAN, 1, 1), (LEAN, 2, 1))  # the batch changed
    assert not steady_period(None, (LEAN, 1, 1))  # after a prefill


def test_no_speculation_costs_a_step_on_the_servers_own_decode_path_once_one_is_measured():
    """Where auto runs its stretches without speculation on SGLang's own decode path, choosing no
    speculation buys a step there, not the n-gram worker's wrapped plain step (LEAN), which cost
    more: measured as a plain step while the path ran most steps, it made verifies of drafts that
    accepted ~0.2 tokens look worthwhile."""
    from fastverify.controller import CHAIN, NONE, Option, choose, evaluate
    from fastverify.costs import LEAN, PATH, SPEC, StepCosts, steady_period

    table = CostTable(((1, 0.9), (4, 0.9)), ((1, 1.0), (2, 1.1), (8, 1.2)), "t")
    c = StepCosts(table, window=8, min_samples=3)
    for _ in range(3):
        c.record(LEAN, 1, 1, 2.2)  # the worker's plain step
        c.record(SPEC, 1, 2, 2.5)  # a verify of one draft token
    chain1, none = Option(CHAIN, 1, 2), Option(NONE)

    def best():
        return choose([evaluate(o, c, [0.2]) for o in (none, chain1)], none, 0.03).option

    assert c.decode_ms(1) == pytest.approx(2.2) and best() == chain1  # 1.2 / 2.5 > 1 / 2.2
    c.record(PATH, 1, 1, 1.7)  # one step on the path: its host part serves every batch size
    assert c.decode_ms(1) == pytest.approx(1.7) and c.decode_ms(4) == pytest.approx(1.7)
    assert best() == none  # 1 / 1.7 > 1.2 / 2.5
    for _ in range(3):
        c.record(PATH, 4, 1, 1.9)
    assert c.decode_ms(4) == pytest.approx(1.9) and c.step_ms(LEAN, 1, 1) == pytest.approx(2.2)
    # the frozen copy the controller reads has them too
    assert c.snapshot().decode_ms(4) == pytest.approx(1.9)
    # a step on the path is of a plain step's class: the worker's plain step before a stretch and
    # the stretch's first step are measured
    assert steady_period((LEAN, 2, 1), (PATH, 2, 1)) and steady_period((PATH, 2, 1), (PATH, 2, 1))
    assert not steady_period((PATH, 2, 1), (SPEC, 2, 2))


def test_a_spell_from_the_plain_path_is_priced_with_what_leaving_it_costs():
    """What an excursion from the server's own decode path took beyond its steps' decided costs
    (SWITCH, recorded by the glue) is added to the first step of a spell in the rate of every
    option that speculates, once measured `min_samples` times at the batch size (median, never
    below 0); not to the step's own cost, and not once a spell runs."""
    from fastverify.controller import CHAIN, NONE, Option, choose, evaluate
    from fastverify.costs import PATH, SPEC, SWITCH, StepCosts

    table = CostTable(((1, 0.9), (4, 0.9)), ((1, 1.0), (2, 1.1), (8, 1.2)), "t")
    c = StepCosts(table, window=8, min_samples=3)
    for _ in range(3):
        c.record(PATH, 4, 1, 1.9)
        c.record(SPEC, 4, 8, 3.6)
    assert c.switch_ms(4) == 0.0
    c.record(SWITCH, 4, 1, -0.5)  # an excursion may take less than its steps were priced at
    c.record(SWITCH, 4, 1, 2.0)
    assert c.switch_ms(4) == 0.0  # not measured enough yet
    c.record(SWITCH, 4, 1, 2.4)
    assert c.switch_ms(4) == pytest.approx(2.0) and c.switch_ms(1) == 0.0
    chain7, none = Option(CHAIN, 7, 8), Option(NONE)
    gains = [1.6] * 4  # 10.4 tokens in 3.6 ms against 4 in 1.9 ms; with 2.0 ms more, fewer
    e = evaluate(chain7, c, gains)
    assert e.rate == pytest.approx(10.4 / 3.6) and e.pass_ms == pytest.approx(3.6)
    e = evaluate(chain7, c, gains, switch_ms=c.switch_ms(4))
    assert e.rate == pytest.approx(10.4 / 5.6) and e.pass_ms == pytest.approx(3.6)
    assert choose([evaluate(o, c, gains, switch_ms=2.0) for o in (none, chain7)], none,
                  0.03).option == none
    for _ in range(3):
        c.record(SWITCH, 4, 1, -1.0)
    assert c.switch_ms(4) == 0.0  # never below 0
