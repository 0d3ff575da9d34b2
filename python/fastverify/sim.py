"""Decode-loop simulator that drives the real `fastverify.controller` with traces and cost tables.

Only the model forward is simulated: its cost comes from a `CostTable`, and the number of draft
tokens it would accept at each position of each request comes from a trace (position-indexed, so
every policy sees the same text). A step:

    views  = [(req, features at its position)]              what the n-gram lookup reports
    plan   = policy.decide(views)                            the REAL Controller for "auto";
                                                             fixed otherwise
    accept = chain: min(A_chain[pos], k); tree: A_tree[pos]; not speculating: 0
    time  += decode_ms(bs) or verify_ms(tokens in the pass)  from the TRUE cost table
             + lookup_ms when the step looked drafts up      (host: corpus lookup, its blocking
                                                             copy, the speculative verify path;
                                                             0 by default)
             + probe_ms when auto probed                     (drafts looked up behind the launch
                                                             only to be scored: host time the
                                                             step lacks where the host is busy;
                                                             0 by default)
    pos   += 1 + accept
    drafts made at earlier steps resolve once the produced tokens show their first divergence (at
    most K + 1 tokens later) and are fed to the controller, verified or not (ShadowTracker does
    this in the server).

Traces: `synthetic_requests` (known acceptance: geometric with continuation probability p, the
regime may change with the step number) and `replay_requests` (drafts from SGLang's n-gram corpus
over the recorded default trace, via fastverify.replay; needs the JIT-built corpus).

Cost tables (`cost_table(name)`), both in the form the server loads:
- "h200-nvlink": CONTEXT.md's 2x H200 measurements: 122 NCCL all-reduces in a CUDA graph
  at 19.8 / 19.5 / 24.8 us for 1 / 8 / 64 tokens and a dense compute stand-in of 9.7 ms
  per pass at 1-64 tokens;
- "pcie-comm-bound": the reference report's 8x PCIe box, the pass-cost profile fitted to its own
  numbers (fastverify/data/profiles/reference-kimi-tp8.json, read through fastverify.passcost):
  122 all-reduces per pass at 59 us for 1 token (decode 12.2 ms, 82 tok/s), 205 us at 4 tokens
  (EAGLE-3's ~30 ms verify), 230 us at 8 (n-gram's ~33 ms tree pass), compute 5 ms. (It was a
  linear ramp 59 -> 205 us over 1 -> 8 tokens, which made a 4-token pass 19.8 ms and EAGLE-3's
  chain win 1.23x where the box measured 0.73x.)
Above 64 tokens both are extrapolations, not measurements: h200-nvlink's compute =
c * max(1, tokens / 192) (a roofline knee for bf16 GEMMs), all-reduce linear in tokens; a profile's
curves continue with the slope of their last two points (passcost).
Any other name is a pass-cost profile: a built-in one (fastverify/data/profiles/NAME.json), a
profile file or a `fastverify bench allreduce --json` result (PATH#backend), turned into a table by
`PassCostProfile.cost_table`.
- "h200-dummy24": the start-up calibration of the auto server of benchmark/results/h200x2/auto/run10
  (2x H200, TP=2, the dummy 7168-hidden 24-layer model): decode and verify graphs as measured up to
  8 requests / 64 tokens, linear extrapolation above. With `--lookup-ms 1.8` (that run: a chain +
  widths step that verified nothing took 6.36 ms against 4.54 ms for a plain server's step) it
  stands for the run's whole steps.
`python -m fastverify.sim` prints every table used.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from fastverify.argtypes import int_list
from fastverify.controller import (CHAIN, NONE, PLAN_PROBE, AutoConfig, Controller, Option,
                                   RequestView, follow_bound_steps, options_for)
from fastverify.costs import (LEAN, PROBE, SPEC, CostTable, CostTableError, StepCosts,
                              load_cost_table, steady_period)
from fastverify.gains import DraftFeatures

PROBE_MAX, COST_SYNC_STEPS = AutoConfig.probe_max, AutoConfig.cost_sync_steps  # the server's

TABLE_POINTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
_KNEE_TOKENS = 192  # assumed compute knee above the measured 64 tokens (extrapolation)


def _compute_ms(base_ms: float, tokens: int) -> float:
    return base_ms * max(1.0, tokens / _KNEE_TOKENS)


def _h200_allreduce_us(tokens: int) -> float:
    # CONTEXT.md, 2x H200 NV18, torch NCCL all-reduce of [tokens, 7168] bf16 inside a CUDA graph
    pts = ((1, 19.8), (8, 19.5), (64, 24.8))
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if tokens <= x1:
            return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
    return 24.8 + (24.8 - 19.5) / 56 * (tokens - 64)


# run10's start-up calibration (auto_lines.txt): DECODE graphs at 1-8 requests,
# verify graphs at 1-64 tokens
_DUMMY24_DECODE = ((1, 4.4269), (2, 4.4421), (4, 4.4385), (8, 4.4543))
_DUMMY24_VERIFY = ((1, 4.4967), (2, 4.6166), (4, 4.6370), (8, 4.8352), (16, 4.9216),
                   (32, 4.9967), (64, 5.0923))


REFERENCE_PROFILE = "reference-kimi-tp8"  # the profile behind "pcie-comm-bound"


def _server_table_file(name: str) -> bool:
    """Is ``name`` a JSON file in the form the server's auto cost table flag reads (decode_ms and
    verify_ms, or those under "cost_table")?"""
    p = Path(name)
    if p.suffix != ".json" or not p.is_file():
        return False
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and ("decode_ms" in obj or "cost_table" in obj)


def cost_table(name: str) -> CostTable:
    """A built-in table by name, a cost table file in the server's form (what
    ``--speculative-ngram-auto-cost-table`` reads, such as a calibration's), or a pass-cost profile
    (name, file, or bench json[#backend])."""
    if name == "h200-dummy24":
        return CostTable(_DUMMY24_DECODE, _DUMMY24_VERIFY, name)
    if _server_table_file(name):
        try:
            table = load_cost_table(name, "--tables")
        except CostTableError as e:
            raise ValueError(str(e)) from None
        return CostTable(table.decode, table.verify, name)
    if name == "h200-nvlink":
        def f(t):
            return _compute_ms(9.7, t) + 122 * _h200_allreduce_us(t) / 1000.0
        pts = tuple((t, round(f(t), 4)) for t in TABLE_POINTS)
        return CostTable(pts, pts, name)  # a decode step of bs requests is a pass of bs tokens
    from fastverify import passcost
    try:
        profile = passcost.load_profile(REFERENCE_PROFILE if name == "pcie-comm-bound" else name,
                                        "--tables")
    except passcost.PassCostError as e:
        raise ValueError(f"{e}; or one of the built-in tables {', '.join(ALL_TABLES)}") from None
    table = profile.cost_table(TABLE_POINTS)
    return CostTable(table.decode, table.verify, name)


COST_TABLES = ("h200-nvlink", "pcie-comm-bound")  # the default report
ALL_TABLES = COST_TABLES + ("h200-dummy24",)


# ------------------------------------------------------------------------------------------- traces
@dataclass
class SimRequest:
    """Per position: features of the draft made there, accepted drafts as the best K-chain
    and as the tree. `regimes` holds alternative (features, chain, tree) lists;
    `regime_of_step` picks one per step."""

    rid: object
    regimes: list  # [(features list, chain list, tree list)]
    # positions at which a lookup made behind the step in flight finds the corpus unsure of
    # the token in flight (it offered more than one): the server then looks up for real
    # where full matches are wanted
    unsure: frozenset = frozenset()
    # the request samples (temperature > 0): told to the policy when it joins (its
    # drafts' features say so too)
    sampled: bool = False
    # draft tokens the gain model's scoring adds to a matched draft's acceptance (capped at K): a
    # biased scorer, the verify itself accepting what the chain list says (0: scored as verified)
    scored_extra: int = 0

    @property
    def length(self) -> int:
        return len(self.regimes[0][1])


def _geometric(rng: random.Random, p: float, cap: int) -> int:
    n = 0
    while n < cap and rng.random() < p:
        n += 1
    return n


def synthetic_requests(n: int, length: int, ps: Sequence[float], max_chain: int = 7,
                       tree_width: int = 8, match_rate: float = 0.9, seed: int = 0) -> list:
    """Requests with known acceptance: at each position the lookup matches with probability
    `match_rate` (features drawn at random, so they carry no information about the outcome); a match
    is accepted for A ~ Geometric(p) tokens (capped at K) as a chain, and the tree (2 branches)
    accepts the better of two independent paths capped at its depth. One regime per p in `ps`."""
    rng = random.Random(seed)
    depth = max(1, (tree_width - 1) // 2)
    reqs = []
    for r in range(n):
        regimes = []
        for p in ps:
            feats, ch, tr = [], [], []
            for _ in range(length):
                if rng.random() < match_rate:
                    f = DraftFeatures(rng.randint(1, 8), rng.randint(1, 3))
                    a = _geometric(rng, p, max_chain)
                    b = _geometric(rng, p, depth)
                    feats.append(f), ch.append(a), tr.append(max(min(a, depth), b))
                else:
                    feats.append(DraftFeatures(0, 0)), ch.append(0), tr.append(0)
            regimes.append((feats, ch, tr))
        reqs.append(SimRequest(f"r{r}", regimes))
    return reqs


def replay_requests(trace_path=None, max_chain: int = 7, tree_width: int = 8, concurrency: int = 1,
                    corpus_factory=None) -> list:
    """Position-indexed acceptance from SGLang's n-gram corpus over a recorded
    trace (fastverify.replay).

    The corpus is queried at every position of every request (requests run `concurrency` at a time
    in trace order, and the query window is inserted after every position); the tree is the corpus
    draft of `tree_width` tokens and the chain is the corpus path of K tokens
    (fastverify.replay.chain_path).
    The server inserts once per step rather than once per token, so these are close to, not equal
    to, the server's drafts."""
    from fastverify import replay as rp
    from fastverify.gains import chain_accept, draft_features, tree_accept

    trace = rp.load_trace(trace_path or rp.DEFAULT_TRACE)
    cfg = rp.ReplayConfig(mode="tree", size=tree_width)
    factory = corpus_factory or rp.sglang_corpus_factory
    corpus = rp.warm_up(factory, cfg)  # keeps the JIT loader's no-GPU warning out of the output
    d = cfg.corpus_draft_tokens
    out = []
    # requests with an empty or one-token output have no decode step (Trace.short_requests)
    reqs = [(f"r{i}", r) for i, r in enumerate(trace.requests) if len(r.output_ids) >= 2]
    for start in range(0, len(reqs), concurrency):
        group = reqs[start:start + concurrency]
        data = {rid: ([], [], []) for rid, _ in group}
        for g in range(1, max(len(r.output_ids) for _, r in group)):
            live = [(rid, r) for rid, r in group if g < len(r.output_ids)]
            queries = [rp._query_window(r.prompt_ids, r.output_ids, g, cfg.max_trie_depth)
                       for _, r in live]
            corpus.synchronize()
            toks, mask = corpus.batch_get([rid for rid, _ in live], queries,
                                          [len(r.prompt_ids) + g for _, r in live])
            toks, mask = [int(t) for t in toks], [int(m) for m in mask]
            for b, (rid, r) in enumerate(live):
                tokens = toks[b * d:(b + 1) * d]
                parents = rp.tree_parents([mask[(b * d + i) * d:(b * d + i + 1) * d]
                                           for i in range(d)])
                target = r.output_ids[g:]
                # draft nodes only: drop the root (index 0) and renumber parents (root -> -1)
                nodes, par = tokens[1:], [p - 1 for p in parents[1:]]
                real = rp.has_real_candidate(tokens, parents)
                chain = rp.chain_path(tokens, parents, max_chain) if real else []
                f = draft_features(nodes, par) if real else DraftFeatures(0, 0)
                data[rid][0].append(f)
                data[rid][1].append(chain_accept(chain, target)[0])
                data[rid][2].append(tree_accept(nodes, par, target)[0])
            corpus.batch_put(queries)
        for rid, _ in group:
            out.append(SimRequest(rid, [data[rid]]))
        corpus.erase_match_state([rid for rid, _ in group])
    return out


# ----------------------------------------------------------------------------------------- policies
class FixedPolicy:
    """One option every step. `gate_no_match`: requests whose lookup found nothing verify nothing
    (the chain mode's no-match gating); the tree verifies every request (stock SGLang)."""

    def __init__(self, option: Option, gate_no_match: bool = True):
        self.option = option
        self.gate_no_match = gate_no_match
        self.label = option.label

    # a speculative fixed mode looks drafts up every step; no speculation never
    @property
    def looked_up(self) -> bool:
        return self.option.kind != NONE

    def decide(self, views, unsure=None):
        if self.option.kind == NONE:
            return self.option, (False,) * len(views)
        return self.option, tuple((v.features.match_len > 0) or not self.gate_no_match
                                  for v in views)

    def observe(self, rid, features, chain, tree):
        pass

    def finish(self, rid):
        pass


class AutoPolicy:
    """The server's flow (fastverify.glue.auto): a request seen for the first time is looked up at
    once; otherwise `Controller.plan_lookup` on each request's last looked-up features decides
    between a lookup step (`decide` on this step's drafts) and a plain step without drafts
    (`note_lean`). After a step that gave every request one token (no speculation, or all requests
    new) the server looks drafts up behind the step in flight, without waiting for it, so such a
    lookup costs no `lookup_ms` (`paid_lookup` False), unless the corpus is unsure of the token in
    flight while full matches would pay (`SimRequest.unsure`: then it looks up for real, paid);
    after a step that speculated, a lookup waits (paid). A probe (`plan_lookup` gave PLAN_PROBE, or
    a first lookup `Controller.first_lookup_behind` allows) costs nothing and its drafts are only
    scored (`note_probe`); new requests' first lookup that could only be a probe waits one step
    (`Controller.defer_first_lookup`). The server's lookups behind see the tokens one step late,
    which the simulator does not model: it uses this step's features. Only drafts that were looked
    up are scored later (`looked_up`).

    `step_costs`: the controller decides on whole-step costs measured as the loop runs, as in the
    server (`StepCosts`: a step's simulated time recorded by kind where the step before it was of
    its class, `costs.steady_period`; the controller reads a copy taken every `COST_SYNC_STEPS`
    steps); None: on the cost table alone. `period_lag` 1: the time recorded for a step is the step
    before it, as the server's host clock measures a GPU-bound step under overlap scheduling."""

    label = "auto"

    def __init__(self, controller: Controller, probe_max: int = PROBE_MAX,
                 step_costs: Optional[StepCosts] = None, period_lag: int = 0):
        self.c = controller
        # what the host clock shows as a step's period: its own time (0), or the step's before it
        # (1: overlap scheduling where the GPU is the bottleneck, `costs.steady_period`)
        self.period_lag = period_lag
        self._history: list = []  # ((kind, bs, width), ms) of the steps simulated
        self.probe_max = probe_max
        self.last: dict = {}  # rid -> features of its last lookup
        self.looked_up = True
        self.step_costs = step_costs
        self._steps = 0
        self.paid_lookup = True  # this step waited for and ran a lookup (a lookup behind does not)
        self.probed = False  # this step was a probe (drafts only scored; `simulate`'s probe_ms)
        self.plain_before = True  # the last step gave every request one token
        self._gains: dict = {}  # rid -> expected accepted tokens of the draft it verifies now

    def record(self, bs: int, width: int, ms: float) -> None:
        """The step just simulated took `ms` (width: its verify width, 1 without speculation)."""
        if self.step_costs is None:
            return
        kind = SPEC if width > 1 or self.paid_lookup else PROBE if self.probed else LEAN
        h = self._history
        h.append(((kind, bs, width), ms))
        del h[:-(self.period_lag + 2)]
        # as the server: the period the host clock shows, kept where the step before is of its class
        if len(h) >= max(2, self.period_lag + 1) and steady_period(h[-2][0], h[-1][0]):
            self.step_costs.record(kind, bs, width, h[-1 - self.period_lag][1])
        self._steps += 1
        if self._steps % COST_SYNC_STEPS == 0:
            self.c.costs = self.step_costs.snapshot()

    def decide(self, views, unsure=None):
        """``unsure``: per view, whether a lookup behind the step in flight would find the corpus
        unsure of the token in flight (`SimRequest.unsure`); None: never."""
        fresh = [v for v in views if v.req_id not in self.last]
        ones = self.plain_before or len(fresh) == len(views)
        self.paid_lookup = True
        self.probed = False
        self.c.planned = None
        if fresh:
            self.c.reset_probe()
            if ones and self.c.defer_first_lookup([v.req_id for v in views]):
                # as the server in overlap mode: a first lookup that could only
                # be a probe waits one step
                for v in fresh:
                    self.last[v.req_id] = self.c.no_draft(v.req_id)
                return self._lean(len(views))
            if not ones:
                # sets planned: PLAN_PROBE or None
                self.c.first_lookup_behind([v.req_id for v in views])
        elif not self.c.plan_lookup([RequestView(v.req_id, self.last[v.req_id]) for v in views],
                                    self.probe_max, behind=ones):
            return self._lean(len(views))
        self.looked_up = True
        for v in views:
            self.last[v.req_id] = v.features
        if ones and unsure and any(unsure) and self.c._full_match_wanted([v.req_id for v in views]):
            # as lookup_behind: the corpus is unsure of a token in flight and full matches
            # are expected to pay, so the drafts are looked up for real after that token
            # (paid) and decided on at once
            d = self.c.decide(views)
        # looked up behind the step in flight, verified if chosen
        elif ones and self.c.planned != PLAN_PROBE:
            self.paid_lookup = False
            d = self.c.decide(views, behind=True)
        elif self.c.planned == PLAN_PROBE:  # a probe (made after the step's launch): scored only
            self.paid_lookup = False
            self.probed = True
            d = self.c.note_probe(views)
        else:
            d = self.c.decide(views)
        self.plain_before = d.option.kind == NONE or not any(d.speculate)
        self._gains = dict(zip((v.req_id for v in views), d.gains))
        return d.option, d.speculate

    def _lean(self, bs: int):
        """A step without a lookup: no speculation, nothing paid, nothing to score later."""
        self.looked_up = False
        self.paid_lookup = False
        self.probed = False
        self.plain_before = True
        self._gains = {}
        d = self.c.note_lean(bs)
        return d.option, d.speculate

    def observe(self, rid, features, chain, tree):
        self.c.observe(rid, features, chain, tree)

    def verified(self, rid, accepted: int) -> None:
        """A draft this policy verified accepted `accepted` tokens (the controller's
        calibration)."""
        self.c.note_verified(self._gains.get(rid, 0.0), accepted)

    def join(self, rid, sampled: bool) -> None:
        """A request joins the batch: whether it samples (the glue's `_sync_requests`)."""
        self.c.note_sampling(rid, sampled)

    def finish(self, rid):
        self.c.finish(rid)
        self.last.pop(rid, None)


@dataclass
class SimResult:
    label: str
    tokens: int = 0
    time_ms: float = 0.0
    steps: int = 0
    lookups: int = 0  # steps that looked drafts up (and paid for it)
    probes: int = 0  # steps that looked drafts up only to score them, at no cost (auto's probes)
    options: list = field(default_factory=list)  # chosen option label per step
    batch: list = field(default_factory=list)  # running requests per step
    step_ms: list = field(default_factory=list)  # simulated time per step
    step_tokens: list = field(default_factory=list)  # tokens produced per step
    step_lookups: list = field(default_factory=list)  # per step: it paid for a lookup
    finished: dict = field(default_factory=dict)  # rid -> index of the step in which it finished
    # per step: it looked drafts up only to score them
    step_probes: list = field(default_factory=list)

    def probe_steps(self, start: int = 0) -> int:
        return sum(self.step_probes[start:])

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.time_ms * 1000.0 if self.time_ms else 0.0


def simulate(requests: Sequence[SimRequest], policy, costs: CostTable, bs: int,
             shape: str = "ragged", max_chain: int = 7, tree_width: int = 8,
             regime_of_step: Optional[Callable[[int], int]] = None, lookup_ms: float = 0.0,
             probe_ms: float = 0.0, scored_at_lookups: bool = False) -> SimResult:
    """Run `requests` through a decode loop of at most `bs` concurrent requests (refilled in order).
    `lookup_ms`: what a step that looked drafts up costs on top of its pass (0: passes only).
    `probe_ms`: what a probe (`AutoPolicy.probed`: drafts looked up behind the launch only to be
    scored) adds to its step, where the host has less time to spare than the lookup takes (0: it
    fits in the host's slack).
    `scored_at_lookups`: drafts are scored only in steps that look drafts up (a lookup or a probe),
    as the server scores them where its steps without speculation run on SGLang's own decode path
    (`glue.plain_path`: the shadow tracker advances at probes and at the worker's steps); else as
    soon as the output decides them."""
    res = SimResult(policy.label)
    queue = list(requests)[::-1]
    active: dict = {}  # rid -> [request, pos, pending drafts [(pos, regime)]]
    cap_tree = max(tree_width - 1, 1)
    step = 0
    while queue or active:
        while queue and len(active) < bs:
            r = queue.pop()
            active[r.rid] = [r, 0, []]
            if hasattr(policy, "join"):
                policy.join(r.rid, r.sampled)
        regime = regime_of_step(step) if regime_of_step else 0
        step += 1
        rids = list(active)
        t0 = res.time_ms
        views = [RequestView(rid, active[rid][0].regimes[regime][0][active[rid][1]])
                 for rid in rids]
        option, spec = policy.decide(views,
                                     [active[rid][1] in active[rid][0].unsure for rid in rids])
        n_spec = sum(spec) if option.kind != NONE else 0
        if n_spec == 0:
            res.time_ms += costs.decode_ms(len(rids))
        else:
            width = option.width
            tokens = (len(rids) * width if shape == "uniform"
                      else n_spec * width + (len(rids) - n_spec))
            res.time_ms += costs.verify_ms(tokens)
        paid = bool(policy.looked_up and getattr(policy, "paid_lookup", True))
        probed = bool(policy.looked_up and not paid and getattr(policy, "probed", False))
        if paid:
            res.time_ms += lookup_ms
            res.lookups += 1
        elif policy.looked_up:
            res.probes += 1
            if probed:
                res.time_ms += probe_ms
        tokens_before = res.tokens
        if hasattr(policy, "record"):
            policy.record(len(rids), option.width if n_spec else 1, res.time_ms - t0)
        res.options.append(option.label if n_spec else NONE)
        res.batch.append(len(rids))
        res.steps += 1
        for rid, s in zip(rids, spec):
            st = active[rid]
            req, pos = st[0], st[1]
            feats, ch, tr = req.regimes[regime]
            if policy.looked_up:  # a draft exists (and is scored later) only when it was looked up
                st[2].append((pos, regime))
            acc = 0
            if n_spec and s:
                acc = min(ch[pos], option.k) if option.kind == CHAIN else tr[pos]
                if hasattr(policy, "verified"):
                    policy.verified(rid, acc)
            adv = min(1 + acc, req.length - pos)
            res.tokens += adv
            st[1] = pos + adv
            # (drafts not scored this step wait for a step that is)
            pending, keep = ((st[2], []) if policy.looked_up or not scored_at_lookups
                             else ((), st[2]))
            for p0, rg in pending:  # shadow resolution: the first divergence is known once produced
                f, a_c, a_t = req.regimes[rg][0][p0], req.regimes[rg][1][p0], req.regimes[rg][2][p0]
                need = max(min(a_c + 1, max_chain), min(a_t + 1, cap_tree))
                if st[1] - p0 >= need:
                    if req.scored_extra and f.match_len > 0:
                        a_c = min(a_c + req.scored_extra, max_chain)
                    policy.observe(rid, f, a_c, a_t)
                else:
                    keep.append((p0, rg))
            st[2] = keep
            if st[1] >= req.length:
                policy.finish(rid)
                res.finished[rid] = res.steps - 1
                del active[rid]
        res.step_ms.append(res.time_ms - t0)
        res.step_tokens.append(res.tokens - tokens_before)
        res.step_lookups.append(paid)
        res.step_probes.append(probed)
    return res


def fixed_policies(max_chain: int, tree_width: int) -> list:
    return [FixedPolicy(o) for o in options_for(max_chain, tree_width)]


def run_all(requests, costs, bs, cfg: AutoConfig, regime_of_step=None, controller_costs=None,
            lookup_ms: float = 0.0, probe_max: int = None, probe_ms: float = 0.0,
            scored_at_lookups: bool = False) -> dict:
    """Every fixed option and auto on the same requests; returns label -> SimResult. With
    `lookup_ms` or `probe_ms` > 0 the steps cost more than their passes, and auto decides on
    whole-step costs measured as it runs (as the server does); otherwise on the table
    (`controller_costs`, default: the true one). `scored_at_lookups`: see `simulate`."""
    out = {}
    table = controller_costs or costs
    measured = StepCosts(table) if lookup_ms > 0 or probe_ms > 0 else None
    auto = AutoPolicy(Controller(cfg, StepCosts(table) if measured else table),
                      PROBE_MAX if probe_max is None else probe_max, measured)
    for pol in fixed_policies(cfg.max_chain, cfg.tree_width) + [auto]:
        out[pol.label] = simulate(requests, pol, costs, bs, cfg.shape, cfg.max_chain,
                                  cfg.tree_width, regime_of_step, lookup_ms, probe_ms,
                                  scored_at_lookups)
    return out


def summarize(results: dict) -> dict:
    none = results[NONE].tokens_per_s
    fixed = {k: v for k, v in results.items() if k != "auto"}
    best = max(fixed, key=lambda k: fixed[k].tokens_per_s)
    auto = results["auto"]
    mix: dict = {}
    for o in auto.options:
        mix[o] = mix.get(o, 0) + 1
    return {
        "tokens_per_s": {k: round(v.tokens_per_s, 2) for k, v in results.items()},
        "best_fixed": best,
        "auto_vs_none": round(auto.tokens_per_s / none, 4),
        "auto_vs_best_fixed": round(auto.tokens_per_s / fixed[best].tokens_per_s, 4),
        "auto_option_steps": dict(sorted(mix.items(), key=lambda kv: -kv[1])),
        "auto_lookup_steps": auto.lookups,
        "auto_probe_steps": auto.probes,
    }


def regime_rates(requests: Sequence[SimRequest], regime: int, costs: CostTable, bs: int,
                 cfg: AutoConfig) -> dict:
    """True expected rate (tokens per ms) of every option for a batch of `bs` under `regime`,
    from the trace's own mean acceptance over all positions (what a controller with perfect
    knowledge would use)."""
    from fastverify.controller import evaluate
    ch = [a for r in requests for a in r.regimes[regime][1]]
    tr = [a for r in requests for a in r.regimes[regime][2]]
    out = {}
    for o in options_for(cfg.max_chain, cfg.tree_width, cfg.chain_widths):
        g = 0.0 if o.kind == NONE else (sum(min(a, o.k) for a in ch) / len(ch) if o.kind == CHAIN
                                          else sum(tr) / len(tr))
        out[o.label] = evaluate(o, costs, [g] * bs, cfg.shape).rate
    return out


def follow_steps(res: SimResult, start: int, end: int, rates_for: Callable[[int], dict],
                 tol: float = 0.15):
    """Steps after `start` from which every chosen option (until `end`) has a true expected rate
    within `tol` of the best option's; None if the last step of the window is still off."""
    last_bad = None
    for s in range(start, end):
        rates = rates_for(res.batch[s])
        if rates[res.options[s]] < (1.0 - tol) * max(rates.values()):
            last_bad = s
    if last_bad is None:
        return 0
    return None if last_bad == end - 1 else last_bad + 1 - start


def switching_run(costs: CostTable, bs: int, cfg: AutoConfig, period: int = 200,
                  p_high: float = 0.85,
                  length: int = 1024, seed: int = 0, tol: float = 0.15, lookup_ms: float = 0.0,
                  probe_max: Optional[int] = None, probe_ms: float = 0.0) -> tuple:
    """Acceptance switches between 0 and `p_high` every `period` steps (every position matches, so
    the features cannot tell). Returns (results, follow steps per switch that has a full window)."""
    reqs = synthetic_requests(2 * bs + 2, length, (0.0, p_high), cfg.max_chain, cfg.tree_width,
                              match_rate=1.0, seed=seed)
    res = run_all(reqs, costs, bs, cfg, regime_of_step=lambda s: (s // period) % 2,
                  lookup_ms=lookup_ms, probe_max=probe_max, probe_ms=probe_ms)
    auto = res["auto"]
    cache: dict = {}

    def rates_for(regime):
        def get(b):
            if (regime, b) not in cache:
                cache[(regime, b)] = regime_rates(reqs, regime, costs, b, cfg)
            return cache[(regime, b)]
        return get
    follow = []
    for s0 in range(period, len(auto.options) - period + 1, period):
        if auto.batch[s0 + period - 1] != bs:  # only windows with a full batch (no draining tail)
            break
        follow.append(follow_steps(auto, s0, s0 + period, rates_for((s0 // period) % 2), tol))
    return res, follow


def after_load_requests(n: int, length: int, max_chain: int = 7, match_rate: float = 0.05,
                        seed: int = 1,
                        prefix: str = "b", unsure_first: bool = True,
                        sampled: bool = False) -> list:
    """A second load on the prompts of a repetitive one, now sampled: at its first position each
    request's lookup matches in full (the corpus holds the first load's continuation of the same
    prompt) and later only now and then, with short matches; nothing is ever accepted (the sampled
    output diverges at once). `unsure_first`: the first position's lookup behind the prefill's token
    finds the corpus unsure of that token (the prompt's end was followed by more than one
    continuation), as the GPU runs' step traces show for the first decode steps of such a load.
    `sampled`: the requests say they sample (`SimRequest.sampled`, and their drafts' features), as
    the server's requests at temperature 1 do; else they pass for greedy ones."""
    rng = random.Random(seed)
    reqs = []
    for r in range(n):
        feats = [DraftFeatures(max_chain, 1, sampled)]
        for _ in range(length - 1):
            feats.append(DraftFeatures(rng.randint(1, 3), 1, sampled) if rng.random() < match_rate
                         else DraftFeatures(0, 0, sampled))
        reqs.append(SimRequest(f"{prefix}{r}", [(feats, [0] * length, [0] * length)],
                               frozenset({0}) if unsure_first else frozenset(), sampled))
    return reqs


def window_rate(res: SimResult, start: int) -> float:
    """Tokens per second over the steps from `start` on."""
    ms = sum(res.step_ms[start:])
    return sum(res.step_tokens[start:]) / ms * 1000.0 if ms else 0.0


def load_switch_run(costs: CostTable, bs: int, cfg: AutoConfig, n_per_load: int = 8,
                    length: int = 200, p_high: float = 0.85, seed: int = 0, lookup_ms: float = 0.0,
                    probe_max: Optional[int] = None, unsure_first: bool = True,
                    sampled: bool = False, probe_ms: float = 0.0) -> tuple:
    """A repetitive load (acceptance `p_high`), then a non-repetitive one of new requests whose
    first lookups still match in full (`after_load_requests`; `sampled`: requests that say they
    sample), on one controller. Returns (results, a summary of the second load alone: auto's and no
    speculation's tokens/s from the step after the last request of the first load finished, and the
    lookups auto paid for there)."""
    first = synthetic_requests(n_per_load, length, (p_high,), cfg.max_chain,
                               cfg.tree_width, seed=seed)
    second = after_load_requests(n_per_load, length, cfg.max_chain, seed=seed + 1,
                                 unsure_first=unsure_first, sampled=sampled)
    res = run_all(first + second, costs, bs, cfg, lookup_ms=lookup_ms, probe_max=probe_max,
                  probe_ms=probe_ms)

    def start(r: SimResult) -> int:
        return max(r.finished[q.rid] for q in first) + 1
    auto, none = res["auto"], res[NONE]
    a0 = start(auto)
    after = {"auto_vs_none": round(window_rate(auto, a0) / window_rate(none, start(none)), 4),
             "auto_lookups": sum(auto.step_lookups[a0:]), "steps": len(auto.step_ms) - a0,
             "auto_probes": auto.probe_steps(a0)}
    return res, after


# ---------------------------------------------------------------------------------------- scenarios
SCENARIOS = {"zero": (0.0,), "low": (0.3,), "high": (0.85,)}


def _quiet(msg: str) -> None:
    pass


def _progress(total: int, say: Callable[[str], None]) -> Callable[[Optional[str]], None]:
    """done(label) before each of `total` scenarios, done(None) at the end: one line per scenario
    through `say`, with the elapsed time and, once one scenario finished, the time left at the
    mean pace so far."""
    import time
    t0 = time.monotonic()
    state = {"n": 0}

    def done(label):
        n, el = state["n"], time.monotonic() - t0
        if label is None:
            say(f"{total}/{total} scenarios in {el:.0f} s")
            return
        eta = f", ~{el / n * (total - n):.0f} s left" if n else ""
        say(f"{n + 1}/{total} {label} ({el:.0f} s{eta})")
        state["n"] = n + 1
    return done


def scenario_report(batch_sizes=(1, 8, 64), tables=COST_TABLES, n_requests=48, length=256, seed=0,
                    cfg: Optional[AutoConfig] = None, replay: bool = False,
                    switch_period: int = 200,
                    lookup_ms: float = 0.0, probe_max: Optional[int] = None, probe_ms: float = 0.0,
                    progress: Callable[[str], None] = _quiet) -> dict:
    """Every scenario on every table and batch size. `progress(line)`: told before each
    scenario (the CLI prints it to stderr)."""
    cfg = cfg or AutoConfig()
    rows = []
    replayed = None
    if replay:  # before the clock of the scenarios starts: the corpus' start-up is no scenario's
        progress("replaying the default trace through SGLang's n-gram corpus (its start-up: ~15 s, "
                 "the first run compiles it: ~1 min)")
        replayed = replay_requests(max_chain=cfg.max_chain, tree_width=cfg.tree_width)
    done = _progress(len(tables) * len(batch_sizes) * (len(SCENARIOS) + 3 + bool(replay)), progress)
    for table in tables:
        costs = cost_table(table)
        for bs in batch_sizes:
            for name, ps in SCENARIOS.items():
                done(f"{table} bs {bs} synthetic-{name}")
                reqs = synthetic_requests(n_requests, length, ps, cfg.max_chain,
                                          cfg.tree_width, seed=seed)
                rows.append({"table": table, "bs": bs, "trace": f"synthetic-{name}", **summarize(
                    run_all(reqs, costs, bs, cfg, lookup_ms=lookup_ms, probe_max=probe_max,
                            probe_ms=probe_ms))})
            done(f"{table} bs {bs} switch")
            res, follow = switching_run(costs, bs, cfg, switch_period, seed=seed,
                                        lookup_ms=lookup_ms, probe_max=probe_max, probe_ms=probe_ms)
            rows.append({"table": table, "bs": bs, "trace": f"switch-0/0.85-every-{switch_period}",
                         "follow_steps": follow, "follow_bound": follow_bound_steps(cfg),
                         **summarize(res)})
            done(f"{table} bs {bs} load switch")
            res, after = load_switch_run(costs, bs, cfg, max(n_requests // 2, bs),
                                         length, seed=seed,
                                         lookup_ms=lookup_ms, probe_max=probe_max,
                                         probe_ms=probe_ms)
            rows.append({"table": table, "bs": bs, "trace": "load-0.85-then-sampled",
                         "after_switch": after, **summarize(res)})
            # the same, its requests saying they sample (the server's
            # requests at temperature > 0 do)
            done(f"{table} bs {bs} load switch, told")
            res, after = load_switch_run(costs, bs, cfg, max(n_requests // 2, bs),
                                         length, seed=seed,
                                         lookup_ms=lookup_ms, probe_max=probe_max,
                                         probe_ms=probe_ms, sampled=True)
            rows.append({"table": table, "bs": bs, "trace": "load-0.85-then-sampled-told",
                         "after_switch": after, **summarize(res)})
            if replayed is not None:
                done(f"{table} bs {bs} replay-default")
                rows.append({"table": table, "bs": bs, "trace": "replay-default", **summarize(
                    run_all(replayed, costs, bs, cfg, lookup_ms=lookup_ms, probe_max=probe_max,
                            probe_ms=probe_ms))})
    done(None)
    return {"config": cfg.__dict__, "rows": rows, "lookup_ms": lookup_ms, "probe_ms": probe_ms,
            "probe_max": PROBE_MAX if probe_max is None else probe_max,
            "cost_tables": {t: cost_table(t).to_json() for t in tables}}


def format_rows(rows) -> str:
    head = f"{'table':<16} {'bs':>3} {'trace':<28} {'none':>8} {'best fixed':>18} {'auto':>8} " \
           f"{'auto/none':>9} {'auto/best':>9}  auto options (steps)"
    lines = [head, "-" * len(head)]
    for r in rows:
        tps = r["tokens_per_s"]
        best = f"{r['best_fixed']} {tps[r['best_fixed']]:.1f}"
        mix = ", ".join(f"{k}:{v}" for k, v in list(r["auto_option_steps"].items())[:3])
        extra = (f"  follow {r['follow_steps']} (bound {r['follow_bound']})"
                 if "follow_steps" in r else "")
        if "after_switch" in r:
            a = r["after_switch"]
            extra += (f"  second load: {a['auto_vs_none']:.3f}x none, {a['auto_lookups']} lookups, "
                      f"{a['auto_probes']} probes in {a['steps']} steps")
        lines.append(f"{r['table']:<16} {r['bs']:>3} {r['trace']:<28} {tps['none']:>8.1f} "
                     f"{best:>18} {tps['auto']:>8.1f} {r['auto_vs_none']:>9.3f} "
                     f"{r['auto_vs_best_fixed']:>9.3f}  {mix}{extra}")
    return "\n".join(lines)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("sim", help="simulate auto verify control against fixed modes (CPU)")
    _fill_parser(p)
    p.set_defaults(func=run_cli)
    return p


def _fill_parser(p):
    p.add_argument("--batch-sizes", type=int_list("--batch-sizes", minimum=1), default=[1, 8, 64],
                   help="comma-separated concurrent requests (default 1,8,64)")
    p.add_argument("--tables", default=",".join(COST_TABLES),
                   help=f"comma-separated cost tables: {', '.join(ALL_TABLES)}, a cost table "
                        "file as --speculative-ngram-auto-cost-table reads it (decode_ms, "
                        "verify_ms), or pass-cost profiles "
                        "(a built-in name, a profile file, a `fastverify bench allreduce --json` "
                        "result[#backend])")
    p.add_argument("--requests", type=int, default=48, help="requests per load (>= 1)")
    p.add_argument("--length", type=int, default=256, help="tokens per synthetic request (>= 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replay", action="store_true",
                   help="also the replayed default trace (builds the corpus)")
    p.add_argument("--lookup-ms", type=float, default=0.0,
                   help="host time a step that looks drafts up costs on top of its pass (default "
                        "0); 1.8 on the 2x H200 with the 24-layer dummy model (h200-dummy24)")
    p.add_argument("--probe-ms", type=float, default=0.0,
                   help="host time a probe adds to its step where the host has less time to spare "
                        "(default 0); ~0.8 at batch size 4 on the 2x H200 with the 24-layer dummy "
                        "model, ~0 at batch size 1")
    p.add_argument("--probe-max", type=int, default=None,
                   help="auto's longest gap between probe lookups without speculation (the "
                        f"server's: {PROBE_MAX})")
    p.add_argument("--json", help="write the report here")


def run_cli(args, argv=None) -> int:
    bss = tuple(args.batch_sizes)
    tables = tuple(t for t in args.tables.split(",") if t)
    for t in tables:
        try:
            cost_table(t)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if (args.lookup_ms < 0 or args.probe_ms < 0 or args.requests < 1 or args.length < 1
            or (args.probe_max is not None and args.probe_max < 1)):
        print("--lookup-ms and --probe-ms must be >= 0, --requests, --length and --probe-max >= 1",
              file=sys.stderr)
        return 2
    rep = scenario_report(bss, tables, args.requests, args.length, args.seed, replay=args.replay,
                          lookup_ms=args.lookup_ms, probe_max=args.probe_max,
                          probe_ms=args.probe_ms,
                          progress=lambda line: print(f"[sim] {line}", file=sys.stderr, flush=True))
    rep["repro_command"] = ("python -m fastverify.sim "
                            + " ".join(argv if argv is not None else sys.argv[1:]))
    print("# fastverify.sim: simulated decode loop, real controller; config "
          f"{json.dumps(rep['config'])}; lookup step +{rep['lookup_ms']} ms; probe step "
          f"+{rep['probe_ms']} ms; probe gap up to {rep['probe_max']} steps")
    for t, tab in rep["cost_tables"].items():
        print(f"# cost table {t} (ms): " + ", ".join(f"{k}:{v:.2f}"
                                                     for k, v in tab["verify_ms"].items()))
    print(format_rows(rep["rows"]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rep, f, indent=1)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastverify.sim", description=__doc__.split("\n")[0])
    _fill_parser(p)
    args = p.parse_args(argv)
    return run_cli(args, argv)


if __name__ == "__main__":
    raise SystemExit(main())
