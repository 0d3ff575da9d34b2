"""Cost-aware verify control for n-gram speculation (`--speculative-ngram-verify-mode auto`).

Each decode step the controller picks, for the whole batch, the option with the highest expected tokens per
second among: no speculation, a chain of k draft tokens (k = 1..K), and the corpus tree:

    rate(option) = E[tokens emitted by the batch] / t(pass)
                 = (bs + sum_i E[accepted_i | option]) / t_verify(tokens in the pass)        speculating
    rate(none)   = bs / t_decode(bs)

Two inputs, both measured, neither taken from a paper:
- cost: `CostTable`, a verify-cost table t_verify(tokens in the pass) and the plain decode cost t_decode(bs),
  calibrated at server start (glue/auto.py) or loaded from the microbenchmark's JSON;
- gain: `GainModel`, per request, the observed distribution of accepted draft tokens as a function of the
  n-gram match (matched depth, root branch count), updated online and forgetting with a half-life in steps.

Per-request gating: request i speculates under an option only if its own expected speedup is at least one,

    gain_i(option) = E[1 + accepted_i | option] * t_decode(bs) / t_verify(bs * width(option)) >= 1,

otherwise it verifies nothing that step (one token: the plain decode token). Hysteresis: the current option is
kept unless another one is expected to be more than `hysteresis` (relative) faster; so the option kept is never
expected to be slower than the best, and in particular than no speculation, by more than that margin.

The gain model learns from *resolved drafts*: a draft made at position p resolves once the request's real
continuation shows where it first diverges (`ShadowTracker`). This needs no verify at all, so the controller
keeps learning while it does not speculate and never has to gamble to explore: with acceptance 0 it stays at
no speculation after the first steps. Greedy output does not depend on the option chosen (verification is exact).

Follow bound (stated and tested in tests/test_sim.py): after acceptance changes, the estimate's weight on the
old regime after n steps is at most 2**(-n / half_life); a draft resolves at most K + 1 steps after it is made.
`follow_bound_steps` returns K + 1 + ceil(half_life * log2(1 / eps)) with eps = 0.1.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

SHAPES = ("ragged", "uniform")
NONE, CHAIN, TREE = "none", "chain", "tree"


class CostTableError(ValueError):
    """A cost table (flag or file) that cannot be used; the message names its source and the key."""


# ----------------------------------------------------------------------------------------------- costs
def _positive(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CostTableError(f"{where} must be a positive number of milliseconds, got {value!r}")
    return float(value)


def _points(obj, key: str, source: str) -> tuple:
    if not isinstance(obj, Mapping) or not obj:
        raise CostTableError(f"{source}: '{key}' must be a non-empty object mapping a count to milliseconds")
    pts = []
    for k, v in obj.items():
        try:
            n = int(k)
        except (TypeError, ValueError):
            raise CostTableError(f"{source}: '{key}' key {k!r} is not an integer count") from None
        if n < 1 or str(n) != str(k).strip():
            raise CostTableError(f"{source}: '{key}' key {k!r} must be an integer >= 1")
        pts.append((n, _positive(v, f"{source}: '{key}'[{k!r}]")))
    return tuple(sorted(pts))


def _interp(pts: tuple, x: float) -> float:
    """Piecewise-linear in x; flat below the first point; linear extrapolation from the last two points above
    the last one (never below the last value)."""
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if len(pts) == 1:
        return pts[0][1]
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return max(y1, y1 + (y1 - y0) * (x - x1) / (x1 - x0))


@dataclass(frozen=True)
class CostTable:
    """Measured pass times. decode: ((bs, ms), ...) for a plain decode step of bs requests; verify:
    ((tokens, ms), ...) for a target-verify pass of that many tokens (all requests together)."""

    decode: tuple
    verify: tuple
    source: str = "<cost table>"

    def decode_ms(self, bs: int) -> float:
        return _interp(self.decode, bs)

    def verify_ms(self, tokens: int) -> float:
        return _interp(self.verify, tokens)

    def verify_step_ms(self, bs: int, width: int, tokens: int) -> float:
        """A verify step of bs requests at `width` tokens each, `tokens` in the pass (a table knows only tokens)."""
        return self.verify_ms(tokens)

    def scaled(self, verify: float = 1.0, decode: float = 1.0) -> "CostTable":
        return CostTable(tuple((n, ms * decode) for n, ms in self.decode),
                         tuple((n, ms * verify) for n, ms in self.verify), self.source)

    def to_json(self) -> dict:
        return {"decode_ms": {str(n): ms for n, ms in self.decode},
                "verify_ms": {str(n): ms for n, ms in self.verify}, "source": self.source}


def parse_cost_table(obj, source: str = "<cost table>", backend: Optional[str] = None,
                     pick_backend: str = "PATH#backend") -> CostTable:
    """Accepted JSON forms (keys are counts; values milliseconds):

    1. {"decode_ms": {"<bs>": ms, ...}, "verify_ms": {"<tokens in the pass>": ms, ...}}
    2. the same with a scalar "decode_ms" (one stream: decode of bs=1, the replay tool's form);
    3. a result that carries form 1 under the key "cost_table";
    4. benchmark/allreduce_vs_compute.py's --json: summary.rows of {backend, tokens, pass_us} (a CUDA-graph
       median of one modeled pass of that many tokens; it stands for decode of bs = tokens as well). With several
       backends in the file, name one: `PATH#backend` (load_cost_table) or `backend=`; `pick_backend` is how the
       error message tells the user to name one (the replay tool has its own flag for it).
    """
    if isinstance(obj, Mapping) and "cost_table" in obj and "verify_ms" not in obj:
        return parse_cost_table(obj["cost_table"], f"{source} ['cost_table']")
    if isinstance(obj, Mapping) and isinstance(obj.get("summary"), Mapping) and "rows" in obj["summary"]:
        return _from_microbenchmark(obj["summary"]["rows"], source, backend, pick_backend)
    if not isinstance(obj, Mapping):
        raise CostTableError(f"{source}: expected a JSON object with 'decode_ms' and 'verify_ms'")
    for key in ("decode_ms", "verify_ms"):
        if key not in obj:
            raise CostTableError(
                f"{source}: missing key '{key}' (format: {{\"decode_ms\": {{\"1\": 12.2, \"8\": 12.9}}, "
                f"\"verify_ms\": {{\"2\": 14.8, \"8\": 30.0}}}})")
    dec = obj["decode_ms"]
    decode = ((1, _positive(dec, f"{source}: 'decode_ms'")),) if not isinstance(dec, Mapping) else \
        _points(dec, "decode_ms", source)
    return CostTable(decode, _points(obj["verify_ms"], "verify_ms", source), source)


def _from_microbenchmark(rows, source: str, backend: Optional[str], pick_backend: str) -> CostTable:
    usable = [r for r in rows if isinstance(r, Mapping) and not r.get("error") and r.get("pass_us")]
    backends = sorted({str(r.get("backend")) for r in usable if r.get("backend")})
    if not backends:
        raise CostTableError(f"{source}: the microbenchmark result has no rows with a pass time (pass_us)")
    if backend is None and len(backends) > 1:
        raise CostTableError(f"{source}: several all-reduce backends; name one as {pick_backend} "
                             f"({', '.join(backends)})")
    backend = backend or backends[0]
    if backend not in backends:
        raise CostTableError(f"{source}: backend {backend!r} not in the file; allowed: {', '.join(backends)}")
    pts = tuple(sorted((int(r["tokens"]), _positive(float(r["pass_us"]) / 1000.0, f"{source}: pass_us"))
                       for r in usable if r.get("backend") == backend))
    return CostTable(pts, pts, f"{source} [{backend}]")


def load_cost_table(path, flag: str = "--speculative-ngram-auto-cost-table", backend: Optional[str] = None,
                    pick_backend: str = "PATH#backend") -> CostTable:
    """A cost table from a JSON file (`parse_cost_table`'s forms). `PATH#backend` names the microbenchmark
    backend, or `backend=`; `flag` names the option the path came from in every error message."""
    path, _, named = str(path).partition("#")
    backend = backend or named or None
    p = Path(path)
    if not p.is_file():
        raise CostTableError(f"{flag} {path}: file not found")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CostTableError(f"{flag} {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return parse_cost_table(obj, f"{flag} {path}", backend, pick_backend)


def calibrate(time_pass: Callable[[str, int], float], decode_bs: Sequence[int], verify_tokens: Sequence[int],
              repeats: int = 5, budget_s: float = 20.0, clock: Callable[[], float] = time.monotonic,
              log: Optional[Callable[[str], None]] = None, source: str = "calibration") -> CostTable:
    """Build a cost table from `time_pass(kind, n) -> ms` ("decode", bs) / ("verify", tokens), e.g. a replay of
    the server's captured CUDA graph timed with CUDA events. Median of `repeats` per point; points are measured
    small to large and measurement stops at `budget_s` (the points taken so far are kept; at least one of each
    kind must fit or this raises)."""
    if repeats < 1:
        raise ValueError(f"calibration repeats must be >= 1, got {repeats}")
    t0 = clock()
    tables = {"decode": [], "verify": []}
    plan = [("decode", n) for n in sorted(set(decode_bs))] + [("verify", n) for n in sorted(set(verify_tokens))]
    # interleave kinds so that a budget cut keeps both ends of the table
    plan.sort(key=lambda kn: (kn[1], kn[0]))
    skipped = []
    for kind, n in plan:
        if clock() - t0 > budget_s:
            skipped.append((kind, n))
            continue
        samples = sorted(float(time_pass(kind, n)) for _ in range(repeats))
        med = samples[len(samples) // 2] if repeats % 2 else 0.5 * (samples[repeats // 2 - 1] + samples[repeats // 2])
        tables[kind].append((n, _positive(med, f"{source}: {kind}[{n}]")))
    if not tables["decode"] or not tables["verify"]:
        raise CostTableError(f"{source}: the time budget of {budget_s} s ran out before one decode and one verify "
                             f"point were measured; pass --speculative-ngram-auto-cost-table instead")
    table = CostTable(tuple(tables["decode"]), tuple(tables["verify"]), source)
    if log is not None:
        log(f"{source}: {len(tables['decode'])} decode + {len(tables['verify'])} verify points in "
            f"{clock() - t0:.2f} s ({repeats} repeats each, median); skipped {len(skipped)} past the "
            f"{budget_s} s budget; table {json.dumps(table.to_json())}")
    return table


# ------------------------------------------------------------------------------------ whole-step costs
PLAN_PROBE, PLAN_WANTED = "probe", "wanted"  # why Controller.plan_lookup looked drafts up
WANTED_REFRESH_STEPS = 4  # Controller._wanted: an unchanged question is answered again after this many steps
LEAN, SPEC = "lean", "spec"  # a step that skipped the draft lookup (no speculation) / one that looked drafts up
PROBE = "probe"  # a step without speculation that looked drafts up behind its launch, only to score them
STEP_KINDS = (LEAN, SPEC, PROBE)


def _median(xs) -> float:
    v = sorted(xs)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


class StepCosts:
    """What a whole decode step costs, measured on the host clock while the server runs.

    A cost table of graph replays (`CostTable`, from the start-up calibration or a file) holds only the GPU
    pass. A server step also spends host time outside it (scheduling, the draft lookup, sampling and
    acceptance, result processing), and that part differs between a step that looked drafts up (SPEC, at a
    verify width) and one that did not (LEAN: no speculation, no lookup). Measured on the 2x H200 with
    SmolLM2-135M TP=2: graph replays ~1.0-1.2 ms, a plain decode step 3.7 ms, an n-gram step 6.7 ms.

    `record(kind, bs, width, ms)` adds one measured step period. An estimate for (kind, bs, width) is the
    median of its last `window` periods once it has `min_samples`; otherwise the table's GPU time plus the
    kind's host part, the median of (measured - table) over the kind's recent steps at any size (0 before the
    first measurement). Medians, so the occasional period that contains a prefill or an idle gap does not move
    the estimate. LEAN is width 1 by definition, and so is PROBE (a LEAN step that also looked drafts up behind
    its launch: what a probe adds to a plain step, `Controller.probe_cost`).
    """

    def __init__(self, table: CostTable, window: int = 32, min_samples: int = 3):
        if window < 1 or min_samples < 1:
            raise ValueError("window and min_samples must be >= 1")
        self.table = table
        self.source = f"{table.source} + measured whole steps"
        self.window = window
        self.min_samples = min_samples
        self._periods: dict = {}  # (kind, bs, width) -> recent ms
        self._host: dict = {k: [] for k in STEP_KINDS}  # kind -> recent (measured - table) ms
        self._estimates: dict = {}  # (kind, bs, width) -> step_ms, until the next record
        self.version = 0  # counts records: the estimates change only with it

    @staticmethod
    def _key(kind: str, bs: int, width: int) -> tuple:
        """(kind, bs, width) as kept: only SPEC steps have a width other than 1."""
        return kind, int(bs), 1 if kind != SPEC else int(width)

    def graph_ms(self, kind: str, bs: int, width: int) -> float:
        return self.table.decode_ms(bs) if kind != SPEC or width == 1 else self.table.verify_ms(bs * width)

    def record(self, kind: str, bs: int, width: int, ms: float) -> None:
        if kind not in STEP_KINDS:
            raise ValueError(f"step kind must be one of {', '.join(map(repr, STEP_KINDS))}, got {kind!r}")
        if not (bs >= 1 and width >= 1 and math.isfinite(ms) and ms > 0):
            return
        key = self._key(kind, bs, width)
        q = self._periods.setdefault(key, [])
        q.append(float(ms))
        del q[:-self.window]
        h = self._host[kind]
        h.append(float(ms) - self.graph_ms(*key))
        del h[:-self.window]
        self._estimates.clear()
        self.version += 1

    def samples(self, kind: str, bs: int, width: int) -> int:
        return len(self._periods.get(self._key(kind, bs, width), ()))

    def mean_ms(self, kind: str, bs: int, width: int) -> Optional[float]:
        """The mean of (kind, bs, width)'s recent periods, those over twice their median left out (a period
        that held a prefill or an idle wait); None before `min_samples`. Where a kind's periods have a tail (a
        step that now and then comes late), the mean counts it and the median does not."""
        q = self._periods.get(self._key(kind, bs, width))
        if q is None or len(q) < self.min_samples:
            return None
        cut = 2.0 * _median(q)
        kept = [x for x in q if x <= cut]
        return sum(kept) / len(kept)

    def host_ms(self, kind: str) -> float:
        h = self._host[kind]
        return max(_median(h), 0.0) if h else 0.0

    def step_ms(self, kind: str, bs: int, width: int) -> float:
        key = self._key(kind, bs, width)
        ms = self._estimates.get(key)
        if ms is None:  # a decision asks for a few estimates many times between two records
            q = self._periods.get(key)
            ms = (_median(q) if q is not None and len(q) >= self.min_samples
                  else self.graph_ms(*key) + self.host_ms(kind))
            self._estimates[key] = ms
        return ms

    # the cost interface of evaluate(): no speculation = a LEAN step, a chain of width w = a SPEC step
    def decode_ms(self, bs: int) -> float:
        return self.step_ms(LEAN, bs, 1)

    def verify_step_ms(self, bs: int, width: int, tokens: int) -> float:
        return self.step_ms(SPEC, bs, width)

    def verify_ms(self, tokens: int) -> float:
        return self.table.verify_ms(tokens)

    def to_json(self) -> dict:
        return {"table": self.table.to_json(), "host_ms": {k: self.host_ms(k) for k in STEP_KINDS},
                "measured": {f"{k}/bs{bs}/w{w}": round(_median(q), 4) for (k, bs, w), q in sorted(self._periods.items())}}


# --------------------------------------------------------------------------------------------- features
@dataclass(frozen=True)
class DraftFeatures:
    """What the n-gram lookup says about one request's draft this step."""

    match_len: int  # depth of the real (non-padding) draft: how far the corpus continuation reaches
    branches: int  # root children of the real draft (alternatives the corpus offers for the next token)
    # the request samples (temperature > 0) rather than decoding greedily: the same match is accepted far less
    # often, so the gain model learns sampled and greedy requests' drafts apart
    sampled: bool = False


_MATCH_EDGES = (0, 1, 2, 4, 8)  # bucket lower edges of match_len
_BRANCH_EDGES = (0, 1, 2, 4)


def feature_bucket(f: DraftFeatures) -> tuple:
    m = sum(1 for e in _MATCH_EDGES[1:] if f.match_len >= e)
    b = sum(1 for e in _BRANCH_EDGES[1:] if f.branches >= e)
    return (m, b)


def draft_features(tokens: Sequence[int], parents: Sequence[int]) -> DraftFeatures:
    """Features of one draft tree: draft nodes only (root excluded), parents[j] = index of node j's parent
    among the draft nodes or -1 for a child of the root. Pass only the real (non-padding) nodes."""
    depth = [0] * len(tokens)
    for j, p in enumerate(parents):
        depth[j] = 1 if p < 0 else depth[p] + 1
    return DraftFeatures(max(depth, default=0), sum(1 for p in parents if p < 0))


# ------------------------------------------------------------------------------------------- gain model
class _Hist:
    """Exponentially forgetting histogram over 0..n: weights decay by 2**(-dt / half_life) per step."""

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
        self._age(step, decay)
        self.w[min(value, len(self.w) - 1)] += 1.0
        self.mass += 1.0


class GainModel:
    """Per-request distribution of accepted drafts for the chain (the best K-token path) and the tree.

    Three forgetting histograms, each blended into the next finer one with weight `prior_strength`:
    all requests -> the feature bucket -> the request itself (the first and last kept apart for drafts with
    and without a corpus match, so that no-match steps do not dilute the estimate for matched ones). The first
    two are kept apart for sampled and greedy requests (`DraftFeatures.sampled`): a greedy load's full matches
    say nothing of what a sampled request's will be accepted, and the first drafts of a sampled load that
    follows a greedy one would otherwise be judged by it. The all-requests histograms start with `prior_mass`
    pseudo-observations of 0 accepted at step 0 (pessimistic cold start: no speculation until drafts have been
    seen to match); they are forgotten like any observation.
    Besides, `prior_floor` pseudo-observations of 0 accepted are never forgotten: what nothing has confirmed
    for many half-lives goes back to the pessimistic prior instead of keeping its old shape (without them a
    histogram whose last observations were a repetitive load's would still say so, scaled up from a vanishing
    mass, long after that load ended: the first drafts of a next load, which resolve few matched drafts,
    would be judged by it).
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
        self.version = 0  # counts observations and drops: what the model says changes only with it (and age)
        self._shared_at, self._shared = None, {}  # (step, version) -> _shared_dist's answers
        self._bucket: dict = {}  # (bucket, sampled) -> (chain _Hist, tree _Hist)

    def _pair(self, table: dict, key) -> tuple:
        if key not in table:
            table[key] = (_Hist(self.K), _Hist(self.D))
        return table[key]

    def observe(self, req_id, features: DraftFeatures, step: int, chain_accept: int,
                tree_accept: Optional[int] = None) -> None:
        """A resolved draft: it would have had `chain_accept` tokens accepted as a K-chain (capped at K) and
        `tree_accept` as the full tree (None when no tree was drafted)."""
        self.version += 1
        m, s = features.match_len > 0, bool(features.sampled)
        for pair in (self._global[(m, s)], self._pair(self._local, (req_id, m)),
                     self._pair(self._bucket, (feature_bucket(features), s))):
            pair[0].add(chain_accept, step, self.decay)
            if tree_accept is not None and self.D:
                pair[1].add(tree_accept, step, self.decay)

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

    def _shared_dist(self, m: bool, bucket: tuple, step: int, which: int, sampled: bool = False) -> list:
        """The all-requests histogram blended with the feature bucket's (of requests that sample, or of greedy
        ones): the same for every such request of a batch with these features, so kept until the model or the
        step changes."""
        if self._shared_at != (step, self.version):
            self._shared_at, self._shared = (step, self.version), {}
        key = (m, bucket, which, sampled)
        dist = self._shared.get(key)
        if dist is None:
            g = self._global[(m, sampled)][which]
            g._age(step, self.decay)
            floor = self.prior_floor
            if floor > 0:  # the observations, and as many 0s as the floor
                dist = [(x + (floor if a == 0 else 0.0)) / (g.mass + floor) for a, x in enumerate(g.w)]
            elif g.mass > 1e-12:
                dist = [x / g.mass for x in g.w]
            else:  # everything forgotten (long idle): back to the pessimistic prior
                dist = [1.0] + [0.0] * (len(g.w) - 1)
            b = self._bucket.get((bucket, sampled))
            dist = self._shared[key] = self._blend(None if b is None else b[which], dist, step)
        return dist

    def _dist(self, req_id, features: DraftFeatures, step: int, which: int) -> list:
        m = features.match_len > 0
        dist = self._shared_dist(m, feature_bucket(features), step, which, bool(features.sampled))
        loc = self._local.get((req_id, m))
        return self._blend(None if loc is None else loc[which], dist, step)

    def expected(self, req_id, features: DraftFeatures, step: int) -> tuple:
        """(chain, tree): chain[k-1] = E[accepted | chain of k], k = 1..K; tree = E[accepted | tree]."""
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


# ------------------------------------------------------------------------------------------- the rule
@dataclass(frozen=True)
class Option:
    kind: str  # "none" | "chain" | "tree"
    k: int = 0  # chain length (draft tokens); for the tree, its draft nodes
    width: int = 1  # tokens per speculating request in the pass (root included)

    @property
    def label(self) -> str:
        return NONE if self.kind == NONE else (f"chain{self.k}" if self.kind == CHAIN else f"tree{self.width}")


@dataclass(frozen=True)
class Evaluation:
    option: Option
    rate: float  # expected tokens per ms for the batch
    pass_ms: float
    tokens: float  # expected tokens emitted by the batch
    speculate: tuple  # per request: takes part (True) or verifies nothing (False)


def evaluate(option: Option, costs: CostTable, gains: Sequence[float], shape: str = "ragged") -> Evaluation:
    """Expected batch rate of `option` given per-request E[accepted | option] (`gains`)."""
    bs = len(gains)
    t_dec = costs.decode_ms(bs)
    if option.kind == NONE or bs == 0:
        return Evaluation(option, bs / t_dec, t_dec, float(bs), (False,) * bs)
    t_full = costs.verify_step_ms(bs, option.width, bs * option.width)
    spec = tuple((1.0 + g) * t_dec >= t_full for g in gains)  # gain_i >= 1
    n = sum(spec)
    if n == 0:  # nobody speculates: the step is a plain decode step
        return Evaluation(option, bs / t_dec, t_dec, float(bs), spec)
    tokens_in_pass = bs * option.width if shape == "uniform" else n * option.width + (bs - n)
    t = costs.verify_step_ms(bs, option.width, tokens_in_pass)
    emitted = bs + sum(g for g, s in zip(gains, spec) if s)
    return Evaluation(option, emitted / t, t, emitted, spec)


def choose(evals: Sequence[Evaluation], current: Optional[Option], hysteresis: float) -> Evaluation:
    """Best expected rate, but keep `current` unless the best beats it by more than `hysteresis` (relative).
    Ties go to the cheaper option (the order of `evals`)."""
    best = max(evals, key=lambda e: e.rate)  # max keeps the first of equals
    if current is not None:
        for e in evals:
            if e.option == current and best.rate <= e.rate * (1.0 + hysteresis):
                return e
    return best


def options_for(max_chain: int, tree_width: int, chain_widths: Sequence[int] = ()) -> tuple:
    """The option list: none, chain k for k = 1..max_chain (or only the widths a server captured), the tree."""
    ks = range(1, max_chain + 1) if not chain_widths else sorted({w - 1 for w in chain_widths if 2 <= w})
    opts = [Option(NONE)] + [Option(CHAIN, k, k + 1) for k in ks if k <= max_chain]
    if tree_width >= 2:
        opts.append(Option(TREE, tree_width - 1, tree_width))
    return tuple(opts)


# ---------------------------------------------------------------------------------------- controller
@dataclass(frozen=True)
class AutoConfig:
    """Built once from the server flags by glue/auto.py."""

    max_chain: int = 7  # K: longest chain considered (--speculative-num-draft-tokens - 1)
    tree_width: int = 8  # tokens of a tree verify per request (root included); 0: no tree option
    chain_widths: tuple = ()  # verify widths the server can run for chains (root included); () = 2..K+1
    hysteresis: float = 0.03  # --speculative-ngram-auto-hysteresis
    half_life_steps: float = 16.0  # forgetting of the gain model; sets the follow bound (follow_bound_steps)
    prior_strength: float = 4.0
    prior_floor: float = 1.0  # pseudo-observations of 0 accepted the gain model never forgets (GainModel)
    shape: str = "ragged"  # "uniform": every request in a verify pass occupies `width` slots
    log_interval_s: float = 30.0
    # probes (drafts looked up only to learn from) may add at most this share to the time of the steps without
    # speculation, by their measured cost (Controller.probe_cost), though one still comes every probe_max steps
    # (plan_lookup); 1.0: no limit
    probe_budget: float = 0.002

    def __post_init__(self):
        if not isinstance(self.max_chain, int) or self.max_chain < 1:
            raise ValueError(f"--speculative-num-draft-tokens must be >= 2 for auto verify (max chain "
                             f"{self.max_chain!r})")
        if not isinstance(self.tree_width, int) or self.tree_width < 0 or self.tree_width == 1:
            raise ValueError(f"tree width must be 0 (no tree) or >= 2, got {self.tree_width!r}")
        if not (isinstance(self.hysteresis, (int, float)) and 0.0 <= self.hysteresis < 0.5):
            raise ValueError(f"--speculative-ngram-auto-hysteresis must be in [0, 0.5), got {self.hysteresis!r}")
        if not self.half_life_steps > 0:
            raise ValueError(f"half_life_steps must be > 0, got {self.half_life_steps!r}")
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        if not (isinstance(self.probe_budget, (int, float)) and 0.0 < self.probe_budget <= 1.0):
            raise ValueError(f"probe_budget must be in (0, 1], got {self.probe_budget!r}")


def follow_bound_steps(cfg: AutoConfig, eps: float = 0.1, probe_max: int = 0) -> int:
    """Steps after an acceptance change within which the controller acts on the new regime: the next draft is
    looked up within `probe_max` steps (0: every step has drafts), it resolves within K + 1 steps, and after
    n more steps the old regime's weight is <= 2**(-n / half_life) <= eps."""
    return probe_max + cfg.max_chain + 1 + math.ceil(cfg.half_life_steps * math.log2(1.0 / eps))


@dataclass(frozen=True)
class RequestView:
    req_id: object
    features: DraftFeatures


@dataclass(frozen=True)
class Decision:
    option: Option
    speculate: tuple  # per request in the order given
    rates: dict  # option label -> expected tokens per ms
    pass_ms: float
    step: int

    @property
    def speedup(self) -> float:
        return self.rates[self.option.label] / self.rates[NONE]


class Controller:
    """The per-step decision: `decide(requests)` then, when drafts resolve, `observe(...)`."""

    def __init__(self, cfg: AutoConfig, costs: CostTable, log: Optional[Callable[[dict], None]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self._costs_version = 0
        self.costs = costs
        self._wanted_epoch, self._wanted_cache = None, {}
        self._evaluated = (None, None)  # (question, answer) of the last _evaluate
        self._step_costs = (None, {})  # (costs key, {bs: (plain step ms, probe cost ms)}): `_plain_and_probe`
        self.options = options_for(cfg.max_chain, cfg.tree_width, cfg.chain_widths)
        self.gain = GainModel(cfg.max_chain, max(cfg.tree_width - 1, 0), cfg.half_life_steps, cfg.prior_strength,
                              prior_floor=cfg.prior_floor)
        self.current: Optional[Option] = None
        self.step = 0
        self._log = log
        self._clock = clock
        self._last_log = -math.inf
        self._suppressed = 0
        self.counters = {"steps": 0, "switches": 0, "gated_requests": 0, "requests": 0, "lean_steps": 0,
                         "probe_lookups": 0, "behind_lookups": 0, "probes_held": 0}
        self.planned: Optional[str] = None  # why the last plan_lookup looked up: PLAN_PROBE or PLAN_WANTED
        self._since_lookup = 0
        self._probe_gap = 1  # steps between lookups while none is expected to pay (doubles up to probe_max)
        self._probe_credit = 0.0  # ms that probes may still add (`probe_cost`; grows with each step's cost)
        self.steps_by_mode = {o.label: 0 for o in self.options}
        self.last: Optional[Decision] = None
        self._sampled: set = set()  # requests that sample (note_sampling); the others decode greedily

    @property
    def costs(self):
        return self._costs

    @costs.setter
    def costs(self, value) -> None:  # a new table (the server shares rank 0's measurements every few steps)
        self._costs = value
        self._costs_version += 1

    def _costs_key(self) -> tuple:
        """Changes whenever the costs the controller reads may have: a new table, or a record into its own."""
        return self._costs_version, getattr(self._costs, "version", 0)

    def _evaluate(self, requests: Sequence[RequestView], step: int) -> tuple:
        """(per-request (chain, tree) expectations, an Evaluation per option in `self.options` order).

        The last answer is kept: a step that speculated asks the same question twice (`plan_lookup` with each
        request's last features, then `decide` with the new drafts', the same on a steady load)."""
        key = (step, self.gain.version, self._costs_key(), tuple((r.req_id, r.features) for r in requests))
        if key == self._evaluated[0]:
            return self._evaluated[1]
        out = self._evaluate_now(requests, step)
        self._evaluated = (key, out)
        return out

    def _evaluate_now(self, requests: Sequence[RequestView], step: int) -> tuple:
        per_req = [self.gain.expected(r.req_id, r.features, step) for r in requests]
        evals = []
        for o in self.options:
            if o.kind == NONE:
                g = [0.0] * len(per_req)
            elif o.kind == CHAIN:
                g = [c[o.k - 1] for c, _ in per_req]
            else:
                g = [t for _, t in per_req]
            evals.append(evaluate(o, self.costs, g, self.cfg.shape))
        return per_req, evals

    def decide(self, requests: Sequence[RequestView], behind: bool = False) -> Decision:
        """A step whose drafts were looked up: the option and who takes part. ``behind``: the drafts were looked
        up without waiting for the step in flight (counted apart)."""
        self.step += 1
        self.counters["behind_lookups"] += int(behind)
        self._since_lookup = 0
        self._accrue_probe_credit(len(requests))
        per_req, evals = self._evaluate(requests, self.step)
        chosen = choose(evals, self.current, self.cfg.hysteresis)
        if not any(chosen.speculate):  # an option nobody takes part in is a plain decode step
            chosen = evals[0]
        if self.current is not None and chosen.option != self.current:
            self.counters["switches"] += 1
        self.current = chosen.option
        d = Decision(chosen.option, chosen.speculate, {e.option.label: e.rate for e in evals}, chosen.pass_ms,
                     self.step)
        self._back_off(chosen.option.kind != NONE)
        self.last = d
        self.counters["steps"] += 1
        self.counters["requests"] += len(requests)
        self.counters["gated_requests"] += sum(1 for s in chosen.speculate if not s) if chosen.option.kind != NONE else 0
        self.steps_by_mode[chosen.option.label] += 1
        self._maybe_log(d, requests, per_req)
        return d

    def plan_lookup(self, requests: Sequence[RequestView], probe_max: int = 0, behind: bool = False,
                    refill: bool = False) -> bool:
        """Before a step's drafts exist: is the draft lookup worth making? `requests` carry each request's
        last known features (the glue looks a request it has not seen up without asking). True when an
        option that speculates is expected to beat no speculation by more than the hysteresis, or when the
        probe gap has passed since the last lookup: the gain model learns only from drafts that were made,
        and a request whose last lookup found nothing may match a few tokens later (output that starts to
        repeat itself). The gap is 1 step after a lookup that chose to speculate (or `reset_probe`: a new
        request) and doubles after each lookup that chose not to, up to `probe_max` (0: no probes).
        False: the step runs without speculation and without a lookup (`note_lean`). Always True unless
        skipping the lookup is measured to pay (`lean_pays`). `planned` says how to look up: PLAN_WANTED (for
        real: the drafts may be verified this step) or PLAN_PROBE (the gap passed and even drafts that matched
        in full are not expected to pay: drafts only to learn from, see `note_probe`).
        ``behind``: the lookup would not wait for the step in flight (its drafts are looked up on the host's
        tokens and verified at once if `decide` says so): it costs host time only, so it is made when wanted or
        when the probe gap passed, and never just because a lookup step was not measured dearer.
        ``refill``: one of the steps right after a prefill, whose host work is not hidden behind the GPU's (the
        forward before was the prefill, and the host still has the prefill's result to process): a probe that
        could not pay waits, as it waits for the probe credit (never past `probe_max` steps)."""
        self.planned = None
        if not requests:
            return False
        if not behind and not self.lean_pays(len(requests)):
            self.planned = PLAN_WANTED
            return True
        if self._wanted(requests):
            self._since_lookup = 0
            self.planned = PLAN_WANTED
            return True
        if probe_max > 0 and self._since_lookup + 1 >= min(self._probe_gap, probe_max):
            # a probe that may find drafts worth verifying at once is a real lookup; one whose drafts would not
            # pay even if they matched in full (the requests' own acceptance of matching drafts is low) is for
            # learning only, and cheaper (PLAN_PROBE: looked up behind, scored, the step stays plain), but not
            # free where the host has little time to spare: it waits until the probe credit covers its
            # measured cost (the next step asks again), though never past `probe_max` steps since the last
            # lookup (so that a change in acceptance is still noticed within follow_bound_steps)
            promising = self._full_match_wanted([r.req_id for r in requests])
            if not promising:
                cost = self._plain_and_probe(len(requests))[1]
                if (refill or cost > self._probe_credit) and self._since_lookup + 1 < probe_max:
                    self.counters["probes_held"] += 1
                    self._since_lookup += 1
                    return False
                self._probe_credit -= cost  # below 0 after a probe the credit did not cover: paid back first
            self._since_lookup = 0
            self.planned = PLAN_WANTED if promising else PLAN_PROBE
            return True
        self._since_lookup += 1
        return False

    def probe_cost(self, bs: int) -> float:
        """What a probe adds to a plain step at batch size `bs` (ms): the mean period of steps that probed
        (PROBE) less that of plain steps (LEAN), both measured (`StepCosts.mean_ms`, `min_samples` each); 0
        until then (the first probes measure it) and with a cost table that measures no whole steps. A probe's
        lookup runs on the host while the GPU decodes, so it costs nothing until the host's share of the step
        outgrows the GPU's, and then first in the steps where the host had little to spare: the mean, not the
        median (2x H200, 24-layer dummy model: at batch size 4 0-0.8 ms of a 4.6 ms step by the host the machine
        came with; at batch size 1 the median probe step was 0.06 ms longer, the mean 0.25 ms)."""
        mean_ms = getattr(self.costs, "mean_ms", None)
        if mean_ms is None:
            return 0.0
        probe, plain = mean_ms(PROBE, bs, 1), mean_ms(LEAN, bs, 1)
        if probe is None or plain is None:
            return 0.0
        return max(probe - plain, 0.0)

    def _plain_and_probe(self, bs: int) -> tuple:
        """(a plain step's cost, `probe_cost`) at batch size `bs`, kept until the costs change (every step asks)."""
        key = self._costs_key()
        if key != self._step_costs[0]:
            self._step_costs = (key, {})
        hit = self._step_costs[1].get(bs)
        if hit is None:
            hit = self._step_costs[1][bs] = (self.costs.decode_ms(bs), self.probe_cost(bs))
        return hit

    def _accrue_probe_credit(self, bs: int) -> None:
        """Each step adds `probe_budget` of a plain step's cost to the probe credit, kept to at most one probe's
        cost (a long stretch without probes does not buy a burst of them)."""
        plain, cap = self._plain_and_probe(bs)
        gain = self.cfg.probe_budget * plain
        self._probe_credit = min(self._probe_credit + gain, max(cap, gain))  # a debt is paid back step by step

    def _wanted(self, requests: Sequence[RequestView]) -> bool:
        """Is an option that speculates expected to beat no speculation (by the hysteresis) for `requests`?

        Asked on most steps without speculation with the same requests and features, so the answer is kept
        until the gain model observes something, the costs or the current option change, or WANTED_REFRESH_STEPS
        steps pass (the model's forgetting moves its estimates a little every step)."""
        epoch = (self.gain.version, self._costs_key(), self.current, (self.step + 1) // WANTED_REFRESH_STEPS)
        if epoch != self._wanted_epoch:
            self._wanted_epoch, self._wanted_cache = epoch, {}
        key = tuple((r.req_id, r.features) for r in requests)
        hit = self._wanted_cache.get(key)
        if hit is not None:
            return hit
        _, evals = self._evaluate(requests, self.step + 1)
        best = choose(evals, self.current if self.current is not None else evals[0].option, self.cfg.hysteresis)
        wanted = best.option.kind != NONE and any(best.speculate)
        if len(self._wanted_cache) < 64:
            self._wanted_cache[key] = wanted
        return wanted

    def _full_match_wanted(self, req_ids: Sequence) -> bool:
        """Would drafts that matched in full (the longest chain) be worth verifying for these requests, with
        what the gain model knows of each (a request without history: all requests' recent acceptance)?"""
        k = self.cfg.max_chain
        return self._wanted([RequestView(r, DraftFeatures(k, 1, self.samples(r))) for r in req_ids])

    def note_probe(self, requests: Sequence[RequestView]) -> Decision:
        """A probe step (`plan_lookup` gave PLAN_PROBE) whose drafts were looked up only to be scored, and which
        ran without speculation: `requests` carry the features of those drafts. The probe gap goes back to 1
        when they make speculation look worthwhile (the next step then looks up for real) and doubles
        otherwise; the step counts as a step without a lookup's drafts verified (`note_lean`)."""
        self._back_off(self._wanted(requests))
        self.counters["probe_lookups"] += 1
        return self.note_lean(len(requests))

    def lean_pays(self, bs: int, margin: float = 0.02) -> bool:
        """Is a step without a lookup measured to be cheaper than a lookup step that verifies nothing? A lean
        step saves the lookup's host time but its drafts are never scored, so the gain model learns less; it is
        taken only where the whole-step costs (StepCosts) show it at least `margin` cheaper, and, to measure
        it, until it has `min_samples` periods. A plain cost table has no such difference: always False."""
        step_ms = getattr(self.costs, "step_ms", None)
        if step_ms is None:
            return False
        if self.costs.samples(LEAN, bs, 1) < self.costs.min_samples:
            return True  # not measured yet: take lean steps to measure them
        return step_ms(LEAN, bs, 1) * (1.0 + margin) < step_ms(SPEC, bs, 1)

    def first_lookup_behind(self, req_ids: Sequence) -> bool:
        """A batch with requests not looked up yet: may their first lookup be a probe (made behind, the step
        a plain one) instead of a lookup step that waits for the step in flight? Only when (a) a lookup step
        at this batch size has been measured (`min_samples` SPEC periods of width 1: until then these first
        lookups are what measures it) and measured dearer than a plain step (`lean_pays`), and (b) not even
        drafts that matched in full would be worth verifying for any of the requests (the gain model: a
        request without history gets the recent acceptance of all requests, none once it has been forgotten).
        A load whose drafts have been paying keeps its first lookups real. Sets `planned` to PLAN_PROBE when
        True (then `note_probe` with the probe's features)."""
        self.planned = None
        bs = len(req_ids)
        samples = getattr(self.costs, "samples", None)
        if not bs or samples is None or samples(SPEC, bs, 1) < self.costs.min_samples:
            return False
        if not self.lean_pays(bs):
            return False
        if self._full_match_wanted(req_ids):
            return False
        self.planned = PLAN_PROBE
        self._since_lookup = 0  # a probe like plan_lookup's: the next one after the backed-off gap
        return True

    def defer_first_lookup(self, req_ids: Sequence) -> bool:
        """A step right after new requests' prefill, whose drafts would be looked up behind the token in flight:
        may that lookup wait? True when not even drafts that matched in full would be verified for any request
        of the batch (`_full_match_wanted`): the lookup can then only be a probe, and made in this step it
        delays the new requests' first token (the scheduler processes the prefill's result after launching this
        step), while made later it runs on the host as the GPU decodes. The probe gap goes to 1: the first
        `plan_lookup` not in the steps right after the prefill (``refill``) looks up. False: look up now; always
        before the gain model observed anything (a cold start learns from these first drafts)."""
        if not req_ids or self.gain.version == 0 or self._full_match_wanted(req_ids):
            return False
        self._probe_gap = 1
        return True

    def _back_off(self, speculating: bool) -> None:
        """Lookups back off while they buy nothing: after a lookup (or probe) the gap goes back to 1 if it
        chose (or would choose) to speculate, and doubles otherwise."""
        self._probe_gap = 1 if speculating else min(self._probe_gap * 2, 1 << 16)

    def reset_probe(self) -> None:
        """A new request joined: look up again soon (its output may start repeating at once)."""
        self._probe_gap = 1

    def note_lean(self, bs: int) -> Decision:
        """A step that ran without a lookup: a decision for no speculation, counted like one."""
        self.step += 1
        self._accrue_probe_credit(bs)
        if self.current is not None and self.current.kind != NONE:
            self.counters["switches"] += 1
        self.current = self.options[0]
        t = self._plain_and_probe(bs)[0]
        d = Decision(self.current, (False,) * bs, {NONE: bs / t}, t, self.step)
        self.last = d
        self.counters["steps"] += 1
        self.counters["requests"] += bs
        self.counters["lean_steps"] += 1
        self.steps_by_mode[NONE] += 1
        return d

    def observe(self, req_id, features: DraftFeatures, chain_accept: int, tree_accept: Optional[int] = None) -> None:
        self.gain.observe(req_id, features, self.step, chain_accept, tree_accept)

    def finish(self, req_id) -> None:
        self.gain.drop(req_id)
        self._sampled.discard(req_id)

    def note_sampling(self, req_id, sampled: bool) -> None:
        """Whether a request samples (temperature > 0) or decodes greedily, told once when it joins: a full
        match wanted for it (`_full_match_wanted`) is judged by the drafts of requests that decode as it does.
        Its drafts carry the same in their features (`DraftFeatures.sampled`)."""
        if sampled:
            self._sampled.add(req_id)
        else:
            self._sampled.discard(req_id)

    def samples(self, req_id) -> bool:
        """What `note_sampling` was told for this request (False: greedy, or not told)."""
        return req_id in self._sampled

    def no_draft(self, req_id) -> DraftFeatures:
        """A request's features before its first lookup, where that lookup was deferred (`defer_first_lookup`):
        no draft, sampling as the request does."""
        return DraftFeatures(0, 0, self.samples(req_id))

    def _maybe_log(self, d: Decision, requests, per_req) -> None:
        if self._log is None:
            return
        now = self._clock()
        if now - self._last_log < self.cfg.log_interval_s:
            self._suppressed += 1
            return
        self._last_log = now
        k = self.cfg.max_chain
        self._log({
            "step": d.step, "bs": len(requests), "option": d.option.label, "speedup_vs_none": round(d.speedup, 4),
            "rates_tok_per_ms": {lbl: round(r, 5) for lbl, r in d.rates.items()},
            "pass_ms": round(d.pass_ms, 4), "decode_ms": round(self.costs.decode_ms(len(requests)), 4),
            "speculating": sum(d.speculate) if d.option.kind != NONE else 0,
            "mean_expected_chain_accept": round(sum(c[k - 1] for c, _ in per_req) / max(len(per_req), 1), 4),
            "mean_expected_tree_accept": round(sum(t for _, t in per_req) / max(len(per_req), 1), 4),
            "switches": self.counters["switches"], "decisions_since_last_log": self._suppressed + 1,
        })
        self._suppressed = 0

    def metrics(self) -> dict:
        """Values for the server's metrics exporter (gauges and counters, all numbers)."""
        d = self.last
        out = {
            "auto_steps_total": float(self.counters["steps"]),
            "auto_switches_total": float(self.counters["switches"]),
            "auto_gated_requests_total": float(self.counters["gated_requests"]),
            "auto_requests_total": float(self.counters["requests"]),
            "auto_lean_steps_total": float(self.counters["lean_steps"]),
            "auto_probe_lookups_total": float(self.counters["probe_lookups"]),
            "auto_behind_lookups_total": float(self.counters["behind_lookups"]),
            "auto_probes_held_total": float(self.counters["probes_held"]),
        }
        for lbl, n in self.steps_by_mode.items():
            out[f"auto_steps_{lbl}_total"] = float(n)
        if d is not None:
            out.update({
                "auto_chain_k": float(d.option.k if d.option.kind == CHAIN else 0),
                "auto_tree": float(d.option.kind == TREE),
                "auto_expected_speedup": d.speedup,
                "auto_pass_ms": d.pass_ms,
            })
        return out


# ------------------------------------------------------------------------------------ shadow resolution
@dataclass
class _Pending:
    pos: int
    features: DraftFeatures
    chain: tuple
    tree_tokens: Optional[tuple]
    tree_parents: Optional[tuple]


def chain_accept(chain: Sequence[int], actual: Sequence[int]) -> tuple:
    """(accepted, resolved): accepted leading tokens of `chain` against the known continuation `actual`."""
    n = 0
    while n < len(chain) and n < len(actual):
        if chain[n] != actual[n]:
            return n, True
        n += 1
    return n, n == len(chain)


def tree_accept(tokens: Sequence[int], parents: Sequence[int], actual: Sequence[int]) -> tuple:
    """(accepted, resolved): greedy walk of the tree (draft nodes, parent -1 = root) along `actual`."""
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

    `record(req, pos, ...)`: the draft made when the request had `pos` tokens (it proposes tokens pos, pos+1..).
    `advance(req, tokens)`: the request's tokens so far (any sequence indexable from 0 that covers pos..);
    returns resolved (features, chain_accept, tree_accept) tuples. A draft resolves at its first divergence or
    when fully matched, so at most K + 1 tokens after it was made."""

    def __init__(self, max_pending: int = 64):
        self._pending: dict = {}
        self.max_pending = max_pending

    def record(self, req_id, pos: int, features: DraftFeatures, chain: Sequence[int],
               tree_tokens: Optional[Sequence[int]] = None, tree_parents: Optional[Sequence[int]] = None) -> None:
        q = self._pending.setdefault(req_id, [])
        q.append(_Pending(pos, features, tuple(chain), None if tree_tokens is None else tuple(tree_tokens),
                          None if tree_parents is None else tuple(tree_parents)))
        del q[:-self.max_pending]

    def advance(self, req_id, tokens: Sequence[int], length: Optional[int] = None) -> list:
        q = self._pending.get(req_id)
        if not q:
            return []
        n = len(tokens) if length is None else length
        done, keep = [], []
        for p in q:
            actual = tokens[p.pos:n]
            ca, cres = chain_accept(p.chain, actual)
            ta, tres = (None, True) if p.tree_tokens is None else tree_accept(p.tree_tokens, p.tree_parents, actual)
            (done if cres and tres else keep).append((p, ca, ta))
        self._pending[req_id] = [p for p, _, _ in keep]
        return [(p.features, ca, ta) for p, ca, ta in done]

    def drop(self, req_id) -> None:
        self._pending.pop(req_id, None)
