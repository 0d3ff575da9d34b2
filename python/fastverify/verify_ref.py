"""Torch reference of speculative verification: greedy tree, greedy chain, and
sampled (rejection) verify.

This is the CPU reference the CUDA verify kernels are checked against on a GPU. Inputs use SGLang's
verify layout: ``candidates`` [bs, d] (node 0 is the root, i.e. the last verified token),
``retrieve_index`` [bs, d] (row of each node in the flat [bs*d] logits), ``next_token`` [bs, d]
(first child, -1 none) and ``next_sibling`` [bs, d] (next child of the same parent, -1 none).
``target_predict`` [bs, d] / ``target_probs`` [bs, d, vocab] are the target model's outputs at each
node, i.e. its prediction for the token after that node.

Every function returns a ``VerifyResult``: ``accept_index`` [bs, d] (flat rows of the accepted
nodes, root first, -1 after), ``accept_len`` [bs] (accepted drafts + 1 bonus token: what
SGLang reports as accept length) and ``tokens`` (per request, the emitted tokens: accepted
drafts then the bonus token).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VerifyResult:
    accept_index: torch.Tensor  # [bs, d] int64, -1 padded
    accept_len: torch.Tensor  # [bs] int64, accepted drafts + 1
    tokens: list  # bs lists of emitted token ids

    @property
    def num_accepted_drafts(self) -> torch.Tensor:
        return self.accept_len - 1


def greedy_verify_tree(candidates, retrieve_index, next_token, next_sibling,
                       target_predict) -> VerifyResult:
    """Greedy tree verify: from the root, descend into the child whose token
    equals the target's argmax."""
    bs, d = candidates.shape
    accept_index = torch.full((bs, d), -1, dtype=torch.int64)
    accept_len = torch.zeros(bs, dtype=torch.int64)
    tokens = []
    for b in range(bs):
        last = 0
        accept_index[b, 0] = retrieve_index[b, 0]
        out = []
        n = 0
        child = int(next_token[b, 0])
        while child != -1:
            want = int(target_predict[b, last])
            while child != -1 and int(candidates[b, child]) != want:
                child = int(next_sibling[b, child])
            if child == -1:
                break
            out.append(want)
            n += 1
            accept_index[b, n] = retrieve_index[b, child]
            last = child
            child = int(next_token[b, last])
        out.append(int(target_predict[b, last]))  # bonus token
        accept_len[b] = n + 1
        tokens.append(out)
    return VerifyResult(accept_index, accept_len, tokens)


def greedy_verify_chain(chain_tokens, target_predict, chain_len=None) -> VerifyResult:
    """Greedy chain verify: accept the longest prefix where each draft equals the
    target's argmax before it.

    ``chain_tokens`` [bs, k] (root first), ``target_predict`` [bs, k], ``chain_len`` [bs] real
    drafts (default k-1).
    """
    bs, k = chain_tokens.shape
    if chain_len is None:
        chain_len = torch.full((bs,), k - 1, dtype=torch.int64)
    chain_len = torch.as_tensor(chain_len, dtype=torch.int64)
    match = (chain_tokens[:, 1:] == target_predict[:, :-1]).to(torch.int64)  # [bs, k-1]
    real = torch.arange(k - 1)[None, :] < chain_len[:, None]  # [bs, k-1]
    n_acc = (match * real).cumprod(dim=1).sum(dim=1)  # [bs] accepted drafts
    accept_index = torch.full((bs, k), -1, dtype=torch.int64)
    tokens = []
    for b in range(bs):
        n = int(n_acc[b])
        accept_index[b, : n + 1] = b * k + torch.arange(n + 1)
        tokens.append([int(t) for t in chain_tokens[b, 1 : n + 1]] + [int(target_predict[b, n])])
    return VerifyResult(accept_index, n_acc + 1, tokens)


def sampled_verify_tree(
    candidates, retrieve_index, next_token, next_sibling, target_probs, coins, final_coins
) -> VerifyResult:
    """Sampled verify of point-mass drafts (n-gram drafts have no draft
    distribution; draft_probs = 0).

    Rule (SGLang's tree_speculative_sampling_target_only with threshold_single = threshold_acc = 1):
    at each level draw one coin u; try the children in sibling order, accepting child i iff p(t_i) >
    0 and u < p(t_1)+...+p(t_i), so child i wins with probability p(t_i). If none wins, the bonus
    token is drawn from p with the tried tokens removed and renormalized, which gives every other
    token x probability p(x): the output follows p exactly. ``coins`` [bs, d] (coin of the level
    below node i is ``coins[b, i]``), ``final_coins`` [bs], both uniform [0,1).
    """
    bs, d = candidates.shape
    accept_index = torch.full((bs, d), -1, dtype=torch.int64)
    accept_len = torch.zeros(bs, dtype=torch.int64)
    tokens = []
    for b in range(bs):
        last, n, out = 0, 0, []
        accept_index[b, 0] = retrieve_index[b, 0]
        tried = []
        while True:
            p = target_probs[b, last]  # [vocab]
            u = float(coins[b, last])
            acc = 0.0
            tried = []
            child = int(next_token[b, last])
            won = -1
            while child != -1:
                t = int(candidates[b, child])
                pt = float(p[t])
                acc += pt
                if pt > 0 and u < acc:
                    won = child
                    break
                tried.append(t)
                child = int(next_sibling[b, child])
            if won == -1:
                break
            out.append(int(candidates[b, won]))
            n += 1
            accept_index[b, n] = retrieve_index[b, won]
            last = won
        # relu(p - q), q = p on tried tokens
        residual = target_probs[b, last].clone().to(torch.float64)
        if tried:
            residual[torch.tensor(tried)] = 0.0
        cdf = torch.cumsum(residual, 0)
        x = float(final_coins[b]) * float(cdf[-1])
        bonus = int(torch.searchsorted(cdf, torch.tensor([x], dtype=torch.float64), right=True)[0])
        # first token whose cdf exceeds x, so its mass is > 0
        bonus = min(bonus, residual.shape[0] - 1)
        out.append(bonus)
        accept_len[b] = n + 1
        tokens.append(out)
    return VerifyResult(accept_index, accept_len, tokens)


def chain_links(bs: int, k: int):
    """retrieve_index / next_token / next_sibling [bs, k] of ``bs`` chains
    (root -> 1 -> ... -> k-1)."""
    ar = torch.arange(k)
    retrieve_index = torch.arange(bs * k).reshape(bs, k)
    next_token = torch.where(ar == k - 1, torch.tensor(-1), ar + 1).expand(bs, k).clone()
    next_sibling = torch.full((bs, k), -1, dtype=torch.int64)
    return retrieve_index, next_token, next_sibling


def sampled_verify_chain(chain_tokens, target_probs, coins, final_coins) -> VerifyResult:
    """Sampled chain verify: ``sampled_verify_tree`` on chain links (the same rule,
    one child per level)."""
    bs, k = chain_tokens.shape
    ri, nt, ns = chain_links(bs, k)
    return sampled_verify_tree(chain_tokens, ri, nt, ns, target_probs, coins, final_coins)
