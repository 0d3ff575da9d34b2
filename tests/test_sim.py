"""The issue's guarantees, checked in simulation with the real decision code
(fastverify.controller):

(a) acceptance 0: auto >= 0.98x no speculation;
(b) high acceptance: auto within 5% of the best fixed mode in hindsight;
(c) acceptance switching mid-stream: auto follows within follow_bound_steps(cfg) steps;
plus: with acceptance held flat, the decision flips with the fabric (cost table) and the batch size.

Both cost tables are the sim's "h200-nvlink" (CONTEXT.md measurements) and "pcie-comm-bound" (the
reference report's box). Throughput is simulated from the tables, not timed."""
import json

import pytest

from fastverify import sim
from fastverify.controller import (NONE, AutoConfig, Controller, Option, evaluate,
                                   follow_bound_steps, options_for)
from fastverify.costs import CostTable

CFG = AutoConfig()
TABLES = sim.COST_TABLES


def _run(ps, table, bs, n=40, length=256, match_rate=0.9, seed=1, controller_costs=None):
    reqs = sim.synthetic_requests(n, length, ps, CFG.max_chain, CFG.tree_width,
                                  match_rate=match_rate, seed=seed)
    return sim.summarize(sim.run_all(reqs, sim.cost_table(table), bs, CFG,
                                     controller_costs=controller_costs))


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("bs", [1, 8, 48])
def test_a_acceptance_zero_never_slower_than_no_speculation(table, bs):
    s = _run((0.0,), table, bs)
    assert s["auto_vs_none"] >= 0.98, s
    # the corpus reports matches at 90% of positions, none of which is accepted: the controller must
    # not keep paying for verify passes that buy nothing
    spec_steps = sum(v for k, v in s["auto_option_steps"].items() if k != NONE)
    costs = sim.cost_table(table)
    if costs.verify_ms(bs * 2) > costs.decode_ms(bs) * 1.001:
        assert spec_steps <= 0.02 * sum(s["auto_option_steps"].values()), s


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("bs", [1, 8, 48])
@pytest.mark.parametrize("p", [0.7, 0.9])
def test_b_high_acceptance_within_5_percent_of_best_fixed(table, bs, p):
    s = _run((p,), table, bs)
    assert s["auto_vs_best_fixed"] >= 0.95, s
    assert s["auto_vs_none"] >= 0.98, s


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("bs", [1, 8])
def test_c_follows_acceptance_changes_within_bound(table, bs):
    bound = follow_bound_steps(CFG)
    assert bound == 8 + 54  # K + 1 + ceil(16 * log2(10))
    res, follow = sim.switching_run(sim.cost_table(table), bs, CFG, period=200)
    assert len(follow) >= 2, follow  # at least one switch each way was observed with a full window
    assert all(f is not None and f <= bound for f in follow), (follow, bound)
    s = sim.summarize(res)
    assert s["auto_vs_none"] >= 0.98 and s["auto_vs_best_fixed"] >= 0.95, s


def test_c_follows_within_bound_when_probes_are_dear_and_held():
    """Probes held to their budget (each 0.8 ms here, whole steps measured with a 1.8 ms lookup) are
    never held past PROBE_MAX steps since the last lookup, so the follow bound of a controller that
    probes every PROBE_MAX steps still holds, and on a load whose acceptance switches between 0 and
    0.85 auto keeps what it gains with probes that cost nothing, less their cost (held without the
    cap, it noticed the switch 50 steps late instead of 27 and kept 0.89 of it)."""
    costs = sim.cost_table("h200-dummy24")
    bound = follow_bound_steps(CFG, probe_max=sim.PROBE_MAX)
    res, follow = sim.switching_run(costs, 4, CFG, period=200, lookup_ms=1.8, probe_ms=0.8)
    assert len(follow) >= 2 and all(f is not None and f <= bound for f in follow), (follow, bound)
    free, _ = sim.switching_run(costs, 4, CFG, period=200, lookup_ms=1.8)
    dear, free = sim.summarize(res)["auto_vs_none"], sim.summarize(free)["auto_vs_none"]
    assert dear >= 0.98 * free, (dear, free)


def test_c_follow_measure_catches_a_controller_that_does_not_follow():
    # the same measurement on a policy that never changes must report a failure to follow
    costs = sim.cost_table("pcie-comm-bound")
    reqs = sim.synthetic_requests(4, 1024, (0.0, 0.85), CFG.max_chain, CFG.tree_width,
                                  match_rate=1.0)
    stuck = sim.simulate(reqs, sim.FixedPolicy(Option(NONE)), costs, 1,
                         regime_of_step=lambda s: (s // 200) % 2)
    rates = sim.regime_rates(reqs, 1, costs, 1, CFG)
    assert sim.follow_steps(stuck, 200, 400, lambda b: rates) is None


def test_decision_flips_with_fabric_and_batch_size_at_flat_acceptance():
    chosen = {}
    for table in TABLES:
        for bs in (1, 64):
            s = _run((0.5,), table, bs, n=max(24, 2 * bs), length=192)
            mix = s["auto_option_steps"]
            chosen[(table, bs)] = max(mix, key=mix.get)
            assert s["auto_vs_best_fixed"] >= 0.95, (table, bs, s)
    # same acceptance everywhere; the best option is not
    assert chosen[("h200-nvlink", 1)] != NONE
    assert chosen[("pcie-comm-bound", 64)] == NONE
    assert chosen[("h200-nvlink", 1)] != chosen[("pcie-comm-bound", 1)]
    assert chosen[("h200-nvlink", 1)] != chosen[("h200-nvlink", 64)]


def test_pessimistic_cost_table_costs_speed_but_not_correctness():
    # the controller believes verify costs twice what it does: it speculates less than it could, yet
    # never runs slower than no speculation. (The opposite error, a table that makes verify look
    # cheaper than decode, does lead to useless verify passes: the table must be measured in the
    # server, which the glue does.)
    true = sim.cost_table("pcie-comm-bound")
    s = _run((0.6,), "pcie-comm-bound", 1, controller_costs=true.scaled(verify=2.0))
    assert s["auto_vs_none"] >= 0.98, s
    honest = _run((0.6,), "pcie-comm-bound", 1)
    assert honest["auto_vs_none"] >= s["auto_vs_none"] - 1e-9, (honest, s)


def test_simulator_accounts_costs_from_the_true_table():
    # one request of 4 tokens, a chain that accepts everything: steps of 1 + 2
    # tokens on a width-3 pass
    costs = CostTable(((1, 10.0),), ((1, 10.0), (3, 12.0)))
    r = sim.SimRequest("x", [([sim.DraftFeatures(3, 1)] * 4, [3, 3, 3, 3], [0, 0, 0, 0])])
    res = sim.simulate([r], sim.FixedPolicy(Option("chain", 2, 3)), costs, 1)
    assert res.tokens == 4 and res.steps == 2 and res.time_ms == pytest.approx(24.0)
    res = sim.simulate([r], sim.FixedPolicy(Option(NONE)), costs, 1)
    assert res.tokens == 4 and res.steps == 4 and res.time_ms == pytest.approx(40.0)


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert sim.main(["--batch-sizes", "1", "--requests", "4", "--length", "64", "--json",
                     str(out)]) == 0
    import json
    rep = json.loads(out.read_text())
    assert rep["repro_command"].startswith("python -m fastverify.sim")
    assert {r["trace"] for r in rep["rows"]} >= {"synthetic-zero", "synthetic-high"}
    assert "auto/none" in capsys.readouterr().out


@pytest.fixture(scope="module")
def replayed():
    pytest.importorskip("sglang.srt.speculative.cpp_ngram.ngram_corpus")
    from fastverify import replay as rp
    if not rp.DEFAULT_TRACE.is_file():
        pytest.skip("no default trace in python/fastverify/data")
    return sim.replay_requests(max_chain=CFG.max_chain, tree_width=CFG.tree_width)


@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("bs", [1, 4, 16])
def test_replayed_default_trace(replayed, table, bs):
    # drafts from SGLang's own n-gram corpus over the recorded default trace
    # (acceptance as the corpus gives it)
    s = sim.summarize(sim.run_all(replayed, sim.cost_table(table), bs, CFG))
    assert s["auto_vs_none"] >= 0.98, s
    assert s["auto_vs_best_fixed"] >= 0.95, s


def test_auto_in_the_simulator_runs_the_servers_lookup_and_lean_flow():
    """The simulated auto policy makes lean steps (no lookup, no draft to score) where the
    server would (lean measured cheaper), and still finds high acceptance again through its
    backed-off probe lookups."""
    from fastverify.costs import LEAN, SPEC, StepCosts

    costs = sim.cost_table("pcie-comm-bound")
    reqs = sim.synthetic_requests(4, 1024, (0.0, 0.85), CFG.max_chain, CFG.tree_width,
                                  match_rate=1.0)
    # the controller's view: a lean step measured 10 % cheaper than a lookup step
    measured = StepCosts(costs)
    for _ in range(3):
        measured.record(LEAN, 1, 1, costs.decode_ms(1) * 0.9)
        measured.record(SPEC, 1, 1, costs.decode_ms(1))
    ctl = Controller(CFG, measured)
    res = sim.simulate(reqs, sim.AutoPolicy(ctl), costs, 1, CFG.shape, CFG.max_chain,
                       CFG.tree_width, regime_of_step=lambda s: (s // 200) % 2)
    assert ctl.counters["lean_steps"] > 0.3 * res.steps  # most steps of the acceptance-0 periods
    # and it speculates in the others
    assert sum(1 for o in res.options if o != NONE) > 0.2 * res.steps
    assert follow_bound_steps(CFG, probe_max=32) == 32 + 8 + 54


def test_lookup_steps_cost_their_host_time_and_auto_probes_on_its_schedule():
    """`lookup_ms`: every step that looked drafts up for real pays it (all steps of a
    speculative fixed mode, none of no speculation). At acceptance 0 auto runs plain steps only,
    so every request's last step gave it one token and each lookup is made behind the step in
    flight, at no cost: a new request is looked up at once, then after gaps of 2, 4, ... up to
    32 steps (steps 0, 2, 6, 14, 30, 62, 94, 126, 158, 190 of a 200-token request), and none of
    those drafts is verified."""
    reqs = sim.synthetic_requests(16, 200, (0.0,), CFG.max_chain, CFG.tree_width, seed=0)
    res = sim.run_all(reqs, sim.cost_table("h200-dummy24"), 1, CFG, lookup_ms=1.8)
    auto, none, chain = res["auto"], res[NONE], res["chain7"]
    assert none.lookups == 0 and chain.lookups == chain.steps
    assert auto.steps == none.steps == 16 * 200 and auto.lookups == 0 and auto.probes == 16 * 10
    first = [i for i in range(200) if auto.step_lookups[i] or auto.options[i] != NONE]
    assert first == [] and auto.time_ms == pytest.approx(none.time_ms)
    s = sim.summarize(res)
    assert s["auto_vs_none"] == 1.0 and s["auto_lookup_steps"] == 0 and s["auto_probe_steps"] == 160
    # with lookups free the same run is no speculation exactly
    free = sim.summarize(sim.run_all(reqs, sim.cost_table("h200-dummy24"), 1, CFG))
    assert free["tokens_per_s"]["none"] == s["tokens_per_s"]["none"]


def test_with_lookup_costs_auto_keeps_its_guarantees():
    """(a) and (b) of the issue under whole-step costs with a lookup cost: acceptance 0 >= 0.98x no
    speculation, high acceptance within 5 % of the best fixed mode."""
    costs = sim.cost_table("h200-dummy24")
    for bs in (1, 4):
        zero = sim.summarize(sim.run_all(
            sim.synthetic_requests(16, 200, (0.0,), CFG.max_chain, CFG.tree_width),
            costs, bs, CFG, lookup_ms=1.8))
        high = sim.summarize(sim.run_all(
            sim.synthetic_requests(16, 200, (0.85,), CFG.max_chain, CFG.tree_width),
            costs, bs, CFG, lookup_ms=1.8))
        assert zero["auto_vs_none"] >= 0.98, zero
        assert high["auto_vs_best_fixed"] >= 0.95, high


@pytest.mark.parametrize("bs", [1, 4])
def test_a_sampled_load_after_a_repetitive_one_stays_at_no_speculation(bs):
    """The first lookups of a load whose drafts match in full but are never accepted (a sampled load
    on the prompts of a repetitive one) follow a load that speculated: the gain model still expects
    full matches to pay. Looked up behind the step in flight they cost nothing; the second load
    stays within 2 % of no speculation and pays for few lookups."""
    res, after = sim.load_switch_run(sim.cost_table("h200-dummy24"), bs, CFG, 8, 200, lookup_ms=1.8)
    assert after["auto_vs_none"] >= 0.98 and after["auto_lookups"] <= 2 * bs, after
    s = sim.summarize(res)
    assert s["auto_vs_best_fixed"] >= 1.0, s  # the best fixed mode loses on one of the two loads


def test_load_switch_first_lookup_unsure_of_the_token_in_flight():
    """The second load's first lookup (behind its prefill's token) finds the corpus unsure of that
    token while full matches still look worth verifying: the server looks up for real (paid) and
    verifies the full match, which is rejected. The gain model's floor keeps that to the first
    request: later ones are judged by a model that has forgotten the first load (without the floor
    the second request speculates too)."""
    import dataclasses

    costs = sim.cost_table("h200-dummy24")

    def second_load(cfg, unsure=True):
        res, after = sim.load_switch_run(costs, 1, cfg, 8, 200, lookup_ms=1.8, unsure_first=unsure)
        auto = res["auto"]
        start = len(auto.step_ms) - after["steps"]
        return auto.step_lookups[start], [i - start for i, o in enumerate(auto.options)
                                          if i >= start and o != NONE]

    paid, spec = second_load(CFG)
    assert paid and spec == [0]
    paid, spec = second_load(dataclasses.replace(CFG, prior_floor=0.0))
    # the second request (from step 200) still trusts the first load
    assert paid and spec == [0, 200]
    paid, _ = second_load(CFG, unsure=False)
    assert not paid  # a sure guess: looked up behind, nothing paid


def test_load_switch_to_requests_that_say_they_sample():
    """The GPU check's second load samples at temperature 1 and its requests say so: judged by
    sampled requests' drafts alone (the pessimistic prior here), no request of it verifies a
    draft or pays for a lookup after the switch at bs 1, and at bs 4 one lookup is paid, on
    the first step of the window (requests that pass for greedy, as above: 1 and 5 verify
    passes, 2 and 6 paid lookups)."""
    costs = sim.cost_table("h200-dummy24")
    for bs, greedy_like, told in ((1, (1, 2), (0, 0)), (4, (5, 6), (0, 1))):
        seen = {}
        for sampled in (False, True):
            res, after = sim.load_switch_run(costs, bs, CFG, 8, 200, lookup_ms=1.8, sampled=sampled)
            auto = res["auto"]
            start = len(auto.step_ms) - after["steps"]
            seen[sampled] = (sum(1 for o in auto.options[start:] if o != NONE),
                             after["auto_lookups"], after["auto_vs_none"])
        assert seen[False][:2] == greedy_like and seen[True][:2] == told
        assert seen[True][2] > seen[False][2]


def test_probes_that_cost_host_time_stay_within_the_probe_budget():
    """At batch size 4 on the 2x H200 a probe made the step ~0.8 ms longer (the host's share of the
    step outgrew the GPU's). On a sampled load that never pays, auto measures that cost and spreads
    its probes towards `probe_budget` of the load's time, but never beyond PROBE_MAX steps apart
    (here that cap binds: a probe every 32 steps instead of 1, 2, 4, ... again after each join),
    besides the one probe owed to each join's deferred first lookup (made once the steps right
    after the prefill passed, whatever the credit); without the limit it probed half as often again
    and lost 0.4 % more. Where probes fit in the host's slack (probe_ms 0) nothing is held."""
    import dataclasses

    costs = sim.cost_table("h200-dummy24")
    seen = {}
    for budget in (1.0, CFG.probe_budget):
        cfg = dataclasses.replace(CFG, probe_budget=budget)
        res, after = sim.load_switch_run(costs, 4, cfg, 16, 200, lookup_ms=1.8, sampled=True,
                                         probe_ms=0.8)
        auto = res["auto"]
        start = len(auto.step_ms) - after["steps"]
        at = [i for i in range(start, len(auto.step_ms)) if auto.step_probes[i]
              and auto.batch[i] == 4]
        seen[budget] = (after["auto_probes"], after["auto_vs_none"], at, auto.finished.values())
    probes, rate, at, finished = seen[CFG.probe_budget]
    # the first probes are free until min_samples of them are measured and the costs are next shared
    # (COST_SYNC_STEPS); from then on the budget would space them ~90 steps apart (0.8 ms / (budget
    # * a 4.44 ms step)), and the cap holds them to PROBE_MAX, but for the probes owed to joins
    measured = [b for a, b in zip(at, at[1:]) if a > at[0] + sim.COST_SYNC_STEPS]
    gaps = [(a, b) for a, b in zip(at, at[1:]) if a >= measured[0]] if measured else []
    owed = [b for a, b in gaps if any(0 < b - f <= 3 for f in finished)]
    assert len(gaps) >= 10 and max(b - a for a, b in gaps) <= sim.PROBE_MAX + 4, seen
    assert all(b - a >= sim.PROBE_MAX for a, b in gaps if b not in owed), seen
    assert 0 < len(owed) <= len(finished), seen
    assert seen[1.0][0] >= 1.4 * probes and rate > seen[1.0][1] + 0.003, seen
    _, free = sim.load_switch_run(costs, 4, CFG, 16, 200, lookup_ms=1.8, sampled=True, probe_ms=0.0)
    assert free["auto_probes"] >= 1.5 * probes  # probes that cost nothing are not held


def test_measured_table_and_flags():
    t = sim.cost_table("h200-dummy24")
    assert t.decode_ms(1) == pytest.approx(4.4269) and t.verify_ms(8) == pytest.approx(4.8352)
    assert sim.main(["--tables", "h200-dummy24", "--lookup-ms", "-1"]) == 2
    assert sim.main(["--tables", "h200-dummy24", "--probe-max", "0"]) == 2
    assert sim.main(["--tables", "h200-dummy24", "--probe-ms", "-0.5"]) == 2
    assert sim.main(["--tables", "nope"]) == 2


# ------------------------------------------------------------------- the reference box, pinned
# The reference report's measurements (CONTEXT.md): plain 82 tok/s; EAGLE-3, 3 chain tokens, accept
# length ~2.0 with ~3 ms of drafting per step, 60 tok/s; the K2 drafter on K2.5 at ~1.5, 52 tok/s;
# NGRAM tree of 8 at accept length 1.3-1.5, 41 tok/s.
def _reference_rates(costs):
    def rate(width, accept, extra_ms=0.0):
        return accept / (costs.verify_ms(width) + extra_ms) * 1000.0
    return {"plain": 1000.0 / costs.decode_ms(1),
            "tree8": [rate(8, a) for a in (1.3, 1.4, 1.5)],
            "eagle3": rate(4, 2.0, 3.0), "k2_eagle3": rate(4, 1.5, 3.0), "rate": rate}


def test_pcie_comm_bound_is_the_fitted_reference_profile():
    costs = sim.cost_table("pcie-comm-bound")
    r = _reference_rates(costs)
    assert r["plain"] == pytest.approx(82.0, rel=0.01)
    assert all(abs(t / 41.0 - 1) <= 0.15 for t in r["tree8"]), r["tree8"]
    assert r["eagle3"] == pytest.approx(60.0, rel=0.15)
    assert r["k2_eagle3"] == pytest.approx(52.0, rel=0.15)
    # every shape the reference ran is a loss at its costs, and so is every n-gram chain at the
    # tree's best accept length (a chain accepts at most what its path of the tree does)
    losing = r["tree8"] + [r["eagle3"], r["k2_eagle3"]] + \
        [r["rate"](k + 1, min(1.5, k + 1)) for k in range(1, 8)]
    assert max(losing) < r["plain"], losing
    # the controller agrees: it gates every such option off (plain's rate) at such acceptance
    for opt in options_for(CFG.max_chain, CFG.tree_width):
        if opt.kind != NONE:
            ev = evaluate(opt, costs, [0.5])
            assert not any(ev.speculate) and ev.rate == pytest.approx(1 / costs.decode_ms(1)), opt


def test_the_old_linear_ramp_fails_the_reference_pin():
    """The pin above can fail: the table this replaced (59 -> 205 us per all-reduce linear over
    1 -> 8 tokens, compute 5 ms) makes EAGLE-3 win at 1.23x plain where the box measured 0.73x."""
    def f(t):
        return 5.0 + 122 * (59.0 + (205.0 - 59.0) / 7.0 * (t - 1)) / 1000.0
    pts = tuple((t, f(t)) for t in (1, 2, 4, 8, 16))
    r = _reference_rates(CostTable(pts, pts, "linear"))
    assert r["eagle3"] > 1.15 * 60.0 and r["eagle3"] > r["plain"]


def test_tables_take_profiles_by_name_and_file(tmp_path, capsys):
    t = sim.cost_table("nccl-tuned-switch")
    from fastverify import passcost
    prof = passcost.load_profile("nccl-tuned-switch")
    assert t.verify_ms(8) == pytest.approx(prof.pass_ms(8), abs=1e-3)
    f = tmp_path / "box.json"
    f.write_text('{"allreduces_per_pass": 10, "allreduce_us": {"1": 100, "8": 200}, '
                 '"compute_ms": {"1": 1.0}}')
    assert sim.cost_table(str(f)).verify_ms(8) == pytest.approx(3.0)
    assert sim.main(["--tables", f"pcie-ipc-sm120,{f}", "--batch-sizes", "1", "--requests", "2",
                     "--length", "32"]) == 0
    out = capsys.readouterr()
    assert "pcie-ipc-sm120" in out.out and "box.json" in out.out
    assert "[sim] 12/12" in out.err and "s left" in out.err  # progress on stderr, time left
    assert sim.main(["--tables", "nope"]) == 2
    assert "no built-in profile of that name" in capsys.readouterr().err


def test_scenario_report_tells_progress_before_each_scenario():
    lines = []
    sim.scenario_report((1,), ("h200-dummy24",), 2, 32, progress=lines.append)
    assert len(lines) == len(sim.SCENARIOS) + 3 + 1
    assert lines[0].startswith("1/6 h200-dummy24 bs 1 synthetic-zero")
    assert lines[-1].startswith("6/6 scenarios in")


@pytest.mark.parametrize("ps", [(0.3,), (0.0, 0.85)])
def test_measured_costs_do_not_depend_on_the_periods_lag(ps):
    """Under overlap scheduling where the GPU is the bottleneck, the period the host measures for a
    step is the device time of the step before it (`period_lag` 1). Auto records a period only
    between two steps of one class (`costs.steady_period`), so it decides as it would on each step's
    own time: the same steps, option for option, under the reference box's pass costs (where a
    chain trial among plain steps, measured as the plain step before it, looked cheap)."""
    from fastverify.costs import StepCosts

    table = sim.cost_table("reference-kimi-tp8")
    reqs = sim.synthetic_requests(16, 400, ps, CFG.max_chain, CFG.tree_width, seed=0)
    runs = {}
    for lag in (0, 1):
        pol = sim.AutoPolicy(Controller(CFG, StepCosts(table)), sim.PROBE_MAX, StepCosts(table),
                             period_lag=lag)
        runs[lag] = sim.simulate(reqs, pol, table, 1, CFG.shape, CFG.max_chain, CFG.tree_width,
                                 regime_of_step=(lambda s: (s // 200) % 2) if len(ps) > 1
                                 else None)
    assert runs[1].options == runs[0].options
    assert runs[1].tokens_per_s == pytest.approx(runs[0].tokens_per_s)
    assert any(o != NONE for o in runs[0].options)  # it speculated somewhere: a real comparison


def test_a_cost_table_file_in_the_servers_form_is_a_table(tmp_path, capsys):
    """`--tables` takes the file `--speculative-ngram-auto-cost-table` reads (decode_ms,
    verify_ms): its points are the simulated costs, and a broken one is refused with the
    server's own message."""
    f = tmp_path / "costs.json"
    f.write_text(json.dumps({"decode_ms": {"1": 2.0, "64": 2.0},
                             "verify_ms": {"1": 2.0, "64": 4.0}}))
    t = sim.cost_table(str(f))
    assert t.decode_ms(4) == 2.0 and t.verify_ms(64) == 4.0 and t.source == str(f)
    assert sim.main(["--tables", str(f), "--batch-sizes", "1", "--requests", "2",
                     "--length", "32"]) == 0
    assert f"# cost table {f} (ms): 1:2.00" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"decode_ms": {"1": 2.0}}))
    assert sim.main(["--tables", str(bad), "--batch-sizes", "1"]) == 2
    assert "missing key 'verify_ms'" in capsys.readouterr().err


def _novel_then_memorised(bs: int, scored_at_lookups: bool = False) -> tuple:
    """Eight requests whose drafts never pay, then eight whose drafts match almost always and are
    accepted (a prompt repeated: its earlier output is in the corpus), on one controller whose
    probes cost host time (0.8 ms, the 2x H200 at batch size 4); ``scored_at_lookups``: drafts
    scored only at lookups, as on the server's own decode path (`sim.simulate`). Returns (auto's
    tokens/s over the second load against the best fixed option's, auto's steps without
    speculation there)."""
    first = sim.synthetic_requests(8, 200, (0.0,), CFG.max_chain, CFG.tree_width, seed=0)
    second = sim.synthetic_requests(8, 200, (0.97,), CFG.max_chain, CFG.tree_width,
                                    match_rate=0.99, seed=5)
    for i, q in enumerate(second):
        q.rid = f"m{i}"
    res = sim.run_all(first + second, sim.cost_table("h200-dummy24"), bs, CFG, lookup_ms=1.8,
                      probe_ms=0.8, scored_at_lookups=scored_at_lookups)

    def start(r):
        return max(r.finished[q.rid] for q in first) + 1

    rates = {label: sim.window_rate(r, start(r)) for label, r in res.items()}
    auto = res["auto"]
    plain = sum(1 for o in auto.options[start(auto):] if o == NONE)
    return rates["auto"] / max(v for k, v in rates.items() if k != "auto"), plain


@pytest.mark.parametrize("bs", [1, 4])
def test_a_memorised_load_after_a_novel_one_is_speculated_from_its_first_requests(bs):
    """The novel load leaves the gain model expecting nothing of a full match, so the memorised
    requests' first lookups are deferred to a probe: that probe is owed and made once the steps
    right after the prefill passed, not held for credit (it was: probes every 32 steps, at batch
    size 4 19 plain steps of 75 and 0.864x the best chain; now 6 and 0.97x)."""
    ratio, plain = _novel_then_memorised(bs)
    assert ratio >= 0.95 and plain <= 12, (ratio, plain)


@pytest.mark.parametrize("bs", [1, 4])
def test_a_memorised_load_is_learnt_from_the_probe_that_confirms_its_first_match(bs):
    """As on the server's own decode path, drafts are scored only at lookups: the owed first probe
    finds the memorised request's full match, and the gain model, which judges a new request by the
    novel load before, learns that it holds only when a later lookup scores it. The confirming
    probe (`Controller.note_probe`) comes once those drafts are decided; without it the next probe
    waited for credit (batch size 4: 0.784x the best fixed option, 34 plain steps; now 0.934x and
    11; batch size 1, whose probes the credit covers, 0.942x and 40 either way)."""
    ratio, plain = _novel_then_memorised(bs, scored_at_lookups=True)
    assert ratio >= 0.92 and plain <= (14 if bs == 4 else 44), (ratio, plain)
