"""A per-iteration trace of SGLang's scheduler loop, for finding where a
server's decode step loses time.

A profiler answers "where does the host spend its time on average"; a step that is slow only now and
then (a garbage collection, a step with extra host work that no longer fits under the GPU's step)
disappears in an average. This records every iteration instead, cheaply enough to leave the step
timing intact (a few clock reads per iteration, no device synchronisation of its own):

- ``R``: one ``Scheduler.run_batch`` call (the host preparing and launching a step): start, end,
  forward mode, batch size, for an n-gram worker in auto verify mode the kind of step the
  controller ran (``lean``/``spec``, ``path`` for a step on SGLang's own decode path), its width,
  and whether drafts were looked up only to learn from (``probe``; for a ``path`` step, whether it
  probed there: `plain_path._probe` runs inside the launch); last, the seconds spent since
  the previous launch record in each function of ``SPANS`` (batch selection, the forward,
  sampling, the glue's pieces); then ``greedy`` or ``sampled`` (every request of the batch decodes
  greedily, or not: the sampler's host and device work differ by several times, so steps of a
  greedy load and of a sampled one are not compared with each other), or None where the batch does
  not say; with ``FASTVERIFY_STEP_TRACE_AB`` set, last the step's variant, ``a`` or ``b`` (below).
- ``P``: one ``Scheduler.process_batch_result`` call: start, end, and the time spent inside it
  waiting on CUDA events (the host waiting for the step in flight).
- ``G``: one garbage collection: generation, start, duration.
- ``I``: the scheduler found nothing to run (its idle hook, first call after a launch): time. A step
  whose next launch comes after one waited for new requests, not for itself.
- ``C``: one Triton kernel compiled (or loaded from Triton's on-disk cache) while serving:
  start, duration, the kernel's name, its compile-time constants and its argument types (what
  made this call a new one).
- ``E`` (with ``FASTVERIFY_STEP_TRACE_GPU=1``): the device side of one ``R``: its start (the
  ``R``'s), the milliseconds the forward stream took from the step's first mark to its last
  (``span``), and from its last mark to the next step's first (``gap``). Two CUDA events per step,
  recorded on the scheduler's forward stream (the current stream without one) when ``run_batch``
  starts and when it returns, read once the next step's first has passed: while the host launches
  each step before the GPU finishes the one before (a GPU-bound step), the span is the step's device
  time and the gap is 0; a host that comes late shows as gap. So two servers whose host periods
  differ can be told apart: longer device work, or a host that leaves the GPU idle.

Times are ``time.perf_counter()`` seconds. Records go to one JSON-lines file per process, appended
whenever the scheduler goes idle (no step in flight to delay) and, while it never does, in blocks of
``FLUSH_EVERY`` records (writing 512 records took a step ~10 ms, so blocks are rare: about one per
8000 decode steps). A server killed mid-load loses what it recorded since it last went idle.
``lab/step_trace.py`` turns the files into per-step statistics.

Turned on by ``FASTVERIFY_STEP_TRACE=DIR`` in a process that imports SGLang's scheduler after
``install_import_hook()`` ran (``lab/steptrace/sitecustomize.py`` does it at interpreter start, when
its folder is on ``PYTHONPATH``). ``FASTVERIFY_STEP_TRACE_SPANS=0``: no function of ``SPANS`` is
wrapped (Triton's compile step still is), so that every server pays the same few wrappers a step:
each span costs the host two clock readings and a sum, and a server on auto's plain path runs
through more of them than a plain server, which biases a comparison of periods at the 0.01 ms level.
Nothing in the patch series depends on it.

Within-process A/B (``FASTVERIFY_STEP_TRACE_AB``): two servers' periods differ by their processes'
own offsets (0.04-0.07 ms a step between two identical auto servers on one H200, as large as the
costs looked for), so a piece of host work is priced inside one process instead: its decode steps
alternate in blocks of ``FASTVERIFY_STEP_TRACE_AB_BLOCK`` (32) between variant ``a`` (the server
as it runs) and ``b`` (the same plus one piece of work, done right after the step's ``run_batch``),
and ``lab/ab_within.py`` sets each ``b`` block against the ``a`` block before it. The piece of
work: ``spin:US``, a busy wait of US microseconds on every decode step (the known cost that shows
the method recovers it). Or variant ``b`` runs the server with one of the plain path's earlier
policies (`AB_POLICIES`, swapped in for each step before its path choice): ``put_first``, a
stretch's last output put as it leaves the path (not after the worker's lookup,
`plain_path.put_pending`).
"""

from __future__ import annotations

import gc
import importlib
import importlib.abc
import importlib.util
import json
import os
import sys
import time
from collections import deque
from typing import Callable, List, Optional

ENV = "FASTVERIFY_STEP_TRACE"
GPU_ENV = "FASTVERIFY_STEP_TRACE_GPU"  # "1": also the device side of each step (E records)
SPANS_ENV = "FASTVERIFY_STEP_TRACE_SPANS"  # "0": only Triton's compile step of SPANS is wrapped
AB_ENV = "FASTVERIFY_STEP_TRACE_AB"  # the piece of work of variant "b" (module docstring)
AB_BLOCK_ENV = "FASTVERIFY_STEP_TRACE_AB_BLOCK"  # decode steps per block of one variant
AB_BLOCK = 32
# records kept in memory at most (~2 per step): a write on the scheduler thread stalls a step
FLUSH_EVERY = 16384
MARK = "_fastverify_span"  # set on the functions this module wrapped
GPU_MARK = "_fastverify_gpu_span"  # set on the functions GpuMarks wrapped
# forward modes of the batches whose step the auto glue decides
AUTO_MODES = ("DECODE", "TARGET_VERIFY")
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
COMPILE_LABEL = "triton_compile"  # the span of Triton's compile step (also written as a C record)
# Functions timed inside each iteration (module, attribute path, label): SGLang's forward and
# sampling, the n-gram worker's step and corpus update, the auto glue's pieces, the scheduler's
# batch selection. Those whose module is not imported (a server without speculation) are left out.
SPANS = (
    ("sglang.srt.managers.scheduler", "Scheduler.get_next_batch_to_run", "schedule"),
    ("sglang.srt.managers.tp_worker", "TpModelWorker.forward_batch_generation", "target_step"),
    ("sglang.srt.model_executor.model_runner", "ModelRunner.forward", "model_forward"),
    ("sglang.srt.model_executor.model_runner", "ModelRunner.sample", "sample"),
    ("sglang.srt.speculative.ngram_worker", "NGRAMWorker.forward_batch_generation", "ngram_step"),
    ("sglang.srt.speculative.ngram_worker", "NGRAMWorker._update_ngram_corpus", "corpus_put"),
    ("fastverify.glue.auto", "plain_step", "plain_step"),
    ("fastverify.glue.auto", "run_plain_decode", "plain_decode"),
    ("fastverify.plain_step", "plain_inputs", "plain_inputs"),
    ("fastverify.plain_step", "plain_outputs", "plain_outputs"),
    ("fastverify.glue.auto", "probe_behind", "probe_behind"),
    ("fastverify.glue.auto", "_sync_requests", "sync_requests"),
    ("fastverify.glue.auto", "step_drafts", "step_drafts"),
    ("fastverify.glue.auto", "lookup_behind", "lookup_behind"),
    # a plain step's put (the same work as above)
    ("fastverify.glue.auto", "corpus_put_host", "corpus_put"),
    # auto's stretches on SGLang's own decode path (patch 0012): the scheduler's choice before
    # each decode preparation, the switches, the worker's step, its probes and the relay of its
    # tokens
    ("fastverify.glue.plain_path", "choose_path", "path_choice"),
    ("fastverify.glue.plain_path", "enter", "path_enter"),
    ("fastverify.glue.plain_path", "leave", "path_leave"),
    ("fastverify.glue.plain_path", "step", "path_step"),
    ("fastverify.glue.plain_path", "_probe", "path_probe"),
    ("fastverify.glue.plain_path", "relay", "path_relay"),
    ("fastverify.glue.plain_path", "fill_roots", "path_roots"),
    # a Triton kernel met with new arguments is compiled (or loaded from the on-disk cache) here
    ("triton.runtime.jit", "JITFunction._do_compile", "triton_compile"),
)
# Functions between two CUDA events when FASTVERIFY_STEP_TRACE_GPU=1 (the device
# side of SPANS' two largest)
GPU_SPANS = (
    ("sglang.srt.model_executor.model_runner", "ModelRunner.forward", "forward"),
    ("sglang.srt.model_executor.model_runner", "ModelRunner.sample", "sample"),
)


class GpuMarks:
    """The ``E`` records: two timing events per step on the forward stream, read without waiting (an
    event is read once the next step's first event has passed, ``query()``), and reused once read.
    Functions wrapped by ``wrap_inner`` add a pair of events on the current stream around each call
    inside a step; the E record then also carries the milliseconds between each pair, summed per
    label (``GPU_SPANS``: the model's forward, graph replay included, and the sampler), so a step's
    device span splits into those and the rest."""

    def __init__(self, event_cls):
        self.event_cls = event_cls
        # (start of the R record, first, last, [(label, a, b)]), oldest first
        self.pending: deque = deque()
        self.free: list = []
        self._first = None
        self._inner: list = []  # (label, event before, event after) of the step being launched

    def _event(self):
        return self.free.pop() if self.free else self.event_cls(enable_timing=True)

    @staticmethod
    def _record(event, stream=None) -> None:
        if stream is None:
            event.record()
        else:
            event.record(stream)

    def begin(self, stream) -> None:
        self._first = self._event()
        self._inner = []
        self._record(self._first, stream)

    def end(self, stream, start: float) -> list:
        """The step launched: its last mark; returns the E records of earlier steps
        that can be read now."""
        if self._first is None:
            return []
        last = self._event()
        self._record(last, stream)
        self.pending.append((start, self._first, last, self._inner))
        self._first, self._inner = None, []
        return self.harvest()

    def wrap_inner(self, fn, label: str):
        """``fn`` between two events on the current stream when called inside a
        step (else untouched)."""
        marks = self

        def inner(*args, **kwargs):
            if marks._first is None:
                return fn(*args, **kwargs)
            before = marks._event()
            marks._record(before)
            try:
                return fn(*args, **kwargs)
            finally:
                after = marks._event()
                marks._record(after)
                marks._inner.append((label, before, after))

        inner.__wrapped__ = fn
        setattr(inner, GPU_MARK, True)
        return inner

    def harvest(self) -> list:
        out = []
        while len(self.pending) >= 2 and self.pending[1][1].query():
            start, first, last, inner = self.pending.popleft()
            # still the first mark of the step now oldest: not freed yet
            following = self.pending[0][1]
            rec = ["E", start, float(first.elapsed_time(last)), float(last.elapsed_time(following))]
            if inner:
                parts: dict = {}
                for label, a, b in inner:
                    # (on another stream than the forward's: may be running)
                    if a.query() and b.query():
                        parts[label] = parts.get(label, 0.0) + float(a.elapsed_time(b))
                    self.free += [a, b]
                rec.append(parts)
            out.append(rec)
            self.free += [first, last]
        return out


def spinner(us: float, clock: Callable[[], float] = time.perf_counter):
    """Variant ``spin:US``: a busy wait of ``us`` microseconds after every decode step."""
    seconds = us / 1e6

    def spin(scheduler, batch, mode: str, on_path: bool) -> None:
        if mode != "DECODE":
            return
        end = clock() + seconds
        while clock() < end:
            pass

    return spin


class Swap:
    """A policy variant: variant "b" runs with ``module.name`` replaced by ``make(original)``,
    variant "a" with the original. Set for each step before its path choice (the scheduler asks
    `plain_path.choose_path` before it runs the step's batch)."""

    def __init__(self, module: str, name: str, make: Callable):
        self.module, self.name, self.make = module, name, make
        self._mod = self._original = self._b = None

    def __call__(self, variant: str) -> None:
        if self._mod is None:
            self._mod = importlib.import_module(self.module)
            self._original = getattr(self._mod, self.name)
            self._b = self.make(self._original, self._mod)
        setattr(self._mod, self.name, self._b if variant == "b" else self._original)


def _put_at_leave(original, module):
    """``put_first``: a stretch's last output put as the batch leaves the path, before the worker's
    lookup, as before `plain_path.put_pending`."""

    def leave(scheduler, batch, state, why=""):
        original(scheduler, batch, state, why)
        module.put_pending(scheduler.model_worker, state)

    return leave


# the policies a variant "b" runs with: name -> Swap (its variant "a" is the server as it is)
AB_POLICIES = {
    "put_first": ("fastverify.glue.plain_path", "leave", _put_at_leave),
}


class WithinAB:
    """Variant of each step: decode steps (forward mode DECODE) alternate in blocks of ``block``,
    "a" first; other steps take the variant of the block they fall in. ``extra`` runs after each
    step of variant "b"; ``policy`` (a `Swap`) is set for the next step's variant after each step,
    and for variant "a" before the first (`StepTrace.wrap_run_batch`)."""

    def __init__(self, extra: Optional[Callable] = None, block: int = AB_BLOCK,
                 policy: Optional[Callable] = None):
        if int(block) < 1:
            raise ValueError(f"{AB_BLOCK_ENV} must be >= 1, got {block!r}")
        self.extra, self.block, self.policy = extra, int(block), policy
        self.decode_steps = 0
        self.policy_set = False

    def next_variant(self) -> str:
        return "b" if (self.decode_steps // self.block) % 2 else "a"

    def variant(self, mode: str) -> str:
        v = self.next_variant()
        if mode == "DECODE":
            self.decode_steps += 1
        return v


def within_ab(env=None) -> Optional[WithinAB]:
    """The A/B that ``AB_ENV`` names (None where unset); a clear error for a name it does not
    know."""
    env = os.environ if env is None else env
    spec = env.get(AB_ENV, "").strip()
    if not spec:
        return None
    block = env.get(AB_BLOCK_ENV, str(AB_BLOCK))
    try:
        block = int(block)
    except ValueError:
        raise ValueError(f"{AB_BLOCK_ENV}={block!r}: not an integer") from None
    if spec.startswith("spin:"):
        try:
            us = float(spec[5:])
        except ValueError:
            us = -1.0
        if not us > 0:
            raise ValueError(f"{AB_ENV}={spec!r}: spin needs microseconds > 0 (spin:20)")
        return WithinAB(spinner(us), block)
    if spec in AB_POLICIES:
        return WithinAB(block=block, policy=Swap(*AB_POLICIES[spec]))
    names = ", ".join(sorted(AB_POLICIES))
    raise ValueError(f"{AB_ENV}={spec!r}: one of {names} or spin:US")


class StepTrace:
    """Collects the records of one process and appends them to ``path`` when the scheduler goes
    idle, or every ``flush_every`` records when it does not."""

    def __init__(self, path: str, flush_every: int = None,
                 clock: Callable[[], float] = time.perf_counter, gpu: Optional[GpuMarks] = None):
        flush_every = FLUSH_EVERY if flush_every is None else flush_every
        self.path = path
        self.flush_every = max(int(flush_every), 1)
        self.clock = clock
        self.records: List[list] = []
        self.waited = 0.0  # seconds waited on CUDA events since the last reset
        # label -> seconds spent in that function since the last launch record
        self.spans: dict = {}
        self.span_targets = SPANS
        # with gpu: functions between two events (GpuMarks.wrap_inner)
        self.gpu_span_targets = GPU_SPANS
        self._spans_installed = False
        self.idle_noted = False  # an "I" record was written since the last launch
        self._gc_start: Optional[float] = None
        self.gpu = gpu  # GpuMarks, or None: no E records
        self.ab: Optional[WithinAB] = None  # a within-process A/B (module docstring), or None

    def add(self, record: list) -> None:
        self.records.append(record)
        if len(self.records) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self.records:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            for rec in self.records:
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.records = []

    # ---- garbage collections
    # ------------------------------------------------------------------------------
    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = self.clock()
        elif phase == "stop" and self._gc_start is not None:
            start, self._gc_start = self._gc_start, None
            self.add(["G", int(info.get("generation", -1)), start, self.clock() - start])

    # ---- wrappers
    # -----------------------------------------------------------------------------------------
    def _timed(self, fn, add):
        """``fn`` calling ``add(seconds)`` with its duration after each call
        (also when it raises)."""
        clock = self.clock

        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                add(clock() - t0)

        timed.__wrapped__ = fn
        return timed

    def _add_wait(self, seconds: float) -> None:
        self.waited += seconds

    def wrap_wait(self, fn):
        """A CUDA wait (``Event.synchronize``, ``Stream.synchronize``) that adds its
        duration to ``waited``."""
        return self._timed(fn, self._add_wait)

    def wrap_span(self, fn, label: str):
        """``fn`` adding its duration to ``spans[label]`` (reported with the next launch record)."""
        def add(seconds: float) -> None:
            # (spans is replaced at each launch)
            self.spans[label] = self.spans.get(label, 0.0) + seconds

        span = self._timed(fn, add)
        setattr(span, MARK, True)
        return span

    def wrap_compile(self, fn):
        """Triton's ``JITFunction._do_compile``: timed as the span ``triton_compile``, and a ``C``
        record naming the kernel, the compile-time constants and the argument types it met."""
        span = self.wrap_span(fn, COMPILE_LABEL)
        trace = self

        def compile_kernel(jit, *args, **kwargs):
            t0 = trace.clock()
            try:
                return span(jit, *args, **kwargs)
            finally:
                trace.add(["C", t0, trace.clock() - t0, kernel_name(jit), _constexprs(args, kwargs),
                           _signature(args, kwargs)])

        compile_kernel.__wrapped__ = fn
        setattr(compile_kernel, MARK, True)
        return compile_kernel

    def install_spans(self) -> list:
        """Wrap each function of ``span_targets`` ((module, "Class.method" or "function",
        label)) whose module is imported; returns the labels wrapped. Done at the first step,
        when the workers exist."""
        self._spans_installed = True
        done = []
        for module_name, qualname, label in self.span_targets:
            owner, attr, fn = _resolve(module_name, qualname)
            # (SGLang's own decorators set __wrapped__ too)
            if fn is None or getattr(fn, MARK, False):
                continue
            setattr(owner, attr, self.wrap_compile(fn) if label == COMPILE_LABEL
                    else self.wrap_span(fn, label))
            done.append(label)
        for module_name, qualname, label in (self.gpu_span_targets if self.gpu is not None else ()):
            owner, attr, fn = _resolve(module_name, qualname)
            if fn is None or getattr(fn, GPU_MARK, False):
                continue
            setattr(owner, attr, self.gpu.wrap_inner(fn, label))
            done.append(f"gpu:{label}")
        return done

    def wrap_run_batch(self, fn):
        trace = self

        def run_batch(scheduler, batch, *args, **kwargs):
            if not trace._spans_installed:
                trace.install_spans()
            # before the step: a verify step changes the mode
            mode, bs = mode_name(batch), batch_size(batch)
            how = sampling_kind(batch)
            on_path = on_plain_path(scheduler, batch)
            probes = path_probes(scheduler) if on_path else None
            trace.idle_noted = False
            gpu, stream = trace.gpu, getattr(scheduler, "forward_stream", None)
            ab = trace.ab
            if ab is not None and ab.policy is not None and not ab.policy_set:
                ab.policy(ab.next_variant())  # (the first step's: later ones are set below)
                ab.policy_set = True
            t0 = trace.clock()
            if gpu is not None:
                gpu.begin(stream)
            result = fn(scheduler, batch, *args, **kwargs)
            variant = ab.variant(mode) if ab is not None else None
            if variant == "b" and ab.extra is not None:
                ab.extra(scheduler, batch, mode, on_path)
            marks = gpu.end(stream, t0) if gpu is not None else ()
            t1 = trace.clock()
            if ab is not None and ab.policy is not None:
                ab.policy(ab.next_variant())  # before the next step's path choice (not timed)
            spans, trace.spans = trace.spans, {}
            # (a prefill is no auto step: the worker's last step kind is
            # still its last decode step's)
            kind = ([PATH_KIND, 1, probes is not None and path_probes(scheduler) != probes]
                    if on_path and mode == "DECODE"
                    else auto_step(scheduler) if mode in AUTO_MODES else [None, None, None])
            rec = ["R", t0, t1, mode, bs, *kind, spans, how]
            if variant is not None:
                rec.append(variant)
            trace.add(rec)
            for rec in marks:
                trace.add(rec)
            return result

        run_batch.__wrapped__ = fn
        return run_batch

    def wrap_process(self, fn):
        trace = self

        def process_batch_result(scheduler, batch, result, *args, **kwargs):
            trace.waited = 0.0
            t0 = trace.clock()
            try:
                return fn(scheduler, batch, result, *args, **kwargs)
            finally:
                trace.add(["P", t0, trace.clock(), trace.waited])

        process_batch_result.__wrapped__ = fn
        return process_batch_result

    def wrap_idle(self, fn):
        """The scheduler's idle hook: a good moment to write what was
        collected (no step in flight)."""
        trace = self

        def on_idle(scheduler, *args, **kwargs):
            if not trace.idle_noted:
                trace.records.append(["I", trace.clock()])
                trace.idle_noted = True
            trace.flush()
            return fn(scheduler, *args, **kwargs)

        on_idle.__wrapped__ = fn
        return on_idle


def _resolve(module_name: str, qualname: str) -> tuple:
    """(owner, attribute, function) of "Class.method" or "function" in an imported module; function
    None when the module is not imported or lacks it."""
    owner = sys.modules.get(module_name)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    return owner, attr, (getattr(owner, attr, None) if owner is not None else None)


def kernel_name(jit) -> str:
    """A Triton JITFunction's name (its Python function's)."""
    name = getattr(jit, "__name__", None) or getattr(getattr(jit, "fn", None), "__name__", None)
    return str(name) if name else type(jit).__name__


def _constexprs(args, kwargs, limit: int = 160) -> str:
    """The compile-time constants of a ``_do_compile(key, signature, device,
    constexprs, ...)`` call, short."""
    value = kwargs.get("constexprs", args[3] if len(args) > 3 else None)
    return "" if value is None else repr(value)[:limit]


def _signature(args, kwargs, limit: int = 240) -> str:
    """The argument types of that call (``name:*i64`` ...), short: a kernel met again with other
    dtypes compiles again."""
    value = kwargs.get("signature", args[1] if len(args) > 1 else None)
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())[:limit]
    return "" if value is None else repr(value)[:limit]


def mode_name(batch) -> str:
    mode = getattr(batch, "forward_mode", None)
    return getattr(mode, "name", str(mode))


def batch_size(batch) -> int:
    reqs = getattr(batch, "reqs", None)
    return len(reqs) if reqs is not None else 0


def sampling_kind(batch) -> Optional[str]:
    """"greedy" when every request of the batch decodes greedily (SGLang's ``is_all_greedy``),
    "sampled" when one does not, None when the batch carries no sampling info."""
    flag = getattr(getattr(batch, "sampling_info", None), "is_all_greedy", None)
    if flag is None:
        return None
    return "greedy" if bool(flag) else "sampled"


# the kind written for a step of auto's on SGLang's own decode path (glue.plain_path)
PATH_KIND = "path"


def _auto_state(scheduler):
    """The auto glue's state on the scheduler's n-gram worker (`glue.auto.AutoState`), or None."""
    return getattr(getattr(scheduler, "draft_worker", None), "_fv_auto", None)


def on_plain_path(scheduler, batch) -> bool:
    """Whether an auto-mode n-gram worker's batch runs this step on SGLang's own decode path (it
    reads as not speculative there, in a server that speculates)."""
    if _auto_state(scheduler) is None:
        return False
    algo = getattr(batch, "spec_algorithm", None)
    return algo is not None and bool(algo.is_none())


def path_probes(scheduler):
    """How many probes an auto-mode n-gram worker has made on SGLang's own decode path
    (`plain_path._probe`, which runs inside the step's launch), None without one: a path step whose
    launch changed it probed."""
    counters = getattr(getattr(_auto_state(scheduler), "controller", None), "counters", None)
    return None if counters is None else counters.get("plain_path_probes", 0)


def auto_step(scheduler) -> list:
    """[kind, width, probe] of the step an auto-mode n-gram worker just ran; [None,
    None, None] otherwise."""
    state = _auto_state(scheduler)
    if state is None:
        return [None, None, None]
    step = state.last_step
    if step is None:
        return [None, None, None]
    # a probe step (its own kind in the cost model) is written as a lean step that probed
    return ["lean" if step[0] == "probe" else step[0], int(step[2]), step[0] == "probe"]


def instrument(scheduler_cls, event_cls, trace: StepTrace, stream_cls=None) -> StepTrace:
    """Wrap the scheduler's run_batch, process_batch_result and on_idle, the CUDA
    waits and the collector."""
    scheduler_cls.run_batch = trace.wrap_run_batch(scheduler_cls.run_batch)
    scheduler_cls.process_batch_result = trace.wrap_process(scheduler_cls.process_batch_result)
    if hasattr(scheduler_cls, "on_idle"):
        scheduler_cls.on_idle = trace.wrap_idle(scheduler_cls.on_idle)
    event_cls.synchronize = trace.wrap_wait(event_cls.synchronize)
    if stream_cls is not None:
        stream_cls.synchronize = trace.wrap_wait(stream_cls.synchronize)
    gc.callbacks.append(trace.on_gc)
    return trace


def trace_path(directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, f"steps-{os.getpid()}.jsonl")


def span_targets(env=None) -> tuple:
    """The functions a trace wraps as spans: all of ``SPANS``, or with ``SPANS_ENV`` "0" only
    Triton's compile step (a step that compiled is still told apart)."""
    env = os.environ if env is None else env
    if env.get(SPANS_ENV, "1") == "0":
        return tuple(t for t in SPANS if t[2] == COMPILE_LABEL)
    return SPANS


def _instrument_module(module) -> None:
    import torch

    gpu = GpuMarks(torch.cuda.Event) if os.environ.get(GPU_ENV, "0") == "1" else None
    trace = StepTrace(trace_path(os.environ[ENV]), gpu=gpu)
    trace.span_targets = span_targets()
    trace.ab = within_ab()
    instrument(module.Scheduler, torch.cuda.Event, trace, torch.cuda.Stream)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``action(module)`` right after ``name`` has been executed, once."""

    def __init__(self, name: str, action):
        self.name, self.action = name, action

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the real finders below find the module
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, action = spec.loader, self.action

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                action(module)

        spec.loader = _Loader()
        sys.meta_path.remove(self)
        return spec


def install_import_hook(env=None) -> bool:
    """With FASTVERIFY_STEP_TRACE set: instrument SGLang's scheduler when it is
    imported. True if installed."""
    env = os.environ if env is None else env
    if not env.get(ENV):
        return False
    within_ab(env)  # (a misspelt A/B stops the launch here, not in the scheduler's process)
    sys.meta_path.insert(0, _AfterImport(SCHEDULER_MODULE, _instrument_module))
    return True
