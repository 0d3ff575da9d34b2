"""SGLang side of verify-pass timing (--enable-verify-timing): CUDA events on the GPU stream.

Patch 0006 calls this module at four seams (both series):
- ``check_server_args``: ``timing_hook.check_flags(server_args)`` -> a bad flag fails at launch;
- ``ModelRunner.forward``: ``timing_hook.pass_scope(self, forward_batch)`` around the forward;
- ``ModelRunner._forward_raw``: ``can_run_graph =
  timing_hook.graph_or_eager(can_run_graph)`` and ``and not timing_hook.eager_pass()`` on
  the piecewise prefill-graph branch: a sampled pass runs eagerly;
- ``GroupCoordinator.all_reduce`` / ``fused_allreduce_rmsnorm`` and FlashInfer's
  ``flashinfer_allreduce_residual_rmsnorm``: ``@timing_hook.timed_collective(kind)``.

With the flag off nothing here records an event: ``pass_scope`` hands back one shared null context,
no pass is ever open, and the collective wrappers call straight through (one global read per call).
The accounting lives in fastverify.timing; this module only owns the CUDA events and the
SGLang objects. Importing it is cheap and imports no SGLang module at top level
(parallel_state imports it).
"""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, Optional

from fastverify import timing
from fastverify.timing import PassTimer, TimingConfig

logger = logging.getLogger(__name__)

# The timer whose sampled pass is open right now, else None. Set only between PassTimer.begin and
# end of a sampled pass on this process; the collective wrappers read it once per call.
_ACTIVE: Optional[PassTimer] = None
_ACTIVE_STACK: Optional[contextlib.ExitStack] = None
_NULL = contextlib.nullcontext()
_ATTR = "_fastverify_timer"


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------
def config_from_server_args(server_args: Any, *, tp_size: int = 1,
                            tp_rank: int = 0) -> TimingConfig:
    """The one place that reads our flags off SGLang's ServerArgs (same names
    in 0.5.16 and 0.5.23)."""
    return TimingConfig.from_flags(
        getattr(server_args, "enable_verify_timing", False),
        getattr(server_args, "verify_timing_interval", timing.DEFAULT_INTERVAL),
        getattr(server_args, "verify_timing_log_interval", timing.DEFAULT_LOG_INTERVAL_S),
        tp_size=tp_size,
        tp_rank=tp_rank,
        model_name=getattr(server_args, "served_model_name", None)
        or getattr(server_args, "model_path", ""),
        export_metrics=bool(getattr(server_args, "enable_metrics", False)),
    )


def check_flags(server_args: Any) -> None:
    """Launcher-side validation (SGLang's check_server_args): raises ValueError naming the flag."""
    config_from_server_args(server_args)


# --------------------------------------------------------------------------------------------------
# CUDA events
# --------------------------------------------------------------------------------------------------
class CudaEventClock:
    """fastverify.timing.DeviceClock on the current CUDA stream."""

    def __init__(self):
        import torch

        self._torch = torch

    def mark(self):
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def done(self, mark) -> bool:
        return mark.query()

    def elapsed_ms(self, start, end) -> float:
        return start.elapsed_time(end)

    def hold(self, cycles: int) -> None:
        self._torch.cuda._sleep(int(cycles))  # GPU busy-wait; lets the host enqueue the pass ahead

    def wait(self, mark) -> None:
        mark.synchronize()


def _exchange_over(group):
    """All-gather of a small picklable object over the TP group's CPU side (gloo):
    every rank's payload."""
    import torch.distributed as dist

    def exchange(payload):
        out = [None] * group.world_size
        dist.all_gather_object(out, payload, group=group.cpu_group)
        return out

    return exchange


# --------------------------------------------------------------------------------------------------
# The pass seam (ModelRunner.forward / _forward_raw)
# --------------------------------------------------------------------------------------------------
def _mode_of(forward_batch) -> Optional[str]:
    fm = forward_batch.forward_mode
    if fm.is_target_verify():
        return "verify"
    if fm.is_decode():
        return "decode"
    return None  # prefill, extend, idle, draft passes are not timed


def _build_timer(runner) -> Optional[PassTimer]:
    server_args = runner.server_args
    if (not getattr(server_args, "enable_verify_timing", False)
            or getattr(runner, "is_draft_worker", False)):
        return None
    import torch

    if not torch.cuda.is_available():
        logger.warning("--enable-verify-timing needs CUDA; verify timing is off on this device")
        return None
    from sglang.srt.distributed import parallel_state

    tp = parallel_state.get_tp_group()
    config = config_from_server_args(server_args, tp_size=tp.world_size, tp_rank=tp.rank_in_group)
    metrics = None
    if config.export_metrics:
        import prometheus_client  # after PROMETHEUS_MULTIPROC_DIR is set, like SGLang's collectors

        metrics = timing.VerifyMetrics(prometheus_client, config)
    exchange = _exchange_over(tp) if tp.world_size > 1 else None
    logger.info(
        "Verify timing on: one pass in %d of each mode (verify, decode) runs eagerly with CUDA "
        "events around every all-reduce%s; metrics %s",
        config.floor,
        ", per-call times gathered over the %d TP ranks" % tp.world_size if exchange else "",
        "on" if metrics else "off (no --enable-metrics)",
    )
    return PassTimer(config, CudaEventClock(), metrics=metrics, log=logger.info, exchange=exchange)


def timer_for(runner) -> Optional[PassTimer]:
    """The runner's timer, built on first use from its server_args; None when the flag is off."""
    try:
        return runner.__dict__[_ATTR]
    except KeyError:
        pass
    timer = _build_timer(runner)
    setattr(runner, _ATTR, timer)
    return timer


def pass_scope(runner, forward_batch):
    """Context around one ModelRunner.forward. Off, draft runner or untimed mode:
    a shared null context."""
    timer = timer_for(runner)
    if timer is None:
        return _NULL
    mode = _mode_of(forward_batch)
    if mode is None:
        return _NULL
    return _pass(timer, mode, forward_batch)


@contextlib.contextmanager
def _pass(timer: PassTimer, mode: str, forward_batch):
    global _ACTIVE, _ACTIVE_STACK
    ids = forward_batch.input_ids
    # [bs * k] for verify
    tokens = int(ids.shape[0]) if ids is not None else int(forward_batch.batch_size)
    if not timer.begin(mode, tokens, int(forward_batch.batch_size)):
        yield
        return
    _ACTIVE, _ACTIVE_STACK = timer, contextlib.ExitStack()
    ok = False
    try:
        yield
        ok = True
    finally:
        stack = _ACTIVE_STACK
        _ACTIVE, _ACTIVE_STACK = None, None
        stack.close()
        timer.end() if ok else timer.abort()


def eager_pass() -> bool:
    """True while a sampled pass is open: it must not replay a CUDA graph."""
    return _ACTIVE is not None


def graph_or_eager(can_run_graph: bool) -> bool:
    """ModelRunner's graph decision for this pass. A sampled pass runs eagerly; if it would have
    replayed the decode graph, it also uses the graph's communicator (pynccl on the current stream,
    as SGLang's graph_capture() does) instead of eager torch.distributed NCCL on a side stream."""
    if _ACTIVE is None:
        return can_run_graph
    if can_run_graph and _ACTIVE_STACK is not None:
        from sglang.srt.distributed import parallel_state

        pynccl = getattr(parallel_state.get_tp_group(), "pynccl_comm", None)
        if pynccl is not None:
            _ACTIVE_STACK.enter_context(pynccl.change_state(enable=True))
    return False


# --------------------------------------------------------------------------------------------------
# The collective seam (parallel_state / flashinfer_comm_fusion)
# --------------------------------------------------------------------------------------------------
def _fused_applied(out) -> bool:
    """A fused all-reduce+RMSNorm call ran (SGLang falls back to a plain all-reduce when it returns
    None or (None, ...))."""
    if out is None:
        return False
    if isinstance(out, tuple) and out and out[0] is None:
        return False
    return True


def timed_collective(kind: str) -> Callable:
    """Decorator for a collective: brackets the call with CUDA events while a
    sampled pass is open."""
    if kind not in timing.SPAN_KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {timing.SPAN_KINDS}")
    applied = _fused_applied if kind == "allreduce_norm" else None

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            timer = _ACTIVE
            if timer is None:
                return fn(*args, **kwargs)
            return timer.timed_call(kind, fn, args, kwargs, applied)

        return wrapper

    return decorate
