"""The auto verify controller: decision rule (golden and property tests), configuration,
lookups and probes, logging and metrics (fastverify/controller.py). Pure Python; runs in
both CPU environments."""
import math
import random

import pytest

from fastverify.controller import (CHAIN, NONE, TREE, AutoConfig, Controller, Option, RequestView,
                                   choose, evaluate, follow_bound_steps, options_for)
from fastverify.costs import CostTable
from fastverify.gains import DraftFeatures

# verify as cheap as decode
FLAT = CostTable(((1, 10.0), (64, 10.0)), ((1, 10.0), (8, 10.0), (64, 10.0)), "flat")
# 1 ms per token + 9
LINEAR = CostTable(((1, 10.0), (8, 17.0)), ((1, 10.0), (8, 17.0), (64, 73.0)), "linear")


def test_a_full_match_wanted_is_judged_by_requests_that_decode_alike():
    """`_full_match_wanted` (first lookups, lookups behind) asks for each request as it decodes:
    after a greedy load whose full matches were accepted, a new greedy request's full match is worth
    verifying, a new sampled one's is not; `finish` forgets what a request was told."""
    ctl = Controller(AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8),
                                shape="uniform"), FLAT)
    for step in range(6):
        ctl.observe("old", DraftFeatures(7, 1), step, 7)
    ctl.note_sampling("s", True)
    ctl.note_sampling("g", False)
    assert ctl.samples("s") and not ctl.samples("g") and not ctl.samples("never told")
    assert ctl._full_match_wanted(["g"]) is True
    assert ctl._full_match_wanted(["s"]) is False
    assert ctl.defer_first_lookup(["g"]) is False  # full matches wanted: looked up at once
    assert (ctl.no_draft("s") == DraftFeatures(0, 0, True)
            and ctl.no_draft("g") == DraftFeatures(0, 0))
    ctl.finish("s")
    assert not ctl.samples("s")


# ------------------------------------------------------------------------------------ decision rule
def _evals(costs, gains_by_option, bs, shape="ragged"):
    opts = options_for(4, 6)
    out = []
    for o in opts:
        g = gains_by_option(o)
        out.append(evaluate(o, costs, [g] * bs, shape))
    return out


def test_golden_rates():
    # bs 2, chain 2 (width 3): verify(6 tokens) on LINEAR = 15 ms; 2 requests x (1 + 1.5) tokens
    e = evaluate(Option(CHAIN, 2, 3), LINEAR, [1.5, 1.5])
    assert (e.pass_ms == pytest.approx(15.0) and e.tokens == pytest.approx(5.0)
            and e.rate == pytest.approx(5 / 15))
    # request 2 has gain (1 + 0.2) * 11 / 15 < 1: it verifies nothing; ragged pass = 3 + 1 tokens
    e = evaluate(Option(CHAIN, 2, 3), LINEAR, [1.5, 0.2])
    assert (e.speculate == (True, False) and e.pass_ms == pytest.approx(13.0)
            and e.tokens == pytest.approx(3.5))
    e = evaluate(Option(CHAIN, 2, 3), LINEAR, [1.5, 0.2], shape="uniform")
    assert e.pass_ms == pytest.approx(15.0)
    assert evaluate(Option(NONE), LINEAR, [9.0, 9.0]).rate == pytest.approx(2 / 11)


def test_acceptance_zero_picks_none_unless_verify_is_free():
    for bs in (1, 4, 32):
        evals = _evals(LINEAR, lambda o: 0.0, bs)
        assert choose(evals, None, 0.03).option.kind == NONE


def test_chain_beats_tree_when_cost_grows_with_tokens():
    # same expected acceptance for chain 4 and the 6-wide tree: the chain's pass is smaller
    evals = _evals(LINEAR, lambda o: 0.0 if o.kind == NONE else min(o.k, 3) * 0.9, 1)
    best = choose(evals, None, 0.0).option
    assert best.kind == CHAIN
    evals = _evals(FLAT, lambda o: 0.0 if o.kind == NONE
                   else (2.0 if o.kind == TREE else 0.3 * o.k), 1)
    # verify is free: the tree's extra acceptance wins
    assert choose(evals, None, 0.0).option.kind == TREE


@pytest.mark.parametrize("seed", range(30))
def test_property_never_below_none_by_more_than_hysteresis(seed):
    rng = random.Random(seed)
    h = rng.choice([0.0, 0.03, 0.1])
    bs = rng.choice([1, 2, 8, 32])
    pts = sorted(rng.sample(range(1, 300), 4))
    vals = sorted(rng.uniform(5, 50) for _ in pts)
    costs = CostTable(((1, vals[0]),), tuple(zip(pts, vals)))
    opts = options_for(5, 8)
    current = None
    for _ in range(20):
        per_req = [sorted(rng.uniform(0, 3) for _ in range(5)) for _ in range(bs)]
        evals = [evaluate(o, costs, [0.0 if o.kind == NONE
                                     else (r[o.k - 1] if o.kind == CHAIN else r[-1] * 1.1)
                                     for r in per_req]) for o in opts]
        e = choose(evals, current, h)
        best = max(x.rate for x in evals)
        none = evals[0].rate
        assert e.rate * (1 + h) >= best - 1e-12
        assert e.rate * (1 + h) >= none - 1e-12
        current = e.option


@pytest.mark.parametrize("seed", range(20))
def test_property_monotonic_in_cost_and_gain(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 4, 16])
    base = rng.uniform(5, 20)
    slope = rng.uniform(0.01, 2)
    costs = CostTable(((1, base), (bs, base + slope * (bs - 1))),
                      ((1, base), (512, base + slope * 511)))
    gains = [rng.uniform(0, 2) for _ in range(bs)]
    o = Option(CHAIN, 3, 4)
    r0 = evaluate(o, costs, gains).rate
    # more expected acceptance never lowers an option's rate; a dearer verify never raises it
    assert evaluate(o, costs, [g + 0.5 for g in gains]).rate >= r0 - 1e-12
    assert evaluate(o, costs.scaled(verify=1.5), gains).rate <= r0 + 1e-12
    # the choice: more gain never moves from speculating to none; dearer verify
    # never moves from none to spec
    def pick(c, gs):
        ev = [evaluate(op, c, [0.0 if op.kind == NONE else g * min(op.k, 3) / 3 for g in gs])
              for op in options_for(4, 0)]
        return choose(ev, None, 0.0).option
    p0 = pick(costs, gains)
    if p0.kind != NONE:
        assert pick(costs, [g * 2 for g in gains]).kind != NONE
    else:
        assert pick(costs.scaled(verify=2.0), gains).kind == NONE


def test_hysteresis_keeps_current_within_margin():
    a = evaluate(Option(NONE), FLAT, [0.0])  # rate 0.1
    b = evaluate(Option(CHAIN, 1, 2), FLAT, [0.02])  # rate 0.102
    assert choose([a, b], Option(NONE), 0.03).option.kind == NONE
    assert choose([a, b], None, 0.03).option.kind == CHAIN
    c = evaluate(Option(CHAIN, 2, 3), FLAT, [0.5])
    assert choose([a, b, c], Option(NONE), 0.03).option.k == 2


def test_options_for_captured_widths():
    labels = [o.label for o in options_for(7, 8, chain_widths=(2, 4, 8))]
    assert labels == ["none", "chain1", "chain3", "chain7", "tree8"]
    assert [o.label for o in options_for(2, 0)] == ["none", "chain1", "chain2"]


# --------------------------------------------------------------------------------------- controller
def test_auto_config_validation():
    with pytest.raises(ValueError, match="--speculative-ngram-auto-hysteresis"):
        AutoConfig(hysteresis=0.7)
    with pytest.raises(ValueError, match="--speculative-num-draft-tokens"):
        AutoConfig(max_chain=0)
    with pytest.raises(ValueError, match="shape must be one of ragged, uniform"):
        AutoConfig(shape="square")
    assert (follow_bound_steps(AutoConfig(max_chain=7, half_life_steps=8))
            == 8 + math.ceil(8 * math.log2(10)))


def test_controller_cold_start_learns_and_logs_rarely():
    logs = []
    now = [0.0]
    c = Controller(AutoConfig(max_chain=3, tree_width=0, log_interval_s=10.0), LINEAR,
                   log=logs.append, clock=lambda: now[0])
    f = DraftFeatures(4, 1)
    views = [RequestView("a", f), RequestView("b", f)]
    assert c.decide(views).option.kind == NONE  # nothing seen yet: no speculation
    for step in range(40):
        for r in ("a", "b"):
            c.observe(r, f, 3)
        d = c.decide(views)
        now[0] += 1.0
    assert d.option == Option(CHAIN, 3, 4) and d.speculate == (True, True)
    assert 3 <= len(logs) <= 5  # 41 decisions over 40 s at one line per 10 s
    assert {"option", "rates_tok_per_ms", "decode_ms", "pass_ms", "bs"} <= set(logs[-1])
    m = c.metrics()
    assert (m["auto_chain_k"] == 3.0 and m["auto_steps_total"] == 41.0
            and m["auto_steps_none_total"] >= 1)
    assert m["auto_expected_speedup"] > 1.0
    c.finish("a")
    assert ("a", True) not in c.gain._local


def test_controller_gates_unmatched_requests():
    c = Controller(AutoConfig(max_chain=2, tree_width=0), LINEAR)
    hit, miss = DraftFeatures(4, 1), DraftFeatures(0, 0)
    for _ in range(30):
        c.observe("a", hit, 2)
        c.observe("b", miss, 0)
        d = c.decide([RequestView("a", hit), RequestView("b", miss)])
    assert d.option.kind == CHAIN and d.speculate == (True, False)


# --------------------------------------------------------------------- whole-step costs, lean steps
def test_measured_host_time_changes_the_choice():
    """Graph times say a width-8 chain costs as much as a decode; whole steps say it costs
    1.8x. At a mean acceptance of 0.5 tokens the table's choice is the chain, the measured
    steps' choice is none."""
    from fastverify.costs import LEAN, SPEC, StepCosts

    table = CostTable(((1, 1.0),), ((1, 1.0), (8, 1.05)), "graphs")
    gains = [0.5]
    by_table = max((evaluate(o, table, gains, "uniform") for o in options_for(7, 0, (1, 2, 4, 8))),
                   key=lambda e: e.rate)
    assert by_table.option.kind == "chain"
    steps = StepCosts(table)
    for _ in range(3):
        steps.record(LEAN, 1, 1, 3.7)
        steps.record(SPEC, 1, 8, 6.7)
        steps.record(SPEC, 1, 2, 6.5)
        steps.record(SPEC, 1, 4, 6.6)
    best = max((evaluate(o, steps, gains, "uniform") for o in options_for(7, 0, (1, 2, 4, 8))),
               key=lambda e: e.rate)
    assert best.option.kind == "none"


def _lean_cheaper(lean_ms=3.7, lookup_ms=6.5):
    """Step costs in which a step without a lookup is measured cheaper than a
    lookup step of width 1."""
    from fastverify.costs import LEAN, SPEC, StepCosts

    c = StepCosts(CostTable(((1, 10.0),), ((1, 10.0), (8, 10.5)), "t"))
    for _ in range(3):
        c.record(LEAN, 1, 1, lean_ms)
        c.record(SPEC, 1, 1, lookup_ms)
        c.record(SPEC, 1, 8, lookup_ms + 0.2)
    return c


def _counting(cfg, rids=("r",), what=lambda reqs, step: step):
    """A controller on `_lean_cheaper` costs whose gain model saw each of `rids` accept six full
    matches, and the list its evaluations of the options are noted in (`what` of each)."""
    ctl = Controller(cfg, _lean_cheaper())
    for _ in range(6):
        for r in rids:
            ctl.observe(r, DraftFeatures(7, 1), 7)
    calls = []
    real = ctl._evaluate_now
    ctl._evaluate_now = lambda reqs, step: (calls.append(what(reqs, step)), real(reqs, step))[1]
    return ctl, calls


def test_lean_steps_only_where_measured_to_pay():
    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    views = [RequestView("r", DraftFeatures(7, 1))]
    # a plain table: no lean step, look up every step
    assert Controller(cfg, FLAT).lean_pays(1) is False
    assert Controller(cfg, FLAT).plan_lookup(views) is True
    assert Controller(cfg, _lean_cheaper()).lean_pays(1) is True
    # < 2 % cheaper: not worth it
    assert Controller(cfg, _lean_cheaper(6.45, 6.5)).lean_pays(1) is False
    from fastverify.costs import StepCosts

    fresh = StepCosts(FLAT)
    assert Controller(cfg, fresh).lean_pays(1) is True  # not measured yet: lean steps measure it


def test_plan_lookup_pessimistic_start_learning_and_probes():
    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    table = _lean_cheaper()
    ctl = Controller(cfg, table)
    f = DraftFeatures(7, 1)
    views = [RequestView("r", f)]
    assert ctl.plan_lookup(views) is False  # the prior: nothing accepted yet
    d = ctl.note_lean(1)
    assert (d.option.kind == "none" and ctl.counters["lean_steps"] == 1
            and ctl.steps_by_mode["none"] == 1)
    for _ in range(6):
        ctl.observe("r", f, 7)  # drafts of this match were right in full
    assert ctl.plan_lookup(views) is True
    assert ctl.plan_lookup([]) is False


def test_plan_lookup_behind_keeps_the_probe_schedule_where_lookups_were_not_measured_dearer():
    """A lookup behind the step in flight costs host time only: it is made when wanted or on
    the probe schedule, not on every step just because a lookup step was never measured
    dearer than a plain one."""
    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    views = [RequestView("r", DraftFeatures(7, 1))]
    # a plain table: every step
    assert Controller(cfg, FLAT).plan_lookup(views, probe_max=8) is True
    ctl = Controller(cfg, FLAT)
    at = []
    for i in range(1, 17):
        if ctl.plan_lookup(views, probe_max=8, behind=True):
            ctl.decide(views, behind=True)
            at.append(i)
        else:
            ctl.note_lean(1)
    assert at == [1, 3, 7, 15] and ctl.counters["behind_lookups"] == 4


def test_wanted_is_asked_again_only_when_its_inputs_change():
    """`plan_lookup` asks the same question on most steps without speculation: the answer is kept
    until the gain model observes something, the costs change, or WANTED_REFRESH_STEPS steps pass,
    and it is the answer a fresh evaluation gives."""
    from fastverify.controller import WANTED_REFRESH_STEPS

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    ctl = Controller(cfg, _lean_cheaper())
    calls = []
    real = ctl._evaluate
    ctl._evaluate = lambda reqs, step: (calls.append(step), real(reqs, step))[1]
    views = [RequestView("r", DraftFeatures(7, 1))]
    assert ctl._wanted(views) is False and ctl._wanted(views) is False and len(calls) == 1
    # other features
    assert ctl._wanted([RequestView("r", DraftFeatures(3, 1))]) is False and len(calls) == 2
    for _ in range(6):
        ctl.observe("r", DraftFeatures(7, 1), 7)
    # observed: asked again, and the answer changed
    assert ctl._wanted(views) is True and len(calls) == 3
    for _ in range(WANTED_REFRESH_STEPS):
        ctl.note_lean(1)
    assert ctl._wanted(views) is True and len(calls) == 4  # aged: asked again
    ctl.costs = FLAT
    assert ctl._wanted(views) is True and len(calls) == 5  # new costs: asked again
    fresh = Controller(cfg, FLAT)
    for _ in range(6):
        fresh.observe("r", DraftFeatures(7, 1), 7)
    fresh.step = ctl.step
    fresh.current = ctl.current
    assert fresh._wanted(views) == ctl._wanted(views)


def test_a_speculating_step_evaluates_once_unless_its_inputs_change():
    """After a step that speculated, `plan_lookup` evaluates the options on each request's last
    features and `decide` on the new drafts'; on a steady load they are the same question,
    answered once. Any input that changes in between (the drafts' features, an observation, a
    period recorded into the controller's own costs) makes `decide` evaluate again, and its answer
    is a fresh controller's."""
    from fastverify.costs import LEAN, SPEC, StepCosts

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    ctl, calls = _counting(cfg)
    views = [RequestView("r", DraftFeatures(7, 1))]
    assert (ctl.plan_lookup(views, 32) is True and ctl.decide(views).option.kind == CHAIN
            and len(calls) == 1)
    # the next step: the last one verified for "r", so the lookup is made without asking
    # (`_still_verifying`); its decision asks, on the new drafts' features
    assert ctl.plan_lookup(views, 32) is True and len(calls) == 1
    ctl.decide([RequestView("r", DraftFeatures(3, 1))])
    assert len(calls) == 2
    ctl.plan_lookup(views, 32)
    n = len(calls)
    ctl.observe("r", DraftFeatures(7, 1), 0)
    ctl.decide(views)
    assert len(calls) == n + 1  # an observation in between
    own = StepCosts(FLAT, min_samples=1)
    ctl.costs = own
    ctl.plan_lookup(views, 32)
    before = ctl._evaluate(views, ctl.step + 1)[1]
    own.record(SPEC, 1, 8, 500.0)  # a period recorded into the table the controller reads
    own.record(LEAN, 1, 1, 10.0)
    after = ctl._evaluate(views, ctl.step + 1)[1]
    assert after[-1].rate < before[-1].rate  # width 8 now measured dear
    d = ctl.decide(views)
    assert d.option.kind == NONE
    fresh = Controller(cfg, own)
    fresh.gain, fresh.step, fresh.current = ctl.gain, ctl.step - 1, ctl.current
    assert fresh._evaluate_now(views, ctl.step)[1] == after


def test_probe_lookups_back_off_and_reset():
    """Nothing worth a lookup: look up anyway after 1, 2, 4, 8, 8, ... steps (cap 8 here); a new
    request or a lookup that chose to speculate brings the gap back to 1."""
    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    ctl = Controller(cfg, _lean_cheaper())
    views = [RequestView("r", DraftFeatures(7, 1))]

    def lookups(n):
        """Steps (1-based) at which plan_lookup says look up; each lookup is decided
        like the server does."""
        at = []
        for i in range(1, n + 1):
            if ctl.plan_lookup(views, probe_max=8):
                ctl.decide(views)
                at.append(i)
            else:
                ctl.note_lean(1)
        return at

    assert lookups(40) == [1, 3, 7, 15, 23, 31, 39]  # gaps 1, 2, 4, 8, 8, ...
    ctl.reset_probe()
    assert lookups(8) == [1, 3, 7]
    for _ in range(6):
        # drafts now pay: every step looks up and speculates
        ctl.observe("r", DraftFeatures(7, 1), 7)
    assert lookups(5) == [1, 2, 3, 4, 5] and ctl.current.kind == "chain"
    assert ctl.plan_lookup(views, probe_max=0) is True  # the expected gain alone asks for it


def test_probes_that_could_not_pay_are_marked_for_looking_up_behind():
    """A probe whose drafts would not pay even if they matched in full is PLAN_PROBE (the server
    looks it up on the host's tokens and stays plain); `note_probe` then backs the gap off like a
    lookup that chose no speculation, or brings it to 1 when the probe's drafts make speculation
    look worthwhile. A probe that could pay (matching drafts of this request are accepted) is a real
    lookup (PLAN_WANTED)."""
    from fastverify.controller import PLAN_PROBE, PLAN_WANTED

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    ctl = Controller(cfg, _lean_cheaper())
    none_yet = [RequestView("r", DraftFeatures(0, 0))]
    at = []
    for i in range(1, 41):
        if ctl.plan_lookup(none_yet, probe_max=8):
            assert ctl.planned == PLAN_PROBE  # the prior: even a full match is not expected to pay
            d = ctl.note_probe(none_yet)
            assert d.option.kind == "none"
            at.append(i)
        else:
            assert ctl.planned is None
            ctl.note_lean(1)
    assert at == [1, 3, 7, 15, 23, 31, 39] and ctl.counters["probe_lookups"] == 7
    assert ctl.metrics()["auto_probe_lookups_total"] == 7.0
    assert ctl.counters["lean_steps"] == 40  # probe steps are plain steps
    # matching drafts of this request turn out to be accepted: a probe's full-match features now ask
    # for a real lookup, and the next step's plan says so too
    for _ in range(6):
        ctl.observe("r", DraftFeatures(7, 1), 7)
    ctl.note_probe([RequestView("r", DraftFeatures(7, 1))])
    assert ctl.plan_lookup([RequestView("r", DraftFeatures(7, 1))],
                           probe_max=8) and ctl.planned == PLAN_WANTED
    # and a request whose last draft found nothing, but whose matching drafts are
    # accepted, is looked up for real
    ctl.reset_probe()
    assert ctl.plan_lookup(none_yet, probe_max=8) and ctl.planned == PLAN_WANTED


def _probes_dearer(probe_ms, lean_ms=4.6, bs=4):
    """Step costs (batch size `bs`) in which a lookup step is dearer than a plain one, and a probe
    step has been measured at `probe_ms`."""
    from fastverify.costs import LEAN, PROBE, SPEC, StepCosts

    c = StepCosts(CostTable(((bs, 4.4),), ((bs, 4.4), (8 * bs, 5.0)), "t"))
    for _ in range(3):
        c.record(LEAN, bs, 1, lean_ms)
        c.record(SPEC, bs, 1, lean_ms + 1.8)
        c.record(PROBE, bs, 1, probe_ms)
    return c


def test_probe_cost_is_measured_probe_steps_less_plain_ones():
    from fastverify.costs import LEAN, PROBE, StepCosts

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    assert Controller(cfg, _probes_dearer(5.4)).probe_cost(4) == pytest.approx(0.8)
    # cheaper (noise): free, never negative
    assert Controller(cfg, _probes_dearer(4.5)).probe_cost(4) == 0.0
    # nothing measured at that size
    assert Controller(cfg, _probes_dearer(5.4)).probe_cost(1) == 0.0
    assert Controller(cfg, FLAT).probe_cost(1) == 0.0  # a table measures no whole steps
    c = StepCosts(CostTable(((4, 4.4),), ((4, 4.4), (32, 5.0)), "t"))
    for _ in range(3):
        c.record(LEAN, 4, 1, 4.6)
    c.record(PROBE, 4, 1, 9.0)
    c.record(PROBE, 4, 1, 9.0)
    # two probe periods: not measured yet (min_samples 3)
    assert Controller(cfg, c).probe_cost(4) == 0.0
    c.record(PROBE, 4, 7, 5.1)  # a probe step is width 1 whatever the caller says
    assert c.samples(PROBE, 4, 1) == 3
    # the probes' mean
    assert Controller(cfg, c).probe_cost(4) == pytest.approx((9.0 + 9.0 + 5.1) / 3 - 4.6)


def test_probe_cost_counts_the_probes_that_came_late_and_leaves_prefills_out():
    """Most probe steps no longer than plain ones, a quarter of them late by ~1 ms: the
    median says free, the cost is what they add on average. A period that held a prefill (10x
    a step) is no step's cost."""
    from fastverify.costs import LEAN, PROBE, StepCosts

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    c = StepCosts(CostTable(((1, 4.4),), ((1, 4.4), (8, 5.0)), "t"))
    for i in range(32):
        c.record(LEAN, 1, 1, 46.0 if i == 5 else 4.6)
        c.record(PROBE, 1, 1, 5.6 if i % 4 == 0 else 4.65)
    # the window keeps the last 32: 7 late ones, 24 on time, the prefill
    c.record(PROBE, 1, 1, 46.0)
    assert c.step_ms(PROBE, 1, 1) - c.step_ms(LEAN, 1, 1) == pytest.approx(0.05)
    assert c.mean_ms(LEAN, 1, 1) == pytest.approx(4.6)
    assert c.mean_ms(PROBE, 1, 1) == pytest.approx((7 * 5.6 + 24 * 4.65) / 31)
    assert Controller(cfg, c).probe_cost(1) == pytest.approx((7 * 5.6 + 24 * 4.65) / 31 - 4.6)
    assert c.mean_ms(PROBE, 4, 1) is None  # not measured at that size


def test_forced_probes_of_scored_requests_stay_within_the_floor_share():
    """The probes `probe_max` forces past the credit: for requests whose own matched drafts were
    scored they come as far apart as keeps their measured cost within `probe_floor_share` of the
    plain steps' time (at most PROBE_STRETCH_MAX * probe_max); for a request not scored yet, or
    where a probe costs little against a step, every `probe_max` steps as before."""
    from fastverify.controller import PLAN_PROBE, PROBE_STRETCH_MAX

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    ctl = Controller(cfg, _probes_dearer(5.4))  # a probe 0.8 ms, a plain step 4.6 ms at bs 4
    rids = list("abcd")
    # not scored yet: probe_max, however dear the probe
    assert ctl.forced_probe_gap(8, rids) == 8
    for r in rids:
        ctl.gain.observe(r, DraftFeatures(6, 1), 0, 0)  # matched drafts, none accepted
    # 0.8 / (0.004 * 4.6) = 43.5
    assert ctl.forced_probe_gap(32, rids) == 44
    assert ctl.forced_probe_gap(8, rids) == PROBE_STRETCH_MAX * 8  # capped
    assert ctl.forced_probe_gap(64, rids) == 64  # the probe within the share at probe_max
    assert ctl.forced_probe_gap(32, rids + ["new"]) == 32  # one request not scored: probe_max
    assert Controller(cfg, _probes_dearer(4.6)).forced_probe_gap(32, rids) == 32  # free probes
    # the gap holds in plan_lookup: probes that could not pay, no credit to cover them
    views = [RequestView(r, DraftFeatures(0, 0)) for r in rids]
    at = []
    for i in range(1, 201):
        if ctl.plan_lookup(views, probe_max=32):
            assert ctl.planned == PLAN_PROBE
            ctl.note_probe(views)
            at.append(i)
        else:
            ctl.note_lean(4)
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert gaps and max(gaps) == 44 and all(g >= 32 for g in gaps[-2:]), at
    # and in steps_without_lookup (a stretch on the path): past the probe gap, held for credit
    # until the forced gap, 44 steps since the last lookup
    ctl._since_lookup, ctl._probe_gap, ctl._probe_credit = 32, 32, -10.0
    assert ctl.steps_without_lookup(32, 256, rids, 4) == 44 - 32 - 1
    with pytest.raises(ValueError, match="probe_floor_share must be in"):
        AutoConfig(probe_floor_share=0.0)


def test_probes_wait_for_the_probe_budget_to_cover_their_measured_cost():
    """Probes whose drafts could not pay cost host time where the host is busy: they are spread so
    that their measured cost stays within `probe_budget` of the plain steps' time, but never beyond
    `probe_max` steps apart. Free probes keep the 1, 2, 4, ... gaps."""
    from fastverify.controller import PLAN_PROBE

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform",
                     probe_budget=0.01)
    views = [RequestView(r, DraftFeatures(0, 0)) for r in "abcd"]

    def probes(ctl, n, probe_max=8):
        at = []
        for i in range(1, n + 1):
            if ctl.plan_lookup(views, probe_max=probe_max):
                assert ctl.planned == PLAN_PROBE
                ctl.note_probe(views)
                at.append(i)
            else:
                ctl.note_lean(4)
        return at

    free = probes(Controller(cfg, _probes_dearer(4.6)), 200)
    assert free[:7] == [1, 3, 7, 15, 23, 31, 39] and len(free) == 27
    # 0.8 ms each; 1 % of a 4.6 ms step buys one every ~18 steps
    ctl = Controller(cfg, _probes_dearer(5.4))
    dear = probes(ctl, 200, probe_max=64)
    # ~18 steps apart while the schedule's own gap (1, 2, ... 16) is shorter, then
    # the schedule's 32 and 64
    assert dear == [19, 37, 55, 73, 91, 123, 187]
    # within the budget (and one probe's worth of credit)
    assert len(dear) * 0.8 <= 0.01 * 4.6 * 200 + 0.8
    assert ctl.counters["probes_held"] > 0 and ctl.metrics()["auto_probes_held_total"] > 0
    # never held past probe_max steps since the last lookup (the follow bound): with a gap cap of
    # 8 the dear probes come every 8 steps (the credit running into debt), where the free ones
    # ran 1, 3, 7, 15, 23, ...
    capped = probes(Controller(cfg, _probes_dearer(5.4)), 200)
    assert capped == list(range(8, 201, 8))
    # a long stretch without any probe due does not buy a burst: the credit holds one probe at most
    ctl2 = Controller(cfg, _probes_dearer(5.4))
    for _ in range(500):
        ctl2.note_lean(4)
    ctl2.reset_probe()
    burst = probes(ctl2, 40, probe_max=64)
    assert burst[0] == 1 and burst[1] - burst[0] >= 17
    # probes that could pay (real lookups) are never held
    ctl3 = Controller(cfg, _probes_dearer(5.4))
    for _ in range(6):
        for r in "abcd":
            ctl3.observe(r, DraftFeatures(7, 1), 7)
    assert all(ctl3.plan_lookup(views, probe_max=8)
               for _ in range(5)) and ctl3.counters["probes_held"] == 0


def test_probes_wait_out_the_steps_right_after_a_prefill():
    """In the steps right after a prefill the host's work is not hidden behind the GPU's (`refill`):
    a probe that could not pay waits them out, even one measured free, though never past `probe_max`
    steps since the last lookup; a lookup whose drafts could pay does not wait."""
    from fastverify.controller import PLAN_PROBE, PLAN_WANTED

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    views = [RequestView(r, DraftFeatures(0, 0)) for r in "abcd"]
    ctl = Controller(cfg, _probes_dearer(4.6))  # probes measured free: nothing held for the budget
    ctl.reset_probe()  # a request joined: the next step may probe
    got = [ctl.plan_lookup(views, probe_max=8, refill=i <= 3) for i in range(1, 5)]
    assert (got == [False, False, False, True] and ctl.planned == PLAN_PROBE
            and ctl.counters["probes_held"] == 3)
    ctl.note_probe(views)
    # a host that never stops refilling (a prefill every few steps) still
    # probes every probe_max steps
    got = [ctl.plan_lookup(views, probe_max=4, refill=True) for _ in range(12)]
    assert [i + 1 for i, g in enumerate(got) if g] == [4, 8, 12]
    # drafts of these requests that matched in full have been accepted: their
    # lookup is real, made at once
    ctl = Controller(cfg, _probes_dearer(4.6))
    for _ in range(6):
        for r in "abcd":
            ctl.observe(r, DraftFeatures(7, 1), 7)
    ctl.reset_probe()
    assert ctl.plan_lookup(views, probe_max=8, refill=True) and ctl.planned == PLAN_WANTED
    assert ctl.counters["probes_held"] == 0


def test_first_lookup_behind_only_when_measured_and_nothing_would_pay():
    """A new request's first lookup may be a probe only where a lookup step at that batch size
    has been measured (SPEC periods of width 1), measured dearer than a plain step, and not
    even a full match would be verified; afterwards the probe gap runs from that probe, as
    after plan_lookup's own."""
    from fastverify.controller import PLAN_PROBE
    from fastverify.costs import LEAN, SPEC, StepCosts

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    assert Controller(cfg, FLAT).first_lookup_behind(["a"]) is False  # a plain table: never
    unmeasured = StepCosts(CostTable(((1, 10.0), (2, 10.0)), ((1, 10.0), (8, 10.5)), "t"))
    for _ in range(3):
        unmeasured.record(LEAN, 1, 1, 3.7)
        unmeasured.record(SPEC, 1, 8, 6.7)  # lookup steps measured, but not at width 1
    ctl = Controller(cfg, unmeasured)
    assert ctl.first_lookup_behind(["a"]) is False and ctl.planned is None
    ctl = Controller(cfg, _lean_cheaper())
    assert ctl.first_lookup_behind([]) is False
    assert ctl.first_lookup_behind(["a", "b"]) is False  # bs 2: nothing measured at that size
    ctl._since_lookup = 10  # long since the last lookup of the batch before this request joined
    # the prior: nothing accepted
    assert ctl.first_lookup_behind(["a"]) is True and ctl.planned == PLAN_PROBE
    ctl.note_probe([RequestView("a", DraftFeatures(0, 0))])
    views = [RequestView("a", DraftFeatures(0, 0))]
    # gap 2 from it
    assert [ctl.plan_lookup(views, probe_max=8) for _ in range(3)] == [False, True, False]
    # lean does not pay
    assert Controller(cfg, _lean_cheaper(6.45, 6.5)).first_lookup_behind(["a"]) is False
    ctl = Controller(cfg, _lean_cheaper())
    for _ in range(6):
        ctl.observe("old", DraftFeatures(7, 1), 7)  # recent requests' full matches were accepted
    assert ctl.first_lookup_behind(["new"]) is False  # then a new request is looked up for real


def test_first_lookup_deferred_only_when_it_could_only_probe():
    """Right after new requests' prefill, a lookup behind the token in flight that could only be a
    probe (not even full matches would be verified) waits one step; the next plan_lookup makes it.
    Never on a cold start (those first drafts are what the model learns from), nor while full
    matches are expected to pay."""
    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8), shape="uniform")
    dear = CostTable(((1, 10.0), (4, 10.0)), ((1, 10.0), (8, 400.0), (64, 900.0)), "dear")
    assert Controller(cfg, dear).defer_first_lookup(["a"]) is False  # cold: nothing observed yet
    assert Controller(cfg, dear).defer_first_lookup([]) is False
    ctl = Controller(cfg, dear)
    ctl.observe("old", DraftFeatures(3, 1), 0)
    ctl._probe_gap, ctl._since_lookup = 16, 0
    assert ctl.defer_first_lookup(["a", "b"]) is True
    assert ctl.plan_lookup([RequestView(r, DraftFeatures(0, 0)) for r in "ab"],
                           probe_max=32, behind=True)
    cheap = Controller(cfg, FLAT)
    for step in range(6):
        cheap.observe("old", DraftFeatures(7, 1), step, 7)  # recent full matches were accepted
    assert cheap.defer_first_lookup(["new"]) is False


def test_a_request_whose_drafts_were_verified_logs_what_they_were_expected_to_accept():
    """The decision log samples one step in 30 s; whether the gain model held for the requests
    auto speculated for is logged once per request, as it finishes."""
    logged = []
    table = CostTable(((1, 10.0),), ((1, 10.0), (8, 12.0)))
    c = Controller(AutoConfig(max_chain=3, tree_width=0), table, log=logged.append)
    c.note_verified(3.5, 1.0, "a")
    c.note_verified(3.0, 2.0, "a")
    c.note_verified(2.0, 2.0)  # (no request named: the calibration only)
    c.finish("b")  # nothing verified for it: no record
    assert logged == []
    c.finish("a")
    assert logged == [{"request": "a", "verified_drafts": 2, "expected_tokens": 6.5,
                       "accepted_tokens": 3.0}]
    c.finish("a")  # once
    assert len(logged) == 1
    # the calibration counts all three
    assert c._verified[0] == pytest.approx(8.5) and c._verified[1] == pytest.approx(5.0)


def test_a_confirming_probe_is_owed_once_to_a_new_request_whose_probe_matched_in_full():
    """`note_probe` of drafts the model does not trust: a new request's long match owes the probe
    that scores it `max_chain` + 2 steps on, whatever the credit (`plan_lookup` makes it, the
    probes before it wait for credit); once per request, never for a request whose matched drafts
    were scored, never where full acceptance could not pay, nor where the next probe comes by then
    and is not held for credit. One scored full acceptance then makes the request's full match
    worth verifying (an H200's measured costs: a plain step 1.58 ms, chain 8 2.75 ms)."""
    h200 = CostTable(((1, 1.58), (8, 1.58)), ((1, 2.75), (64, 2.9)), "h200")
    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8))

    def probed(ctl, views, credit=0.0):
        ctl._plain_and_probe = lambda bs: (1.58, 0.5)  # a probe dearer than the credit
        ctl._probe_credit = credit
        # the last step before the forced probe (stretched for a request whose drafts were scored)
        ctl._since_lookup = ctl.forced_probe_gap(32, [v.req_id for v in views]) - 1
        ctl._probe_gap = 32
        assert ctl.plan_lookup(views, 32, behind=True) and ctl.planned == "probe"
        ctl.note_probe(views)

    def after_a_novel_load():
        ctl = Controller(cfg, h200)
        for i in range(40):  # matched drafts, none accepted
            ctl.gain.observe("old", DraftFeatures(6, 1), i * 15, 0)
        ctl.finish("old")
        ctl.step = 700
        return ctl

    ctl = after_a_novel_load()
    full = [RequestView("new", DraftFeatures(7, 1))]
    assert not ctl._full_match_wanted(["new"])
    probed(ctl, full)
    assert ctl.counters["confirming_probes"] == 1 and ctl._confirm_step == 700 + 9
    # the steps before it: held for credit (the gap of 2 passed at 702)
    n = ctl.steps_without_lookup(32, 256, ["new"], 1)
    assert n == 8
    for _ in range(n):
        assert not ctl.plan_lookup(full, 32, behind=True)
        ctl.note_lean(1)
    assert ctl.step == 709 and ctl.plan_lookup(full, 32, behind=True) and ctl.planned == "probe"
    assert ctl._confirm_step is None
    # that probe scored the first one's drafts: accepted in full, the full match is now wanted
    ctl.gain.observe("new", DraftFeatures(6, 1), ctl.step, 7)
    assert ctl._wanted(full)
    # once per request: a second long match of the same request owes nothing
    ctl._wanted = lambda views: False
    ctl.note_probe(full)
    assert ctl.counters["confirming_probes"] == 1 and ctl._confirm_step is None
    del ctl._wanted
    # a request whose matched drafts were scored, or a short match: nothing owed
    ctl = after_a_novel_load()
    ctl.gain.observe("seen", DraftFeatures(6, 1), ctl.step, 0)
    for views in ([RequestView("seen", DraftFeatures(7, 1))],
                  [RequestView("short", DraftFeatures(2, 1))]):
        probed(ctl, views)
        assert ctl.counters["confirming_probes"] == 0 and ctl._confirm_step is None
    # the next probe (gap 2) comes by then and the credit covers it: nothing owed; held: owed
    ctl._probe_gap, ctl._probe_credit = 2, 10.0
    ctl._owe_confirmation([RequestView("cheap", DraftFeatures(7, 1))])
    assert ctl.counters["confirming_probes"] == 0
    ctl._probe_credit = 0.0
    ctl._owe_confirmation([RequestView("cheap", DraftFeatures(7, 1))])
    assert ctl.counters["confirming_probes"] == 1
    # where verifying never pays, nothing owed
    never = Controller(cfg, CostTable(((1, 1.0), (8, 1.0)), ((1, 1e5), (64, 1e5)), "never"))
    never.gain.version = 1
    probed(never, [RequestView("x", DraftFeatures(7, 1))])
    assert never.counters["confirming_probes"] == 0


def test_the_step_after_one_that_verified_looks_up_without_evaluating_again():
    """A step right after one that verified drafts for the same requests looks its drafts up without
    evaluating the options on their last features (the decision before was made on them one step
    earlier; where the drafts' features changed since, that question was a second evaluation of the
    options, `_still_verifying`). It evaluates again where the requests changed, the last step
    verified nothing or left a request out, and the step's own decision still stops speculating
    where it no longer pays."""
    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8))
    ctl, calls = _counting(cfg, ("r", "s"), lambda reqs, step: [v.req_id for v in reqs])
    full = DraftFeatures(7, 1)
    r = [RequestView("r", full)]
    assert ctl.plan_lookup(r, 32) and ctl.decide(r).option.kind == CHAIN
    assert calls == [["r"]]
    assert ctl.plan_lookup(r, 32) and ctl.planned == "wanted" and calls == [["r"]]
    rs = [RequestView("r", full), RequestView("s", full)]
    ctl.decide(r)
    assert ctl.plan_lookup(rs, 32) and calls[-1] == ["r", "s"]  # "s" joined: asked
    n = len(calls)
    ctl.note_lean(2)  # a step that verified nothing
    ctl.plan_lookup(rs, 32)
    assert len(calls) == n + 1
    nothing = [RequestView("r", full), RequestView("s", DraftFeatures(0, 0))]
    d = ctl.decide(nothing)
    assert d.option.kind == CHAIN and d.speculate == (True, False)
    n = len(calls)
    assert ctl.plan_lookup(nothing, 32) and len(calls) == n + 1  # "s" was left out: asked
    # the load stops paying: a verified draft that accepted far less than expected (below the
    # margin), and the next lookup asks again; the decision drops the drafts
    assert ctl.decide(r).option.kind == CHAIN
    assert ctl._still_verifying(r)
    for _ in range(200):
        ctl.observe("r", full, 0)
    ctl.note_verified(6.0, 0, "r")
    assert not ctl._still_verifying(r)
    n = len(calls)
    ctl.plan_lookup(r, 32)
    assert len(calls) == n + 1
    assert ctl.decide(r).option.kind == NONE


def test_a_decision_asks_the_costs_once_per_option_until_they_change():
    """The costs an option's evaluation reads (a plain step's, the pass's) are asked once per batch
    size and kept until the costs change (`OptionCosts`): a decision is arithmetic on the gains.
    Its answers are those of `evaluate` on the same costs."""
    from fastverify.controller import evaluate
    from fastverify.costs import SPEC, StepCosts

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8))
    costs = StepCosts(LINEAR, min_samples=1)
    asked = []
    for name in ("decode_ms", "verify_step_ms"):
        real = getattr(costs, name)
        setattr(costs, name, lambda *a, _r=real, _n=name: (asked.append(_n), _r(*a))[1])
    ctl = Controller(cfg, costs)
    for _ in range(6):
        ctl.observe("r", DraftFeatures(7, 1), 5)
    views = [RequestView("r", DraftFeatures(m, 1)) for m in (7, 3, 1, 7, 5)]
    for v in views:
        d = ctl.decide([v])
    first = len(asked)
    assert first <= 3 * len(ctl.options)  # (a plain step, the full pass, the pass taken part in)
    for v in views:
        ctl.decide([v])
    assert len(asked) == first
    per_req, evals = ctl._evaluate_now([views[0]], ctl.step)
    for o, e in zip(ctl.options, evals):
        g = [0.0] if o.kind == NONE else [per_req[0][0][o.k - 1]]
        assert e == evaluate(o, costs, g, cfg.shape)
    costs.record(SPEC, 1, 8, 50.0)  # a record: the costs changed
    ctl.decide([views[0]])
    assert len(asked) > first
    assert d.option is not None


def test_a_clear_decision_answers_the_same_question_for_the_next_steps():
    """On a steady load (the same requests and drafts' features every step, each verified draft
    accepted in full) a clear decision's evaluation answers the next steps' same question: the
    options are evaluated once in `EVAL_REUSE_STEPS` (R) steps (`_clear_reuse`). A change of
    features, of requests or a draft that accepted less than expected is evaluated at once; the
    reused decisions are the ones a fresh evaluation gives there."""
    from fastverify.controller import EVAL_REUSE_STEPS as R

    assert R >= 2
    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8))
    ctl, calls = _counting(cfg)
    full = [RequestView("r", DraftFeatures(7, 1))]

    def step(views, accepted=7):
        d = ctl.decide(views)
        ctl.observe("r", views[0].features, accepted)
        ctl.note_verified(d.gains[0] if d.gains else 0.0, accepted, "r")
        return d

    step(full)  # the spell's first step (from no speculation: a question of its own)
    decisions = [step(full) for _ in range(R + 3)]  # steps 2 .. R + 4
    assert calls == [1, 2, 2 + R]
    assert {d.option for d in decisions} == {Option(CHAIN, 7, 8)}
    fresh = Controller(cfg, ctl.costs)
    fresh.gain, fresh.step, fresh.current = ctl.gain, ctl.step, ctl.current
    # step R + 5, reused: as a fresh evaluation
    assert fresh.decide(full).option == step(full).option
    assert calls == [1, 2, 2 + R]
    # features the gain model estimates apart (another match bucket: step R + 6)
    step([RequestView("r", DraftFeatures(3, 1))])
    assert calls[-1] == R + 6
    step(full, accepted=1)  # evaluated (features back to 7), and its draft failed
    step(full)
    assert calls[-2:] == [R + 7, R + 8]
    step([RequestView("r", DraftFeatures(7, 1)), RequestView("s", DraftFeatures(7, 1))])
    assert calls[-1] == R + 9  # a request joined


def test_drafts_estimated_alike_share_an_evaluation_with_the_same_answer():
    """A draft's exact length moves within its feature bucket from step to step (a lookup behind
    leads with the token in flight, the corpus continuation ends short): the gain model estimates
    drafts of one bucket alike, so a clear decision's evaluation answers them too, and its answer
    is the one a fresh evaluation gives."""
    from fastverify.gains import estimate_key, feature_bucket

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8))
    ctl, calls = _counting(cfg)
    lengths = [7, 6, 7, 5, 4, 6, 7, 6]  # one bucket (4-7 tokens matched)
    assert len({feature_bucket(DraftFeatures(m, 1)) for m in lengths}) == 1
    fresh = Controller(cfg, ctl.costs)  # (its own calibration: 1, as ctl's on these drafts)
    for m in lengths:
        views = [RequestView("r", DraftFeatures(m, 1))]
        # what a fresh evaluation answers for this length is what it answers for the longest
        fresh.gain, fresh.current = ctl.gain, ctl.current
        assert (fresh._evaluate_now(views, ctl.step + 1)
                == fresh._evaluate_now([RequestView("r", DraftFeatures(7, 1))], ctl.step + 1))
        d = ctl.decide(views)
        ctl.observe("r", views[0].features, 7)
        ctl.note_verified(d.gains[0], 7, "r")
    assert ctl.calibration() == 1.0
    assert len(calls) <= 2  # (the spell's first step asks a question of its own)
    # sampled and greedy drafts, matched and unmatched ones: asked apart
    keys = {estimate_key(DraftFeatures(m, 1 if m else 0, s))
            for m in (0, 7) for s in (False, True)}
    assert len(keys) == 4


def test_a_clear_decision_stands_until_its_drafts_fall_short_by_its_margin():
    """A verified draft that accepts less than its expected mean is the normal case on memorised
    text (drafts diverge wherever the corpus holds two continuations): the clear decision stands
    while the drafts verified since its evaluation accepted at least 1 - `CLEAR_MARGIN` of what
    they were expected to, all requests together, and ends at the draft that takes them below
    that (the next decision evaluates afresh, the next lookup asks)."""
    from fastverify.controller import CLEAR_MARGIN

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8))
    ctl, calls = _counting(cfg)
    views = [RequestView("r", DraftFeatures(7, 1)), RequestView("s", DraftFeatures(7, 1))]
    for _ in range(3):  # the spell's first steps: a clear decision
        d = ctl.decide(views)
        for rid, g in zip(("r", "s"), d.gains):
            ctl.observe(rid, views[0].features, 7)
            ctl.note_verified(g, 7, rid)
    n = len(calls)
    d = ctl.decide(views)
    assert len(calls) == n and ctl._still_verifying(views)
    exp = ctl._since_evaluated[0]
    g = d.gains[0]
    # one request's draft short of its mean, the other's in full: above the margin, it stands
    ctl.note_verified(g, g - 1.0, "r")
    ctl.note_verified(d.gains[1], 7, "s")
    assert ctl._still_verifying(views)
    assert ctl._since_evaluated[0] == pytest.approx(exp + g + d.gains[1])
    # drafts that accept nothing: it ends at the one that takes the sum below 1 - CLEAR_MARGIN of
    # its expectation
    for _ in range(20):
        e, a = ctl._since_evaluated
        below = a < (1.0 - CLEAR_MARGIN) * (e + g)
        ctl.note_verified(g, 0.0, "r")
        assert ctl._still_verifying(views) == (not below)
        if below:
            break
    assert not ctl._still_verifying(views)
    n = len(calls)
    ctl.decide(views)
    assert len(calls) == n + 1  # evaluated afresh
    assert ctl._since_evaluated == [0.0, 0.0]


def test_a_reused_evaluation_is_chosen_from_once(monkeypatch):
    """Where a decision's evaluation is the last one's (`_clear_reuse`) and the current option has
    not changed, the choice made of it (`choose`, the rates, the gains) is the last one's; a fresh
    evaluation or another current option is chosen from again, and the decisions are the ones a
    controller choosing every step makes."""
    from fastverify import controller as ctl_mod

    cfg = AutoConfig(max_chain=7, tree_width=0, chain_widths=(2, 4, 8))
    ctl, evaluations = _counting(cfg)
    chosen = []
    real = ctl_mod.choose
    monkeypatch.setattr(ctl_mod, "choose", lambda *a: (chosen.append(ctl.step), real(*a))[1])
    full = [RequestView("r", DraftFeatures(7, 1))]
    out = []
    for _ in range(8):
        d = ctl.decide(full)
        ctl.observe("r", full[0].features, 7)
        ctl.note_verified(d.gains[0], 7, "r")
        out.append((d.option, d.speculate, d.gains, d.rates, d.pass_ms))
    assert ctl_mod.EVAL_REUSE_STEPS >= 7  # (all 8 steps after the first share one evaluation)
    assert evaluations == [1, 2] and chosen == [1, 2]
    assert all(o[0] == Option(CHAIN, 7, 8) for o in out[1:])
    assert all(o[1:] == out[1][1:] for o in out[2:])  # steps 3-8: step 2's choice
    # another current option that speculates (the same question): chosen from again
    ctl.current = next(o for o in ctl.options if o.kind == CHAIN and o.k == 3)
    ctl.decide(full)
    assert chosen[-1] == 9 and evaluations == [1, 2]
    # the same decisions as a controller that chooses every step
    again, _ = _counting(cfg)

    def choose_every_step(answer):
        again._chosen = (None, None, None)  # nothing kept
        return ctl_mod.Controller._choice(again, answer)
    monkeypatch.setattr(again, "_choice", choose_every_step)
    for want in out:
        d = again.decide(full)
        again.observe("r", full[0].features, 7)
        again.note_verified(d.gains[0], 7, "r")
        assert (d.option, d.speculate, d.gains, d.rates, d.pass_ms) == want
