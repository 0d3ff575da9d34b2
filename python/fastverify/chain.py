"""Chain verify for n-gram speculation: reduce SGLang's draft tree to one
path, and gate empty drafts.

The pipeline, per decode step (numpy on the host, torch only for the device-side index tensors):

    corpus.batch_get -> (tokens[bs*d], mask[bs*d*d])        SGLang's own n-gram corpus, d = k
      -> reduce_to_chain(tokens, mask, k, match_type)      one root-to-leaf path per request
      -> chain_indices(seq_lens, k)                        positions / retrieve_* for the verify
                                                           kernels
      -> plan_verify(draft_lens, k, buckets)               verify width and the tokens it saves
      -> VerifyStats.record(...)                           accept length, verified tokens per step

Input format (what ``NgramCorpus.batch_get`` returns, identical in SGLang 0.5.16 and 0.5.23): for
each of the ``bs`` requests ``d`` tokens and a ``d x d`` 0/1 matrix, row-major. Node 0 is the root
(the last context token); ``mask[i, j] == 1`` iff node ``j`` is an ancestor of node ``i`` or ``i``
itself. Nodes are in breadth-first order, so a parent always has a smaller index than its children.
When the corpus finds fewer than ``d - 1`` candidates it pads with token 0 attached to the root; a
request with no candidate at all is ``[root, 0, 0, ...]``.

Which path is "best" (decided from csrc/ngram_corpus/trie.cpp and result.cpp,
same code in both pins):
    The corpus builds its tree with a score, but ``fillResult`` emits each node's children by
    iterating a ``std::unordered_map<token, slot>``, so the sibling order in the output is hash
    order: neither the recency order of BFS mode (children taken from each trie node's LRU list,
    most recent first) nor the frequency order of PROB mode survives. What survives is the shape of
    the tree, and the two build rules shape it differently:
    - BFS (recency): anchors (matched context suffixes) are expanded longest first; each anchor's
      breadth shrinks level by level, so only the most recently seen continuations are followed
      deep, and continuations that several anchors agree on merge into one deeper branch. The most
      recent, best-supported continuation is therefore the deepest branch: descend by (subtree
      height, subtree size, lower index).
    - PROB (frequency): nodes are popped best-first by path probability (child frequency normalized
      over the top ``max_bfs_breadth`` children times the parent's probability), so more probable
      branches receive more of the node budget: descend by (subtree size, subtree height, lower
      index), i.e. follow the mass.
    Ties fall to the lower output index, which makes the choice deterministic for a given corpus
    output.

Padding: the trailing nodes that are token 0, children of the root and leaves are padding
(``fillResult`` appends them after every real node). A real token-0 leaf under the root placed last
in the output is indistinguishable from padding and is treated as padding (it can only shorten a
draft, never change output).

The chain is emitted in the same corpus format (tokens[bs*k], mask[bs*k*k]) so the unchanged SGLang
path keeps working: the chain occupies nodes 0..n, padding nodes n+1..k-1 are token 0 and continue
the chain (the mask is lower-triangular). Verification stays lossless with padding in the chain: a
padding token is accepted only where the target itself predicts token 0. ``chain_len`` (real draft
tokens, 0..k-1) is returned separately.

No-match gating and static CUDA-graph shapes (``plan_verify``):
    SGLang captures verify graphs for a fixed number of tokens per request. A batch keeps its shapes
    static by verifying every request at one width ``w`` per step, chosen as the smallest captured
    width (``buckets``) that fits the longest real draft plus the root, ``w >= 1 + max(chain_len)``;
    shorter drafts are padded only up to ``w``, and each request keeps its own draft length (padding
    is never counted as drafted). When no request in the batch has a real candidate, the step is a
    plain decode (``action == "decode"``, width 1): nothing is verified beyond the one token each
    request needs anyway. ``VerifyStats`` accounts verified tokens per step for the static width
    (``bs * k``, what stock SGLang and today's patch run) and for the planned width, so the saving
    is measured before the width switch is wired to multi-width graph capture.

Public API (used by the server glue and by the offline replay tool):
    ``ChainConfig``                         frozen mode/k/match-type/buckets,
                                            validated with flag names
    ``tree_parents(mask)``                  [bs, d] parent index per node (-1 for the root)
    ``real_draft_lengths(tokens, mask)``    [bs] number of real (non-padding) draft nodes in the
                                            tree
    ``extract_chains(tokens, mask, match_type)``  ([bs, d] chain tokens, [bs] chain length)
    ``reduce_to_chain(tokens, mask, k, match_type)``  corpus format in, corpus format + chain
                                                      length out
    ``chain_indices(seq_lens, k)``          positions, retrieve_index, retrieve_next_token,
                                            retrieve_next_sibling
    ``plan_verify(draft_lens, k, buckets)`` ``VerifyPlan``: action, width, verified tokens static
                                            vs planned
    ``VerifyStats``                         running accept-length / verified-token accounting
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

MODES = ("tree", "chain")
MATCH_TYPES = ("BFS", "PROB")


@dataclass(frozen=True)
class ChainConfig:
    """Verify-mode configuration, built once from the server flags by the glue."""

    mode: str = "tree"  # --speculative-ngram-verify-mode
    # --speculative-num-draft-tokens: k, the verify width including the root
    num_draft_tokens: int = 12
    match_type: str = "BFS"  # --speculative-ngram-match-type
    buckets: tuple = ()  # captured verify widths; () means only k is captured (stock SGLang)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(
                f"--speculative-ngram-verify-mode must be one of {', '.join(MODES)}; got "
                f"{self.mode!r}"
            )
        if self.match_type not in MATCH_TYPES:
            raise ValueError(
                f"--speculative-ngram-match-type must be one of {', '.join(MATCH_TYPES)}; got "
                f"{self.match_type!r}"
            )
        k = self.num_draft_tokens
        if not isinstance(k, (int, np.integer)) or k < 2:
            raise ValueError("--speculative-num-draft-tokens must be an integer >= 2 for n-gram "
                             f"verify; got {k!r}")
        for w in self.buckets:
            if not 1 <= int(w) <= k:
                raise ValueError(f"verify width buckets must lie in 1..{k} "
                                 f"(--speculative-num-draft-tokens); got {w}")

    @property
    def widths(self) -> tuple:
        return tuple(sorted(set(int(w) for w in self.buckets) | {int(self.num_draft_tokens)}))


def _as_trees(tokens, mask, d: int | None = None):
    """Flat corpus output -> tokens [bs, d] int64, mask [bs, d, d] bool."""
    tokens = np.asarray(tokens, dtype=np.int64)
    mask = np.asarray(mask)
    if d is None:
        if tokens.ndim == 2:
            d = tokens.shape[1]
        else:
            raise ValueError("d (the number of draft tokens per request) is needed for flat inputs")
    tokens = tokens.reshape(-1, d)
    bs = tokens.shape[0]
    if mask.size != bs * d * d:
        raise ValueError(f"mask has {mask.size} elements; expected bs*d*d = {bs}*{d}*{d}")
    return tokens, mask.reshape(bs, d, d).astype(bool)


def tree_parents(mask) -> np.ndarray:
    """[bs, d, d] ancestor-or-self mask -> [bs, d] parent index (the deepest strict
    ancestor; -1 for node 0)."""
    mask = np.asarray(mask).astype(bool)
    bs, d, _ = mask.shape
    strict_below, index = _parent_consts(d)
    # In BFS order the parent is the ancestor with the largest index.
    return np.where(mask & strict_below, index, -1).max(axis=2)  # [bs, d]


@lru_cache(maxsize=8)
def _parent_consts(d: int):
    """The [1, d, d] strictly-lower-triangular mask (ancestors j < i) and the [1, 1, d] column index
    (read-only: shared between calls)."""
    below, index = np.tril(np.ones((d, d), dtype=bool), -1)[None], np.arange(d)[None, None, :]
    below.flags.writeable = index.flags.writeable = False
    return below, index


# The per-request walks below run on Python lists: a tree has d nodes (the draft token count, 8 by
# default), where indexing a numpy array one element at a time costs more than the walk itself (the
# chain hook and the auto glue run them on every lookup).
def _padding_start(tokens_row: list, parent_row: list) -> int:
    """Index of the first node of the trailing padding run (d if there is none): token-0 nodes
    under the root. They are leaves: a child comes after its parent, and every later node of the
    run hangs from the root."""
    start = len(tokens_row)
    while start > 1:
        i = start - 1
        if tokens_row[i] == 0 and parent_row[i] == 0:
            start = i
        else:
            break
    return start


def _rows(tokens, mask, d):
    """(tokens as lists, parents as lists) per request, from corpus output."""
    tokens, mask = _as_trees(tokens, mask, d)
    return tokens, tokens.tolist(), tree_parents(mask).tolist()


def real_draft_lengths(tokens, mask, d: int | None = None) -> np.ndarray:
    """[bs] number of real draft nodes (excluding the root and the token-0 padding) per request."""
    _, toks, parents = _rows(tokens, mask, d)
    return np.array([_padding_start(t, p) - 1 for t, p in zip(toks, parents)], dtype=np.int64)


def _best_path(parent_row: list, n_real: int, match_type: str) -> list:
    """Node indices of the chosen root-to-leaf path (root excluded), over the
    real nodes 0..n_real."""
    n = n_real + 1
    children = [[] for _ in range(n)]
    for i in range(1, n):
        children[parent_row[i]].append(i)
    height = [0] * n  # longest path below the node, in edges
    size = [1] * n  # nodes in the subtree, the node included
    for i in range(n - 1, 0, -1):  # children have larger indices than parents
        p = parent_row[i]
        if height[i] + 1 > height[p]:
            height[p] = height[i] + 1
        size[p] += size[i]
    if match_type == "BFS":
        key = lambda c: (height[c], size[c], -c)  # noqa: E731  deepest branch first (recency, see docstring)
    else:
        key = lambda c: (size[c], height[c], -c)  # noqa: E731  most mass first (frequency, see docstring)
    path, node = [], 0
    while children[node]:
        node = max(children[node], key=key)
        path.append(node)
    return path


def extract_chains(tokens, mask, match_type: str = "BFS", d: int | None = None):
    """Best root-to-leaf path of each request's tree.

    Returns ``chain_tokens`` [bs, d] int64 (root, the path, then token-0 padding) and ``chain_len``
    [bs] int64, the number of real draft tokens on the path (0 when the corpus found nothing).
    """
    if match_type not in MATCH_TYPES:
        raise ValueError(f"--speculative-ngram-match-type must be one of {', '.join(MATCH_TYPES)}; "
                         f"got {match_type!r}")
    tokens, toks, parents = _rows(tokens, mask, d)
    bs, d = tokens.shape
    chain_tokens = np.zeros((bs, d), dtype=np.int64)  # [bs, d]
    chain_tokens[:, 0] = tokens[:, 0]
    chain_len = np.zeros(bs, dtype=np.int64)  # [bs]
    for b in range(bs):
        n_real = _padding_start(toks[b], parents[b]) - 1
        if n_real <= 0:
            continue  # no draft: the root alone
        path = _best_path(parents[b], n_real, match_type)
        chain_tokens[b, 1 : 1 + len(path)] = [toks[b][j] for j in path]
        chain_len[b] = len(path)
    return chain_tokens, chain_len


def root_choices(tokens, mask, d: int | None = None) -> np.ndarray:
    """[bs] how many different next tokens each request's tree offers (distinct real
    children of the root)."""
    _, toks, parents = _rows(tokens, mask, d)
    out = [len({t[j] for j in range(1, _padding_start(t, p)) if p[j] == 0})
           for t, p in zip(toks, parents)]
    return np.array(out, dtype=np.int64)


def chain_mask(bs: int, k: int, dtype=np.int64) -> np.ndarray:
    """Corpus-format mask of ``bs`` chains of ``k`` nodes: lower-triangular, flat [bs*k*k]."""
    return np.tile(_tril_flat(k, np.dtype(dtype)), bs)


@lru_cache(maxsize=8)
def _tril_flat(k: int, dtype) -> np.ndarray:
    out = np.tril(np.ones((k, k), dtype=dtype)).reshape(-1)
    out.flags.writeable = False  # shared between calls (np.tile copies it)
    return out


def reduce_to_chain(tokens, mask, k: int, match_type: str = "BFS"):
    """Corpus output -> the same format holding one chain per request.

    ``tokens`` flat [bs*k] (or [bs, k]) and ``mask`` flat [bs*k*k] as ``NgramCorpus.batch_get``
    returns them. Returns ``(chain_tokens [bs*k] int64, chain_mask [bs*k*k] of the input mask's
    dtype, chain_len [bs] int64)``.
    """
    mask_dtype = np.asarray(mask).dtype
    chain_tokens, chain_len = extract_chains(tokens, mask, match_type, d=k)
    return (chain_tokens.reshape(-1),
            chain_mask(chain_tokens.shape[0], k, dtype=mask_dtype), chain_len)


def chain_indices(seq_lens, k: int):
    """Verify metadata of ``bs`` chains of width ``k`` (torch tensors on ``seq_lens``' device).

    positions [bs*k] = seq_len + i; retrieve_index [bs, k] = b*k + i; retrieve_next_token [bs, k] =
    i+1 (-1 at the end); retrieve_next_sibling [bs, k] = -1. Equal to what SGLang's
    reconstruct_indices_from_tree_mask gives for the lower-triangular mask of ``chain_mask``.
    """
    import torch

    seq_lens = torch.as_tensor(seq_lens)
    bs = seq_lens.shape[0]
    dev = seq_lens.device
    ar = torch.arange(k, dtype=torch.int64, device=dev)  # [k]
    positions = (seq_lens.to(torch.int64)[:, None] + ar[None, :]).reshape(-1)  # [bs*k]
    retrieve_index = torch.arange(bs * k, dtype=torch.int64, device=dev).reshape(bs, k)  # [bs, k]
    next_token = (ar + 1).masked_fill(ar == k - 1, -1).expand(bs, k).contiguous()  # [bs, k]
    next_sibling = torch.full((bs, k), -1, dtype=torch.int64, device=dev)  # [bs, k]
    return positions, retrieve_index, next_token, next_sibling


@dataclass(frozen=True)
class VerifyPlan:
    """What one decode step verifies, and what it would have verified at the static width."""

    action: str  # "verify" or "decode" (no request has a real draft)
    width: int  # tokens per request in this step (1 for decode)
    draft_lens: tuple  # real draft tokens per request, capped at width - 1
    tokens_static: int  # bs * k: stock SGLang and the static-width step
    tokens_planned: int  # bs * width

    @property
    def tokens_saved(self) -> int:
        return self.tokens_static - self.tokens_planned


def plan_verify(draft_lens: Sequence[int], k: int, buckets: Sequence[int] = ()) -> VerifyPlan:
    """Choose the verify width of one step from the per-request real draft lengths
    (see module docstring)."""
    lens = [int(x) for x in draft_lens]
    bs = len(lens)
    if any(x < 0 or x > k - 1 for x in lens):
        raise ValueError(f"draft lengths must lie in 0..{k - 1} (k = "
                         f"--speculative-num-draft-tokens); got {lens}")
    widths = sorted(set(int(w) for w in buckets) | {int(k)})
    longest = max(lens, default=0)
    if longest == 0:
        return VerifyPlan("decode", 1, tuple([0] * bs), bs * k, bs)
    width = next(w for w in widths if w >= longest + 1)
    return VerifyPlan("verify", width, tuple(min(x, width - 1) for x in lens), bs * k, bs * width)


@dataclass
class VerifyStats:
    """Running accounting of n-gram verify steps (what the server logs and exports).

    accept length = tokens emitted per request per step (accepted drafts + the bonus
    token); comparable between tree and chain, unlike SGLang's accept rate whose
    denominator is k - 1 drafts per request.
    """

    steps: int = 0
    requests: int = 0  # request-steps
    accepted_tokens: int = 0  # accepted drafts + bonus, summed over request-steps
    drafted_tokens: int = 0  # real draft tokens offered
    tokens_static: int = 0  # verified tokens at the static width
    tokens_planned: int = 0  # verified tokens with no-match gating and the smallest fitting bucket
    no_match_requests: int = 0
    no_match_steps: int = 0
    accept_hist: dict = field(default_factory=dict)  # accept length -> request-steps

    def record(self, accept_lens: Sequence[int], plan: VerifyPlan | None = None) -> None:
        """One verify step: per-request accept lengths (bonus included) and the
        step's plan, if known."""
        lens = [int(x) for x in accept_lens]
        self.steps += 1
        self.requests += len(lens)
        self.accepted_tokens += sum(lens)
        for x in lens:
            self.accept_hist[x] = self.accept_hist.get(x, 0) + 1
        if plan is not None:
            self.drafted_tokens += sum(plan.draft_lens)
            self.tokens_static += plan.tokens_static
            self.tokens_planned += plan.tokens_planned
            self.no_match_requests += sum(1 for x in plan.draft_lens if x == 0)
            self.no_match_steps += plan.action == "decode"

    def summary(self) -> dict:
        steps = max(self.steps, 1)
        reqs = max(self.requests, 1)
        return {
            "steps": self.steps,
            "accept_length": self.accepted_tokens / reqs,
            "verified_tokens_per_step": self.tokens_static / steps,
            "planned_tokens_per_step": self.tokens_planned / steps,
            "drafted_tokens_per_request": self.drafted_tokens / reqs,
            "no_match_fraction": self.no_match_requests / reqs,
            "no_match_steps": self.no_match_steps,
            "accept_hist": dict(sorted(self.accept_hist.items())),
        }

    def reset(self) -> None:
        self.__init__()
