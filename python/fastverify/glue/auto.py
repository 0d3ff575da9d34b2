"""Auto verify control glue: what patch 0007-ngram-verify-auto calls from SGLang's n-gram worker.

`--speculative-ngram-verify-mode auto` verifies like chain mode (one path, causal attention, no mask; patch
0005) on the verify widths captured by patch 0008 (`--speculative-ngram-verify-widths`, which must include 1:
width 1 is the step without speculation). Each decode step fastverify.controller picks the width (none, or a
chain of k = width - 1) with the highest expected tokens/s from a measured cost table and the online gain
model, and gates requests whose own expected gain is below one to no draft.

Seams (both pinned SGLang versions; the patch holds the exact hunks):
    server args / arg_groups            "auto" for --speculative-ngram-verify-mode; --speculative-ngram-auto-
                                        cost-table, --speculative-ngram-auto-hysteresis
    speculative_hook._handle_ngram      chain_view(args) for 0005's overrides (auto verifies chain-shaped);
                                        validate_server_args(args): flag checks before any process starts
    NGRAMWorker.__init__                chain_view(args) for 0005's verify hook
    NGRAMWorker.init_cuda_graphs        setup(worker): after 0008 built the runtimes per width: cost table
                                        (file, or calibration by replaying the captured verify graphs)
    NGRAMWorker._prepare_for_speculative_decoding
                                        lean_drafts(worker, batch, bs): before the lookup; measures the last
                                        step's period and, when no speculation is expected to pay, runs this
                                        step without a lookup (root tokens from the GPU, width 1); else
                                        step_drafts(worker, batch, tokens, mask, bs) after the lookup: decide,
                                        gate, truncate, select the width's runtime (0008's finish_step puts k
                                        back); device_or_host(drafts) for the buffer copy
    spec_info.create_dummy_verify_input verify_shape(mode): capture graphs mask-free in auto mode

Every TP rank must pick the same width each step (the pass holds collectives): the gain model sees the same
requests and tokens on every rank, and the cost table is the file's or rank 0's calibration, broadcast. The
measured step periods differ slightly between ranks, so they are rank 0's: each rank measures, and rank 0's
medians are broadcast every `COST_SYNC_STEPS` steps (a step count, the same on every rank); between two
broadcasts the controller uses the last broadcast costs.

A step without a lookup ("lean"): the n-gram worker's step spends host time on the corpus lookup, the
draft bookkeeping and a blocking copy of the last accepted tokens; a step that will verify nothing needs none
of it. Its root token (the last accepted one) is gathered on the GPU from the previous step's accept tokens,
the corpus still receives the request's tokens (as in SGLang's own non-overlap path, without the tokens of
the step in flight), and the width-1 verify graph runs. Without speculation, drafts are still looked up after
1, 2, 4, ... up to `PROBE_MAX` steps (back to 1 when a request joins or speculation is chosen), so the gain
model keeps learning from real drafts and output that starts to repeat is noticed within a few steps.
"""
from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass, field

from fastverify.controller import (LEAN, SPEC, AutoConfig, Controller, CostTable, CostTableError, DraftFeatures,
                                   RequestView, ShadowTracker, StepCosts, calibrate, load_cost_table)

logger = logging.getLogger("fastverify.auto")

MODE_FLAG = "--speculative-ngram-verify-mode"
COSTS_FLAG = "--speculative-ngram-auto-cost-table"
HYST_FLAG = "--speculative-ngram-auto-hysteresis"
WIDTHS_FLAG = "--speculative-ngram-verify-widths"
HELP_COST_TABLE = (
    "JSON cost table for --speculative-ngram-verify-mode auto: {\"decode_ms\": {bs: ms}, \"verify_ms\": "
    "{tokens in the pass: ms}} (or a microbenchmark JSON carrying it under \"cost_table\"). Default: measured at "
    "start-up by replaying the captured verify graphs of every width (sglang-fastverify).")
HELP_HYSTERESIS = (
    "Auto verify keeps its current choice unless another is expected to be this much faster (relative), "
    "0 <= h < 0.5 (sglang-fastverify).")
CALIBRATION_BS = (1, 2, 4, 8, 16, 32, 64, 128)
CALIBRATION_REPEATS = 5
CALIBRATION_WARMUP = 2
PROBE_MAX = 32  # without speculation, drafts are still looked up after 1, 2, 4, ... up to this many steps
COST_SYNC_STEPS = 64  # rank 0's measured step costs reach every rank this often (in steps)


class _ChainView:
    """Read-only view of the server args in which auto reads as chain (the verify shape it shares)."""

    def __init__(self, args):
        object.__setattr__(self, "_args", args)

    def __getattr__(self, name):
        if name == "speculative_ngram_verify_mode":
            return "chain"
        return getattr(self._args, name)


def verify_shape(mode):
    """The verify shape of a mode for code written for tree/chain: auto verifies chains."""
    return "chain" if mode == "auto" else mode


def chain_view(args):
    return _ChainView(args) if getattr(args, "speculative_ngram_verify_mode", None) == "auto" else args


def config_from(spec):
    """The frozen AutoConfig from the server args (None unless the mode is auto)."""
    if getattr(spec, "speculative_ngram_verify_mode", None) != "auto":
        return None
    from fastverify.widths import parse_widths

    k = int(spec.speculative_num_draft_tokens)
    widths = parse_widths(getattr(spec, "speculative_ngram_verify_widths", None), k, "auto")
    if not widths.enabled or 1 not in widths.widths:
        raise ValueError(f"{MODE_FLAG} auto needs {WIDTHS_FLAG} with 1 (the step without speculation) and "
                         f"k = {k}, e.g. {WIDTHS_FLAG} 1,2,4,{k}; got {getattr(spec, 'speculative_ngram_verify_widths', None)!r}")
    h = getattr(spec, "speculative_ngram_auto_hysteresis", 0.03)
    return AutoConfig(max_chain=k - 1, tree_width=0, chain_widths=tuple(w for w in widths.widths if w >= 2),
                      hysteresis=float(h), shape="uniform")


def validate_server_args(spec):
    """Launcher-side checks (raise ValueError naming the flag); loads the cost table file if one is given."""
    cfg = config_from(spec)
    path = getattr(spec, "speculative_ngram_auto_cost_table", None)
    if cfg is None:
        if path:
            raise ValueError(f"{COSTS_FLAG} needs {MODE_FLAG} auto")
        return None
    if getattr(spec, "enable_watermark", False):
        raise ValueError(f"{MODE_FLAG} auto cannot be combined with --enable-watermark; use tree")
    if path:
        load_cost_table(path, COSTS_FLAG)
    return cfg


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
    last_start: float = None  # host clock at the start of the previous decode step
    last_step: tuple = None  # (kind, bs, width) of the previous decode step
    synced: bool = False  # this step's requests were already advanced by lean_drafts
    steps: int = 0
    sync_costs: object = None  # callable(StepCosts) -> rank 0's, called at the same step on every rank; None: one rank
    clock: object = time.perf_counter


def setup(worker, spec=None, observability=None):
    """Once per worker, after the verify runtimes per width exist. None unless the mode is auto."""
    spec = spec if spec is not None else _spec_of(worker)
    cfg = config_from(spec)
    if cfg is None:
        worker._fv_auto = None
        return None
    obs = observability if observability is not None else spec
    path = getattr(spec, "speculative_ngram_auto_cost_table", None)
    costs = load_cost_table(path, COSTS_FLAG) if path else _broadcast_from_first_rank(calibrate_worker(worker))
    logger.info("auto verify: widths %s, cost table %s: decode %s ms, verify %s ms", (1,) + cfg.chain_widths,
                costs.source, costs.decode, costs.verify)
    step_costs = StepCosts(costs)
    ctl = Controller(cfg, step_costs, log=lambda rec: logger.info("auto verify decision %s", rec))
    state = AutoState(ctl, ShadowTracker(), cfg.max_chain + 1,
                      gauges=_make_gauges() if getattr(obs, "enable_metrics", False) else None,
                      metrics_every=max(int(getattr(obs, "decode_log_interval", 40) or 40), 1),
                      costs=StepCosts(costs), sync_costs=_tp_broadcaster())
    worker._fv_auto = state
    return state


def device_or_host(drafts):
    """The draft tokens for the worker's device buffer copy: a lean step's are a device tensor already."""
    import torch

    return drafts if isinstance(drafts, torch.Tensor) else torch.from_numpy(drafts)


def root_tokens(spec_info, bs: int):
    """[bs] the last accepted token of each request, gathered on the device from the previous step's accept
    tokens ([bs * k], accept_lens [bs]): the root of this step's draft, as the corpus lookup would return it."""
    import torch

    acc = spec_info.accept_tokens.reshape(bs, -1)  # [bs, k]
    idx = (spec_info.accept_lens.to(torch.long) - 1).clamp_(min=0).view(bs, 1)  # [bs, 1]
    return acc.gather(1, idx).view(bs)


def _tick(state: AutoState) -> None:
    """Start of a decode step: the previous step's period goes to the cost model; rank 0's model is shared."""
    now = state.clock()
    if state.last_start is not None and state.last_step is not None:
        kind, bs, width = state.last_step
        state.costs.record(kind, bs, width, 1000.0 * (now - state.last_start))
    state.last_start, state.last_step = now, None
    state.steps += 1
    if state.steps % COST_SYNC_STEPS == 0:
        # a frozen copy: the live measurements keep changing on each rank between two synchronisations, and
        # a controller that read them directly would decide differently on different ranks (and hang the TP
        # group in mismatched collectives)
        shared = state.sync_costs(state.costs) if state.sync_costs else state.costs
        state.controller.costs = copy.deepcopy(shared)


def _sync_requests(state: AutoState, batch) -> None:
    """Requests that left the batch are forgotten; drafts whose outcome the output now shows are scored."""
    rids = [req.rid for req in batch.reqs]
    for rid in state.prev_rids - set(rids):
        state.controller.finish(rid)
        state.shadow.drop(rid)
        state.features.pop(rid, None)
    state.prev_rids = frozenset(rids)
    for req in batch.reqs:
        for f, ca, _ in state.shadow.advance(req.rid, req.output_ids):
            state.controller.observe(req.rid, f, ca)


def lean_drafts(worker, batch, bs: int):
    """Before the lookup of a decode step. (None, None): look drafts up (then step_drafts). Otherwise this step
    runs without speculation and without a lookup: returns (root tokens [bs] on the device, mask [bs] of
    ones) with the width-1 runtime selected. Always (None, None) unless the mode is auto."""
    state: AutoState = getattr(worker, "_fv_auto", None)
    if state is None:
        return None, None
    _tick(state)
    _sync_requests(state, batch)
    state.synced = True
    if any(req.rid not in state.features for req in batch.reqs):
        state.controller.reset_probe()
        return None, None  # a request not looked up yet is looked up once (its match is unknown)
    if getattr(batch, "has_grammar", False):
        return None, None
    views = [RequestView(req.rid, state.features[req.rid]) for req in batch.reqs]
    if state.controller.plan_lookup(views, PROBE_MAX):
        return None, None
    import numpy as np

    from fastverify.glue.verify_runtime import select_runtime

    roots = root_tokens(batch.spec_info, bs)
    # _update_ngram_corpus reads these after the verify: no carried tokens (they are not on the host yet);
    # the corpus gets the request's tokens up to the last processed step, as in SGLang's non-overlap path
    worker.prev_token_ids = []
    worker.prev_accept_lens = [0] * bs
    select_runtime(worker, 1)
    d = state.controller.note_lean(bs)
    state.last_step = (LEAN, bs, 1)
    state.synced = False
    _export(state, d)
    return roots, np.ones(bs, dtype=bool)


def step_drafts(worker, batch, tokens, mask, bs: int):
    """One decode step: chain-format drafts at k ([bs*k], [bs*k*k]) -> drafts at the chosen width, runtime
    selected. Returns the inputs unchanged unless the mode is auto."""
    state: AutoState = getattr(worker, "_fv_auto", None)
    if state is None:
        return tokens, mask
    from fastverify.glue.verify_runtime import select_runtime
    from fastverify.widths import chain_draft_lengths, truncate_drafts

    k = state.k
    lens = chain_draft_lengths(tokens, k)  # [bs] real chain tokens per request
    flat = [int(t) for t in tokens]
    use_prev = bool(getattr(worker, "enable_overlap", False)) and not getattr(batch, "has_grammar", False)
    prev_lens = list(getattr(worker, "prev_accept_lens", None) or [0] * bs)
    if not state.synced:
        _sync_requests(state, batch)
    state.synced = False
    views = []
    for i, req in enumerate(batch.reqs):
        n = int(lens[i])
        f = DraftFeatures(n, 1 if n else 0)
        state.features[req.rid] = f
        # the draft proposes output positions len(output_ids) + tokens carried from the last step (overlap)
        pos = len(req.output_ids) + (int(prev_lens[i]) if use_prev else 0)
        state.shadow.record(req.rid, pos, f, flat[i * k + 1:i * k + 1 + n])
        views.append(RequestView(req.rid, f))
    d = state.controller.decide(views)
    width = 1 if d.option.kind == "none" else d.option.width
    keep = [min(int(lens[i]), width - 1) if s else 0 for i, s in enumerate(d.speculate)]
    tokens, mask = truncate_drafts(tokens, mask, k, width, keep)
    select_runtime(worker, width)
    state.last_step = (SPEC, bs, width)
    _export(state, d)
    return tokens, mask


def _export(state: AutoState, d) -> None:
    if state.gauges is not None and d.step % state.metrics_every == 0:
        for name, value in state.controller.metrics().items():
            if name not in state.gauges:
                state.gauges[name] = _gauge(name)
            state.gauges[name].set(value)


# ---------------------------------------------------------------------------------------------- calibration
def calibrate_worker(worker, repeats: int = CALIBRATION_REPEATS, batch_sizes=CALIBRATION_BS) -> CostTable:
    """Replay the captured verify graph of every width at the captured batch sizes in `batch_sizes`, timed
    with CUDA events (median of `repeats` after `CALIBRATION_WARMUP`). Width 1 gives decode_ms[bs] and every
    width verify_ms[bs * width]. Call before serving: a replay reuses the graph's static inputs, which hold the
    capture's dummy batch only until the first real step. The plan is fixed (no time cut) so that all TP ranks
    replay the same graphs; each graph replay is one forward pass, so it takes
    widths x batch sizes x (repeats + warm-up) passes, e.g. 4 x 8 x 7 x ~15 ms ~ 3.4 s."""
    import torch

    rts = getattr(worker, "_fv_widths", None)
    if rts is None:
        raise CostTableError(f"{MODE_FLAG} auto needs {WIDTHS_FLAG} (the verify runtimes per width)")
    graphs = {}  # (width, bs) -> replay callable
    for width, rt in rts.runtimes.items():
        runner = rt.graph_runner
        if runner is None:
            raise CostTableError(f"{MODE_FLAG} auto: CUDA graphs are off, so verify cost cannot be calibrated "
                                 f"in the server's graphs; pass {COSTS_FLAG}")
        for key, graph in getattr(runner.backend, "_graphs", {}).items():
            if getattr(key, "stream_idx", None) is None and key.size in batch_sizes:
                graphs.setdefault((width, int(key.size)), graph.replay)
    if not any(w == 1 for w, _ in graphs):
        raise CostTableError(f"{MODE_FLAG} auto: no captured width-1 graph to time; pass {COSTS_FLAG}")
    by_tokens = {}
    for (w, bs) in sorted(graphs):
        by_tokens.setdefault(w * bs, (w, bs))

    def time_pass(kind, n):
        replay = graphs[(1, n)] if kind == "decode" else graphs[by_tokens[n]]
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
    return calibrate(time_pass, sorted(bs for w, bs in graphs if w == 1), sorted(by_tokens), repeats=repeats,
                     budget_s=math.inf, log=logger.info, source="calibration (captured verify graphs, CUDA events)")


def _tp_broadcaster():
    """With TP > 1: a callable that returns TP rank 0's object on every rank (a CPU-side broadcast; every rank
    must call it at the same point); None with one rank or no distributed setup."""
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

    _GAUGES[name] = Gauge(f"sglang:fastverify_ngram_{name}", f"n-gram auto verify: {name.replace('_', ' ')}",
                          multiprocess_mode="mostrecent")
    return _GAUGES[name]


def _make_gauges() -> dict:
    return {}
