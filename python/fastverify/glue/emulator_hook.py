"""SGLang side of pass-cost emulation (--emulate-pass-cost PROFILE, --emulate-pass-cost-compute).

Patch 0011 calls this module at four seams (both series):
- ``check_server_args``: ``emulator_hook.check_flags(server_args)``: a bad flag or profile fails at
  launch, and the launcher logs the ACTIVE warning with the waits it will add;
- ``ModelRunner.__init__``, once the device is set: ``emulator_hook.install(self)``: on the target
  model's runner only (never a draft model's), calibrates and self-checks the device wait (the
  server refuses to start when it is off), and appends a hook to SGLang's
  ``ModelRunner.capture_tail_hooks``, which its decode/verify CUDA graph runner calls after the
  model's forward inside every graph capture, so each captured graph (decode at each batch size,
  TARGET_VERIFY at each width) ends with its fixed wait (the warm-up runs before a capture do not
  wait);
- ``ModelRunner._forward_raw``, before its last return (every pass that did not replay a
  decode/verify graph: eager decode/verify, prefill/extend eager or in a piecewise prefill graph):
  ``emulator_hook.eager_wait(self, forward_batch)``;
- ``ModelRunner.forward``: ``emulator_hook.pass_scope(self, forward_batch)`` around the pass: counts
  it, times one pass in emulator.SAMPLE_EVERY with CUDA events, writes the periodic ACTIVE line.

Off (no flag) every call returns at once (one dict lookup) and no hook is appended. The wait math,
the calibration and the self-check live in fastverify.emulator; this module owns torch.cuda and the
SGLang objects. Importing it imports no SGLang module.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, List, Optional

from fastverify import emulator
from fastverify.emulator import EmulatorConfig, PassEmulator

logger = logging.getLogger(__name__)

_ATTR = "_fastverify_emulator"
_NULL = contextlib.nullcontext()


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------
def config_from_server_args(server_args: Any) -> Optional[EmulatorConfig]:
    """The one place that reads the flags off SGLang's ServerArgs (same names in both pins)."""
    compute = bool(getattr(server_args, "emulate_pass_cost_compute", False))
    return emulator.config_from_flags(getattr(server_args, "emulate_pass_cost", None), compute)


def check_flags(server_args: Any) -> None:
    """Launcher-side validation (SGLang's check_server_args): raises EmulatorError naming the
    flag."""
    config = config_from_server_args(server_args)
    if config is not None:
        logger.warning("%s. %s", config.banner(), config.table())


def check_tokens(server_args: Any) -> List[int]:
    """Token counts the self-check times: 1 (decode, batch size 1), the widest verify pass of one
    request (speculative_num_draft_tokens) and emulator.CHECK_TOKENS."""
    k = getattr(server_args, "speculative_num_draft_tokens", None)
    spec = getattr(server_args, "speculative_algorithm", None)
    out = set(emulator.CHECK_TOKENS)
    if spec and isinstance(k, int) and k > 0:
        out.add(k)
    return sorted(out)


# --------------------------------------------------------------------------------------------------
# The CUDA device
# --------------------------------------------------------------------------------------------------
class CudaSpinDevice:
    """emulator.SpinDevice on the current CUDA stream: torch.cuda._sleep spins, CUDA events time
    them."""

    HOLD_CYCLES = 200_000  # ~0.1 ms spin before a timed rep: the host enqueues the rep meanwhile

    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise emulator.EmulatorError(f"{emulator.FLAG}: needs a CUDA device (none is visible)")
        self._torch = torch

    def spin(self, cycles: int) -> None:
        self._torch.cuda._sleep(int(cycles))

    def mark(self):
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def elapsed_us(self, start, end) -> Optional[float]:
        if not end.query():
            return None
        return start.elapsed_time(end) * 1000.0

    def time_us(self, fn: Callable[[], None], reps: int, graph: bool = False) -> List[float]:
        torch = self._torch
        replay = fn
        g = None
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                fn()
            replay = g.replay
        pairs = []
        for _ in range(reps):
            self.spin(self.HOLD_CYCLES)
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            replay()
            b.record()
            pairs.append((a, b))
        torch.cuda.synchronize()
        out = [a.elapsed_time(b) * 1000.0 for a, b in pairs]
        del g
        return out


# --------------------------------------------------------------------------------------------------
# Install on the target model runner
# --------------------------------------------------------------------------------------------------
def _stream_capturing() -> bool:
    import torch

    return torch.cuda.is_available() and bool(torch.cuda.is_current_stream_capturing())


_METRICS: dict = {}  # one set of collectors per process and labels (a second would be a duplicate)


def _build_metrics(server_args: Any, config: EmulatorConfig, tp_rank: int, worst: float):
    if not getattr(server_args, "enable_metrics", False):
        return None
    key = (config.profile.name, config.mode, tp_rank)
    if key not in _METRICS:
        import prometheus_client  # after PROMETHEUS_MULTIPROC_DIR is set, like SGLang's collectors

        _METRICS[key] = emulator.EmulatorMetrics(prometheus_client, config, tp_rank=tp_rank,
                                                 worst_check_error=worst)
    return _METRICS[key]


def _tp_rank(runner) -> int:
    for obj, name in ((getattr(runner, "ps", None), "tp_rank"), (runner, "tp_rank")):
        rank = getattr(obj, name, None)
        if isinstance(rank, int):
            return rank
    return 0


def install(runner, device: Any = None, metrics: Any = None,
            capturing: Callable[[], bool] = _stream_capturing) -> Optional[PassEmulator]:
    """Called once in ModelRunner.__init__ after the device is set. Flag off or a draft model's
    runner: nothing (None). Else calibrate + self-check (CalibrationError stops the server), keep
    the emulator on the runner and append the capture hook. ``device`` / ``metrics`` /
    ``capturing``: stand-ins for tests."""
    server_args = runner.server_args
    config = config_from_server_args(server_args)
    if config is None or getattr(runner, "is_draft_worker", False):
        if config is not None:
            logger.info("pass-cost emulation: not on the draft model's runner")
        runner.__dict__[_ATTR] = None
        return None
    if device is None:
        device = CudaSpinDevice()
    calibration, checks = emulator.calibrate_and_check(device, config, check_tokens(server_args),
                                                       log=logger.warning)
    worst = max((abs(r.error) for r in checks), default=0.0)
    if metrics is None:
        metrics = _build_metrics(server_args, config, _tp_rank(runner), worst)
    em = PassEmulator(config, calibration, device, checks=checks, metrics=metrics)
    runner.__dict__[_ATTR] = em
    runner.capture_tail_hooks.append(_CaptureTail(em, capturing))
    for line in em.startup_lines():
        logger.warning("%s", line)
    return em


def emulator_of(runner) -> Optional[PassEmulator]:
    return runner.__dict__.get(_ATTR)


class _CaptureTail:
    """SGLang's capture tail hook: hook(graph_runner, out, forward_batch, num_tokens), called after
    the model's forward inside each decode/verify graph capture and its warm-up runs. While the
    stream is capturing, the wait enqueued here is recorded into the graph at the graph's token
    count (replays then wait without any Python); the warm-up runs before it do not wait (a large
    graph's wait could take seconds per run, for nothing)."""

    def __init__(self, em: PassEmulator, capturing: Callable[[], bool] = _stream_capturing):
        self.em, self.capturing = em, capturing
        self.graph_tokens = {}  # (id(graph runner), captured batch size) -> the graph's tokens

    def __call__(self, graph_runner, out, forward_batch, num_tokens) -> None:
        if not self.capturing():
            return
        n = int(num_tokens)
        self.em.wait(n)
        self.graph_tokens[(id(graph_runner), int(forward_batch.batch_size))] = n


# --------------------------------------------------------------------------------------------------
# Per pass
# --------------------------------------------------------------------------------------------------
def pass_kind(forward_batch) -> str:
    fm = forward_batch.forward_mode
    if fm.is_target_verify():
        return "verify"
    if fm.is_decode():
        return "decode"
    if fm.is_idle():
        return "idle"
    return "prefill"


def pass_token_count(forward_batch) -> int:
    """Tokens of a pass: input_ids is [bs] for decode, [bs * width] for verify, [extend tokens] for
    an extend/prefill pass."""
    ids = getattr(forward_batch, "input_ids", None)
    if ids is not None:
        return int(ids.shape[0])
    n = getattr(forward_batch, "extend_num_tokens", None)
    return int(n) if isinstance(n, int) else int(forward_batch.batch_size)


def eager_wait(runner, forward_batch) -> None:
    """After a pass that did not replay a decode/verify graph. Split prefill (a few layers per call)
    gets no wait: it is not emulated."""
    em = runner.__dict__.get(_ATTR)
    if em is None:
        return
    if forward_batch.forward_mode.is_split_prefill():
        return
    n = pass_token_count(forward_batch)
    em.wait(n)
    em.eager_tokens = (em.eager_tokens or 0) + n


def pass_scope(runner, forward_batch):
    """Context around one ModelRunner.forward. Flag off or a draft runner: a shared null
    context."""
    em = runner.__dict__.get(_ATTR)
    if em is None:
        return _NULL
    return _pass(em, runner, forward_batch)


def _graph_tokens(em: PassEmulator, runner) -> Optional[int]:
    """Token count of the decode/verify graph the pass replayed (its padded shape)."""
    gr = getattr(runner, "decode_cuda_graph_runner", None)
    bs = getattr(gr, "bs", None)
    for hook in getattr(runner, "capture_tail_hooks", ()):
        if isinstance(hook, _CaptureTail) and hook.em is em and isinstance(bs, int):
            return hook.graph_tokens.get((id(gr), bs))
    return None


@contextlib.contextmanager
def _pass(em: PassEmulator, runner, forward_batch):
    sampled = em.take_sample() and not _stream_capturing()  # no timing events inside a capture
    start = em.device.mark() if sampled else None
    em.eager_tokens = None  # eager_wait adds the tokens of a pass that waited outside a graph
    yield
    end = em.device.mark() if sampled else None
    kind = pass_kind(forward_batch)
    eager, em.eager_tokens = em.eager_tokens, None
    if eager is not None:
        em.record(kind, eager, in_graph=False, start=start, end=end)
    elif not forward_batch.forward_mode.is_split_prefill():
        n = _graph_tokens(em, runner)
        em.record(kind, n if n is not None else pass_token_count(forward_batch), in_graph=True,
                  start=start, end=end)
    if em.due():
        logger.warning("%s", em.summary())
