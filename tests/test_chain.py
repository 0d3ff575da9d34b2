"""Chain extraction, chain indices and no-match gating on hand-drawn trees
(exact expected values)."""
import numpy as np
import pytest
import torch

from fastverify.chain import (
    ChainConfig, VerifyStats, chain_indices, chain_mask, extract_chains, plan_verify,
    real_draft_lengths, reduce_to_chain, tree_parents,
)


def tree(tokens, parents):
    """Corpus-format tree from tokens and parent indices (node 0 = root, parent -1)."""
    d = len(tokens)
    m = np.zeros((d, d), dtype=np.int64)
    for i in range(d):
        m[i, i] = 1
        if parents[i] >= 0:
            m[i] |= m[parents[i]]
    return np.array(tokens, dtype=np.int64), m


# The corpus' own output for query [1, 2, 3] over [1..10] and
# [1,2,3,44,...,100] (cpu-testing.md §3.2):
#   3 -> 4 -> 5 -> 6          (3 nodes below 4)
#   3 -> 44 -> 55 -> 66 -> 77 (4 nodes below 44)
T1 = tree([3, 4, 44, 5, 55, 6, 66, 77], [-1, 0, 0, 1, 2, 3, 4, 6])
# A bushy short branch against a long thin one:
#   9 -> 1 -> {2, 3, 4}       (subtree size 4, height 1)
#   9 -> 7 -> 8 -> 5          (subtree size 3, height 2)
T2 = tree([9, 1, 7, 2, 3, 4, 8, 5], [-1, 0, 0, 1, 1, 1, 2, 6])
NO_MATCH = tree([999, 0, 0, 0, 0, 0, 0, 0], [-1, 0, 0, 0, 0, 0, 0, 0])
PARTIAL = tree([44, 55, 66, 77, 88, 99, 100, 0], [-1, 0, 1, 2, 3, 4, 5, 0])


def stack(*trees):
    return np.concatenate([t for t, _ in trees]), np.concatenate([m.reshape(-1) for _, m in trees])


def test_parents_and_real_lengths():
    toks, mask = stack(T1, T2, NO_MATCH, PARTIAL)
    assert tree_parents(mask.reshape(4, 8, 8))[0].tolist() == [-1, 0, 0, 1, 2, 3, 4, 6]
    assert real_draft_lengths(toks, mask, 8).tolist() == [7, 7, 0, 6]


def test_bfs_takes_deepest_branch_prob_takes_heaviest():
    toks, mask = stack(T1, T2)
    ct, cl = extract_chains(toks, mask, "BFS", d=8)
    assert ct.tolist() == [[3, 44, 55, 66, 77, 0, 0, 0], [9, 7, 8, 5, 0, 0, 0, 0]]
    assert cl.tolist() == [4, 3]
    ct, cl = extract_chains(toks, mask, "PROB", d=8)
    assert ct.tolist() == [[3, 44, 55, 66, 77, 0, 0, 0], [9, 1, 2, 0, 0, 0, 0, 0]]
    assert cl.tolist() == [4, 2]


def test_ties_fall_to_lower_index():
    t = tree([5, 6, 7, 8, 9], [-1, 0, 0, 1, 2])  # two identical branches
    ct, cl = extract_chains(*t, "BFS", d=5)
    assert ct.tolist() == [[5, 6, 8, 0, 0]] and cl.tolist() == [2]


def test_no_match_and_partial():
    toks, mask = stack(NO_MATCH, PARTIAL)
    ct, cl = extract_chains(toks, mask, "BFS", d=8)
    assert ct.tolist() == [[999, 0, 0, 0, 0, 0, 0, 0], [44, 55, 66, 77, 88, 99, 100, 0]]
    assert cl.tolist() == [0, 6]


def _random_tree(rng, d):
    """A random BFS-ordered tree of d nodes (parents at smaller indices, children of a node
    contiguous), random tokens, and a random run of token-0 padding under the root at the end."""
    pad = int(rng.integers(0, d))
    real = d - pad
    parents = [-1]
    frontier = [0]
    while len(parents) < real:
        p = (frontier.pop(0) if frontier and rng.random() < 0.5 else parents[-1]
             if len(parents) > 1 else 0)
        for _ in range(int(rng.integers(1, 4))):
            if len(parents) == real:
                break
            parents.append(p)
            frontier.append(len(parents) - 1)
    parents = sorted(parents[1:])  # BFS order: parents never decrease along the output
    parents = [-1] + parents
    tokens = [int(x) for x in rng.integers(1, 50, size=d)]
    for i in range(real, d):
        parents.append(0) if len(parents) < d else None
        tokens[i] = 0
    return tokens[:d], parents[:d]


def _brute_best(tokens, parents, match_type):
    """The documented rule, spelled out: drop the trailing token-0 leaves under the root, then
    descend from the root to the child with the largest (height, size, -index) for BFS, (size,
    height, -index) for PROB."""
    d = len(tokens)
    end = d
    while (end > 1 and tokens[end - 1] == 0 and parents[end - 1] == 0
           and (end - 1) not in parents[:end]):
        end -= 1
    kids = {i: [j for j in range(1, end) if parents[j] == i] for i in range(end)}

    def height(i):
        return max((1 + height(c) for c in kids[i]), default=0)

    def size(i):
        return 1 + sum(size(c) for c in kids[i])

    key = ((lambda c: (height(c), size(c), -c)) if match_type == "BFS"
           else (lambda c: (size(c), height(c), -c)))
    path, node = [], 0
    while kids[node]:
        node = max(kids[node], key=key)
        path.append(node)
    return [tokens[0]] + [tokens[j] for j in path] + [0] * (d - 1 - len(path)), len(path), end - 1


@pytest.mark.parametrize("match_type", ["BFS", "PROB"])
def test_random_trees_match_the_rule_spelled_out(match_type):
    rng = np.random.default_rng(7)
    d, bs = 8, 64
    rows = [_random_tree(rng, d) for _ in range(bs)]
    toks, mask = stack(*[tree(t, p) for t, p in rows])
    ct, cl = extract_chains(toks, mask, match_type, d=d)
    want = [_brute_best(t, p, match_type) for t, p in rows]
    assert ct.tolist() == [w[0] for w in want]
    assert cl.tolist() == [w[1] for w in want]
    assert real_draft_lengths(toks, mask, d).tolist() == [w[2] for w in want]
    # empty and deep drafts both drawn
    assert sum(w[1] == 0 for w in want) > 0 and max(w[1] for w in want) >= 4


def test_reduce_to_chain_corpus_format():
    toks, mask = stack(T1, NO_MATCH)
    ct, cm, cl = reduce_to_chain(toks, mask.astype(np.int64), 8, "BFS")
    assert ct.shape == (16,) and cm.shape == (128,) and cm.dtype == np.int64
    assert ct.tolist() == [3, 44, 55, 66, 77, 0, 0, 0, 999, 0, 0, 0, 0, 0, 0, 0]
    assert (cm.reshape(2, 8, 8) == np.tril(np.ones((8, 8)))).all()
    assert cl.tolist() == [4, 0]


def test_chain_indices_exact():
    pos, ri, nt, ns = chain_indices(torch.tensor([10, 3]), 4)
    assert pos.tolist() == [10, 11, 12, 13, 3, 4, 5, 6]
    assert ri.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert nt.tolist() == [[1, 2, 3, -1], [1, 2, 3, -1]]
    assert ns.tolist() == [[-1] * 4, [-1] * 4]


def test_chain_indices_equal_tree_reconstruction_of_chain_mask():
    from sgl_kernel.speculative import reconstruct_indices_from_tree_mask

    bs, k = 3, 5
    seq = torch.tensor([7, 1, 20])
    pos, ri, nt, ns = (torch.empty(bs * k, dtype=torch.int64),
                       *(torch.empty(bs, k, dtype=torch.int64) for _ in range(3)))
    reconstruct_indices_from_tree_mask(torch.from_numpy(chain_mask(bs, k)).bool(), seq, pos, ri,
                                       nt, ns, bs, k)
    for got, want in zip((pos, ri, nt, ns), chain_indices(seq, k)):
        assert torch.equal(got, want)


def test_plan_verify_gating_and_buckets():
    p = plan_verify([0, 0, 0], 8)
    assert (p.action, p.width, p.tokens_static, p.tokens_planned,
            p.tokens_saved) == ("decode", 1, 24, 3, 21)
    p = plan_verify([0, 2, 1], 8, buckets=(2, 4))
    assert (p.action, p.width, p.draft_lens, p.tokens_planned) == ("verify", 4, (0, 2, 1), 12)
    p = plan_verify([0, 4], 8, buckets=(2, 4))  # needs 5 -> only k=8 fits
    assert (p.width, p.tokens_planned, p.tokens_saved) == (8, 16, 0)
    with pytest.raises(ValueError, match="draft lengths must lie in 0..7"):
        plan_verify([8], 8)


def test_verify_stats_accounting():
    s = VerifyStats()
    s.record([3, 1], plan_verify([4, 0], 8, buckets=(5,)))
    s.record([1, 1], plan_verify([0, 0], 8))
    out = s.summary()
    assert out["steps"] == 2 and out["accept_length"] == pytest.approx(6 / 4)
    assert (out["verified_tokens_per_step"] == 16
            and out["planned_tokens_per_step"] == pytest.approx((10 + 2) / 2))
    assert out["no_match_fraction"] == 0.75 and out["no_match_steps"] == 1
    assert out["accept_hist"] == {1: 3, 3: 1}


def test_config_errors_name_the_flag():
    with pytest.raises(ValueError,
                       match="--speculative-ngram-verify-mode must be one of tree, chain; got "
                             "'path'"):
        ChainConfig(mode="path")
    with pytest.raises(ValueError, match="--speculative-ngram-match-type"):
        ChainConfig(match_type="LRU")
    with pytest.raises(ValueError, match="--speculative-num-draft-tokens must be an integer >= 2"):
        ChainConfig(num_draft_tokens=1)
    with pytest.raises(ValueError, match="buckets must lie in 1..8"):
        ChainConfig(num_draft_tokens=8, buckets=(9,))
    assert ChainConfig(num_draft_tokens=8, buckets=(4, 2)).widths == (2, 4, 8)
