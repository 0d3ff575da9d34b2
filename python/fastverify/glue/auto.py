"""Auto verify control glue: what patch 0007-ngram-verify-auto calls from SGLang's n-gram worker.

`--speculative-ngram-verify-mode auto` verifies like chain mode (one path, causal
attention, no mask; patch
0005) on the verify widths captured by patch 0008
      (`--speculative-ngram-verify-widths`, which must include 1:
width 1 is the step without speculation). Each decode step fastverify.controller picks the width
(none, or a chain of k = width - 1) with the highest expected tokens/s from a measured cost table
and the online gain model, and gates requests whose own expected gain is below one to no draft.

Seams (both pinned SGLang versions; the patch holds the exact hunks):
    server args / arg_groups            "auto" for --speculative-ngram-verify-mode;
                                        --speculative-ngram-auto-cost-table,
                                        --speculative-ngram-auto-hysteresis
    speculative_hook._handle_ngram      validate_server_args(args): flag checks before any process
                                        starts
    NGRAMWorker.init_cuda_graphs        setup(worker): after 0008 built the runtimes per width:
                                        the plain decode runtime (DECODE graphs), then the cost
                                        table (file, or calibration by replaying the captured
                                        decode and verify graphs)
    NGRAMWorker.forward_batch_generation
                                        plain_step(worker, batch, on_publish[, pp_proxy_tensors]):
                                        first in the step; measures the last step's period and,
                                        when no speculation is expected to pay, runs this step as
                                        a plain decode step (a probe's drafts looked up behind
                                        first) and returns its result
    NGRAMWorker._prepare_for_speculative_decoding
                                        drafts_behind(worker, batch) or the worker's own lookup:
                                        the drafts plain_step looked up behind the token in
                                        flight; step_drafts(worker, batch, tokens, mask, bs) after
                                        the lookup: decide, gate, truncate, select the width's
                                        runtime (0008's finish_step puts k back);
                                        fill_roots(worker, batch, draft_tokens) after the drafts'
                                        copy: the roots of drafts looked up behind

Auto verifies chains, so 0005's seams treat it as chain mode (its overrides, the chain reduction,
mask-free capture dummies): fastverify.glue.config gives both modes the chain shape.

Every TP rank must pick the same width each step (the pass holds collectives): the gain model
sees the same requests and tokens on every rank, and the cost table is the file's or rank 0's
calibration, broadcast. The measured step periods differ slightly between ranks, so they are
rank 0's: each rank measures, and rank 0's medians are broadcast every
`AutoConfig.cost_sync_steps` steps (a step count, the same on every rank); between two
broadcasts the controller uses the last broadcast costs.

A step without speculation (kind LEAN in the cost model): it needs neither the corpus lookup nor the
draft bookkeeping nor the blocking copy of the last accepted tokens, and SGLang's verify path at
width 1 still costs more than its plain decode step (on the 2x H200 with a 2-layer model 3.9 ms
against 2.2 ms: verify sampling, target-verify metadata, the KV move). So it runs as SGLang's plain
decode step inside the n-gram worker: each request's last accepted token (gathered on the device
from the previous step's accept tokens) is decoded with DECODE graphs captured once more at start-up
while the model runner reads as not speculative, and sampled by the plain sampler; the result is
shaped as a verify step that accepted no draft, and the corpus still receives the request's tokens
(as in SGLang's own non-overlap path, without the tokens of the step in flight). Without
speculation, drafts are still looked up after 1, 2, 4, ... up to `AutoConfig.probe_max` steps (back
to 1 when a request joins or speculation is chosen), so the gain model keeps learning from real
drafts and output that starts to repeat is noticed within a few steps; where a probe is measured to
lengthen its step (the host has less time to spare than the lookup takes), probes are spread to a
budget of that cost, never beyond `probe_max` steps apart, or for requests whose own drafts were
scored never beyond the gap that keeps those forced probes within `AutoConfig.probe_floor_share`
of the plain steps' time (`Controller.probe_cost`, `AutoConfig.probe_budget`,
`Controller.forced_probe_gap`). After a step that gave every request one token (a plain step, or the
prefill of requests that all just joined) a lookup does not wait for the step in flight
(`lookup_behind`): the host lacks at most that token, the corpus guesses it and is asked again past
the guess (`chains_past_the_token_in_flight`), the controller decides on those drafts at once, and a
step that speculates verifies them with each root written on the device (`fill_roots`); where the
corpus is unsure of the token in flight and drafts of the load pay, the worker looks up for real
instead. A probe whose drafts could not pay even if they matched in full is looked up on the host's
tokens after the plain step was launched and before its corpus put (`probe_behind`: the GPU decodes
meanwhile), scored later, and the step stays plain; after a step that speculated, a probe that could
pay is a real lookup, and a lookup step that then verifies nothing runs at width 1. In overlap mode,
the first lookup of requests that just joined waits where it could only be such a probe
(`Controller.defer_first_lookup`): the step launched right after their prefill delays their first
token, the scheduler processing the prefill's result only after that launch. No such probe is made
in the `REFILL_STEPS` decode steps after any prefill (`Controller.plan_lookup`'s ``refill``): their
host work is not hidden behind the GPU's while the pipeline refills (measured on the 2x
H200: those three steps ~1 ms longer each in auto than in the plain server, a
probe's lookup 0.3-0.6 ms).
"""
from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from fastverify.chain import reduce_to_chain, root_choices
from fastverify.controller import NONE, PLAN_PROBE, Controller, RequestView
from fastverify.costs import (LEAN, PATH, PROBE, SPEC, CostTable, CostTableError, StepCosts,
                              calibrate, load_cost_table, steady_period)
from fastverify.gains import DraftFeatures, ShadowTracker
from fastverify.glue.config import MODE_FLAG, WIDTHS_FLAG, verify_config
# (at the module's import, not in the functions a verify step calls: a from-import there costs
# ~1 us a step on this project's CPU and several on the GPU machines' hosts)
from fastverify.glue.verify_runtime import select_runtime
from fastverify.widths import choose_width, truncate_drafts

logger = logging.getLogger("fastverify.auto")

COSTS_FLAG = "--speculative-ngram-auto-cost-table"
HYST_FLAG = "--speculative-ngram-auto-hysteresis"
HELP_COST_TABLE = (
    "JSON cost table for --speculative-ngram-verify-mode auto: {\"decode_ms\": {bs: ms}, "
    "\"verify_ms\": {tokens in the pass: ms}} (or a microbenchmark JSON carrying it under "
    "\"cost_table\"). Default: measured at start-up by replaying the captured verify graphs of "
    "every width (sglang-fastverify).")
HELP_HYSTERESIS = (
    "Auto verify keeps its current choice unless another is expected to be this much faster "
    "(relative), 0 <= h < 0.5 (sglang-fastverify).")
CALIBRATION_BS = (1, 2, 4, 8, 16, 32, 64, 128)
CALIBRATION_REPEATS = 5
CALIBRATION_WARMUP = 2
# decode steps after a prefill whose host work is exposed (2x H200: the steps prefill + 1..3
REFILL_STEPS = 3
# ran 0.6-1.3 ms longer each in auto than in the plain server)


def validate_server_args(spec):
    """Launcher-side checks (raise ValueError naming the flag); loads the cost table file if one is
    given. Returns the AutoConfig (None unless the mode is auto)."""
    cfg = verify_config(spec)
    if cfg.auto is None:
        if cfg.cost_table:
            raise ValueError(f"{COSTS_FLAG} needs {MODE_FLAG} auto")
        return None
    if cfg.watermark:
        raise ValueError(f"{MODE_FLAG} auto cannot be combined with --enable-watermark; use tree")
    if cfg.cost_table:
        load_cost_table(cfg.cost_table, COSTS_FLAG)
    return cfg.auto


class Behind(NamedTuple):
    """Drafts `plain_step` looked up behind the step in flight and chose to verify."""

    tokens: object  # chain-format [bs*k]
    mask: object
    decision: object  # the controller's Decision on them
    lens: object  # [bs] real chain tokens per request
    in_flight: bool  # some request's root is the token in flight (`fill_roots` writes it)


@dataclass
class AutoState:
    controller: Controller
    shadow: ShadowTracker
    k: int
    prev_rids: frozenset = frozenset()
    gauges: dict = None
    metrics_every: int = 40
    costs: StepCosts = None  # this rank's measurements
    features: dict = field(default_factory=dict)  # rid -> DraftFeatures of its last draft
    views: dict = field(default_factory=dict)  # rid -> its RequestView on those features (`view`)
    last_start: float = None  # host clock at the start of the previous decode step
    last_step: tuple = None  # (kind, bs, width) of the previous decode step
    step_before: tuple = None  # and of the one before it (`costs.steady_period`)
    # the previous decode step was a plain one (every accept length in the batch is 1)
    lean_before: bool = False
    synced: bool = False  # this step's requests were already advanced by plain_step
    steps: int = 0
    # callable(StepCosts) -> rank 0's, called at the same step on every rank; None: one rank
    sync_costs: object = None
    clock: object = time.perf_counter
    plain: object = None  # the plain decode runtime (verify_runtime.build_plain_runtime)
    behind: Behind = None  # drafts looked up behind the step in flight, to verify this step
    last_batch_rids: frozenset = frozenset()  # requests of the last forward launched (any mode)
    # requests of the forward before this one: its tokens not on the host
    in_flight_rids: frozenset = frozenset()
    # decode steps since the last prefill forward (this one counted)
    since_prefill: int = REFILL_STEPS + 1
    # requests of the prefill forwards since the last decode step (several where requests arrived
    # one after another before the first decode step: `plain_path._after_prefill`)
    prefill_rids: frozenset = frozenset()
    # the server's own decode path for stretches without speculation (glue.plain_path): whether
    # the server's settings allow it (None: not asked yet), the steps run on it in this stretch
    # and the most it was to run
    path_ok: bool = None
    stretch: int = 0
    stretch_len: int = 0
    # of the stretch's steps: those the controller has counted (`Controller.note_plain_path`, or
    # this step's lean or probe count) and those whose output the corpus was given
    noted: int = 0
    put: int = 0
    path_bs: int = 0  # the batch size of the stretch's last step
    # the requests of the stretch's last step (None before its first): those that leave the batch
    # on the path (they finished) give the corpus their output since the last put
    path_reqs: list = None
    # (host clock, batch size, stretch step) at the start of the plain path's step being timed
    path_timing: tuple = None
    # this step on the plain path probes (looks drafts up behind its forward: `plain_path.step`)
    probe_now: bool = False
    # the forward launched last gave every request one token without speculation (the worker's
    # plain step or the plain path's)
    last_forward_plain: bool = False
    info_type: object = None  # the server's speculative input class (taken from a batch)
    spec_algorithm: object = None  # the server's algorithm (taken from a batch)
    future_map: object = None  # the scheduler's (its token buffer holds the plain path's tokens)
    books_warned: bool = False
    path_logged_at: float = None  # host clock of the last log line on the stretches
    path_refusals: Counter = field(default_factory=Counter)  # why -> steps that started no stretch
    path_begun: Counter = field(default_factory=Counter)  # what came before -> stretches begun so
    path_ended: Counter = field(default_factory=Counter)  # why -> stretches ended so
    # the controller's step at the last broadcast of the costs made at a probe on the plain path
    path_synced_at: int = None
    # a stretch's last output, held back by plain_path.leave: put once the worker's step that
    # follows has looked up (plain_path.put_pending)
    pending_put: list = None


def setup(worker, spec=None, observability=None, plain=None):
    """Once per worker, after the verify runtimes per width exist. None unless the mode is auto.

    Builds the plain decode runtime (DECODE graphs; ``plain``: one built already) and then,
    without a cost table file, calibrates: the plain graphs give the decode costs, the verify graphs
    of every width the rest."""
    spec = spec if spec is not None else _spec_of(worker)
    flags = verify_config(spec)
    cfg = flags.auto
    if cfg is None:
        worker._fv_auto = None
        return None
    obs = observability if observability is not None else spec
    if plain is None:
        from fastverify.glue.verify_runtime import build_plain_runtime

        plain = build_plain_runtime(worker)
    costs = (load_cost_table(flags.cost_table, COSTS_FLAG) if flags.cost_table
             else _broadcast_from_first_rank(calibrate_worker(worker, plain=plain)))
    logger.info("auto verify: widths %s, cost table %s: decode %s ms, verify %s ms",
                (1,) + cfg.chain_widths, costs.source, costs.decode, costs.verify)
    step_costs = StepCosts(costs)
    ctl = Controller(cfg, step_costs, log=log_record)
    state = AutoState(ctl, ShadowTracker(), cfg.max_chain + 1,
                      gauges=_make_gauges() if getattr(obs, "enable_metrics", False) else None,
                      metrics_every=max(int(getattr(obs, "decode_log_interval", 40) or 40), 1),
                      costs=StepCosts(costs), sync_costs=_tp_broadcaster(), plain=plain)
    worker._fv_auto = state
    return state


def log_record(rec: dict) -> None:
    """The controller's log records: "auto verify request {...}" for a request whose drafts were
    verified, as it finishes (`Controller.finish`; lab/gpu/evaluate.py sums these lines), "auto
    verify decision {...}" for a sampled decision."""
    logger.info("auto verify %s %s", "request" if "request" in rec else "decision", rec)


def _tick(state: AutoState) -> None:
    """Start of a decode step of the worker's: the previous step's period goes to the cost model
    where the step before it was of its class (`costs.steady_period`: under overlap scheduling a
    period at a change of class measures the other step); rank 0's model is shared. (A step on the
    server's own decode path is timed apart, one in `plain_path.TIME_EVERY`: `plain_path._time`.)"""
    now = state.clock()
    state.lean_before = state.last_step is not None and state.last_step[0] in (LEAN, PROBE, PATH)
    if (state.last_start is not None and state.last_step is not None
            and steady_period(state.step_before, state.last_step)):
        kind, bs, width = state.last_step
        state.costs.record(kind, bs, width, 1000.0 * (now - state.last_start))
    # after a prefill (no start recorded) this step's period holds the prefill's device time under
    # overlap: the next period is not kept either
    state.step_before = state.last_step if state.last_start is not None else None
    state.last_start, state.last_step = now, None
    state.steps += 1
    if state.steps % state.controller.cfg.cost_sync_steps == 0:
        # a frozen copy: the live measurements keep changing on each rank between two
        # synchronisations, and a controller that read them directly would decide differently on
        # different ranks (and hang the TP group in mismatched collectives)
        shared = state.sync_costs(state.costs) if state.sync_costs else state.costs
        state.controller.costs = shared.snapshot()


def not_a_decode_step(state: AutoState) -> None:
    """A forward that is no decode step (a prefill): the period from the last decode step's start
    to the next one's holds this forward too, so it is not recorded as that step's cost (it made
    steps without speculation look dearer than they are, every time requests joined)."""
    state.since_prefill = 0
    state.last_start = None
    state.path_timing = None  # nor is the period of a step on the plain path (a chunk of a prefill
    # runs between two steps of a stretch without changing its batch)
    state.controller.excursion_void()  # no measure of what leaving the plain path costs


def samples(req) -> bool:
    """Whether a request samples rather than decoding greedily, as SGLang's batch sampling info
    tells them apart: its parameters turn temperature 0 into top_k 1, and top_k <= 1 decodes
    greedily. A request without sampling parameters counts as greedy."""
    top_k = getattr(getattr(req, "sampling_params", None), "top_k", None)
    return top_k is not None and top_k > 1


def view(state: AutoState, rid) -> RequestView:
    """The controller's view of a request on its last known features (`AutoState.features`): the
    same instance while they are the same (a steady load asks with it twice a step)."""
    f = state.features[rid]
    v = state.views.get(rid)
    if v is None or v.features is not f:
        v = state.views[rid] = RequestView(rid, f)
    return v


def _sync_requests(state: AutoState, batch) -> None:
    """Requests that left the batch are forgotten, requests that joined are noted as
    sampling or greedy (the gain model learns them apart); drafts whose outcome the output
    now shows are scored."""
    ctl, shadow = state.controller, state.shadow
    now = frozenset(req.rid for req in batch.reqs)
    prev = state.prev_rids
    if now != prev:
        for rid in prev - now:
            ctl.finish(rid)
            shadow.drop(rid)
            state.features.pop(rid, None)
            state.views.pop(rid, None)
        state.prev_rids = now
    advance, observe, note_verified = shadow.advance_tagged, ctl.observe, ctl.note_verified
    for req in batch.reqs:
        rid = req.rid
        if rid not in prev:
            ctl.note_sampling(rid, samples(req))
        for f, ca, _, verified in advance(rid, req.output_ids):
            observe(rid, f, ca)
            if verified is not None:  # (expected, verified draft tokens): calibration
                note_verified(verified[0], min(ca, verified[1]), rid)


def plain_step(worker, batch, on_publish=None, pp_proxy_tensors=None):
    """At the start of the n-gram worker's step. None: the step speculates (or is not a decode
    step): the worker goes on with its lookup (or takes the drafts already looked up behind:
    `drafts_behind`), then step_drafts. Otherwise the step was chosen to verify nothing and has run
    as a plain decode step; returns its result (what the worker's own step returns, one token per
    request). Always None unless the mode is auto."""
    state: AutoState = getattr(worker, "_fv_auto", None)
    if state is None:
        return None
    # (a batch on the server's own decode path never gets here: glue.plain_path.worker_step runs
    # it first in the worker's step)
    state.last_forward_plain = False
    if state.future_map is not None:
        from fastverify.glue import plain_path

        plain_path.fill_roots(worker, batch, state)  # the first step after a stretch
    # the requests of the forward launched before this one (prefill or decode): its
    # result is not processed yet
    state.in_flight_rids, state.last_batch_rids = (state.last_batch_rids,
                                                   frozenset(r.rid for r in batch.reqs))
    if not batch.forward_mode.is_decode():
        # (a prefill right after a prefill: their requests together, as SGLang merges them)
        state.prefill_rids = (state.prefill_rids if state.since_prefill == 0
                              else frozenset()) | state.last_batch_rids
        not_a_decode_step(state)
        return None
    state.since_prefill += 1
    _tick(state)
    _sync_requests(state, batch)
    state.synced = True
    state.behind = None
    ctl = state.controller
    bs = len(batch.reqs)
    fresh = [req.rid not in state.features for req in batch.reqs]
    if any(fresh):
        ctl.reset_probe()
    if not _plain_capable(state, batch, pp_proxy_tensors):
        return None
    # every request's last step gave it one token (a plain step, or the prefill of a request
    # that joined): the host lacks at most that token, so drafts can be looked up without
    # waiting for it and verified from it
    ones = state.lean_before or all(fresh)
    if any(fresh):
        # a request not looked up yet is looked up once (its match is unknown); without waiting
        # when every request's last step gave it one token, else for real unless a lookup step is
        # measured not to pay and even a full match would not be verified (then behind, as a
        # probe). A lookup behind that could only be a probe waits for the next step in overlap
        # mode, off the path of the new requests' first token (their features: no draft yet, so the
        # next step looks them up)
        rids = [req.rid for req in batch.reqs]
        if not ones and not ctl.first_lookup_behind(rids):
            return None
        look = not (ones and _host_behind(worker, batch) and ctl.defer_first_lookup(rids))
        if not look:
            for req, new in zip(batch.reqs, fresh):
                if new:
                    state.features[req.rid] = ctl.no_draft(req.rid)
        probe = not ones  # first_lookup_behind allowed a probe
    else:
        views = [view(state, req.rid) for req in batch.reqs]
        look = ctl.plan_lookup(views, ctl.cfg.probe_max,
                               behind=ones, refill=state.since_prefill <= REFILL_STEPS)
        probe = look and ctl.planned == PLAN_PROBE
        if look and not ones and not probe:
            # speculation is expected to pay: look drafts up (waiting for
            # the step in flight), verify
            return None
    d = None
    # a probe's drafts are only scored (even full matches would not be verified): looked up after
    # this step's launch, while the GPU decodes, instead of delaying it
    if look and ones and not probe:
        found = lookup_behind(worker, state, batch)
        if found is None:
            return None  # looked up for real by the worker (step_drafts decides)
        tokens, mask, in_flight, lens, views = found
        d = ctl.decide(views, behind=True)
        if d.option.kind != NONE and any(d.speculate):
            worker._fv.expect(lens)  # the verify accounting of the worker's own lookups
            # the worker verifies them: drafts_behind, step_drafts
            state.behind = Behind(tokens, mask, d, lens, in_flight)
            state.synced = False
            return None
    # its result reaches the verify accounting as a step without drafts
    worker._fv.expect_no_drafts(bs)
    probed = []
    # a probe is looked up on the host's tokens before this step's corpus put (whose insert the
    # lookup would wait for; it adds only the n-grams that end at each request's last token, none of
    # them a continuation of the context asked about), scored later; the step stays plain
    hook = (lambda: probed.append(probe_behind(worker, state, batch))) if probe else None
    result = run_plain_decode(worker, batch, state.plain, state.k, on_publish, roots_first=ones,
                              before_put=hook)
    if state.pending_put is not None:  # (after this step's lookups, if any)
        from fastverify.glue.plain_path import put_pending

        put_pending(worker, state)
    if probe:
        d = ctl.note_probe(probed[0])
    d = d if d is not None else ctl.note_lean(bs)
    # a probe's period measures what it adds (probe_cost)
    state.last_step = (PROBE if probe else LEAN, bs, 1)
    state.last_forward_plain = True
    state.synced = False
    _export(state, d)
    return result


def _host_contexts(worker, batch, guesses=None) -> tuple:
    """(request ids, contexts, total lengths) of SGLang's own corpus query on the tokens the host
    has: per request the last max_trie_depth tokens of prompt + output and the total length, built
    from the prompt's tail only (0.5.16's worker copies each whole prompt every step); ``guesses``
    (per request a token or None) extends a request's context by that token."""
    depth = int(worker.max_trie_depth)
    req_ids, contexts, totals = [], [], []
    for i, req in enumerate(batch.reqs):
        prompt = getattr(req, "origin_input_ids_unpadded", None)
        prompt = req.origin_input_ids if prompt is None else prompt
        out = list(req.output_ids[-depth:])
        extra = [] if guesses is None or guesses[i] is None else [guesses[i]]
        contexts.append(worker._efficient_concat_last_n(list(prompt[-depth:]), out + extra, depth))
        req_ids.append(req.rid)
        totals.append(len(prompt) + len(req.output_ids) + len(extra))
    return req_ids, contexts, totals


def _corpus_behind(worker, batch, guesses=None):
    """The corpus asked on the tokens the host has (`_host_contexts`), one step behind in overlap
    mode, so no device-to-host copy has to finish first. Returns the corpus' raw (tokens, mask). The
    corpus' per-request match state advances from these contexts as from any lookup (it rebuilds
    itself when a context does not extend the last one)."""
    req_ids, contexts, totals = _host_contexts(worker, batch, guesses)
    worker.ngram_corpus.synchronize()
    return worker.ngram_corpus.batch_get(req_ids, contexts, totals)


def erase_departed(worker, batch) -> None:
    """The corpus' match state of each request looked up before (the set SGLang's own step keeps,
    ``_prev_decode_rids``) that is not in the batch is erased, and the batch's requests are the ones
    the next call compares with: a lookup (`batch_get`) makes a request's state, and only an erase
    frees it. At each step of the worker's without speculation and at each probe on the plain path
    (`plain_path._probe`; a request whose every decode step ran there is probed there only)."""
    rids = {req.rid for req in batch.reqs}
    departed = worker._prev_decode_rids - rids
    if departed:
        worker.ngram_corpus.erase_match_state(list(departed))
    worker._prev_decode_rids = rids


def corpus_put_host(worker, batch) -> None:
    """What SGLang's ``_update_ngram_corpus`` puts after a step without drafts (nothing carried from
    the step: the host's tokens), without copying whole prompts."""
    worker.ngram_corpus.batch_put(_host_contexts(worker, batch)[1])


def probe_behind(worker, state: AutoState, batch) -> list:
    """A probe's drafts, looked up behind the step in flight (the host's chains) and never verified:
    each request's chain is recorded for the shadow tracker (it predicts the output from position
    len(output_ids) on) and its features replace the request's last known ones. Returns the views
    with the new features."""
    lags = [0] * len(batch.reqs)  # drafts from the host's tokens as they are
    tokens, _mask, _unsure = chains_past_the_token_in_flight(worker, batch, state.k, lags)
    # where the host lacks a request's last token (overlap mode), the chain's first token guesses
    # it: a verify made now would have that token as its root and gain nothing from the guess, so
    # the draft is scored past it (`ShadowTracker.record`'s lead), as lookup_behind's drafts are
    leads = ([int(req.rid in state.in_flight_rids) for req in batch.reqs]
             if _host_behind(worker, batch) else lags)
    return _record_drafts(state, batch, tokens, lags, leads)[1]


def chains_past_the_token_in_flight(worker, batch, k: int, lags):
    """Chain drafts for the position after each request's last token, from the host's tokens.
    ``lags[i]`` is 1 where the host lacks request i's last token (it was produced by the forward
    still in flight) and 0 where it has it. With lag 0 the corpus' chain on the host's context is
    the draft. With lag 1 that chain guesses the token in flight (its first draft token g); where
    there is one, the corpus is asked again on the context extended by g, and that chain (root g,
    then up to k - 1 tokens) is the draft. Where g is not the token in flight, the drafts are merely
    wrong guesses, which the verify pass rejects (output is unchanged either way); a request without
    a guess gets no draft. The roots are placeholders until `fill_roots` writes each request's last
    token on the device. Returns chain-format (tokens [bs*k], mask, unsure [bs]: a guess among more
    than one next token the corpus offered)."""
    match_type = worker._fv.config.match_type
    raw, raw_mask = _corpus_behind(worker, batch)
    tokens, mask, lens = reduce_to_chain(raw, raw_mask, k, match_type)
    rows = np.asarray(tokens).reshape(-1, k)
    guesses = [int(rows[i, 1]) if lags[i] and lens[i] > 0 else None for i in range(rows.shape[0])]
    guessed = np.array([g is not None for g in guesses], dtype=bool)
    unsure = (root_choices(raw, raw_mask, k) > 1) & guessed if guessed.any() else guessed
    out = rows.copy()
    if guessed.any():
        again, mask2 = _corpus_behind(worker, batch, guesses)
        # the corpus keeps a match state per request that the next query extends by the
        # tokens its total length says were added; a guess may be wrong, so the state it
        # leaves must not be extended
        worker.ngram_corpus.erase_match_state([req.rid for req, g in zip(batch.reqs, guesses)
                                               if g is not None])
        again, mask, _ = reduce_to_chain(again, mask2, k, match_type)
        again = np.asarray(again).reshape(-1, k)
    for i, g in enumerate(guesses):
        if g is not None:
            out[i] = again[i]
        elif lags[i]:
            out[i, 1:] = 0  # nothing to guess the token in flight from: no draft
    return out.reshape(-1), mask, unsure


def lookup_behind(worker, state: AutoState, batch) -> tuple:
    """Drafts to verify this step, looked up without waiting for the step in flight: every request's
    last step gave it exactly one token (`plain_step`: ``ones``). The corpus is asked on the host's
    tokens (`_corpus_behind`) and its output reduced to chains as in the worker's chain hook. In
    overlap mode the host lacks that token where the forward still in flight produced it (the
    request took part in the forward launched last, `AutoState.in_flight_rids`; a request that
    joined in an earlier prefill has it): those chains continue past it
    (`chains_past_the_token_in_flight`, the roots written on the device by `fill_roots`) and are
    recorded at output position len(output_ids) + 1; the others are the worker's own lookup. The
    corpus learns nothing of the token in flight this step (as after a plain step). Returns (tokens
    [bs*k], mask, behind: the host lacked a token, real chain lengths [bs], views), or None,
    recording nothing, where the corpus offered more than one token in flight for a request and
    drafts that match in full are expected to pay (a wrong guess would waste a verify pass that a
    lookup after the token costs less than): the worker then looks up for real."""
    bs = len(batch.reqs)
    lags = [int(req.rid in state.in_flight_rids)
            for req in batch.reqs] if _host_behind(worker, batch) else [0] * bs
    tokens, mask, unsure = chains_past_the_token_in_flight(worker, batch, state.k, lags)
    if unsure.any() and state.controller._full_match_wanted([req.rid for req in batch.reqs]):
        # the corpus is unsure of a token in flight and drafts of this load
        # pay: look up for real (wait)
        return None
    worker.prev_token_ids = []
    worker.prev_accept_lens = [0] * bs
    lens, views = _record_drafts(state, batch, tokens, lags)
    return tokens, mask, any(lags), lens, views


def _host_behind(worker, batch) -> bool:
    """Does the host lack the step in flight's tokens (overlap mode: results are processed one step
    late; as in the worker's own lookup, a batch with grammars is processed at once)?"""
    return (bool(getattr(worker, "enable_overlap", False))
            and not getattr(batch, "has_grammar", False))


def drafts_behind(worker, batch):
    """In the worker's draft preparation: the (tokens, mask) plain_step looked up behind the step
    in flight and chose to verify, or None (the worker looks its drafts up itself). Always None
    unless the mode is auto."""
    state: AutoState = getattr(worker, "_fv_auto", None)
    if state is None or state.behind is None:
        return None
    return state.behind.tokens, state.behind.mask


def fill_roots(worker, batch, draft_tokens) -> None:
    """After the worker copied this step's drafts to the device ([bs * width]): with drafts looked
    up behind a token in flight, each row's root becomes the request's last token (the first accept
    token of its last step, which gave it one token). A no-op otherwise."""
    state: AutoState = getattr(worker, "_fv_auto", None)
    if state is None or state.behind is None or not state.behind.in_flight:
        return
    bs = len(batch.reqs)
    draft_tokens.view(bs, -1)[:, 0] = batch.spec_info.accept_tokens.view(bs, -1)[:, 0]


def _chain_length(row) -> int:
    """Real draft tokens of one chain-format row (root first, padded with 0 after its last real
    token), as `widths.chain_draft_lengths` reads a whole batch: the position of the last nonzero
    token after the root, 0 where there is none. For the few rows of a step, a loop over a list
    is several times cheaper than numpy's small-array calls."""
    n = len(row) - 1
    while n > 0 and row[n] == 0:
        n -= 1
    return n


_FEATURES: dict = {}  # (match_len, sampled) -> DraftFeatures: few occur, one instance each


def _features(match_len: int, sampled: bool) -> DraftFeatures:
    """A chain's features (one branch where it has a token): the same instance for the same
    values, so that a step's draft features are neither built again each step nor compared field
    by field where the controller's keys hold them."""
    key = (match_len, sampled)
    f = _FEATURES.get(key)
    if f is None:
        f = _FEATURES[key] = DraftFeatures(match_len, 1 if match_len > 0 else 0, sampled)
    return f


def _record_drafts(state: AutoState, batch, tokens, carried, leads=None) -> tuple:
    """Chain-format drafts [bs*k] of a lookup -> each request's features (kept as its last known
    ones) and its chain recorded for the shadow tracker at output position len(output_ids) +
    carried[i] (tokens of the step in flight, not in output_ids yet). ``leads[i]``: the chain's
    first tokens that only guess tokens in flight (scored past them; the features count the rest).
    Returns (real chain lengths [bs], views with the new features)."""
    k = state.k
    rows = np.asarray(tokens).reshape(-1, k).tolist()
    lens = [_chain_length(row) for row in rows]  # [bs] real chain tokens per request
    views = []
    samples_of = state.controller.samples
    for i, req in enumerate(batch.reqs):
        n = lens[i]
        lead = min(int(leads[i]), n) if leads is not None else 0
        f = _features(n - lead, samples_of(req.rid))
        state.features[req.rid] = f
        state.shadow.record(req.rid, len(req.output_ids) + carried[i], f, rows[i][1:1 + n],
                            lead=lead)
        views.append(view(state, req.rid))
    return lens, views


def _plain_capable(state: AutoState, batch, pp_proxy_tensors) -> bool:
    """Batches a plain decode step inside the n-gram worker does not serve (they speculate or verify
    at width 1 as before): logprobs and hidden states (the scheduler reads them in the verify
    layout), grammars (SGLang masks the verify pass), penalties (SGLang's speculative path
    accumulates them its own way), pipeline stages, and a worker without the plain runtime."""
    penalties = getattr(getattr(getattr(batch, "sampling_info", None),
                                "penalizer_orchestrator", None),
                        "is_required", False)
    return (state.plain is not None and pp_proxy_tensors is None and not penalties
            and not getattr(batch, "return_logprob", False)
            and not getattr(batch, "return_hidden_states", False)
            and not getattr(batch, "has_grammar", False))


# where SGLang's decode graph runner leaves the event that its scheduler's write-after-read barrier
# waits on instead of the whole forward (0.5.16, 0.5.23)
READ_DONE_EVENTS = ("war_fastpath_read_done_event", "shared_read_done_event")


def _whole_step_barrier(model_runner) -> None:
    """After a plain decode step inside the n-gram worker: no early read-done event, so that the
    scheduler orders its stream after the whole step. A DECODE graph replay records an event before
    the replay, meant for a plain server, whose next step takes its tokens through the future map
    on the forward stream. The n-gram worker's next step takes them from the step's own result
    (spec_info's accept tokens and lengths, written by the sampler and `plain_outputs` after the
    replay), and the scheduler gathers those on its own stream whenever a request leaves the batch
    or joins it. Ordered only after that early event, the gather read tensors the step had not
    written yet wherever the GPU was still busy with it (a step slower than the host's work:
    greedy output of auto departed from plain's where requests left a batch of four, at
    deterministic inference's slower kernels, on one H200). Without the event the scheduler waits
    for all of the forward stream's work, as after a verify step."""
    for name in READ_DONE_EVENTS:
        if getattr(model_runner, name, None) is not None:
            setattr(model_runner, name, None)


def run_plain_decode(worker, batch, runtime, k: int, on_publish=None, roots_first: bool = False,
                     before_put=None):
    """One decode step of SGLang's plain path inside the n-gram worker: each request's last accepted
    token (the root its draft would have had) is decoded with the DECODE graphs and the plain
    sampler, then the result is put in the shape the worker's verify step returns, as a step that
    accepted no draft (accept length 1).

    The batch is changed for the pass and put back afterwards: seq_lens count the new token (a
    DECODE pass attends to it; a verify pass counts it among its draft tokens), the token's KV slot
    is the first of those the scheduler reserved for this step's drafts, no spec_info, and the model
    runner reads as not speculative (verify_runtime.plain_algorithm) with the plain runtime's
    attention backend and graph runner in place.

    ``roots_first``: every accept length in the batch is known to be 1 (the last decode step was a
    plain one; a request that joined since comes from a prefill, which accepts one token too), so
    each root is the first accept token and the accept lengths are not read. ``before_put``: called
    once the pass is launched, before the corpus put.

    The tensor work before and after the pass is one Triton launch each (plain_step.plain_inputs /
    plain_outputs) instead of about ten small torch ops."""
    from fastverify.plain_step import plain_inputs, plain_outputs
    from fastverify.glue.verify_runtime import plain_algorithm

    bs = len(batch.reqs)
    mr = worker.model_runner
    info = batch.spec_info
    saved = {name: getattr(batch, name, None) for name in
             ("input_ids", "out_cache_loc", "seq_lens", "seq_lens_cpu", "seq_lens_sum",
              "orig_seq_lens", "spec_info")}
    saved_rt = (mr.attn_backend, mr.decode_cuda_graph_runner)
    # the roots; each new token's KV slot; lengths counting it (new_seq_lens: also the step's
    # result, the pass does not write to it)
    batch.input_ids, batch.out_cache_loc, new_seq_lens, new_orig = plain_inputs(
        info.accept_tokens, info.accept_lens, bs, roots_first, batch.req_to_token_pool.req_to_token,
        batch.req_pool_indices, batch.seq_lens, saved["orig_seq_lens"])
    batch.seq_lens = new_seq_lens
    if saved["seq_lens_cpu"] is not None:
        batch.seq_lens_cpu = saved["seq_lens_cpu"] + 1
    if saved["seq_lens_sum"] is not None:
        batch.seq_lens_sum = int(saved["seq_lens_sum"]) + bs
    if new_orig is not None:
        batch.orig_seq_lens = new_orig
    batch.spec_info = None
    mr.attn_backend, mr.decode_cuda_graph_runner = runtime.attn_backend, runtime.graph_runner
    try:
        with plain_algorithm(mr, batch):
            result = worker.target_worker.forward_batch_generation(batch)
        _whole_step_barrier(mr)  # the target's runner, which the n-gram worker shares
    finally:
        mr.attn_backend, mr.decode_cuda_graph_runner = saved_rt
        for name, value in saved.items():
            setattr(batch, name, value)
    accept_tokens, accept_lens = plain_outputs(result.next_token_ids, k)  # [bs * k], [bs]
    if on_publish is not None:
        on_publish(new_seq_lens)
    if before_put is not None:
        before_put()
    # the corpus learns the output as in SGLang's own step, here without the tokens still in
    # flight (they are not on the host: nothing was looked up), and the match state of
    # requests that left is erased
    worker.prev_token_ids = []
    worker.prev_accept_lens = [0] * bs
    corpus_put_host(worker, batch)
    erase_departed(worker, batch)
    result.accept_lens = accept_lens
    result.new_seq_lens = new_seq_lens
    result.next_draft_input = type(info)(draft_token_num=k, new_seq_lens=new_seq_lens,
                                         accept_tokens=accept_tokens, accept_lens=accept_lens)
    result.speculative_num_draft_tokens = 1
    return result


def step_drafts(worker, batch, tokens, mask, bs: int):
    """One decode step: chain-format drafts at k ([bs*k], [bs*k*k]) -> drafts at the chosen width,
    runtime selected. Returns the inputs unchanged unless the mode is auto."""
    state: AutoState = getattr(worker, "_fv_auto", None)
    if state is None:
        return tokens, mask
    k = state.k
    if state.pending_put is not None:  # (the lookup the stretch left for is made)
        from fastverify.glue.plain_path import put_pending

        put_pending(worker, state)
    if state.behind is not None:  # looked up behind, recorded and decided in plain_step
        d, lens = state.behind.decision, state.behind.lens
    else:
        use_prev = (bool(getattr(worker, "enable_overlap", False))
                    and not getattr(batch, "has_grammar", False))
        prev_lens = list(getattr(worker, "prev_accept_lens", None) or [0] * bs)
        if not state.synced:
            _sync_requests(state, batch)
        state.synced = False
        # the draft proposes output positions len(output_ids) + tokens carried
        # from the last step (overlap)
        lens, views = _record_drafts(state, batch, tokens,
                                     [int(p) if use_prev else 0 for p in prev_lens])
        d = state.controller.decide(views)
    width = 1 if d.option.kind == "none" else d.option.width
    keep = [min(int(lens[i]), width - 1) if s else 0 for i, s in enumerate(d.speculate)]
    if d.option.kind == "chain":
        width = _narrowest(worker, width, keep)
    if width < k or not all(d.speculate):
        # (at width k with every request taking part the drafts are verified as
        # looked up: nothing to cut)
        tokens, mask = truncate_drafts(tokens, mask, k, width, keep)
    # the drafts verified carry what they were expected to accept, for the calibration
    for i, req in enumerate(batch.reqs):
        if keep[i] > 0 and i < len(d.gains):
            state.shadow.tag_last(req.rid, (d.gains[i], keep[i]))
    tokens = checked_drafts(worker, batch, tokens, width, state.behind is not None
                            and state.behind.in_flight)
    select_runtime(worker, width)
    state.last_step = (SPEC, bs, width)
    _export(state, d)
    return tokens, mask


def _narrowest(worker, width: int, keep) -> int:
    """The narrowest captured width that holds every draft token the step keeps (1 + the longest
    of ``keep``, each at most the option's ``width`` - 1, so never wider than it), as chain mode
    picks its width (`widths.choose_width`): what lies past the longest draft is padding, never
    verified, so the step verifies the same drafts in a smaller pass; no draft kept: width 1 where
    captured. On one H100 (SmolLM2, memorised prompts) auto's chain-8 steps at batch size 4 took
    3.45 ms median against chain + widths' 2.97 ms before it, 2.86-2.95 against 2.67 ms with it
    (the rest is host work: `lab/verify_host_time.py`)."""
    if keep and max(keep) + 1 == width:
        # the option's own width (a captured one) holds its longest draft exactly: what
        # choose_width picks, without building its plan (the steady memorised step)
        return width
    rts = getattr(worker, "_fv_widths", None)
    return width if rts is None else choose_width(keep, rts.config)[0]


def _vocab_size(worker):
    mc = getattr(getattr(worker, "model_runner", None), "model_config", None)
    v = getattr(mc, "vocab_size", None)
    return v if isinstance(v, int) and v > 0 else None


def checked_drafts(worker, batch, tokens, width: int, roots_filled: bool):
    """The step's drafts [bs*width] before they are copied to the device: every token id must be a
    vocabulary id (the target's embedding lookup asserts on the device otherwise, and the server
    dies at the next synchronisation with no word of where the id came from). A draft token out of
    range becomes padding (0: rejected unless the target predicts 0 itself, so output is unchanged)
    and is logged with the requests' ids; a root out of range, which would change output, raises
    unless ``roots_filled`` (`fill_roots` writes every root on the device)."""
    vocab = _vocab_size(worker)
    if vocab is None:
        return tokens
    t = np.asarray(tokens)
    ids = t.reshape(-1).tolist()  # (the step's few ids: Python's min and max cost less than numpy's
    # small-array calls, ~3 us each on the GPU machine's host)
    if not ids or (min(ids) >= 0 and max(ids) < vocab):
        return tokens
    bad = (t < 0) | (t >= vocab)
    rows = bad.reshape(-1, width)
    rids = [req.rid for req, r in zip(batch.reqs, rows) if r.any()]
    if rows[:, 0].any() and not roots_filled:
        raise RuntimeError(f"auto verify: draft roots outside the vocabulary ({vocab}) for "
                           f"requests {rids}: {t.reshape(-1, width)[rows[:, 0], 0].tolist()}")
    logger.error("auto verify: draft tokens outside the vocabulary (%d) for requests %s (%s); "
                 "verified as padding", vocab, rids, t[bad].tolist()[:8])
    out = t.copy()
    out[bad] = 0
    return out


def _export(state: AutoState, d) -> None:
    if state.gauges is not None and d.step % state.metrics_every == 0:
        for name, value in state.controller.metrics().items():
            if name not in state.gauges:
                state.gauges[name] = _gauge(name)
            state.gauges[name].set(value)


# -------------------------------------------------------------------------------------- calibration
def calibrate_worker(worker, repeats: int = CALIBRATION_REPEATS, batch_sizes=CALIBRATION_BS,
                     plain=None) -> CostTable:
    """Replay the captured verify graph of every width at the captured batch sizes in `batch_sizes`,
    timed with CUDA events (median of `repeats` after `CALIBRATION_WARMUP`). The plain runtime's
    DECODE graphs give decode_ms[bs] (the width-1 verify graphs when `plain` has none) and every
    width verify_ms[bs * width]. Call before serving: a replay reuses the graph's static inputs,
    which hold the capture's dummy batch only until the first real step. The plan is fixed (no time
    cut) so that all TP ranks replay the same graphs; each graph replay is one forward pass, so it
    takes widths x batch sizes x (repeats + warm-up) passes, e.g. 4 x 8 x 7 x ~15 ms ~ 3.4 s."""
    import torch

    rts = getattr(worker, "_fv_widths", None)
    if rts is None:
        raise CostTableError(f"{MODE_FLAG} auto needs {WIDTHS_FLAG} (the verify runtimes per "
                             "width)")
    graphs = {}  # (width, bs) -> replay callable; width 0: the plain decode graphs
    runtimes = list(rts.runtimes.items())
    if plain is not None and plain.graph_runner is not None:
        runtimes.append((0, plain))
    for width, rt in runtimes:
        runner = rt.graph_runner
        if runner is None:
            raise CostTableError(f"{MODE_FLAG} auto: CUDA graphs are off, so verify cost cannot be "
                                 f"calibrated in the server's graphs; pass {COSTS_FLAG}")
        for key, graph in getattr(runner.backend, "_graphs", {}).items():
            if getattr(key, "stream_idx", None) is None and key.size in batch_sizes:
                graphs.setdefault((width, int(key.size)), graph.replay)
    if not any(w == 1 for w, _ in graphs):
        raise CostTableError(f"{MODE_FLAG} auto: no captured width-1 graph to time; pass "
                             f"{COSTS_FLAG}")
    decode_w = 0 if any(w == 0 for w, _ in graphs) else 1
    by_tokens = {}
    for (w, bs) in sorted(graphs):
        if w:
            by_tokens.setdefault(w * bs, (w, bs))

    def time_pass(kind, n):
        replay = graphs[(decode_w, n)] if kind == "decode" else graphs[by_tokens[n]]
        for _ in range(CALIBRATION_WARMUP if time_pass.warm.get((kind, n)) is None else 0):
            replay()
        time_pass.warm[(kind, n)] = True
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    time_pass.warm = {}
    return calibrate(time_pass, sorted(bs for w, bs in graphs if w == decode_w), sorted(by_tokens),
                     repeats=repeats, budget_s=math.inf, log=logger.info,
                     source="calibration (captured decode and verify graphs, CUDA events)")


def _tp_broadcaster():
    """With TP > 1: a callable that returns TP rank 0's object on every rank (a CPU-side broadcast;
    every rank must call it at the same point); None with one rank or no distributed setup."""
    try:
        import torch.distributed as dist
        from sglang.srt.distributed import get_tp_group
    except ImportError:  # pragma: no cover - single process
        return None
    if not dist.is_initialized():
        return None
    group = get_tp_group()
    if group.world_size == 1:
        return None

    def broadcast(obj):
        box = [obj]
        dist.broadcast_object_list(box, src=group.ranks[0], group=group.cpu_group)
        return box[0]

    return broadcast


def _broadcast_from_first_rank(table: CostTable) -> CostTable:
    """Rank 0's table on every TP rank (identical decisions need identical inputs)."""
    broadcast = _tp_broadcaster()
    return table if broadcast is None else broadcast(table)


def _spec_of(worker):
    from fastverify.glue.verify_runtime import _spec_of as spec_of

    return spec_of(worker)


_GAUGES: dict = {}  # one Prometheus gauge per name and process


def _gauge(name):
    if name in _GAUGES:
        return _GAUGES[name]
    from prometheus_client import Gauge

    _GAUGES[name] = Gauge(f"sglang:fastverify_ngram_{name}",
                          f"n-gram auto verify: {name.replace('_', ' ')}",
                          multiprocess_mode="mostrecent")
    return _GAUGES[name]


def _make_gauges() -> dict:
    return {}
