"""Verify-pass timing: where each TARGET_VERIFY (and, for comparison, decode)
pass spends its GPU time.

The server samples one pass in every ``interval`` passes of each mode and splits its GPU time into
  pass      = first kernel of the forward .. last kernel of the forward (CUDA events on the stream)
  all-reduce = sum of the TP all-reduce calls and fused all-reduce+RMSNorm calls inside the pass
  compute   = pass - all-reduce
and counts the verified tokens and requests of the pass. This module is the accounting; it never
touches CUDA itself. It talks to the device through a ``DeviceClock`` (CUDA events in the server,
``fastverify.glue.timing_hook``; a fake in the tests).

How a sampled pass is measured (why, and its bias: docs/eagle-fast-verify.md, "Verify-pass timing"):
the sampled pass runs eagerly instead of replaying its CUDA graph, with an event before and after
every all-reduce. Before the pass the stream is held by a GPU busy-wait (``DeviceClock.hold``) long
enough for the host to enqueue the whole pass, so the GPU then runs the queued kernels back to back,
as a graph replay would, and host launch overhead does not show up as GPU time. A pass whose start
the GPU reached before the host finished enqueuing it was starved by the host: it is dropped
(counted as ``dropped``) and the next hold is doubled.

With TP > 1 the ranks' holds end at slightly different times and their hosts enqueue at different
speeds, so a rank's all-reduce event pair also contains the time that rank waited for the others to
arrive. The glue gives the timer an ``exchange`` (an all-gather over the TP group's CPU side): the
completed pass's per-call times of all ranks are gathered at the same point of every rank's pass
sequence (the next timed pass), and each call's collective time is taken on the rank that arrived
last (the minimum over ranks); the rest of each rank's call time is reported apart as ``rank wait``.
A pass that any rank dropped is dropped on all.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Protocol, Tuple

MODES = ("verify", "decode")
# plain TP all-reduce, fused all-reduce+residual+RMSNorm
SPAN_KINDS = ("all_reduce", "allreduce_norm")

# Flag names (both SGLang series carry the same three flags).
FLAG_ENABLE = "--enable-verify-timing"
FLAG_INTERVAL = "--verify-timing-interval"
FLAG_LOG_INTERVAL = "--verify-timing-log-interval"

# 0 = budgeted: at least AUTO_FLOOR passes, widened to keep within OVERHEAD_BUDGET
DEFAULT_INTERVAL = 0
# a budgeted interval never samples more often than one pass in this many of a mode
AUTO_FLOOR = 500
OVERHEAD_BUDGET = 0.005  # budgeted sampling may cost at most this share of the host time
# a host gap this long between two timed passes is idle time (no request), not a pass
IDLE_GAP_MS = 1000.0
DEFAULT_LOG_INTERVAL_S = 30.0

HELP_ENABLE = (
    "Time a sample of TARGET_VERIFY and decode passes on the GPU and split each into TP all-reduce "
    "and compute time; exported as sglang:verify_* Prometheus histograms (with --enable-metrics) "
    "and a periodic 'Verify timing' log line."
)
HELP_INTERVAL = (
    "With --enable-verify-timing: time one pass in every N passes of each mode (verify, decode). 0 "
    f"(default): budgeted, at least {AUTO_FLOOR} and widened so that the measured cost of the "
    f"samples stays within {100 * OVERHEAD_BUDGET:g} percent of the server's time; N >= 1: exactly "
    "N (the log line reports the overhead)."
)
HELP_LOG_INTERVAL = (
    "With --enable-verify-timing: seconds between two 'Verify timing' log lines (0 = no log line). "
    f"Default {DEFAULT_LOG_INTERVAL_S:g}."
)


# --------------------------------------------------------------------------------------------------
# Configuration: flags -> one frozen dataclass (built once by the glue)
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TimingConfig:
    enabled: bool = False
    interval: int = DEFAULT_INTERVAL
    log_interval_s: float = DEFAULT_LOG_INTERVAL_S
    tp_size: int = 1
    tp_rank: int = 0
    model_name: str = ""
    export_metrics: bool = False  # --enable-metrics: Prometheus histograms
    log_rank: bool = True  # this rank writes the log line (tp_rank 0)

    @property
    def budgeted(self) -> bool:
        """Interval 0: sampling widens to keep within OVERHEAD_BUDGET; otherwise
        exactly ``interval``."""
        return self.interval == 0

    @property
    def floor(self) -> int:
        return AUTO_FLOOR if self.budgeted else self.interval

    @classmethod
    def from_flags(
        cls,
        enable_verify_timing: Any = False,
        verify_timing_interval: Any = DEFAULT_INTERVAL,
        verify_timing_log_interval: Any = DEFAULT_LOG_INTERVAL_S,
        *,
        tp_size: int = 1,
        tp_rank: int = 0,
        model_name: str = "",
        export_metrics: bool = False,
    ) -> "TimingConfig":
        """Validate the flag values; every bad value is an error naming the
        flag and what it accepts."""
        if not isinstance(enable_verify_timing, bool):
            raise ValueError(f"{FLAG_ENABLE} takes no value (a switch); got "
                             f"{enable_verify_timing!r}")
        if isinstance(verify_timing_interval, bool) or not isinstance(verify_timing_interval, int):
            raise ValueError(f"{FLAG_INTERVAL} must be an integer >= 0 (0: budgeted); got "
                             f"{verify_timing_interval!r}")
        if verify_timing_interval < 0:
            raise ValueError(f"{FLAG_INTERVAL} must be an integer >= 0 (0: budgeted); got "
                             f"{verify_timing_interval}")
        if (isinstance(verify_timing_log_interval, bool)
                or not isinstance(verify_timing_log_interval, (int, float))):
            raise ValueError(f"{FLAG_LOG_INTERVAL} must be a number of seconds >= 0; got "
                             f"{verify_timing_log_interval!r}")
        if not math.isfinite(verify_timing_log_interval) or verify_timing_log_interval < 0:
            raise ValueError(f"{FLAG_LOG_INTERVAL} must be a number of seconds >= 0; got "
                             f"{verify_timing_log_interval}")
        return cls(
            enabled=enable_verify_timing,
            interval=verify_timing_interval,
            log_interval_s=float(verify_timing_log_interval),
            tp_size=int(tp_size),
            tp_rank=int(tp_rank),
            model_name=str(model_name or ""),
            export_metrics=bool(export_metrics),
            log_rank=int(tp_rank) == 0,
        )


# --------------------------------------------------------------------------------------------------
# Sampling: deterministic per-mode pass counters
# --------------------------------------------------------------------------------------------------
class Sampler:
    """A pass of a mode is sampled when ``interval`` passes of that mode have run since its last
    sample (with a fixed interval: pass k, 1-based, when k % interval == 0).

    Deterministic on purpose: every TP rank runs the same sequence of passes, so every rank samples
    the same pass. That matters: a sampled pass runs eagerly, and ranks that disagreed on graph vs
    eager would call different communicators and hang. ``interval`` may change only at the same
    point of every rank's pass sequence (PassTimer applies rank 0's value at the exchange).
    """

    def __init__(self, interval: int):
        if interval < 1:
            raise ValueError(f"{FLAG_INTERVAL} must be an integer >= 1; got {interval}")
        self.interval = interval
        self.passes: Dict[str, int] = {m: 0 for m in MODES}

    def should_sample(self, mode: str) -> bool:
        if mode not in self.passes:
            raise ValueError(f"unknown pass mode {mode!r}; expected one of {MODES}")
        self.passes[mode] += 1
        if self.passes[mode] >= self.interval:
            self.passes[mode] = 0
            return True
        return False


def _upper_median(values) -> float:
    """The middle value (the upper one of an even count): robust to the odd long period."""
    xs = sorted(values)
    return xs[len(xs) // 2]


def widened_interval(floor: int, sample_cost_ms: float, period_ms: float,
                     budget: float = OVERHEAD_BUDGET) -> int:
    """The sampling interval that keeps the sampled passes' extra host time within ``budget`` of the
    total: one sample costs ``sample_cost_ms`` more than an ordinary pass period ``period_ms``, so
    one sample in N passes costs sample_cost / (N * period); never below ``floor`` (the flag)."""
    if not (period_ms > 0 and math.isfinite(sample_cost_ms)) or sample_cost_ms <= 0:
        return floor
    return max(floor, math.ceil(round(sample_cost_ms / (budget * period_ms), 6)))


# --------------------------------------------------------------------------------------------------
# One measured pass
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PassRecord:
    mode: str  # "verify" | "decode"
    pass_ms: float
    allreduce_ms: float  # plain TP all-reduce calls
    fused_ms: float  # fused all-reduce+RMSNorm calls
    allreduce_calls: int
    fused_calls: int
    tokens: int  # tokens in the pass: bs * draft tokens for verify, bs for decode
    requests: int
    wait_ms: float = 0.0  # inside collectives, waiting for other TP ranks to arrive (see exchange)

    @property
    def comm_ms(self) -> float:
        return self.allreduce_ms + self.fused_ms

    @property
    def busy_ms(self) -> float:
        """The pass without the time its collectives waited for other ranks."""
        return self.pass_ms - self.wait_ms

    @property
    def compute_ms(self) -> float:
        return self.busy_ms - self.comm_ms

    @property
    def comm_calls(self) -> int:
        return self.allreduce_calls + self.fused_calls


def build_record(mode: str, pass_ms: float, spans: Iterable[Tuple[str, float]], tokens: int,
                 requests: int, wait_ms: float = 0.0) -> PassRecord:
    """Fold the (kind, ms) spans of one pass into a record (``wait_ms``: see ``across_ranks``)."""
    if mode not in MODES:
        raise ValueError(f"unknown pass mode {mode!r}; expected one of {MODES}")
    totals = {k: 0.0 for k in SPAN_KINDS}
    calls = {k: 0 for k in SPAN_KINDS}
    for kind, ms in spans:
        if kind not in totals:
            raise ValueError(f"unknown span kind {kind!r}; expected one of {SPAN_KINDS}")
        totals[kind] += ms
        calls[kind] += 1
    return PassRecord(
        mode=mode,
        pass_ms=pass_ms,
        allreduce_ms=totals["all_reduce"],
        fused_ms=totals["allreduce_norm"],
        allreduce_calls=calls["all_reduce"],
        fused_calls=calls["allreduce_norm"],
        tokens=int(tokens),
        requests=int(requests),
        wait_ms=float(wait_ms),
    )


def across_ranks(local: List[Tuple[str, float]], ranks: List[List[Tuple[str, float]]]
                 ) -> Optional[Tuple[List[Tuple[str, float]], float]]:
    """Separate collective time from waiting for other ranks, per call.

    ``local``: this rank's (kind, ms) spans of one pass; ``ranks``: every rank's spans of the same
    pass (this one included). A collective cannot finish on any rank before the last rank has joined
    it, and on the rank that joined last it does not wait, so call j's collective time is min over
    ranks of its span, and this rank waited (its span - that minimum). Returns (spans with the
    collective times, total wait) or None when the ranks did not make the same calls (then nothing
    can be paired; the caller keeps the raw spans)."""
    if not ranks or any(len(r) != len(local) for r in ranks):
        return None
    out, wait = [], 0.0
    for j, (kind, ms) in enumerate(local):
        if any(r[j][0] != kind for r in ranks):
            return None
        low = min(float(r[j][1]) for r in ranks)
        out.append((kind, low))
        wait += max(float(ms) - low, 0.0)
    return out, wait


# --------------------------------------------------------------------------------------------------
# Aggregation and the log line
# --------------------------------------------------------------------------------------------------
def percentile(values: List[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class ModeSummary:
    mode: str
    samples: int
    pass_ms: float  # means over the window, so pass = all-reduce + compute holds exactly
    comm_ms: float
    fused_ms: float
    compute_ms: float
    wait_ms: float
    comm_calls: float
    fused_calls: float
    tokens: float
    requests: float
    p50_pass_ms: float
    p90_pass_ms: float
    p99_pass_ms: float

    @property
    def comm_share(self) -> float:
        return self.comm_ms / self.pass_ms if self.pass_ms > 0 else 0.0

    @property
    def us_per_call(self) -> float:
        return 1000.0 * self.comm_ms / self.comm_calls if self.comm_calls else 0.0


def summarize(mode: str, records: List[PassRecord]) -> ModeSummary:
    if not records:
        raise ValueError(f"no {mode} records to summarize")
    n = len(records)

    def mean(f: Callable[[PassRecord], float]) -> float:
        return sum(f(r) for r in records) / n

    passes = [r.busy_ms for r in records]
    return ModeSummary(
        mode=mode,
        samples=n,
        pass_ms=mean(lambda r: r.busy_ms),
        comm_ms=mean(lambda r: r.comm_ms),
        fused_ms=mean(lambda r: r.fused_ms),
        compute_ms=mean(lambda r: r.compute_ms),
        wait_ms=mean(lambda r: r.wait_ms),
        comm_calls=mean(lambda r: r.comm_calls),
        fused_calls=mean(lambda r: r.fused_calls),
        tokens=mean(lambda r: r.tokens),
        requests=mean(lambda r: r.requests),
        p50_pass_ms=percentile(passes, 50),
        p90_pass_ms=percentile(passes, 90),
        p99_pass_ms=percentile(passes, 99),
    )


def _count(x: float) -> str:
    """A mean count: '8' when whole, else one decimal ('12.5')."""
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.1f}"


def format_mode(s: ModeSummary) -> str:
    """One mode's part of the log line, e.g.

    verify: 30.1 ms, all-reduce 24.9 ms (83%), 8 tok, 1 req, compute 5.2 ms, 122 calls 204.1
    us/call, p90 31.2 ms, n 12 A fused all-reduce+RMSNorm share is added after the call count when
    the pass had fused calls:
    ..., 122 calls 204.1 us/call (fused 61 calls 12.0 ms), ...
    and, with TP > 1, the time the collectives waited for other ranks (not part
    of the pass time above):
    ..., rank wait 3.1 ms, p90 ...
    """
    text = (
        f"{s.mode}: {s.pass_ms:.1f} ms, all-reduce {s.comm_ms:.1f} ms ({100 * s.comm_share:.0f}%), "
        f"{_count(s.tokens)} tok, {_count(s.requests)} req, compute {s.compute_ms:.1f} ms, "
        f"{_count(s.comm_calls)} calls {s.us_per_call:.1f} us/call"
    )
    if s.fused_calls:
        text += f" (fused {_count(s.fused_calls)} calls {s.fused_ms:.1f} ms)"
    if s.wait_ms > 0:
        text += f", rank wait {s.wait_ms:.1f} ms"
    return text + f", p90 {s.p90_pass_ms:.1f} ms, n {s.samples}"


def format_log_line(summaries: List[ModeSummary], tp_rank: int, tp_size: int, dropped: int,
                    interval: Optional[int] = None, overhead: Optional[float] = None) -> str:
    """'Verify timing [tp 0/2], verify: ... | decode: ..., dropped 0' (modes in MODES order), then,
    when given, ', 1 in 500 passes sampled (overhead 0.12%)'."""
    parts = " | ".join(format_mode(s) for s in summaries)
    line = f"Verify timing [tp {tp_rank}/{tp_size}], {parts}, dropped {dropped}"
    if interval is not None:
        line += f", 1 in {interval} passes sampled"
        if overhead is not None:
            line += f" (overhead {100 * overhead:.2f}%)"
    return line


class Aggregator:
    """Per-mode window of records between two log lines, plus lifetime counters."""

    def __init__(self):
        self.window: Dict[str, List[PassRecord]] = {m: [] for m in MODES}
        self.window_dropped = 0
        self.total: Dict[str, int] = {m: 0 for m in MODES}
        self.total_dropped: Dict[str, int] = {m: 0 for m in MODES}

    def add(self, record: PassRecord) -> None:
        self.window[record.mode].append(record)
        self.total[record.mode] += 1

    def drop(self, mode: str) -> None:
        self.window_dropped += 1
        self.total_dropped[mode] += 1

    def empty(self) -> bool:
        return not any(self.window.values())

    def flush(self) -> Tuple[List[ModeSummary], int]:
        summaries = [summarize(m, self.window[m]) for m in MODES if self.window[m]]
        dropped = self.window_dropped
        self.window = {m: [] for m in MODES}
        self.window_dropped = 0
        return summaries, dropped


# --------------------------------------------------------------------------------------------------
# Prometheus metrics (names, labels, buckets)
# --------------------------------------------------------------------------------------------------
METRIC_LABELS = ("model_name", "mode", "tp_size", "tp_rank")
# 0.25 ms .. 1 s: a decode pass of a small model on NVLink is ~5 ms, the reference Kimi-K2.5 verify
# pass on 8x PCIe was ~30 ms, its all-reduce share ~25 ms.
SECONDS_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02,
    0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
CALL_BUCKETS = (0, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512)
SHARE_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

METRIC_HELP = {
    "sglang:verify_pass_seconds": "GPU time of a sampled forward pass (mode=verify: TARGET_VERIFY, "
                                  "mode=decode: plain decode), without the time its collectives "
                                  "waited for other TP ranks.",
    "sglang:verify_allreduce_seconds": "GPU time inside TP all-reduce and fused all-reduce+RMSNorm "
                                       "calls of a sampled pass.",
    "sglang:verify_fused_allreduce_norm_seconds": "GPU time inside fused all-reduce+RMSNorm calls "
                                                  "of a sampled pass (part of "
                                                  "verify_allreduce_seconds).",
    "sglang:verify_compute_seconds": "GPU time of a sampled pass outside all-reduces (pass - "
                                     "all-reduce).",
    "sglang:verify_allreduce_share": "All-reduce share of a sampled pass's GPU time (0..1).",
    "sglang:verify_rank_wait_seconds": "Time the collectives of a sampled pass waited for other TP "
                                       "ranks to arrive (not part of verify_pass_seconds).",
    "sglang:verify_pass_tokens": "Tokens in a sampled pass (verified tokens for mode=verify, batch "
                                 "size for decode).",
    "sglang:verify_pass_requests": "Requests in a sampled pass.",
    "sglang:verify_allreduce_calls": "All-reduce calls (plain + fused) in a sampled pass.",
    "sglang:verify_timing_samples": "Sampled passes by outcome: recorded, or dropped (the host "
                                    "could not enqueue the pass before the GPU reached it).",
}


class VerifyMetrics:
    """The Prometheus side. ``prometheus`` is the prometheus_client module (imported by the
    caller after PROMETHEUS_MULTIPROC_DIR is set, as SGLang's own collectors do);
    ``registry`` None = its default."""

    def __init__(self, prometheus: Any, config: TimingConfig, registry: Any = None):
        kw = {} if registry is None else {"registry": registry}
        H, C = prometheus.Histogram, prometheus.Counter
        names = list(METRIC_LABELS)

        def hist(name: str, buckets) -> Any:
            return H(name=name, documentation=METRIC_HELP[name], labelnames=names,
                     buckets=buckets, **kw)

        self.pass_seconds = hist("sglang:verify_pass_seconds", SECONDS_BUCKETS)
        self.allreduce_seconds = hist("sglang:verify_allreduce_seconds", SECONDS_BUCKETS)
        self.fused_seconds = hist("sglang:verify_fused_allreduce_norm_seconds", SECONDS_BUCKETS)
        self.compute_seconds = hist("sglang:verify_compute_seconds", SECONDS_BUCKETS)
        self.share = hist("sglang:verify_allreduce_share", SHARE_BUCKETS)
        self.wait_seconds = hist("sglang:verify_rank_wait_seconds", SECONDS_BUCKETS)
        self.tokens = hist("sglang:verify_pass_tokens", TOKEN_BUCKETS)
        self.requests = hist("sglang:verify_pass_requests", TOKEN_BUCKETS)
        self.calls = hist("sglang:verify_allreduce_calls", CALL_BUCKETS)
        self.samples = C(
            name="sglang:verify_timing_samples",
            documentation=METRIC_HELP["sglang:verify_timing_samples"],
            labelnames=names + ["outcome"],
            **kw,
        )
        self._base = {"model_name": config.model_name, "tp_size": str(config.tp_size),
                      "tp_rank": str(config.tp_rank)}

    def _labels(self, mode: str) -> Dict[str, str]:
        return dict(self._base, mode=mode)

    def observe(self, r: PassRecord) -> None:
        lab = self._labels(r.mode)
        self.pass_seconds.labels(**lab).observe(r.busy_ms / 1000.0)
        self.allreduce_seconds.labels(**lab).observe(r.comm_ms / 1000.0)
        self.fused_seconds.labels(**lab).observe(r.fused_ms / 1000.0)
        self.compute_seconds.labels(**lab).observe(r.compute_ms / 1000.0)
        self.share.labels(**lab).observe(r.comm_ms / r.busy_ms if r.busy_ms > 0 else 0.0)
        self.wait_seconds.labels(**lab).observe(r.wait_ms / 1000.0)
        self.tokens.labels(**lab).observe(r.tokens)
        self.requests.labels(**lab).observe(r.requests)
        self.calls.labels(**lab).observe(r.comm_calls)
        self.samples.labels(outcome="recorded", **lab).inc()

    def dropped(self, mode: str) -> None:
        self.samples.labels(outcome="dropped", **self._labels(mode)).inc()


# --------------------------------------------------------------------------------------------------
# The hold before a sampled pass
# --------------------------------------------------------------------------------------------------
class HoldController:
    """Sizes the GPU busy-wait that precedes a sampled eager pass.

    The hold must outlast the host's enqueue of the whole eager pass (so the GPU then runs it
    back to back); anything longer is pure overhead. Target = 1.5 x the last measured host
    enqueue time, within [min_ms, max_ms]; a starved sample doubles it. The busy-wait is given
    in GPU clock cycles, so the cycles-per-ms rate is re-estimated from every measured hold
    (events around the busy-wait).

    Overhead per sampled pass ~= hold + (eager GPU time - graph GPU time); one sample in
    ``interval`` passes. Example: 30 ms extra per sample, 10 ms passes, interval 500 -> 30
    / (500 * 10) = 0.6%.
    """

    def __init__(self, min_ms: float = 2.0, max_ms: float = 250.0, cycles_per_ms: float = 1.5e6):
        self.min_ms = min_ms
        self.max_ms = max_ms
        self.cycles_per_ms = cycles_per_ms  # 1.5 GHz first guess; H200 SM clock is up to 1.98 GHz
        self.target_ms = min_ms * 5

    def cycles(self) -> int:
        return int(round(self.target_ms * self.cycles_per_ms))

    def observe(self, cycles: int, hold_ms: float, enqueue_ms: float, starved: bool) -> None:
        if hold_ms > 0 and cycles > 0:
            self.cycles_per_ms = cycles / hold_ms
        if starved:
            self.target_ms = min(self.max_ms, 2.0 * max(self.target_ms, enqueue_ms))
        else:
            self.target_ms = min(self.max_ms, max(self.min_ms, 1.5 * enqueue_ms))


# --------------------------------------------------------------------------------------------------
# The pass timer: sampling -> marks on the stream -> records -> metrics and log line
# --------------------------------------------------------------------------------------------------
class DeviceClock(Protocol):
    def mark(self) -> Any:
        """Record a timing event on the current stream now; return it."""

    def done(self, mark: Any) -> bool:
        """The GPU has passed the mark."""

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """GPU milliseconds between two completed marks."""

    def hold(self, cycles: int) -> None:
        """Enqueue a GPU busy-wait of about ``cycles`` clock cycles on the current stream."""

    def wait(self, mark: Any) -> None:
        """Block the host until the GPU has passed the mark (used only with an exchange)."""


@dataclass
class _OpenPass:
    mode: str
    tokens: int
    requests: int
    cycles: int
    hold_start: Any
    start: Any
    host_start: float
    spans: List[Tuple[str, Any, Any]] = field(default_factory=list)
    end: Any = None
    enqueue_ms: float = 0.0
    starved: bool = False


class PassTimer:
    """Owns sampling, the open pass, the pending (not yet completed on the
    GPU) passes and the sinks.

    The glue calls: ``begin(mode, tokens, requests)`` before a forward (True = this pass is
    sampled and must run eagerly), ``span(kind)`` around each all-reduce while a pass is open,
    ``end()`` after the forward, and ``poll()`` whenever convenient (it only queries events; it
    never waits on the GPU).

    ``exchange(payload) -> [payload of every rank]`` (TP > 1): a sampled pass is then completed
    at the next ``begin`` on every rank (the same point of every rank's pass sequence, so the
    all-gather pairs up), after waiting for its end mark; collective time and rank wait are
    split by ``across_ranks``.
    """

    def __init__(
        self,
        config: TimingConfig,
        clock: DeviceClock,
        *,
        metrics: Optional[VerifyMetrics] = None,
        log: Optional[Callable[[str], None]] = None,
        host_clock: Callable[[], float] = time.perf_counter,
        hold: Optional[HoldController] = None,
        exchange: Optional[Callable[[Any], List[Any]]] = None,
    ):
        self.config = config
        self.clock = clock
        self.metrics = metrics
        self.log = log
        self.host_clock = host_clock
        self.hold = hold or HoldController()
        self.sampler = Sampler(config.floor)
        self.aggregator = Aggregator()
        self.open: Optional[_OpenPass] = None
        self._in_call = False
        self.pending: Deque[_OpenPass] = deque()
        self.last_log = host_clock()
        self.records: Deque[PassRecord] = deque(maxlen=256)  # recent records, for inspection
        self.exchange = exchange
        self.unpaired = 0  # exchanged passes whose ranks made different calls (kept with raw spans)
        # host ms between the begins of ordinary passes
        self.periods: Deque[float] = deque(maxlen=64)
        # host ms a sample added to its pass period
        self.sample_costs: Deque[float] = deque(maxlen=8)
        self._last_begin: Optional[float] = None
        self._last_sampled = False
        self.proposed_interval = config.floor

    # -- pass boundaries ---------------------------------------------------------------------------
    def begin(self, mode: str, tokens: int, requests: int) -> bool:
        t0 = self.host_clock()
        if self.exchange is not None:
            while self.pending:  # every rank reaches this point with the same pending pass
                p = self.pending.popleft()
                self.clock.wait(p.end)
                self._complete(p)
        self.poll()
        self._account(t0, self.host_clock())
        if self.open is not None or not self.sampler.should_sample(mode):
            self._last_sampled = False
            return False
        self._last_sampled = True
        cycles = self.hold.cycles()
        hold_start = self.clock.mark()
        self.clock.hold(cycles)
        start = self.clock.mark()
        self.open = _OpenPass(mode, int(tokens), int(requests), cycles, hold_start, start,
                              self.host_clock())
        return True

    def _account(self, entered: float, ready: float) -> None:
        """Host time: an ordinary pass period, or what the last sample added to its period (its
        hold, the eager pass, waiting for it, the exchange), and the interval that keeps
        samples within the budget."""
        last, self._last_begin = self._last_begin, ready
        if last is None:
            return
        if not self._last_sampled:
            if 1000.0 * (entered - last) < IDLE_GAP_MS:
                self.periods.append(1000.0 * (entered - last))
            return
        # a sample costs its hold, the eager pass and the wait for it (at most ~2 x the longest
        # hold); a longer gap also holds idle time and would overstate the cost
        if self.periods and 1000.0 * (ready - last) < 2 * self.hold.max_ms + IDLE_GAP_MS:
            period = _upper_median(self.periods)
            self.sample_costs.append(max(1000.0 * (ready - last) - period, 0.0))
            if self.config.budgeted:
                cost = _upper_median(self.sample_costs)
                self.proposed_interval = widened_interval(self.config.floor, cost, period)
            if self.exchange is None:  # one rank: nobody to agree with
                self.sampler.interval = self.proposed_interval

    def overhead_estimate(self) -> Optional[float]:
        """Share of host time the samples cost at the current interval (None
        before the first sample)."""
        if not self.sample_costs or not self.periods:
            return None
        period = _upper_median(self.periods)
        return (_upper_median(self.sample_costs) / (self.sampler.interval * period)
                if period > 0 else None)

    def end(self) -> None:
        p = self.open
        if p is None:
            return
        self.open = None
        p.end = self.clock.mark()
        p.enqueue_ms = 1000.0 * (self.host_clock() - p.host_start)
        # Host finished enqueuing; if the GPU already passed the pass's start mark, it ran (part of)
        # the pass as fast as the host fed it: launch gaps would count as GPU time. Drop it.
        p.starved = self.clock.done(p.start)
        self.pending.append(p)

    def abort(self) -> None:
        """The forward raised: forget the open pass (its marks may be incomplete)."""
        self.open = None

    def timed_call(self, kind: str, fn: Callable, args: tuple, kwargs: dict,
                   applied: Optional[Callable[[Any], bool]] = None):
        """Run ``fn(*args, **kwargs)``; while a sampled pass is open, bracket it with two marks.

        ``applied(result)`` False discards the span (a fused call that declined and fell
        back to a plain all-reduce, which is then timed on its own). A call nested in a
        timed call is not timed again.
        """
        p = self.open
        if p is None or self._in_call:
            return fn(*args, **kwargs)
        if kind not in SPAN_KINDS:
            raise ValueError(f"unknown span kind {kind!r}; expected one of {SPAN_KINDS}")
        a = self.clock.mark()
        self._in_call = True
        try:
            out = fn(*args, **kwargs)
        finally:
            self._in_call = False
        b = self.clock.mark()
        if applied is None or applied(out):
            p.spans.append((kind, a, b))
        return out

    # -- completion --------------------------------------------------------------------------------
    def poll(self) -> None:
        while self.exchange is None and self.pending and self.clock.done(self.pending[0].end):
            self._complete(self.pending.popleft())
        self._maybe_log()

    def _complete(self, p: _OpenPass) -> None:
        ms = self.clock.elapsed_ms
        hold_ms = ms(p.hold_start, p.start)
        self.hold.observe(p.cycles, hold_ms, p.enqueue_ms, p.starved)
        spans = [(k, ms(a, b)) for k, a, b in p.spans]
        wait = 0.0
        starved = p.starved
        if self.exchange is not None:
            everyone = self.exchange({"starved": p.starved, "spans": spans,
                                      "interval": self.proposed_interval})
            # rank 0's
            self.sampler.interval = int(everyone[0].get("interval", self.sampler.interval))
            starved = any(bool(e["starved"]) for e in everyone)
            paired = None if starved else across_ranks(spans, [e["spans"] for e in everyone])
            if paired is not None:
                spans, wait = paired
            elif not starved:
                self.unpaired += 1
        if starved:
            self.aggregator.drop(p.mode)
            if self.metrics is not None:
                self.metrics.dropped(p.mode)
            return
        record = build_record(p.mode, ms(p.start, p.end), spans, p.tokens, p.requests, wait)
        self.records.append(record)
        self.aggregator.add(record)
        if self.metrics is not None:
            self.metrics.observe(record)

    def _maybe_log(self) -> None:
        if self.log is None or not self.config.log_rank or self.config.log_interval_s <= 0:
            return
        now = self.host_clock()
        if now - self.last_log < self.config.log_interval_s:
            return
        if self.aggregator.empty() and not self.aggregator.window_dropped:
            return
        self.last_log = now
        summaries, dropped = self.aggregator.flush()
        if summaries:
            self.log(format_log_line(summaries, self.config.tp_rank, self.config.tp_size, dropped,
                                     self.sampler.interval, self.overhead_estimate()))
        else:
            self.log(f"Verify timing [tp {self.config.tp_rank}/{self.config.tp_size}], no pass "
                     f"recorded, dropped {dropped}")
