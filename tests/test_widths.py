"""fastverify.widths: flag parsing, width choice, draft truncation, buffer views, accept-token
padding, and greedy losslessness of per-step widths against plain decoding."""
import numpy as np
import pytest
import torch

from fastverify.chain import chain_indices, chain_mask, reduce_to_chain
from fastverify.verify_ref import greedy_verify_chain, greedy_verify_tree
from fastverify.widths import (
    WidthsConfig,
    WidthStats,
    batch_views,
    chain_draft_lengths,
    choose_width,
    pad_accept_tokens,
    parse_widths,
    truncate_drafts,
)

FLAG = "--speculative-ngram-verify-widths"


# ----------------------------------------------------------------------------------------- the flag
def test_parse_ok_and_off():
    c = parse_widths("1,2,4,8", 8, "chain")
    assert c.widths == (1, 2, 4, 8) and c.extra == (1, 2, 4) and c.enabled and c.per_step
    assert parse_widths([2, 8], 8, "auto").per_step is False  # auto: its controller selects
    assert parse_widths(" 8 ", 8, "chain").extra == ()
    for off in (None, "", "  "):
        c = parse_widths(off, 8, "tree")
        assert not c.enabled and c.widths == () and not c.per_step


@pytest.mark.parametrize("value,k,mode,match", [
    ("1,2,x", 8, "chain", f"{FLAG} takes comma-separated integers"),
    ("1.5,8", 8, "chain", "comma-separated integers"),
    ("1,,8", 8, "chain", "comma-separated integers"),
    ("0,8", 8, "chain", r"must lie in 1\.\.8"),
    ("1,9", 8, "chain", r"must lie in 1\.\.8 \(--speculative-num-draft-tokens\); got \[9\]"),
    ("4,2,8", 8, "chain", "increasing order without repeats"),
    ("2,2,8", 8, "chain", "increasing order without repeats"),
    ("1,2,4", 8, "chain", "must include k = 8"),
    ("1,2,8", 8, "tree", "needs --speculative-ngram-verify-mode chain or auto; got 'tree'"),
    ("1", 1, "chain", "needs --speculative-num-draft-tokens >= 2"),
])
def test_parse_errors_name_the_flag(value, k, mode, match):
    with pytest.raises(ValueError, match=match) as e:
        parse_widths(value, k, mode)
    assert FLAG in str(e.value)


# ------------------------------------------------------------------------------------- width choice
def _chains(rows, k):
    """Chain-format tokens [bs*k] from per-request draft lists (root 100+b)."""
    out = np.zeros((len(rows), k), dtype=np.int64)
    for b, r in enumerate(rows):
        out[b, 0] = 100 + b
        out[b, 1 : 1 + len(r)] = r
    return out.reshape(-1)


def test_chain_draft_lengths_golden():
    k = 6
    toks = _chains([[], [5], [5, 6, 7, 8, 9], [5, 0, 7]], k)
    # a 0 inside a chain is a real token
    assert chain_draft_lengths(toks, k).tolist() == [0, 1, 5, 3]
    # trailing real 0 reads as padding
    assert chain_draft_lengths(_chains([[5, 0]], k), k).tolist() == [1]


def test_chain_draft_lengths_match_reduce_to_chain():
    """On the chain module's own output the lengths equal its chain_len (no
    real token 0 drafted)."""
    rng = np.random.default_rng(0)
    k, bs = 8, 16
    for _ in range(20):
        tokens = np.zeros((bs, k), dtype=np.int64)
        mask = np.zeros((bs, k, k), dtype=np.int64)
        for b in range(bs):
            n = int(rng.integers(0, k))  # real nodes after the root, as a random tree in BFS order
            parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n + 1)]
            tokens[b, 0] = 7
            for i in range(1, k):
                p = parents[i] if i <= n else 0
                tokens[b, i] = int(rng.integers(1, 50)) if i <= n else 0
                mask[b, i] = mask[b, p]
                mask[b, i, i] = 1
            mask[b, 0, 0] = 1
        ct, cm, clen = reduce_to_chain(tokens.reshape(-1), mask.reshape(-1), k)
        assert chain_draft_lengths(ct, k).tolist() == clen.tolist()


@pytest.mark.parametrize("lens,widths,expect", [
    ([0, 0, 0], (1, 2, 4, 8), 1),  # no request has a draft: the plain decode token through verify
    ([0, 1], (1, 2, 4, 8), 2),
    ([2, 0], (1, 2, 4, 8), 4),
    ([3, 1], (1, 2, 4, 8), 4),
    ([4], (1, 2, 4, 8), 8),
    ([7, 0], (1, 2, 4, 8), 8),
    ([0, 0], (2, 8), 2),  # width 1 not captured: the smallest captured width
    ([1], (8,), 8),
])
def test_choose_width(lens, widths, expect):
    width, plan = choose_width(lens, WidthsConfig(widths, 8, "chain"))
    assert width == expect
    assert plan.tokens_static == 8 * len(lens)


# --------------------------------------------------------------------------------------- truncation
def test_truncate_chain_golden():
    k = 5
    toks = _chains([[11, 12], [21]], k)
    mask = chain_mask(2, k, dtype=np.uint8)
    t, m = truncate_drafts(toks, mask, k, 3)
    assert t.tolist() == [100, 11, 12, 101, 21, 0]
    assert m.dtype == np.uint8 and m.tolist() == chain_mask(2, 3, dtype=np.uint8).tolist()
    t1, m1 = truncate_drafts(toks, mask, k, 1)
    assert t1.tolist() == [100, 101] and m1.tolist() == [1, 1]
    tk, mk = truncate_drafts(toks, mask, k, k)
    assert tk.tolist() == toks.tolist() and mk.tolist() == mask.tolist()
    # per-request gating: request 0 verifies no draft
    tg, _ = truncate_drafts(toks, mask, k, 3, keep=[0, 1])
    assert tg.tolist() == [100, 0, 0, 101, 21, 0]
    with pytest.raises(ValueError, match=r"1\.\.5"):
        truncate_drafts(toks, mask, k, 6)


def test_truncate_tree_keeps_a_valid_subtree():
    """BFS order: the first w nodes of a tree are a tree; verifying them accepts what the full tree
    accepts whenever w covers the accepted path."""
    # root 0 -> 1(a) 2(b); 1 -> 3(c); 3 -> 4(d)
    tokens = np.array([[9, 1, 2, 3, 4]])
    mask = np.array([[[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0],
                      [1, 1, 0, 1, 1]]])
    t, m = truncate_drafts(tokens.reshape(-1), mask.reshape(-1), 5, 4)
    m = m.reshape(4, 4)
    assert t.tolist() == [9, 1, 2, 3] and (np.tril(m) == m).all() and (m.diagonal() == 1).all()


# -------------------------------------------------------------------------------- views and padding
def test_batch_views_share_the_k_buffer():
    max_bs, k, w = 4, 8, 2
    flat = torch.arange(max_bs * k)
    rows = torch.arange(max_bs * k).reshape(max_bs, k)
    mask = torch.zeros(max_bs * k * k, dtype=torch.bool)
    v = batch_views(flat, max_bs, w, w)
    r = batch_views(rows, max_bs, w, w, rows=True)
    mv = batch_views(mask, max_bs, w * w, w)
    assert (len(v) == max_bs + 1 and v[3].shape == (6,) and r[3].shape == (3, 2)
            and mv[3].shape == (12,))
    assert r[3].is_contiguous() and r[3].data_ptr() == rows.data_ptr()
    r[3].copy_(torch.full((3, 2), -5))
    assert rows.reshape(-1)[:6].tolist() == [-5] * 6 and rows.reshape(-1)[6] == 6
    with pytest.raises(ValueError, match="cannot hold"):
        batch_views(flat, max_bs, k + 1, k + 1)


def test_pad_accept_tokens_keeps_what_is_read():
    bs, w, k = 3, 2, 8
    acc = torch.tensor([11, 12, 21, 22, 31, 32], dtype=torch.int32)
    lens = [2, 1, 2]
    out = pad_accept_tokens(acc, bs, w, k)
    assert out.shape == (bs * k,) and out.dtype == acc.dtype
    for i in range(bs):  # what SGLang reads: row i at stride k, its first accept_len entries
        assert out[i * k : i * k + lens[i]].tolist() == acc[i * w : i * w + lens[i]].tolist()
    # SGLang's batch filter reshapes the carried tokens at k
    assert out.reshape(-1, k)[torch.tensor([2, 0])][:, :2].tolist() == [[31, 32], [11, 12]]
    assert pad_accept_tokens(acc, 3, 2, 2) is acc


def test_width_stats():
    s = WidthStats.empty()
    s.record(4, 1, 8)
    s.record(4, 8, 8)
    assert s.summary() == {"steps": 2, "steps_by_width": {1: 1, 8: 1},
                           "verified_tokens_per_step": 18.0, "static_tokens_per_step": 32.0}


# ------------------------------------------------------------------------------------- losslessness
def _target(ctx):
    """A fixed deterministic 'model': next token from the last three tokens (vocab 1..40)."""
    a, b, c = ctx[-3:]
    return 1 + (a * 131 + b * 31 + c * 7) % 40


def _draft(ctx, rng, k, true_next):
    """Chain drafts: a correct prefix of random length, then wrong tokens, or nothing (no match)."""
    if rng.random() < 0.35:
        return []
    n = int(rng.integers(1, k))
    good = int(rng.integers(0, n + 1))
    seq, c = [], list(ctx)
    for _ in range(good):
        t = true_next(c)
        seq.append(t)
        c.append(t)
    while len(seq) < n:
        seq.append(int(rng.integers(1, 41)))
    return seq


def _decode(widths, k, steps, seed, bs=4):
    rng = np.random.default_rng(seed)
    ctxs = [[1 + b, 2 + b, 3 + b] for b in range(bs)]
    cfg = WidthsConfig(widths, k, "chain") if widths else None
    used = set()
    for _ in range(steps):
        rows = [_draft(c, rng, k, _target) for c in ctxs]
        toks = _chains(rows, k)
        for b in range(bs):
            toks[b * k] = ctxs[b][-1]
        mask = chain_mask(bs, k)
        width = k
        if cfg is not None:
            width, _ = choose_width(chain_draft_lengths(toks, k), cfg)
            toks, mask = truncate_drafts(toks, mask, k, width)
        used.add(width)
        cand = torch.as_tensor(toks).reshape(bs, width)
        # the target's prediction after each node (what the verify pass computes)
        pred = torch.tensor([[_target(ctxs[b] + cand[b, 1 : i + 1].tolist()) for i in range(width)]
                             for b in range(bs)])
        res = greedy_verify_chain(cand, pred)
        _, ri, nt, ns = chain_indices(torch.zeros(bs, dtype=torch.int64), width)
        assert res.tokens == greedy_verify_tree(cand, ri, nt, ns, pred).tokens
        acc = torch.tensor([t + [0] * (width - len(t)) for t in res.tokens]).reshape(-1)
        carried = pad_accept_tokens(acc, bs, width, k)  # the next step reads these at stride k
        for b in range(bs):
            ctxs[b] += carried[b * k : b * k + int(res.accept_len[b])].tolist()
    return ctxs, used


@pytest.mark.parametrize("seed", range(6))
def test_greedy_output_is_independent_of_the_widths(seed):
    k, steps = 8, 30
    ref = [[1 + b, 2 + b, 3 + b] for b in range(4)]
    for c in ref:  # plain greedy decoding
        for _ in range(steps * k):
            c.append(_target(c))
    static, _ = _decode((), k, steps, seed)
    gated, used = _decode((1, 2, 4, 8), k, steps, seed)
    assert gated == static  # same drafts, same acceptances: widths only drop padding
    for got, want in zip(gated, ref):
        assert got == want[: len(got)]
    assert used & {1, 2, 4}  # the test exercised narrower widths
