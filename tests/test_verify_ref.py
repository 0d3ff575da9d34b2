"""Reference verification: golden trees, tree-equals-chain, greedy losslessness through SGLang's
real n-gram corpus, and the sampled rule's output distribution."""
import numpy as np
import pytest
import torch

from fastverify.chain import extract_chains, reduce_to_chain
from fastverify.verify_ref import (
    chain_links, greedy_verify_chain, greedy_verify_tree, sampled_verify_chain, sampled_verify_tree,
)


def links_from_parents(parents):
    """next_token / next_sibling [1, d] of a BFS-ordered tree given by parent indices."""
    d = len(parents)
    nt, ns = [-1] * d, [-1] * d
    for i in range(d - 1, 0, -1):
        nt[parents[i]] = i
    last = {}
    for i in range(d - 1, 0, -1):
        ns[i] = last.get(parents[i], -1)
        last[parents[i]] = i
    return torch.tensor([nt]), torch.tensor([ns])


# root 3 -> {4, 44}; 4 -> 5; 44 -> 55; 5 -> 6; 55 -> 66 -> 77
PARENTS = [-1, 0, 0, 1, 2, 3, 4, 6]
CAND = torch.tensor([[3, 4, 44, 5, 55, 6, 66, 77]])


def test_greedy_tree_golden():
    nt, ns = links_from_parents(PARENTS)
    ri = torch.arange(8)[None]
    # target: after 3 -> 44, after 44 -> 55, after 55 -> 12 (mismatch with 66):
    # accept 44, 55 + bonus 12
    pred = torch.tensor([[44, 0, 55, 0, 12, 0, 0, 0]])
    r = greedy_verify_tree(CAND, ri, nt, ns, pred)
    assert r.accept_index.tolist() == [[0, 2, 4, -1, -1, -1, -1, -1]]
    assert r.accept_len.tolist() == [3] and r.tokens == [[44, 55, 12]]
    # target wants 9 at the root: nothing accepted, bonus 9
    r = greedy_verify_tree(CAND, ri, nt, ns, torch.tensor([[9, 0, 0, 0, 0, 0, 0, 0]]))
    assert r.accept_index.tolist()[0][:2] == [0, -1] and r.tokens == [[9]]
    # the full branch 4 5 6 and the bonus from node 5 (index 5)
    r = greedy_verify_tree(CAND, ri, nt, ns, torch.tensor([[4, 5, 0, 6, 0, 8, 0, 0]]))
    assert r.accept_index.tolist() == [[0, 1, 3, 5, -1, -1, -1, -1]] and r.tokens == [[4, 5, 6, 8]]


def test_greedy_chain_golden_and_chain_len_cap():
    ct = torch.tensor([[3, 44, 55, 66, 77], [9, 1, 2, 0, 0]])
    pred = torch.tensor([[44, 55, 66, 70, 1], [1, 2, 0, 0, 0]])
    r = greedy_verify_chain(ct, pred, chain_len=torch.tensor([4, 2]))
    assert r.accept_len.tolist() == [4, 3]
    # request 2: padding is never accepted, 0 is the bonus
    assert r.tokens == [[44, 55, 66, 70], [1, 2, 0]]
    assert r.accept_index.tolist() == [[0, 1, 2, 3, -1], [5, 6, 7, -1, -1]]


def test_single_path_tree_verifies_like_the_chain():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        k = int(torch.randint(2, 9, (1,), generator=gen))
        ct = torch.randint(0, 4, (3, k), generator=gen)
        pred = torch.randint(0, 4, (3, k), generator=gen)
        ri, nt, ns = chain_links(3, k)
        a, b = greedy_verify_tree(ct, ri, nt, ns, pred), greedy_verify_chain(ct, pred)
        assert (torch.equal(a.accept_index, b.accept_index)
                and torch.equal(a.accept_len, b.accept_len))
        assert a.tokens == b.tokens
        probs = torch.softmax(torch.randn(3, k, 4, generator=gen), -1)
        coins, fc = torch.rand(3, k, generator=gen), torch.rand(3, generator=gen)
        sa, sb = (sampled_verify_tree(ct, ri, nt, ns, probs, coins, fc),
                  sampled_verify_chain(ct, probs, coins, fc))
        assert sa.tokens == sb.tokens and torch.equal(sa.accept_index, sb.accept_index)


# ----- greedy losslessness with drafts from SGLang's own C++ n-gram corpus
# --------------------------------------
V = 24


class TrigramTarget:
    """A fixed random "target model": logits of the next token from the last two tokens."""

    def __init__(self, seed):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(V, V, V, generator=g)  # [prev2, prev1, next]

    def argmax_after(self, context):
        return int(self.table[context[-2] % V, context[-1] % V].argmax())

    def predict_tree(self, context, tokens, parents):
        """Target argmax at every node of a draft tree (node 0 = last context token)."""
        out = []
        for i in range(len(tokens)):
            path, j = [], i
            while j > 0:
                path.append(int(tokens[j]))
                j = parents[j]
            out.append(self.argmax_after(list(context) + path[::-1]))
        return torch.tensor([out])


def decode(target, prompt, steps, corpus=None, mode=None, k=8, max_trie_depth=12, rid="r"):
    """Greedy decoding; with a corpus, speculative (tree or chain verify by the reference).
    Returns tokens, steps."""
    ctx = list(prompt)
    n_steps = 0
    if corpus is not None:
        corpus.batch_put([ctx])
        corpus.synchronize()
    while len(ctx) - len(prompt) < steps:
        n_steps += 1
        if corpus is None:
            ctx.append(target.argmax_after(ctx))
            continue
        tail = ctx[-max_trie_depth:]
        toks, mask = corpus.batch_get([rid], [tail], [len(ctx)])
        if mode == "chain":
            ct, _, cl = reduce_to_chain(toks, mask, k, "BFS")
            ct = torch.from_numpy(ct).reshape(1, k)
            pred = target.predict_tree(ctx, ct[0].tolist(), list(range(-1, k - 1)))
            res = greedy_verify_chain(ct, pred, torch.from_numpy(cl))
        else:
            m = np.asarray(mask).reshape(k, k).astype(bool)
            parents = [-1] + [max(j for j in range(i) if m[i, j]) for i in range(1, k)]
            nt, ns = links_from_parents(parents)
            t = torch.from_numpy(np.asarray(toks)).reshape(1, k)
            pred = target.predict_tree(ctx, t[0].tolist(), parents)
            res = greedy_verify_tree(t, torch.arange(k)[None], nt, ns, pred)
        ctx.extend(res.tokens[0])
        corpus.batch_put([ctx[-max_trie_depth:]])
        corpus.synchronize()
    return ctx[len(prompt):len(prompt) + steps], n_steps


@pytest.fixture(scope="module")
def corpus_cls():
    pytest.importorskip("sglang")
    from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

    return NgramCorpus


@pytest.mark.sglang
@pytest.mark.slow
def test_greedy_lossless_tree_chain_and_plain(corpus_cls):
    total_plain = total_tree = total_chain = 0
    for seed in range(12):
        target = TrigramTarget(seed)
        g = torch.Generator().manual_seed(100 + seed)
        motif = torch.randint(0, V, (6,), generator=g).tolist()
        prompt = torch.randint(0, V, (5,), generator=g).tolist() + motif * 3  # planted repetitions
        plain, n_plain = decode(target, prompt, 60)
        outs = {}
        for mode in ("tree", "chain"):
            c = corpus_cls(max_trie_depth=12, draft_token_num=8, min_bfs_breadth=1,
                           max_bfs_breadth=4, match_type="BFS", capacity=100000)
            outs[mode] = decode(target, prompt, 60, c, mode, rid=f"{mode}{seed}")
        assert outs["tree"][0] == plain, f"seed {seed}: tree verify changed greedy output"
        assert outs["chain"][0] == plain, f"seed {seed}: chain verify changed greedy output"
        total_plain += n_plain
        total_tree += outs["tree"][1]
        total_chain += outs["chain"][1]
    # speculation must actually accept drafts, otherwise the check above compares
    # plain decoding with itself
    assert total_tree < 0.7 * total_plain and total_chain < 0.7 * total_plain


@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.parametrize("match_type", ["BFS", "PROB"])
def test_planted_repetition_gives_expected_chain(corpus_cls, match_type):
    rng = np.random.default_rng(7)
    phrase = list(range(1, 11))  # tokens 1..10 never occur in the noise
    stream = rng.integers(1000, 2000, 300).tolist()
    for pos in (50, 150, 250):
        stream[pos:pos + 10] = phrase
    c = corpus_cls(max_trie_depth=12, draft_token_num=6, min_bfs_breadth=1, max_bfs_breadth=8,
                   match_type=match_type, capacity=100000)
    c.batch_put([stream])
    c.synchronize()
    query = rng.integers(1000, 2000, 8).tolist() + phrase[:4]
    toks, mask = c.batch_get(["q"], [query], [len(query)])
    ct, cl = extract_chains(toks, mask, match_type, d=6)
    assert ct.tolist() == [[4, 5, 6, 7, 8, 9]] and cl.tolist() == [5]
    # an unseen context: no real candidate, the chain is empty
    toks, mask = c.batch_get(["u"], [[3000, 3001]], [2])
    assert extract_chains(toks, mask, match_type, d=6)[1].tolist() == [0]


@pytest.mark.sglang
@pytest.mark.slow
def test_prob_chain_follows_the_most_frequent_continuation(corpus_cls):
    c = corpus_cls(max_trie_depth=8, draft_token_num=5, min_bfs_breadth=1, max_bfs_breadth=4,
                   match_type="PROB", capacity=100000)
    c.batch_put([[900, 1, 2, 3, 50, 51, 52, 901]] * 3 + [[902, 1, 2, 3, 60, 61, 62, 903]])
    c.synchronize()
    toks, mask = c.batch_get(["q"], [[7, 1, 2, 3]], [4])
    ct, cl = extract_chains(toks, mask, "PROB", d=5)
    assert ct.tolist()[0][:4] == [3, 50, 51, 52]


# ----- sampled verification follows the target distribution
# ----------------------------------------------------
CHI2_DF5_P999 = 20.515  # chi-square critical value, 5 degrees of freedom, p = 0.001


def chi2(counts, probs):
    n = counts.sum()
    exp = probs * n
    return float(((counts - exp) ** 2 / exp).sum())


def first_two_token_counts(rule, n=6000, seed=0):
    """Emitted tokens of n independent chain verifies of drafts [root, 2, 4] over
    a 6-token vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.tensor([0.1, 0.15, 0.3, 0.05, 0.25, 0.15])  # target after the root
    q = torch.tensor([0.3, 0.1, 0.1, 0.2, 0.2, 0.1])  # target after draft token 2
    probs = torch.stack([p, q, q]).expand(n, 3, 6)
    ct = torch.tensor([[0, 2, 4]]).expand(n, 3)
    res = rule(ct, probs, torch.rand(n, 3, generator=gen), torch.rand(n, generator=gen))
    first = np.bincount([t[0] for t in res.tokens], minlength=6)
    second = np.bincount([t[1] for t in res.tokens if t[0] == 2 and len(t) > 1], minlength=6)
    return first, second, p.numpy(), q.numpy()


def test_sampled_chain_matches_target_distribution():
    first, second, p, q = first_two_token_counts(sampled_verify_chain)
    assert chi2(first, p) < CHI2_DF5_P999
    assert chi2(second, q) < CHI2_DF5_P999
    # the second token is reached through the accepted draft often enough to test
    assert second.sum() > 1000


def test_chi2_check_rejects_a_wrong_rule():
    # bug: after a rejection the bonus is drawn from p, draft not removed
    def no_residual(ct, probs, coins, fc):
        n = ct.shape[0]
        gen = torch.Generator().manual_seed(1)
        out = []
        for b in range(n):
            if coins[b, 0] < probs[b, 0, ct[b, 1]]:
                out.append([int(ct[b, 1]), int(torch.multinomial(probs[b, 1], 1, generator=gen))])
            else:
                out.append([int(torch.multinomial(probs[b, 0], 1, generator=gen))])
        return type("R", (), {"tokens": out})()

    first, _, p, _ = first_two_token_counts(no_residual)
    assert chi2(first, p) > CHI2_DF5_P999
