"""Pass-cost emulator: make one GPU serve at the pass costs of another deployment (testing only).

With a pass-cost profile (fastverify.passcost) the patched server follows every forward pass of the
target model with a device-side wait of what the profile says a pass of that many tokens costs on
the emulated deployment:

    wait_us(n) = allreduces_per_pass * allreduce_us(n)   mode "comm" (the default)
               + compute_ms(n) * 1000                    mode "comm+compute" (plus its compute)

n is the token count of the pass: a decode pass of bs requests has bs tokens, a TARGET_VERIFY pass
of bs requests at width w has bs * w, a prefill/extend pass its extend tokens; a CUDA graph's wait
is that of the graph's (padded) token count, fixed at capture. The rule is additive: the real pass
of the model being served still runs, and nothing of it is subtracted. In mode "comm" that is the
intent (a small model's real compute plus the emulated deployment's communication); in mode
"comm+compute" the real pass is an excess over the profile, which the server measures on a sample of
passes and reports in its log line.

The wait is a GPU spin of a number of clock cycles (torch.cuda._sleep: a one-thread kernel, recorded
into CUDA graphs like any kernel). Cycles per microsecond are calibrated at start-up (`calibrate`:
spins of a ladder of lengths timed with device events, a least-squares line through them) and the
result is self-checked (`self_check`): the wait of a few token counts, run eagerly and inside a CUDA
graph, must take the profile's time within TOLERANCE, else the server refuses to start with the
measured numbers.

This module never touches CUDA: it talks to a `SpinDevice` (torch.cuda in
fastverify.glue.emulator_hook, a model of a device in the tests) and reads no environment variable.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Sequence, Tuple

from fastverify import passcost
from fastverify.passcost import PassCostError, PassCostProfile

FLAG = "--emulate-pass-cost"
FLAG_COMPUTE = "--emulate-pass-cost-compute"
TOLERANCE = 0.05  # self-check: |measured wait / profile's time - 1| at most this
FIT_TOLERANCE = 0.02  # calibration: each ladder point within this of the fitted line
LOG_INTERVAL_S = 30.0  # the periodic "ACTIVE" warning line
SAMPLE_EVERY = 64  # one pass in this many is timed with device events (its real size: the log)
CHECK_TOKENS = (1, 64)  # always self-checked, with the widest verify pass of one request

HELP_PROFILE = (
    "TESTING ONLY. Emulate another deployment's pass cost: after every forward pass of the target "
    "model the GPU waits what the named pass-cost profile says a pass of that many tokens costs "
    "there (communication only; add --emulate-pass-cost-compute for its compute too). A built-in "
    f"profile name ({', '.join(passcost.builtin_names()) or 'none'}), a profile JSON file, or a "
    "`fastverify bench allreduce --json` result (PATH#backend). Timings of such a server are "
    "emulated, not measurements; the log and /metrics say so while it is on."
)
HELP_COMPUTE = (
    "TESTING ONLY. With --emulate-pass-cost: the wait also includes the profile's compute time per "
    "pass (the profile must have compute_ms)."
)


class EmulatorError(ValueError):
    """A bad --emulate-pass-cost flag or profile; the message names the flag."""


class CalibrationError(RuntimeError):
    """The device wait could not be calibrated, or failed its self-check (the message says by how
    much)."""


# --------------------------------------------------------------------------------------------------
# Configuration: profile + mode -> wait per token count
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EmulatorConfig:
    profile: PassCostProfile
    compute: bool = False

    @property
    def mode(self) -> str:
        return "comm+compute" if self.compute else "comm"

    def wait_us(self, tokens: int) -> float:
        """The device wait after a pass of `tokens` tokens, in us (0 for an empty pass)."""
        if tokens <= 0:
            return 0.0
        return self.profile.pass_ms(int(tokens), compute=self.compute) * 1000.0

    def banner(self) -> str:
        return (f"pass-cost emulation ACTIVE: profile {self.profile.name} ({self.mode}); "
                f"timings are emulated, not measurements")

    def table(self, tokens: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> str:
        """One line: the wait per token count (ms), the way the log states what is emulated."""
        cells = []
        for t in tokens:
            mark = "*" if self.profile.extrapolated(t) else ""
            cells.append(f"{t}:{self.wait_us(t) / 1000.0:.2f}{mark}")
        return ("wait ms per pass by tokens " + " ".join(cells)
                + (" (* extrapolated past the profile's points)" if "*" in "".join(cells) else ""))


def config_from_flags(profile: Optional[str], compute: bool = False) -> Optional[EmulatorConfig]:
    """The flags' meaning, or None when emulation is off. Raises EmulatorError naming the flag."""
    if profile is None or str(profile).strip() == "":
        if compute:
            raise EmulatorError(f"{FLAG_COMPUTE} needs {FLAG} PROFILE (built in: "
                                f"{', '.join(passcost.builtin_names()) or 'none'})")
        return None
    try:
        prof = passcost.load_profile(str(profile).strip(), flag=FLAG)
    except PassCostError as e:
        raise EmulatorError(str(e)) from None
    if compute and not prof.has_compute:
        raise EmulatorError(f"{FLAG_COMPUTE}: profile {prof.name} ({FLAG} {profile}) has no "
                            f"compute_ms; drop {FLAG_COMPUTE} or give a profile with compute_ms")
    return EmulatorConfig(prof, bool(compute))


def pass_tokens(kind: str, batch_size: int, width: int = 1, extend_tokens: int = 0) -> int:
    """Token count of a pass: decode bs, verify bs * width, prefill/extend its extend tokens."""
    if kind == "decode":
        return int(batch_size)
    if kind == "verify":
        return int(batch_size) * int(width)
    if kind == "prefill":
        return int(extend_tokens)
    if kind == "idle":
        return 0
    raise ValueError(f"pass kind {kind!r}; expected decode, verify, prefill or idle")


# --------------------------------------------------------------------------------------------------
# The device
# --------------------------------------------------------------------------------------------------
class SpinDevice(Protocol):
    def spin(self, cycles: int) -> None:
        """Enqueue a wait of `cycles` device clock cycles on the current stream (capturable into a
        device graph)."""

    def time_us(self, fn: Callable[[], None], reps: int, graph: bool = False) -> List[float]:
        """Run fn `reps` times, each bracketed by device events: the elapsed device time of each,
        in us. graph=True: fn is captured once into a device graph and each rep replays it."""

    def mark(self) -> Any:
        """A device event on the current stream."""

    def elapsed_us(self, start: Any, end: Any) -> Optional[float]:
        """Device time between two marks, or None while `end` has not completed (never blocks)."""


@dataclass(frozen=True)
class Calibration:
    """elapsed_us(spin of c cycles) = overhead_us + c / cycles_per_us, fitted on `points`."""

    cycles_per_us: float
    overhead_us: float
    points: Tuple[Tuple[int, float], ...] = ()  # ((cycles, median elapsed us), ...)
    max_residual: float = 0.0  # worst |point / line - 1|

    def cycles_for(self, us: float) -> int:
        if us <= 0:
            return 0
        return max(0, int(round((us - self.overhead_us) * self.cycles_per_us)))

    def describe(self) -> str:
        return (f"{self.cycles_per_us:.1f} cycles/us (clock {self.cycles_per_us:.0f} MHz), "
                f"{self.overhead_us:+.1f} us per wait, {len(self.points)} points within "
                f"{100 * self.max_residual:.2f} % of the line")


def _median_us(device: SpinDevice, cycles: int, reps: int, graph: bool = False) -> float:
    return statistics.median(device.time_us(lambda: device.spin(cycles), reps, graph=graph))


def calibrate(device: SpinDevice, max_us: float, reps: int = 5, points: int = 6,
              min_us: float = 200.0, probe_cycles: int = 2_000_000,
              warmup_cycles: int = 100_000_000,
              fit_tolerance: float = FIT_TOLERANCE) -> Calibration:
    """Cycles per us of the device's spin: a warm-up (clocks up), a probe for the rough rate, then a
    ladder of `points` waits from min_us to max_us (geometric), the median of `reps` each, and a
    least-squares line elapsed = overhead + cycles / rate. Raises CalibrationError if the points are
    not on a line."""
    device.time_us(lambda: device.spin(warmup_cycles), 2)
    probe = _median_us(device, probe_cycles, reps)
    if not probe > 0:
        raise CalibrationError(f"pass-cost emulator: a spin of {probe_cycles} cycles took "
                               f"{probe!r} us")
    rough = probe_cycles / probe
    hi = max(float(max_us), 4 * min_us)
    targets = [min_us * (hi / min_us) ** (i / (points - 1)) for i in range(points)]
    pts = []
    for us in targets:
        c = max(1, int(round(us * rough)))
        pts.append((c, _median_us(device, c, reps)))
    # least squares on relative residuals (weights 1/y^2): the waits span three orders of magnitude,
    # and each must be right within a share of itself, not within microseconds of the longest
    ws = [1.0 / (y * y) if y > 0 else 0.0 for _, y in pts]
    sw = sum(ws)
    mx = sum(w * x for w, (x, _) in zip(ws, pts)) / sw if sw > 0 else 0.0
    my = sum(w * y for w, (_, y) in zip(ws, pts)) / sw if sw > 0 else 0.0
    var = sum(w * (x - mx) ** 2 for w, (x, _) in zip(ws, pts))
    cov = sum(w * (x - mx) * (y - my) for w, (x, y) in zip(ws, pts))
    slope = cov / var if var > 0 else 0.0
    if not slope > 0:
        raise CalibrationError(f"pass-cost emulator: spin time does not grow with cycles "
                               f"(points {pts})")
    overhead = my - slope * mx
    resid = max(abs(y / (overhead + slope * x) - 1.0) for x, y in pts)
    cal = Calibration(1.0 / slope, overhead, tuple(pts), resid)
    if resid > fit_tolerance:
        listing = ", ".join(f"{x} cycles: {y:.1f} us" for x, y in pts)
        raise CalibrationError(f"pass-cost emulator: spin time is not linear in cycles (worst "
                               f"point {100 * resid:.1f} % off the line, allowed "
                               f"{100 * fit_tolerance:g} %): {listing}")
    return cal


@dataclass(frozen=True)
class CheckResult:
    tokens: int
    target_us: float
    measured_us: float
    graph: bool

    @property
    def error(self) -> float:
        return self.measured_us / self.target_us - 1.0

    def describe(self) -> str:
        return (f"{self.tokens} tokens ({'graph' if self.graph else 'eager'}): profile "
                f"{self.target_us / 1000:.3f} ms, measured {self.measured_us / 1000:.3f} ms "
                f"({100 * self.error:+.1f} %)")


def self_check(device: SpinDevice, calibration: Calibration, config: EmulatorConfig,
               tokens: Iterable[int], reps: int = 5, tolerance: float = TOLERANCE,
               graph_modes: Sequence[bool] = (False, True)) -> List[CheckResult]:
    """The wait of each token count, timed (median of `reps`) eagerly and replayed from a device
    graph, against the profile's time. Raises CalibrationError listing every result when one is off
    by more than `tolerance`."""
    results = []
    for n in sorted({int(t) for t in tokens if int(t) > 0}):
        target = config.wait_us(n)
        if target <= 0:
            continue
        cycles = calibration.cycles_for(target)
        for graph in graph_modes:
            measured = _median_us(device, cycles, reps, graph=graph)
            results.append(CheckResult(n, target, measured, graph))
    bad = [r for r in results if abs(r.error) > tolerance]
    if bad:
        raise CalibrationError(
            f"{FLAG} {config.profile.name}: the self-check failed, the emulated wait is off the "
            f"profile's time by more than {100 * tolerance:g} %: "
            + "; ".join(r.describe() for r in results)
            + f". Calibration: {calibration.describe()}. The server does not start.")
    return results


ATTEMPTS = 3  # calibration + self-check rounds before the server gives up


def calibrate_and_check(device: SpinDevice, config: EmulatorConfig, tokens: Iterable[int],
                        attempts: int = ATTEMPTS,
                        log: Optional[Callable[[str], None]] = None
                        ) -> Tuple[Calibration, List[CheckResult]]:
    """`calibrate` then `self_check`, up to `attempts` times: another process busy on the device for
    a moment (a server loading or capturing graphs) disturbs one round, not three; a device that is
    off every time fails with the last round's numbers."""
    tokens = list(tokens)
    max_us = max([config.wait_us(t) for t in tokens] + [0.0])
    last: Optional[CalibrationError] = None
    for i in range(1, max(attempts, 1) + 1):
        try:
            cal = calibrate(device, max_us=max_us)
            return cal, self_check(device, cal, config, tokens)
        except CalibrationError as e:
            last = e
            if log is not None and i < attempts:
                log(f"pass-cost emulator: calibration round {i} of {attempts} failed, again: {e}")
    assert last is not None
    raise last


# --------------------------------------------------------------------------------------------------
# The runtime side: waits per pass, counts, samples, the periodic line
# --------------------------------------------------------------------------------------------------
@dataclass
class _Window:
    passes: Dict[str, int] = field(default_factory=lambda: defaultdict(int))
    wait_ms: Dict[str, float] = field(default_factory=lambda: defaultdict(float))
    samples: Dict[str, List[Tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    short: int = 0


class PassEmulator:
    """What the server holds while emulation is on: the wait of each token count (cycles,
    memoized), a count of the passes and their nominal waits per kind, timed samples of whole passes
    (the real pass = sample - its wait), and the periodic ACTIVE line."""

    def __init__(self, config: EmulatorConfig, calibration: Calibration, device: SpinDevice,
                 checks: Sequence[CheckResult] = (), metrics: Any = None,
                 clock: Callable[[], float] = time.monotonic,
                 log_interval_s: float = LOG_INTERVAL_S, sample_every: int = SAMPLE_EVERY,
                 tolerance: float = TOLERANCE):
        self.config, self.calibration, self.device = config, calibration, device
        self.checks, self.metrics, self.clock = tuple(checks), metrics, clock
        self.log_interval_s, self.sample_every = log_interval_s, sample_every
        self.tolerance = tolerance
        self._cycles: Dict[int, int] = {}
        self._window = _Window()
        self._since = clock()
        self._count = 0
        self._pending: List[Tuple[str, float, Any, Any]] = []
        self.total_passes = 0
        self.eager_tokens: Optional[int] = None  # the glue's note: tokens waited eagerly this pass
        self.extrapolated_tokens: set = set()

    def cycles(self, tokens: int) -> int:
        c = self._cycles.get(tokens)
        if c is None:
            c = self._cycles[tokens] = self.calibration.cycles_for(self.config.wait_us(tokens))
            if self.config.profile.extrapolated(tokens):
                self.extrapolated_tokens.add(int(tokens))
        return c

    def wait(self, tokens: int) -> float:
        """Enqueue the wait of a pass of `tokens` tokens on the device; returns its nominal us."""
        if tokens <= 0:
            return 0.0
        c = self.cycles(tokens)
        if c > 0:
            self.device.spin(c)
        return self.config.wait_us(tokens)

    # ---- per pass (host side; the wait itself was enqueued by `wait` or lives in a graph)
    def take_sample(self) -> bool:
        """True for the one pass in `sample_every` that is timed."""
        self._count += 1
        return self.sample_every > 0 and self._count % self.sample_every == 0

    def record(self, kind: str, tokens: int, in_graph: bool, start: Any = None,
               end: Any = None) -> None:
        wait_us = self.config.wait_us(tokens)
        w = self._window
        w.passes[kind] += 1
        w.wait_ms[kind] += wait_us / 1000.0
        self.total_passes += 1
        if self.metrics is not None:
            self.metrics.observe(kind, "graph" if in_graph else "eager", wait_us / 1e6)
        if start is not None and end is not None:
            self._pending.append((kind, wait_us, start, end))
        self._poll()

    def _poll(self) -> None:
        keep = []
        for kind, wait_us, start, end in self._pending:
            total = self.device.elapsed_us(start, end)
            if total is None:
                keep.append((kind, wait_us, start, end))
                continue
            self._window.samples[kind].append((total, wait_us))
            if total < wait_us * (1.0 - self.tolerance):
                self._window.short += 1
                if self.metrics is not None:
                    self.metrics.short_wait()
        self._pending = keep

    def due(self) -> bool:
        return self.log_interval_s > 0 and self.clock() - self._since >= self.log_interval_s

    def summary(self, reset: bool = True) -> str:
        """The periodic line: the banner, then per kind the passes, their mean wait and the sampled
        real pass (sample - wait, median), and any sampled pass shorter than its wait."""
        w, now = self._window, self.clock()
        span = max(now - self._since, 1e-9)
        parts = []
        for kind in sorted(w.passes):
            n = w.passes[kind]
            text = f"{kind} {n} passes, wait {w.wait_ms[kind] / n:.2f} ms/pass"
            s = w.samples.get(kind)
            if s:
                real = statistics.median(t - wu for t, wu in s) / 1000.0
                text += (f", sampled pass {statistics.median(t for t, _ in s) / 1000.0:.2f} ms = "
                         f"real {real:.2f} ms + wait (n={len(s)})")
            parts.append(text)
        line = (f"{self.config.banner()}. Last {span:.0f} s: " + ("; ".join(parts) or "no passes"))
        if w.short:
            line += (f". {w.short} sampled passes were SHORTER than their wait by more than "
                     f"{100 * self.tolerance:g} %: the device clock changed since calibration")
        if reset:
            self._window, self._since = _Window(), now
        return line

    def startup_lines(self) -> List[str]:
        lines = [self.config.banner(), self.config.table(),
                 f"calibration: {self.calibration.describe()}"]
        if self.checks:
            worst = max(abs(r.error) for r in self.checks)
            lines.append(f"self-check within {100 * self.tolerance:g} % (worst "
                         f"{100 * worst:.1f} %): " + "; ".join(r.describe() for r in self.checks))
        lines.append("rule: the wait is added after the real pass of the served model; nothing of "
                     "the real pass is subtracted (its sampled size is in the periodic line)")
        return lines


# --------------------------------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------------------------------
METRIC_HELP = {
    "sglang:pass_cost_emulation_active":
        "1 while pass-cost emulation is on: timings are emulated.",
    "sglang:pass_cost_emulation_selfcheck_error":
        "Worst relative error of the start-up self-check.",
    "sglang:pass_cost_emulated_passes":
        "Forward passes followed by an emulated wait, per kind and path.",
    "sglang:pass_cost_emulated_wait_seconds":
        "Sum of the emulated waits (the profile's time) per kind.",
    "sglang:pass_cost_emulation_short_waits":
        "Timed passes that took less than their emulated wait.",
}


class EmulatorMetrics:
    """``prometheus`` is the prometheus_client module, imported by the caller after
    PROMETHEUS_MULTIPROC_DIR is set, as SGLang's own collectors are; ``registry`` None = its
    default."""

    def __init__(self, prometheus: Any, config: EmulatorConfig, tp_rank: int = 0,
                 worst_check_error: float = 0.0, registry: Any = None):
        kw = {} if registry is None else {"registry": registry}
        base = {"profile": config.profile.name, "mode": config.mode, "tp_rank": str(tp_rank)}
        names = list(base)

        def gauge(name):
            return prometheus.Gauge(name=name, documentation=METRIC_HELP[name], labelnames=names,
                                    multiprocess_mode="mostrecent", **kw)

        def counter(name, extra=()):
            return prometheus.Counter(name=name, documentation=METRIC_HELP[name],
                                      labelnames=names + list(extra), **kw)

        self.active = gauge("sglang:pass_cost_emulation_active")
        self.check_error = gauge("sglang:pass_cost_emulation_selfcheck_error")
        self.passes = counter("sglang:pass_cost_emulated_passes", ("kind", "path"))
        self.wait_seconds = counter("sglang:pass_cost_emulated_wait_seconds", ("kind",))
        self.short = counter("sglang:pass_cost_emulation_short_waits")
        self._base = base
        self.active.labels(**base).set(1)
        self.check_error.labels(**base).set(float(worst_check_error))

    def observe(self, kind: str, path: str, wait_s: float) -> None:
        self.passes.labels(kind=kind, path=path, **self._base).inc()
        self.wait_seconds.labels(kind=kind, **self._base).inc(wait_s)

    def short_wait(self) -> None:
        self.short.labels(**self._base).inc()
