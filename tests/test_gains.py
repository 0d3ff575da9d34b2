"""The gain model, draft features and shadow resolution of drafts (fastverify/gains.py). Pure
Python; runs in both CPU environments."""
import pytest

from fastverify.controller import AutoConfig, Controller
from fastverify.costs import CostTable
from fastverify.gains import (DraftFeatures, GainModel, ShadowTracker, chain_accept, draft_features,
                              tree_accept)

# verify as cheap as decode
FLAT = CostTable(((1, 10.0), (64, 10.0)), ((1, 10.0), (8, 10.0), (64, 10.0)), "flat")


# ----------------------------------------------------------------------------------------- features
def test_draft_features_and_buckets():
    # root -> a -> b, root -> c : depth 2, 2 branches
    assert draft_features([5, 6, 7], [-1, 0, -1]) == DraftFeatures(2, 2)
    assert draft_features([], []) == DraftFeatures(0, 0)


def test_chain_and_tree_accept_golden():
    assert chain_accept([1, 2, 3], [1, 2, 9, 9]) == (2, True)
    assert chain_accept([1, 2, 3], [1, 2]) == (2, False)  # continuation not known yet
    assert chain_accept([1, 2, 3], [1, 2, 3]) == (3, True)
    tokens, parents = [1, 2, 4, 3], [-1, 0, -1, 1]  # 1 -> 2 -> 3, and 4
    assert tree_accept(tokens, parents, [1, 2, 3, 7]) == (3, True)
    assert tree_accept(tokens, parents, [4, 2]) == (1, True)  # 4 has no children
    assert tree_accept(tokens, parents, [1, 5]) == (1, True)
    assert tree_accept(tokens, parents, [1]) == (1, False)


def test_shadow_tracker_resolves_at_first_divergence():
    sh = ShadowTracker()
    f = DraftFeatures(3, 1)
    seq = [10, 11, 12]
    sh.record("a", 3, f, [20, 21, 22], [20, 30], [-1, -1])
    assert sh.advance("a", seq) == []
    seq += [20]
    assert sh.advance("a", seq) == []  # chain 20 ok, tree 20 leaf -> tree resolved, chain not yet
    seq += [21, 99]
    assert sh.advance("a", seq) == [(f, 2, 1)]
    assert sh.advance("a", seq) == []  # resolved once
    sh.record("a", 6, f, [1])
    sh.drop("a")
    assert sh.advance("a", seq + [1]) == []


# --------------------------------------------------------------------------------------- gain model
def test_gain_model_learns_distribution_and_forgets():
    g = GainModel(max_chain=4, tree_depth=3, half_life_steps=4)
    f = DraftFeatures(4, 1)
    chain, tree = g.expected("r", f, 0)
    assert chain[0] == 0.0 and tree == 0.0  # pessimistic cold start
    for step in range(1, 200):
        g.observe("r", f, step, 4, 3)
    chain, tree = g.expected("r", f, 200)
    assert chain == pytest.approx([1, 2, 3, 4], rel=1e-3) and tree == pytest.approx(3, rel=1e-3)
    for step in range(200, 260):
        g.observe("r", f, step, 0, 0)
    chain, _ = g.expected("r", f, 260)
    assert chain[3] < 0.01  # 60 steps = 15 half-lives later the old regime is gone


def test_gain_model_separates_matched_from_unmatched():
    g = GainModel(max_chain=3, tree_depth=0)
    hit, miss = DraftFeatures(5, 1), DraftFeatures(0, 0)
    for s in range(1, 100):
        g.observe("r", hit, s, 3)
        g.observe("r", miss, s, 0)
    assert g.expected("r", hit, 100)[0][2] > 2.9
    assert g.expected("r", miss, 100)[0][2] < 0.1
    assert g.expected("new", hit, 100)[0][2] > 2.5  # a new request starts from what others showed


def test_gain_model_floor_forgets_towards_the_pessimistic_prior():
    """Without new observations, an all-requests estimate keeps its old shape however small its
    mass (the normalisation scales it back up); `prior_floor` zeros that are never forgotten
    bring it back to the pessimistic prior within a few half-lives, and weigh little while
    observations keep coming."""
    f = DraftFeatures(4, 1)
    kept, floored = (GainModel(max_chain=4, tree_depth=0, half_life_steps=4, prior_floor=x)
                     for x in (0.0, 1.0))
    for g in (kept, floored):
        for step in range(1, 40):
            g.observe("old", f, step, 4)
    # while observations come every step (mass ~6.3 at this half-life) the floor costs at most 1 /
    # 7.3 of the estimate (less: the feature bucket blended in has no floor)
    assert 4 * 6.3 / 7.3 * 0.98 < floored.expected("new", f, 40)[0][3] < 3.9
    assert kept.expected("new", f, 40)[0][3] == pytest.approx(4.0, rel=1e-3)
    # 60 steps (15 half-lives) without a matched draft resolved: the new request sees
    # the old load, or nothing
    assert kept.expected("new", f, 100)[0][3] == pytest.approx(4.0, rel=1e-3)
    assert floored.expected("new", f, 100)[0][3] < 0.01
    assert (AutoConfig().prior_floor == 1.0
            and Controller(AutoConfig(), FLAT).gain.prior_floor == 1.0)


def test_gain_model_learns_sampled_and_greedy_requests_apart():
    """A greedy load's accepted full matches say nothing of a sampled request's: the all-requests
    and the feature bucket's histograms are kept apart by `DraftFeatures.sampled` (a request's own
    were always its own), so a new sampled request starts from the pessimistic prior while a new
    greedy one starts from the load."""
    g = GainModel(max_chain=4, tree_depth=0, half_life_steps=8, prior_floor=1.0)
    greedy, sampled = DraftFeatures(4, 1), DraftFeatures(4, 1, True)
    for step in range(1, 30):
        g.observe(f"g{step % 3}", greedy, step, 4)
    assert g.expected("new", greedy, 30)[0][3] > 3.0
    assert g.expected("new", sampled, 30)[0][3] < 0.05
    for step in range(30, 60):  # sampled requests' rejections do not drag the greedy estimate down
        g.observe(f"s{step % 3}", sampled, step, 0)
    assert g.expected("new", sampled, 60)[0][3] < 0.05
    before = GainModel(max_chain=4, tree_depth=0, half_life_steps=8, prior_floor=1.0)
    for step in range(1, 30):
        before.observe(f"g{step % 3}", greedy, step, 4)
    assert (g.expected("new", greedy, 60)[0][3]
            == pytest.approx(before.expected("new", greedy, 60)[0][3]))
    assert DraftFeatures(4, 1) == DraftFeatures(4, 1, False) and not DraftFeatures(0, 0).sampled


def test_gain_model_batch_estimates_match_one_request_at_a_time():
    """The blend of the all-requests and feature-bucket histograms is shared by the requests of a
    step; each estimate is what a model that answers only that request gives, also after an
    observation in between."""
    f = DraftFeatures(5, 1)
    seen = [(f"r{i % 2}", i, acc) for i, acc in enumerate((5, 1, 7, 0, 3))]

    def fresh():
        m = GainModel(7, 0)
        for rid, step, acc in seen:
            m.observe(rid, f, step, acc)
        return m

    batch = fresh()
    answers = [batch.expected(rid, f, 9) for rid in ("r0", "r1", "r2")]
    assert answers == [fresh().expected(rid, f, 9) for rid in ("r0", "r1", "r2")]
    seen.append(("r2", 9, 7))
    batch.observe("r2", f, 9, 7)
    assert batch.expected("r1", f, 9) == fresh().expected("r1", f, 9) != answers[1]


def test_the_feature_bucket_is_computed_once_per_features():
    """Every observation and estimate asks for its draft's bucket, and few features occur: each is
    computed once (cached) and answers as computing it again does."""
    from fastverify.gains import feature_bucket

    feats = [DraftFeatures(m, b, s) for m in range(10) for b in range(6) for s in (False, True)]
    for f in feats:
        feature_bucket(f)
    hits = feature_bucket.cache_info().hits
    for f in feats:
        assert feature_bucket(f) == feature_bucket.__wrapped__(f)
    assert feature_bucket.cache_info().hits == hits + len(feats)
