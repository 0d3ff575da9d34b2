"""Verify runtimes per width for n-gram speculation: what patch
0008-ngram-verify-widths calls from SGLang.

A verify runtime is what a TARGET_VERIFY pass at w tokens per request needs beyond the weights:
an attention backend built while the spec settings read speculative_num_draft_tokens = w
(backends size their verify metadata from it), a verify graph runner of the same class as
SGLang's own, captured with w tokens per request (None when CUDA graphs are off), and
per-batch-size views of the n-gram worker's draft buffers laid out for w. SGLang builds the
runtime for k = --speculative-num-draft-tokens; this module builds one per extra width at
start-up and swaps them per step, the pattern of SGLang's adaptive speculation (pre-built states,
swapped whole), here keyed by verify width.

Seams (both pinned SGLang versions; the patch holds the exact hunks):
    speculative_hook._handle_ngram        validate_server_args(spec, view): the flag,
                                          before any process starts
    NGRAMWorker.init_cuda_graphs (added)   build_runtimes(worker): after SGLang
                                           captured the width-k graphs
    NGRAMWorker._prepare_for_speculative_decoding
                                           step_drafts(worker, tokens, mask, bs): chain mode
                                           picks the step's width, truncates the drafts and
                                           selects the runtime; the worker's buffer views
                                           are taken after this call
    NGRAMWorker._update_ngram_corpus       carried_stride(worker): the stride of the
                                           carried accept tokens (k)
    NGRAMWorker.forward_batch_generation   finish_step(worker, accept_tokens, bs): back to k, accept
                                           tokens padded to stride k for the next step; returns the
                                           step's width for the result's
                                           speculative_num_draft_tokens

For the auto mode's controller glue: ``select_runtime(worker, width)`` makes the current step run
at ``width`` (call it before the worker takes its buffer views, i.e. from the draft preparation),
with drafts reshaped by ``fastverify.widths.truncate_drafts``; finish_step restores k at the end of
the step as for chain mode.

Nothing here imports SGLang at module level; SGLang objects are read by attribute.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

from fastverify.widths import (
    FLAG,
    WidthsConfig,
    WidthStats,
    batch_views,
    chain_draft_lengths,
    choose_width,
    pad_accept_tokens,
    truncate_drafts,
)
from fastverify.glue.config import verify_config

logger = logging.getLogger("fastverify.verify_runtime")

SOURCE = "fastverify.verify_widths"
# The n-gram worker's per-batch-size draft buffer views (lists indexed by bs) and
# how one request sizes them.
VIEW_LISTS = (
    ("draft_tokens_batch", "draft_tokens", "w", False),
    ("positions_batch", "positions", "w", False),
    ("tree_mask_batch", "tree_mask", "w*w", False),
    ("retrieve_indexes_batch", "retrieve_indexes", "w", True),
    ("retrieve_next_token_batch", "retrieve_next_token", "w", True),
    ("retrieve_next_sibling_batch", "retrieve_next_sibling", "w", True),
)


# ------------------------------------------------------------------------------------ configuration
def validate_server_args(spec, view=None) -> WidthsConfig:
    """Launcher-side check of the flag (raises ValueError naming it); returns the parsed config.

    ``spec``: the resolving server args (k and the verify mode already resolved); ``view``: the
    resolved view, for features whose per-width state SGLang keeps once per model runner
    (refused with the flag).
    """
    cfg = verify_config(spec).widths
    if not cfg.enabled:
        return cfg
    src = view if view is not None else spec
    for name, flag in (("enable_lora", "--enable-lora"), ("enable_pdmux", "--enable-pdmux")):
        if getattr(src, name, False):
            raise ValueError(
                f"{FLAG} cannot be combined with {flag}: its CUDA-graph state is sized once per "
                "model runner for one verify width; drop one of the two flags"
            )
    return cfg


# ----------------------------------------------------------------------------------------- runtimes
@dataclass
class VerifyRuntime:
    """Everything a verify pass at ``width`` tokens per request swaps in."""

    width: int
    attn_backend: object
    graph_runner: object  # None when CUDA graphs are off (the eager path then uses attn_backend)
    views: dict  # worker attribute name -> list of per-bs views
    build_seconds: float = 0.0
    build_bytes: int = 0  # device memory taken by building it (free memory before - after)


@dataclass
class WidthRuntimes:
    """The worker's runtimes by width, the one active now, and what ran."""

    config: WidthsConfig
    runtimes: dict  # width -> VerifyRuntime
    active: int
    log_interval: int = 40
    pending: bool = False  # a width was selected for the step in flight
    stats: WidthStats = field(default_factory=WidthStats.empty)
    window: WidthStats = field(default_factory=WidthStats.empty)

    @property
    def k(self) -> int:
        return self.config.k


def _capture(worker, width: int) -> VerifyRuntime:
    """The runtime the worker and its model runner hold now (SGLang's own, at k)."""
    mr = worker.model_runner
    return VerifyRuntime(width, mr.attn_backend, mr.decode_cuda_graph_runner,
                         {name: getattr(worker, name) for name, *_ in VIEW_LISTS})


def _worker_views(worker, width: int) -> dict:
    views = {}
    for name, buf_name, per, rows in VIEW_LISTS:
        per_req = width * width if per == "w*w" else width
        views[name] = batch_views(getattr(worker, buf_name), worker.max_batch_size, per_req,
                                  width, rows=rows)
    return views


@contextlib.contextmanager
def spec_settings(model_runner, width: int):
    """While building the width's runtime, SGLang's spec settings read
    speculative_num_draft_tokens = width.

    0.5.23 keeps them in the published config bags (get_spec()), changed through
    get_context().override; 0.5.16 reads model_runner.server_args, changed through
    ServerArgs.override. Both are SGLang's audited mutation points (its adaptive speculation uses
    them the same way); the previous values are put back on exit.
    """
    fields = {"speculative_num_draft_tokens": width, "speculative_num_steps": max(width - 1, 0)}
    try:
        from sglang.srt import runtime_context as rc
    except ImportError:  # pragma: no cover - both pins have it
        rc = None
    if rc is not None and hasattr(rc, "get_spec"):
        spec = rc.get_spec()
        saved = {name: getattr(spec, name) for name in fields}
        rc.get_context().override(SOURCE + ".build", **fields)
        try:
            yield
        finally:
            rc.get_context().override(SOURCE + ".restore", **saved)
    else:
        sa = model_runner.server_args
        saved = {name: getattr(sa, name) for name in fields}
        sa.override(SOURCE + ".build", **fields)
        try:
            yield
        finally:
            sa.override(SOURCE + ".restore", **saved)


def _free_bytes(device) -> int:
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()
        return int(torch.cuda.mem_get_info()[0])
    return 0


@contextlib.contextmanager
def own_graph_pool(pool_module=None):
    """While inside, SGLang's shared CUDA graph memory pool reads as not made yet, so a graph runner
    that starts capturing makes a pool of its own (and keeps it); the shared pool is put back on
    exit. A plain decode graph captured this way lays its buffers out in a fresh pool as the plain
    server's first capture does, instead of after the verify graphs' buffers."""
    if pool_module is None:
        from sglang.srt.model_executor.runner_utils import pool as pool_module
    saved = pool_module.get_global_graph_memory_pool()
    pool_module.set_global_graph_memory_pool(None)
    try:
        yield
    finally:
        pool_module.set_global_graph_memory_pool(saved)


@contextlib.contextmanager
def plain_algorithm(model_runner, batch=None):
    """While inside, the model runner (and ``batch``, when given) read as not speculative: SGLang
    then builds, captures and runs the plain decode pass (one token per request, the decode graphs,
    the plain sampler) instead of a TARGET_VERIFY pass. The previous values are put back on exit."""
    saved = model_runner.spec_algorithm
    none = type(saved).NONE
    saved_batch = getattr(batch, "spec_algorithm", None) if batch is not None else None
    model_runner.spec_algorithm = none
    if batch is not None:
        batch.spec_algorithm = none
    try:
        yield
    finally:
        model_runner.spec_algorithm = saved
        if batch is not None:
            batch.spec_algorithm = saved_batch


def _build_one(worker, width: int, plain: bool = False) -> VerifyRuntime:
    """Attention backend + verify graph runner at ``width``, built like SGLang builds its own at k.

    ``plain``: the runtime of a plain decode pass instead (width 1, DECODE-mode graphs), built while
    the model runner reads as not speculative."""
    mr = worker.model_runner
    base_runner = mr.decode_cuda_graph_runner
    tic, free0 = time.perf_counter(), _free_bytes(worker.device)
    # a plain runtime's graphs are captured in a graph memory pool of their own: on 2x H200 the bs-1
    # plain step's forward then came within 4-13 us of the plain server's, against 19-37 us over it
    # in SGLang's shared pool, after the verify graphs (one GEMM; docs/eagle-fast-verify.md)
    with spec_settings(mr, width), (plain_algorithm(mr) if plain else contextlib.nullcontext()), \
            (own_graph_pool() if plain else contextlib.nullcontext()):
        saved_flag = mr.init_new_workspace
        try:
            attn_backend = mr._get_attention_backend(init_new_workspace=True)
        finally:
            mr.init_new_workspace = saved_flag
        graph_runner = None
        if base_runner is not None:
            graph_runner = type(base_runner)(
                mr,
                attn_backend=attn_backend,
                speculative_num_steps=max(width - 1, 0),
                speculative_num_draft_tokens=width,
            )
    rt = VerifyRuntime(width, attn_backend, graph_runner, {} if plain
                       else _worker_views(worker, width))
    rt.build_seconds = time.perf_counter() - tic
    rt.build_bytes = max(free0 - _free_bytes(worker.device), 0) if free0 else 0
    return rt


def build_runtimes(worker, spec=None, observability=None) -> WidthRuntimes | None:
    """Called once per worker after SGLang captured its verify graphs at k; None when the flag is
    off. First, in every n-gram server, the step's Triton kernels are compiled for each batch-size
    bucket and each count of accepted-token slots its verify widths can move
    (`warmup.warm_spec_kernels`), in auto verify mode with the plain decode step's kernels."""
    from fastverify.glue.warmup import warm_spec_kernels

    spec = spec if spec is not None else _spec_of(worker)
    flags = verify_config(spec)
    cfg = flags.widths
    auto = flags.mode == "auto"
    warm_spec_kernels(worker, widths=cfg.widths if cfg.enabled else None, plain=auto)
    if not cfg.enabled:
        worker._fv_widths = None
        return None
    obs = observability if observability is not None else spec
    runtimes = {cfg.k: _capture(worker, cfg.k)}
    for w in cfg.extra:
        runtimes[w] = _build_one(worker, w)
        logger.info("verify width %d: runtime built in %.1f s, %.0f MiB of device memory (%s)", w,
                    runtimes[w].build_seconds, runtimes[w].build_bytes / 2**20,
                    "CUDA graphs" if runtimes[w].graph_runner is not None else "eager")
    rts = WidthRuntimes(cfg, runtimes, cfg.k,
                        max(int(getattr(obs, "decode_log_interval", 40) or 40), 1))
    worker._fv_widths = rts
    logger.info("n-gram verify widths %s (k=%d, mode %s): extra runtimes %.0f MiB in total",
                cfg.widths, cfg.k, cfg.mode, sum(r.build_bytes for r in runtimes.values()) / 2**20)
    return rts


def build_plain_runtime(worker) -> VerifyRuntime:
    """The runtime of a plain decode pass (one token per request, DECODE graphs at the
    captured batch sizes): what the auto mode runs for a step that verifies nothing. Built
    once, by ``auto.setup`` after the verify runtimes, its graphs in a memory pool of their
    own (`own_graph_pool`)."""
    rt = _build_one(worker, 1, plain=True)
    logger.info("plain decode runtime built in %.1f s, %.0f MiB of device memory (%s)",
                rt.build_seconds,
                rt.build_bytes / 2**20, "CUDA graphs" if rt.graph_runner is not None else "eager")
    return rt


def _spec_of(worker):
    try:
        from sglang.srt import runtime_context as rc

        if hasattr(rc, "get_spec"):
            return rc.get_spec()
    except ImportError:  # pragma: no cover
        pass
    return worker.server_args


# ----------------------------------------------------------------------------------------- per step
def select_runtime(worker, width: int) -> VerifyRuntime:
    """Make the worker's next verify pass run at ``width`` (a captured width); returns the runtime.

    Swaps the model runner's attention backend and verify graph runner, the worker's
    draft_token_num-derived state and its buffer views. finish_step puts k back.
    """
    rts: WidthRuntimes = getattr(worker, "_fv_widths", None)
    if rts is None:
        raise ValueError(f"no verify runtimes on this worker: start the server with {FLAG}")
    rt = rts.runtimes.get(int(width))
    if rt is None:
        raise ValueError(f"verify width {width} was not captured; {FLAG} gives {rts.config.widths}")
    mr = worker.model_runner
    mr.attn_backend = rt.attn_backend
    mr.decode_cuda_graph_runner = rt.graph_runner
    for name, views in rt.views.items():
        setattr(worker, name, views)
    worker.draft_token_num = rt.width
    worker.speculative_num_draft_tokens = rt.width
    rts.active = rt.width
    rts.pending = True
    return rt


def step_drafts(worker, tokens, mask, bs: int):
    """Chain mode: pick this step's width from the drafts' real lengths, truncate
    them, select the runtime."""
    rts: WidthRuntimes = getattr(worker, "_fv_widths", None)
    if rts is None or not rts.config.per_step:
        return tokens, mask
    width, _plan = choose_width(chain_draft_lengths(tokens, rts.k), rts.config)
    if width != rts.k:
        tokens, mask = truncate_drafts(tokens, mask, rts.k, width)
    select_runtime(worker, width)
    return tokens, mask


def carried_stride(worker) -> int:
    """Stride of the accept tokens carried between steps: always k (finish_step pads them)."""
    rts: WidthRuntimes = getattr(worker, "_fv_widths", None)
    return worker.draft_token_num if rts is None else rts.k


def finish_step(worker, accept_tokens, bs: int):
    """End of a step: back to the width-k runtime; returns (accept tokens at
    stride k, this step's width).

    Without the flag, or for a step that did not verify, returns the inputs unchanged and
    the worker's own width.
    """
    rts: WidthRuntimes = getattr(worker, "_fv_widths", None)
    if rts is None:
        return accept_tokens, worker.speculative_num_draft_tokens
    if not rts.pending:  # no width was selected this step (prefill, or auto left it at k)
        return accept_tokens, worker.speculative_num_draft_tokens
    width = rts.active
    if width != rts.k:
        accept_tokens = pad_accept_tokens(accept_tokens, bs, width, rts.k)
        select_runtime(worker, rts.k)
    rts.pending = False
    rts.stats.record(bs, width, rts.k)
    rts.window.record(bs, width, rts.k)
    if rts.window.steps >= rts.log_interval:
        s = rts.window.summary()
        logger.info("n-gram verify widths: steps by width %s, verified tok/step %.1f (static width "
                    "%d: %.1f)",
                    s["steps_by_width"], s["verified_tokens_per_step"], rts.k,
                    s["static_tokens_per_step"])
        rts.window = WidthStats.empty()
    return accept_tokens, width
