"""The auto controller's estimates checked against what its verified drafts accepted, the scoring
of drafts looked up one step behind, and the check of draft token ids before they reach the
device."""
import random
from types import SimpleNamespace

import numpy as np
import pytest

from fastverify import sim
from fastverify.controller import NONE, AutoConfig, Controller, RequestView
from fastverify.costs import CostTable
from fastverify.gains import DraftFeatures, ShadowTracker

# the reference box's pass costs at batch size 1 (ms): a pass of 8 tokens ~3.2 plain steps
REF = CostTable(((1, 13.3),), ((1, 13.3), (2, 19.5), (4, 31.1), (8, 42.3)))
CFG = AutoConfig(max_chain=7, tree_width=0, chain_widths=(1, 2, 4, 8))
LONG = DraftFeatures(7, 1)


def _taught(cfg=CFG) -> Controller:
    """A controller whose gain model expects ~3 tokens of a 7-token chain (half of them
    accepted in full)."""
    c = Controller(cfg, REF)
    for i in range(24):
        c.note_lean(1)
        c.observe("r", LONG, 7 if i % 2 else 0)
    return c


def test_shadow_scores_a_draft_past_its_lead_tokens():
    t = ShadowTracker()
    # a chain looked up one step behind: its first token guesses the token in flight (5)
    t.record("a", 3, LONG, [5, 6, 7], lead=1)
    t.record("b", 3, LONG, [5, 6, 7])
    assert t.advance("a", [0, 1, 2, 5, 6, 9]) == [(LONG, 1, None)]  # 6 right past the guess
    assert t.advance("b", [0, 1, 2, 5, 6, 9]) == [(LONG, 2, None)]
    t.record("a", 3, LONG, [5, 6, 7], lead=1)
    assert t.advance("a", [0, 1, 2, 4, 6, 7]) == [(LONG, 0, None)]  # wrong guess: nothing


def test_shadow_returns_the_tag_of_a_resolved_draft():
    t = ShadowTracker()
    t.record("a", 0, LONG, [1, 2, 3])
    t.tag_last("a", (2.5, 3))
    t.record("a", 1, LONG, [2, 9])
    t.tag_last("missing", "ignored")
    out = t.advance_tagged("a", [1, 2, 3, 4])
    assert out == [(LONG, 3, None, (2.5, 3)), (LONG, 1, None, None)]


def test_estimates_follow_what_the_verified_drafts_accepted():
    c = _taught()
    d = c.decide([RequestView("r", LONG)])
    assert d.option.label == "chain7" and d.gains[0] > 2.2  # the model's own estimate pays
    assert c.calibration() == 1.0
    # verified drafts accept far less than expected (the GPU run: ~0.5 of 2.3 expected)
    for _ in range(4):
        c.note_verified(d.gains[0], 0.5)
    assert c.calibration() < 0.5
    d2 = c.decide([RequestView("r", LONG)])
    assert d2.option.kind == NONE and d2.gains == (0.0,)
    # forgotten after enough steps: the model's estimate (taught again) is tried again
    for _ in range(int(8 * CFG.calibration_half_life)):
        c.note_lean(1)
    assert c.calibration() == 1.0
    for i in range(24):
        c.note_lean(1)
        c.observe("r", LONG, 7 if i % 2 else 0)
    assert c.decide([RequestView("r", LONG)]).option.label == "chain7"


def test_drafts_that_accept_about_what_was_expected_keep_the_factor_at_one():
    c = _taught()
    g = c.decide([RequestView("r", LONG)]).gains[0]
    for _ in range(50):
        c.note_verified(g, 0.8 * g)  # within the band: the winner's curse, not a wrong model
    assert c.calibration() == 1.0


def _trial(c: Controller, accepted: float):
    """Steps without speculation, in which the scorer keeps telling the gain model that half the
    chains match in full (what it was taught), until the controller tries the chain again
    (returns the steps waited); then that spell's verified drafts resolve with `accepted` tokens
    each."""
    waited = 0
    while True:
        d = c.decide([RequestView("r", LONG)])
        if d.option.kind != NONE:
            break
        c.note_lean(1)
        c.observe("r", LONG, 7 if waited % 2 else 0)
        waited += 1
        assert waited < 100000, "never tried again"
    for _ in range(4):
        c.note_verified(d.gains[0], accepted)
    return waited


def test_spells_whose_drafts_keep_failing_come_back_less_and_less_often():
    """Each spell of speculation whose verified drafts accepted less than the band of what they
    were expected to doubles the calibration's forgetting (up to calibration_backoff_max times its
    base), so trials at a loss thin out geometrically; a spell that held sets it back."""
    c = _taught()
    base = CFG.calibration_half_life
    waits, half_lives = [], []
    for _ in range(7):
        waits.append(_trial(c, 0.0))
        half_lives.append(c.metrics()["auto_calibration_half_life_steps"])
    # the first spell is judged when the second begins
    assert half_lives == [base, 2 * base, 4 * base, 8 * base, 16 * base, 16 * base, 16 * base]
    assert waits[0] == 0 and all(b > 1.7 * a for a, b in zip(waits[1:4], waits[2:5]))
    assert waits[6] == pytest.approx(waits[5], rel=0.05)  # at the cap
    _trial(c, 7.0)  # this spell's drafts accept in full
    c.note_lean(1)  # a step without speculation ends the spell
    _trial(c, 7.0)  # ... which is judged when the next begins
    assert c.metrics()["auto_calibration_half_life_steps"] == base


def test_without_backoff_the_trials_keep_their_pace():
    c = _taught(AutoConfig(max_chain=7, tree_width=0, chain_widths=(1, 2, 4, 8),
                           calibration_backoff_max=1.0))
    waits = [_trial(c, 0.0) for _ in range(5)]
    assert max(waits[2:]) <= 1.1 * min(waits[2:]) and waits[1] < 1.3 * waits[2]
    assert c.metrics()["auto_calibration_half_life_steps"] == CFG.calibration_half_life


def test_calibration_flags_are_checked():
    with pytest.raises(ValueError, match="calibration_band"):
        AutoConfig(calibration_band=0.0)
    with pytest.raises(ValueError, match="calibration_half_life"):
        AutoConfig(calibration_prior=-1.0)
    with pytest.raises(ValueError, match="calibration_backoff_max must be >= 1"):
        AutoConfig(calibration_backoff_max=0.5)


def _biased_load(scored_extra: int, n: int = 12, length: int = 256, seed: int = 0) -> list:
    """Half the positions match a 7-token chain that is accepted in full 6 % of the time and for
    one token 14 % (0.56 tokens on average, as the chain server's matched drafts on one H200); the
    gain model is told `scored_extra` tokens more for each matched draft than it accepts."""
    rng = random.Random(seed)
    reqs = []
    for r in range(n):
        feats, chain, tree = [], [], []
        for _ in range(length):
            if rng.random() < 0.5:
                u = rng.random()
                a = 7 if u < 0.06 else 1 if u < 0.2 else 0
                feats.append(LONG), chain.append(a), tree.append(min(a, 3))
            else:
                feats.append(DraftFeatures(0, 0)), chain.append(0), tree.append(0)
        reqs.append(sim.SimRequest(f"r{r}", [(feats, chain, tree)], scored_extra=scored_extra))
    return reqs


def test_simulator_a_biased_scorer_no_longer_makes_auto_slower_than_no_speculation():
    """Under the reference box's pass costs: a gain model told 2 tokens more per matched draft
    than the verify accepts (the server's expectation of 2.3-3.2 where 0.5 was accepted) made
    auto verify chains at a loss; checked against the verified drafts it stays at no
    speculation."""
    costs = sim.cost_table("reference-kimi-tp8")
    off = AutoConfig(max_chain=7, tree_width=0, chain_widths=(1, 2, 4, 8), calibration_prior=1e9)
    on = AutoConfig(max_chain=7, tree_width=0, chain_widths=(1, 2, 4, 8))
    biased = sim.summarize(sim.run_all(_biased_load(2), costs, 1, off))
    fixed = sim.summarize(sim.run_all(_biased_load(2), costs, 1, on))
    assert biased["best_fixed"] == NONE and fixed["best_fixed"] == NONE
    assert biased["auto_vs_none"] < 0.96, biased  # without the check: a loss
    assert fixed["auto_vs_none"] >= 0.98, fixed
    # an honest scorer loses nothing to the check
    honest = sim.summarize(sim.run_all(_biased_load(0), costs, 1, on))
    honest_off = sim.summarize(sim.run_all(_biased_load(0), costs, 1, off))
    assert honest["auto_vs_none"] >= 0.98 and honest_off["auto_vs_none"] >= 0.98


def test_simulator_backed_off_trials_halve_what_a_biased_scorer_costs():
    """A long load with the biased scorer: without the backoff, auto keeps trying the chain every
    time the calibration has forgotten its failures; with it, the trials thin out (fewer verify
    steps, less lost against no speculation), and an honest scorer's load is unchanged."""
    costs = sim.cost_table("reference-kimi-tp8")

    def cfg(bo):
        return AutoConfig(max_chain=7, tree_width=0, chain_widths=(1, 2, 4, 8),
                          calibration_backoff_max=bo)
    load = _biased_load(2, n=4, length=3000)
    flat = sim.summarize(sim.run_all(load, costs, 1, cfg(1.0)))
    back = sim.summarize(sim.run_all(_biased_load(2, n=4, length=3000), costs, 1, cfg(16.0)))
    assert back["auto_lookup_steps"] < 0.7 * flat["auto_lookup_steps"], (flat, back)
    assert 1.0 - back["auto_vs_none"] < 0.7 * (1.0 - flat["auto_vs_none"]), (flat, back)
    honest = sim.summarize(sim.run_all(_biased_load(0, n=4, length=3000), costs, 1, cfg(16.0)))
    assert honest["auto_vs_none"] >= 0.995


# ------------------------------------------------------------------------------------------- glue
def _glue_worker(vocab=None):
    from fastverify.glue.verify_runtime import VIEW_LISTS, VerifyRuntime, WidthRuntimes
    from fastverify.widths import parse_widths

    mr = SimpleNamespace(attn_backend="attn4", decode_cuda_graph_runner=None)
    if vocab is not None:
        mr.model_config = SimpleNamespace(vocab_size=vocab)
    w = SimpleNamespace(model_runner=mr, draft_token_num=4, speculative_num_draft_tokens=4,
                        enable_overlap=False)
    rts = {x: VerifyRuntime(x, f"attn{x}", None, {name: f"views{x}" for name, *_ in VIEW_LISTS})
           for x in (1, 2, 4)}
    w._fv_widths = WidthRuntimes(parse_widths("1,2,4", 4, "auto"), rts, 4)
    return w


def _spec(tmp_path):
    import json

    p = tmp_path / "costs.json"
    p.write_text(json.dumps({"decode_ms": {"1": 10, "64": 10}, "verify_ms": {"1": 10,
                                                                            "256": 10.5}}))
    return SimpleNamespace(speculative_ngram_verify_mode="auto", speculative_num_draft_tokens=4,
                           speculative_ngram_match_type="BFS",
                           speculative_ngram_verify_widths="1,2,4",
                           speculative_ngram_auto_cost_table=str(p),
                           speculative_ngram_auto_hysteresis=0.03, enable_metrics=False,
                           decode_log_interval=40)


def test_glue_verified_drafts_reach_the_calibration(tmp_path):
    from fastverify.chain import chain_mask
    from fastverify.glue import auto
    from fastverify.glue.verify_runtime import VerifyRuntime

    w = _glue_worker()
    state = auto.setup(w, _spec(tmp_path), plain=VerifyRuntime(1, "attn-plain", None, {}))
    req = SimpleNamespace(rid="a", output_ids=[1])
    batch = SimpleNamespace(reqs=[req], has_grammar=False)
    for _ in range(8):  # the model learns that full chains are accepted
        state.controller.observe("a", DraftFeatures(3, 1), 3)
    toks = np.array([1, 2, 3, 4], dtype=np.int64)
    out, _ = auto.step_drafts(w, batch, toks, chain_mask(1, 4).reshape(-1), 1)
    assert w.draft_token_num == 4 and state.controller._verified[0] == 0.0
    req.output_ids = [1, 9]  # the target disagreed with the first draft token
    auto._sync_requests(state, batch)
    expected, accepted = state.controller._verified[:2]
    assert expected > 2.0 and accepted == 0.0
    assert state.controller.calibration() < 1.0


def test_glue_a_probe_behind_the_token_in_flight_is_scored_past_it(tmp_path):
    from fastverify.glue import auto
    from fastverify.glue.verify_runtime import VerifyRuntime

    w = _glue_worker()
    state = auto.setup(w, _spec(tmp_path), plain=VerifyRuntime(1, "attn-plain", None, {}))
    req = SimpleNamespace(rid="a", output_ids=[1, 2])
    batch = SimpleNamespace(reqs=[req])
    lens, views = auto._record_drafts(state, batch, np.array([2, 3, 4, 5]), [0], [1])
    assert list(lens) == [3] and views[0].features.match_len == 2
    # 3 was the token in flight (guessed right), 4 right, 5 wrong: one token a verify would gain
    assert state.shadow.advance("a", [1, 2, 3, 4, 9]) == [(views[0].features, 1, None)]


def test_glue_draft_ids_outside_the_vocabulary_never_reach_the_device(caplog):
    from fastverify.glue import auto

    w = _glue_worker(vocab=100)
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")])
    ok = np.array([5, 6, 7, 8, 9, 10, 11, 12])
    assert auto.checked_drafts(w, batch, ok, 4, False) is ok
    bad = np.array([5, 6, 700, 8, 9, 10, 11, -3])
    out = auto.checked_drafts(w, batch, bad, 4, False)
    assert out.tolist() == [5, 6, 0, 8, 9, 10, 11, 0]
    assert "outside the vocabulary" in caplog.text and "'a', 'b'" in caplog.text
    root = np.array([5, 6, 7, 8, 100, 10, 11, 12])
    with pytest.raises(RuntimeError, match=r"roots outside the vocabulary \(100\).*\['b'\]"):
        auto.checked_drafts(w, batch, root, 4, False)
    # roots written on the device afterwards (fill_roots): padded like any draft token
    assert auto.checked_drafts(w, batch, root, 4, True).tolist()[4] == 0
    # no vocabulary known (stand-in runners): unchecked
    assert auto.checked_drafts(_glue_worker(), batch, bad, 4, False) is bad


def test_glue_a_prefill_between_two_decode_steps_is_not_recorded_as_a_step_cost(tmp_path):
    from fastverify.costs import LEAN
    from fastverify.glue import auto
    from fastverify.glue.verify_runtime import VerifyRuntime

    w = _glue_worker()
    state = auto.setup(w, _spec(tmp_path), plain=VerifyRuntime(1, "attn-plain", None, {}))
    now = [0.0]
    state.clock = lambda: now[0]
    for ms in (2, 2, 2, 2):  # plain steps of 2 ms each
        auto._tick(state)
        state.last_step = (LEAN, 1, 1)
        now[0] += ms / 1000.0
    # the first tick had no step before it, the second one's step had none of its class before it
    assert state.costs.samples(LEAN, 1, 1) == 2
    # a prefill of 50 ms (the worker's step sees it too), then the next decode step
    prefill = SimpleNamespace(reqs=[], forward_mode=SimpleNamespace(is_decode=lambda: False),
                              spec_algorithm=SimpleNamespace(is_none=lambda: False))
    assert auto.plain_step(w, prefill) is None
    now[0] += 0.050
    auto._tick(state)
    assert state.costs.samples(LEAN, 1, 1) == 2
    assert state.costs.to_json()["measured"]["lean/bs1/w1"] == pytest.approx(2.0)
    assert state.lean_before  # the step before the prefill still tells the roots apart
    for _ in range(2):
        state.last_step = (LEAN, 1, 1)
        now[0] += 0.002
        auto._tick(state)
    # the first decode step after the prefill is not measured (under overlap scheduling its period
    # holds the prefill's device time); the one after it is again
    assert state.costs.samples(LEAN, 1, 1) == 3
    assert state.costs.mean_ms(LEAN, 1, 1) == pytest.approx(2.0)


def test_simulator_the_backoff_barely_delays_the_return_to_drafts_that_pay():
    """Failing drafts (the biased scorer) for 1,500 steps, then drafts accepted in full 80 % of
    the time: the backed-off calibration must not keep auto from the chain once it pays (within
    2 % of auto without the backoff; 1.6 % apart when written: 1.389 against 1.411x)."""
    costs = sim.cost_table("reference-kimi-tp8")

    def load():
        rng, reqs = random.Random(0), []
        for r in range(4):
            bad = _biased_load(2, n=1, length=1500, seed=r)[0].regimes[0]
            feats, chain, tree = list(bad[0]), list(bad[1]), list(bad[2])
            for _ in range(1500):
                feats.append(LONG), chain.append(7 if rng.random() < 0.8 else 3), tree.append(3)
            reqs.append(sim.SimRequest(f"r{r}", [(feats, chain, tree)], scored_extra=2))
        return reqs

    def cfg(bo):
        return AutoConfig(max_chain=7, tree_width=0, chain_widths=(1, 2, 4, 8),
                          calibration_backoff_max=bo)
    flat = sim.summarize(sim.run_all(load(), costs, 1, cfg(1.0)))
    back = sim.summarize(sim.run_all(load(), costs, 1, cfg(16.0)))
    assert flat["best_fixed"] == back["best_fixed"] == "chain7"
    assert back["auto_vs_none"] > 1.3 and back["auto_vs_none"] >= 0.98 * flat["auto_vs_none"]
