"""The gain side of the auto controller's rate: how many draft tokens a request would have accepted.

- `DraftFeatures` / `draft_features`: what the n-gram lookup says about one request's draft (matched
  depth, root branches, greedy or sampled), bucketed by `feature_bucket`.
- `GainModel`: per request, the forgetting distribution of accepted draft tokens for a chain and for
  the tree, blended from all requests -> the feature bucket -> the request itself.
- `ShadowTracker` (with `chain_accept`, `tree_accept`): resolves each draft against the tokens the
  request really produced, verified or not, so the model keeps learning while nothing speculates.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Sequence


# ----------------------------------------------------------------------------------------- features
@dataclass(frozen=True)
class DraftFeatures:
    """What the n-gram lookup says about one request's draft this step."""

    match_len: int  # depth of the real (non-padding) draft: how far the corpus continuation reaches
    # root children of the real draft (alternatives the corpus offers for the next token)
    branches: int
    # the request samples (temperature > 0) rather than decoding greedily: the same match is
    # accepted far less often, so the gain model learns sampled and greedy requests' drafts apart
    sampled: bool = False


_MATCH_EDGES = (0, 1, 2, 4, 8)  # bucket lower edges of match_len
_BRANCH_EDGES = (0, 1, 2, 4)


@functools.lru_cache(maxsize=4096)  # (every observation and estimate asks; few features occur)
def feature_bucket(f: DraftFeatures) -> tuple:
    m = sum(1 for e in _MATCH_EDGES[1:] if f.match_len >= e)
    b = sum(1 for e in _BRANCH_EDGES[1:] if f.branches >= e)
    return (m, b)


@functools.lru_cache(maxsize=4096)
def estimate_key(f: DraftFeatures) -> tuple:
    """All that `GainModel.expected` reads of a draft's features: its feature bucket (whose first
    index is 0 exactly where nothing matched) and whether the request samples. Drafts with the same
    key are estimated alike whatever their exact lengths, so an answer computed for one serves the
    others (`Controller._evaluate`, `Controller._wanted`)."""
    return feature_bucket(f), bool(f.sampled)


def draft_features(tokens: Sequence[int], parents: Sequence[int]) -> DraftFeatures:
    """Features of one draft tree: draft nodes only (root excluded), parents[j] = index of
    node j's parent among the draft nodes or -1 for a child of the root. Pass only the
    real (non-padding) nodes."""
    depth = [0] * len(tokens)
    for j, p in enumerate(parents):
        depth[j] = 1 if p < 0 else depth[p] + 1
    return DraftFeatures(max(depth, default=0), sum(1 for p in parents if p < 0))


# --------------------------------------------------------------------------------------- gain model
class _Hist:
    """Exponentially forgetting histogram over 0..n: weights decay by 2**(-dt
    / half_life) per step."""

    __slots__ = ("w", "mass", "step")

    def __init__(self, n: int):
        self.w = [0.0] * (n + 1)
        self.mass = 0.0
        self.step = 0

    def _age(self, step: int, decay: float) -> None:
        if step > self.step:
            f = decay ** (step - self.step)
            self.w = [x * f for x in self.w]
            self.mass *= f
            self.step = step

    def add(self, value: int, step: int, decay: float) -> None:
        if step > self.step:  # (most adds of a step find the histogram aged already)
            self._age(step, decay)
        self.w[min(value, len(self.w) - 1)] += 1.0
        self.mass += 1.0


class GainModel:
    """Per-request distribution of accepted drafts for the chain (the best
    K-token path) and the tree.

    Three forgetting histograms, each blended into the next finer one with weight `prior_strength`:
    all requests -> the feature bucket -> the request itself (the first and last kept apart for
    drafts with and without a corpus match, so that no-match steps do not dilute the estimate for
    matched ones). The first two are kept apart for sampled and greedy requests
    (`DraftFeatures.sampled`): a greedy load's full matches say nothing of what a sampled request's
    will be accepted, and the first drafts of a sampled load that follows a greedy one would
    otherwise be judged by it. The all-requests histograms start with `prior_mass`
    pseudo-observations of 0 accepted at step 0 (pessimistic cold start: no speculation until drafts
    have been seen to match); they are forgotten like any observation.
    Besides, `prior_floor` pseudo-observations of 0 accepted are never forgotten: what nothing has
    confirmed for many half-lives goes back to the pessimistic prior instead of keeping its old
    shape (without them a histogram whose last observations were a repetitive load's would still say
    so, scaled up from a vanishing mass, long after that load ended: the first drafts of a next
    load, which resolve few matched drafts, would be judged by it).
    E[accepted | chain k] = sum_{j=1..k} P(A >= j)."""

    def __init__(self, max_chain: int, tree_depth: int, half_life_steps: float = 8.0,
                 prior_strength: float = 4.0, prior_mass: float = 2.0, prior_floor: float = 0.0):
        self.K = max_chain
        self.D = max(tree_depth, 0)
        self.decay = 0.5 ** (1.0 / half_life_steps)
        self.prior_strength = prior_strength
        self.prior_floor = prior_floor
        self._global = {}  # (matched, sampled) -> (chain _Hist, tree _Hist)
        for matched in (False, True):
            for sampled in (False, True):
                self._global[(matched, sampled)] = pair = (_Hist(self.K), _Hist(self.D))
                for h in pair:
                    h.w[0] = prior_mass
                    h.mass = prior_mass
        self._local: dict = {}  # (req_id, matched) -> (chain _Hist, tree _Hist)
        # counts observations and drops: what the model says changes only with it (and age)
        self.version = 0
        self._shared_at, self._shared = None, {}  # (step, version) -> _shared_dist's answers
        self._bucket: dict = {}  # (bucket, sampled) -> (chain _Hist, tree _Hist)

    def _pair(self, table: dict, key) -> tuple:
        pair = table.get(key)
        if pair is None:
            pair = table[key] = (_Hist(self.K), _Hist(self.D))
        return pair

    def observe(self, req_id, features: DraftFeatures, step: int, chain_accept: int,
                tree_accept: Optional[int] = None) -> None:
        """A resolved draft: it would have had `chain_accept` tokens accepted as a K-chain (capped
        at K) and `tree_accept` as the full tree (None when no tree was drafted)."""
        self.version += 1
        m, s = features.match_len > 0, bool(features.sampled)
        pairs = (self._global[(m, s)], self._pair(self._local, (req_id, m)),
                 self._pair(self._bucket, (feature_bucket(features), s)))
        decay = self.decay
        for pair in pairs:
            pair[0].add(chain_accept, step, decay)
        if tree_accept is not None and self.D:
            for pair in pairs:
                pair[1].add(tree_accept, step, decay)

    def scored(self, req_id) -> bool:
        """Has a matched draft of this request been scored (observed)?"""
        return (req_id, True) in self._local

    def drop(self, req_id) -> None:
        self.version += 1
        self._local.pop((req_id, False), None)
        self._local.pop((req_id, True), None)

    def _blend(self, h: Optional[_Hist], parent: list, step: int) -> list:
        if h is None:
            return parent
        h._age(step, self.decay)
        tot = h.mass + self.prior_strength
        return [(h.w[a] + self.prior_strength * parent[a]) / tot for a in range(len(parent))]

    def _shared_dist(self, m: bool, bucket: tuple, step: int, which: int,
                     sampled: bool = False) -> list:
        """The all-requests histogram blended with the feature bucket's (of requests that sample, or
        of greedy ones): the same for every such request of a batch with these features, so kept
        until the model or the step changes."""
        if self._shared_at != (step, self.version):
            self._shared_at, self._shared = (step, self.version), {}
        key = (m, bucket, which, sampled)
        dist = self._shared.get(key)
        if dist is None:
            g = self._global[(m, sampled)][which]
            g._age(step, self.decay)
            floor = self.prior_floor
            if floor > 0:  # the observations, and as many 0s as the floor
                dist = [(x + (floor if a == 0 else 0.0)) / (g.mass + floor)
                        for a, x in enumerate(g.w)]
            elif g.mass > 1e-12:
                dist = [x / g.mass for x in g.w]
            else:  # everything forgotten (long idle): back to the pessimistic prior
                dist = [1.0] + [0.0] * (len(g.w) - 1)
            b = self._bucket.get((bucket, sampled))
            dist = self._shared[key] = self._blend(None if b is None else b[which], dist, step)
        return dist

    def _dist(self, req_id, features: DraftFeatures, step: int, which: int) -> list:
        # (the features are read through `estimate_key` only: the controller keys its kept
        # answers by it)
        bucket, sampled = estimate_key(features)
        m = bucket[0] > 0  # (matched: match_len >= 1)
        dist = self._shared_dist(m, bucket, step, which, sampled)
        loc = self._local.get((req_id, m))
        return self._blend(None if loc is None else loc[which], dist, step)

    def expected(self, req_id, features: DraftFeatures, step: int) -> tuple:
        """(chain, tree): chain[k-1] = E[accepted | chain of k], k = 1..K; tree
        = E[accepted | tree]."""
        p = self._dist(req_id, features, step, 0)
        tail, chain = 0.0, []
        surv = 1.0 - p[0]  # P(A >= 1)
        for k in range(1, self.K + 1):
            tail += max(surv, 0.0)
            chain.append(tail)
            surv -= p[k]
        tree = 0.0
        if self.D:
            q = self._dist(req_id, features, step, 1)
            tree = sum(a * q[a] for a in range(len(q)))
        return chain, tree



# -------------------------------------------------------------------------------- shadow resolution
@dataclass
class _Pending:
    pos: int
    features: DraftFeatures
    chain: tuple
    tree_tokens: Optional[tuple]
    tree_parents: Optional[tuple]
    lead: int = 0  # leading chain tokens a verify would get anyway (`ShadowTracker.record`)
    tag: object = None  # what the caller attached (`ShadowTracker.tag_last`)


def chain_accept(chain: Sequence[int], actual: Sequence[int]) -> tuple:
    """(accepted, resolved): accepted leading tokens of `chain` against the known
    continuation `actual`."""
    m = min(len(chain), len(actual))
    for n in range(m):
        if chain[n] != actual[n]:
            return n, True
    return m, m == len(chain)


def tree_accept(tokens: Sequence[int], parents: Sequence[int], actual: Sequence[int]) -> tuple:
    """(accepted, resolved): greedy walk of the tree (draft nodes, parent -1 =
    root) along `actual`."""
    node, n = -1, 0
    while True:
        kids = [j for j, p in enumerate(parents) if p == node]
        if not kids:
            return n, True
        if n >= len(actual):
            return n, False
        nxt = next((j for j in kids if tokens[j] == actual[n]), None)
        if nxt is None:
            return n, True
        node, n = nxt, n + 1


class ShadowTracker:
    """Resolves each step's drafts against what the request really produced, verified or not.

    `record(req, pos, ...)`: the draft made when the request had `pos` tokens (it proposes
    tokens pos, pos+1..). `advance(req, tokens)`: the request's tokens so far (any sequence
    indexable from 0 that covers pos..); returns resolved (features, chain_accept, tree_accept)
    tuples. A draft resolves at its first divergence or when fully matched, so at most K + 1
    tokens after it was made.

    ``lead`` (record): the chain's first tokens predict tokens a verify made at that time gets
    anyway (a lookup one step behind, overlap mode: its first token guesses the token in flight,
    which is the root of the step's verify): the draft is scored as the verify would have scored
    the rest, 0 unless those lead tokens were right. ``tag_last`` attaches a value to a request's
    last recorded draft, returned by `advance_tagged` (the glue tags the drafts it verified)."""

    def __init__(self, max_pending: int = 64):
        self._pending: dict = {}
        self.max_pending = max_pending

    def record(self, req_id, pos: int, features: DraftFeatures, chain: Sequence[int],
               tree_tokens: Optional[Sequence[int]] = None,
               tree_parents: Optional[Sequence[int]] = None, lead: int = 0) -> None:
        q = self._pending.setdefault(req_id, [])
        q.append(_Pending(pos, features, tuple(chain), None if tree_tokens is None
                          else tuple(tree_tokens),
                          None if tree_parents is None else tuple(tree_parents), int(lead)))
        del q[:-self.max_pending]

    def tag_last(self, req_id, tag) -> None:
        """Attach ``tag`` to the last draft recorded for ``req_id`` (none: a no-op)."""
        q = self._pending.get(req_id)
        if q:
            q[-1].tag = tag

    def advance_tagged(self, req_id, tokens: Sequence[int], length: Optional[int] = None) -> list:
        """`advance`, each resolved draft with its tag: (features, chain_accept, tree_accept,
        tag)."""
        q = self._pending.get(req_id)
        if not q:
            return []
        n = len(tokens) if length is None else length
        done, keep = [], []
        for p in q:
            actual = tokens[p.pos:n]
            ca, cres = chain_accept(p.chain, actual)
            ta, tres = ((None, True) if p.tree_tokens is None
                        else tree_accept(p.tree_tokens, p.tree_parents, actual))
            if cres and tres:
                # with lead tokens: what the verify made past them would have accepted (0 if one
                # was wrong)
                done.append((p.features, max(ca - p.lead, 0), ta, p.tag))
            else:
                keep.append(p)
        self._pending[req_id] = keep
        return done

    def advance(self, req_id, tokens: Sequence[int], length: Optional[int] = None) -> list:
        """The drafts that resolve with the request's tokens so far: (features, chain_accept,
        tree_accept) each."""
        return [r[:3] for r in self.advance_tagged(req_id, tokens, length)]

    def drop(self, req_id) -> None:
        self._pending.pop(req_id, None)
