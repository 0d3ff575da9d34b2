"""Torch implementations of the small per-step verify kernels, timed by the regression benchmarks.

Shapes: ``bs`` requests, ``k`` draft tokens each (the first is the last verified token, the root).

- ``chain_positions(seq_lens, k)``: [bs * k] positions ``seq_len + i``.
- ``chain_mask(seq_lens, k)``: flat bool mask, per request ``[k, seq_len + k]`` row-major
  (prefix visible, causal among the drafts), requests concatenated: the layout of a
  custom-mask attention backend.
- ``tree_mask(seq_lens, parents)``: the same layout for a draft tree given by ``parents`` [bs, k]
  (``parents[:, 0] == -1``, ``parents[b, i] < i``): a draft sees its ancestors and itself.
- ``tree_positions(seq_lens, parents)``: [bs * k] ``seq_len + depth``.
- ``greedy_accept_chain(draft, target)``: accepted length per request (number of drafts after the
  root that match the target's argmax at their predecessor), [bs].
- ``greedy_accept_tree(draft, target, parents)``: the deepest accepted path
  length per request, [bs].

Each has a plain-Python reference (``*_ref``) that the benchmarks and the CPU tests check against.
"""

from __future__ import annotations

from typing import List, Sequence


def chain_positions(seq_lens, k: int):
    import torch

    return (seq_lens[:, None] + torch.arange(k, device=seq_lens.device)).reshape(-1)  # [bs * k]


def chain_mask(seq_lens, k: int):
    import torch

    out = []
    causal = torch.ones(k, k, dtype=torch.bool, device=seq_lens.device).tril()  # [k, k]
    for L in seq_lens.tolist():
        prefix = torch.ones(k, L, dtype=torch.bool, device=seq_lens.device)  # [k, L]
        out.append(torch.cat([prefix, causal], dim=1).reshape(-1))
    return torch.cat(out)


def _ancestors(parents):
    """[bs, k, k] bool: ``anc[b, i, j]`` is True when j is i or an ancestor of i.

    Device-only ops of fixed shapes (no nonzero, no host read), so that tree_positions and
    greedy_accept_tree can be captured in a CUDA graph and timed there."""
    import torch

    bs, k = parents.shape
    idx = torch.arange(k, device=parents.device)  # [k]
    anc = (idx[:, None] == idx[None, :]).expand(bs, k, k).clone()  # [bs, k, k], the diagonal
    cur = parents.clone()  # [bs, k]
    for _ in range(k - 1):  # walk up at most k-1 steps
        valid = cur >= 0  # [bs, k]
        anc |= (cur.clamp_min(0)[..., None] == idx) & valid[..., None]  # [bs, k, k]
        cur = torch.where(valid, parents.gather(1, cur.clamp_min(0)), cur)
    return anc


def tree_mask(seq_lens, parents):
    import torch

    anc = _ancestors(parents)  # [bs, k, k]
    k = parents.shape[1]
    out = []
    for b, L in enumerate(seq_lens.tolist()):
        prefix = torch.ones(k, L, dtype=torch.bool, device=parents.device)
        out.append(torch.cat([prefix, anc[b]], dim=1).reshape(-1))
    return torch.cat(out)


def tree_positions(seq_lens, parents):
    depth = _ancestors(parents).sum(-1) - 1  # [bs, k]
    return (seq_lens[:, None] + depth).reshape(-1)


def greedy_accept_chain(draft, target):
    """draft, target: [bs, k] int. Accepted drafts after the root: leading run of
    draft[:, i] == target[:, i-1]."""
    match = (draft[:, 1:] == target[:, :-1]).int()  # [bs, k-1]
    return match.cumprod(dim=1).sum(dim=1)  # [bs]


def greedy_accept_tree(draft, target, parents):
    """Deepest path of nodes whose token equals the target argmax at their parent; [bs]."""
    import torch

    bs, k = draft.shape
    par = parents.clamp_min(0)
    match = draft == target.gather(1, par)  # [bs, k]
    match[:, 0] = True  # the root is already verified
    ok = match.clone()
    for _ in range(k - 1):  # propagate: a node is accepted only if its parent is
        ok = match & torch.where(parents >= 0, ok.gather(1, par), torch.ones_like(ok))
    depth = _ancestors(parents).sum(-1) - 1  # [bs, k]
    return torch.where(ok, depth, torch.zeros_like(depth)).max(dim=1).values


# -------------------------------------------------------------------------- plain-Python references

def chain_mask_ref(seq_lens: Sequence[int], k: int) -> List[bool]:
    out: List[bool] = []
    for L in seq_lens:
        for i in range(k):
            out += [True] * L + [j <= i for j in range(k)]
    return out


def _path(parents: Sequence[int], i: int) -> List[int]:
    p = [i]
    while parents[p[-1]] >= 0:
        p.append(parents[p[-1]])
    return p


def tree_mask_ref(seq_lens: Sequence[int], parents: Sequence[Sequence[int]]) -> List[bool]:
    out: List[bool] = []
    for L, par in zip(seq_lens, parents):
        k = len(par)
        for i in range(k):
            anc = set(_path(par, i))
            out += [True] * L + [j in anc for j in range(k)]
    return out


def tree_positions_ref(seq_lens: Sequence[int], parents: Sequence[Sequence[int]]) -> List[int]:
    return [L + len(_path(par, i)) - 1 for L, par in zip(seq_lens, parents)
            for i in range(len(par))]


def greedy_accept_chain_ref(draft: Sequence[Sequence[int]],
                            target: Sequence[Sequence[int]]) -> List[int]:
    out = []
    for d, t in zip(draft, target):
        n = 0
        for i in range(1, len(d)):
            if d[i] != t[i - 1]:
                break
            n += 1
        out.append(n)
    return out


def greedy_accept_tree_ref(draft, target, parents) -> List[int]:
    out = []
    for d, t, par in zip(draft, target, parents):
        best = 0
        for i in range(len(d)):
            path = _path(par, i)  # i, parent, ..., root
            if all(d[n] == t[par[n]] for n in path[:-1]):
                best = max(best, len(path) - 1)
        out.append(best)
    return out


def random_tree(k: int, rng) -> List[int]:
    """A random draft tree of k nodes: parents[0] = -1, parents[i] uniform in [0, i)."""
    return [-1] + [rng.randrange(i) for i in range(1, k)]
