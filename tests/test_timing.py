"""fastverify.timing with a fake device clock: sampling, records, aggregation, hold
sizing, metrics, log line."""
from __future__ import annotations

import math

import pytest

from fastverify import timing
from fastverify.timing import (
    Aggregator,
    HoldController,
    PassTimer,
    Sampler,
    TimingConfig,
    VerifyMetrics,
    across_ranks,
    widened_interval,
    build_record,
    format_log_line,
    percentile,
    summarize,
)


# --------------------------------------------------------------------------------------------------
# A fake GPU: marks are timestamps on a simulated stream; the test moves the stream's time forward.
# --------------------------------------------------------------------------------------------------
class Mark:
    def __init__(self, t: float, seq: int):
        self.t, self.seq = t, seq


class FakeClock:
    def __init__(self, true_cycles_per_ms: float = 2.0e6):
        self.t = 0.0  # ms on the simulated stream
        self.seq = 0
        self.completed = math.inf  # marks with seq < completed are done on the "GPU"
        self.true_cycles_per_ms = true_cycles_per_ms
        self.holds = []
        self.started_before_enqueue_done = False  # simulate host starvation of the next pass

    def mark(self):
        self.seq += 1
        return Mark(self.t, self.seq)

    def done(self, mark) -> bool:
        return mark.seq < self.completed

    def elapsed_ms(self, a, b) -> float:
        return b.t - a.t

    def hold(self, cycles: int) -> None:
        self.holds.append(cycles)
        self.t += cycles / self.true_cycles_per_ms

    def run(self, ms: float) -> None:
        self.t += ms

    def wait(self, mark) -> None:
        self.waited = getattr(self, "waited", 0) + 1
        self.completed = math.inf


class HostClock:
    def __init__(self):
        self.s = 1000.0

    def __call__(self) -> float:
        return self.s


def _pass(timer: PassTimer, clock: FakeClock, host: HostClock, mode="verify", tokens=8, requests=1,
          allreduce_ms=(), fused=(), compute_ms=4.0, enqueue_ms=5.0, starved=False, gpu_done=True):
    """One forward as the glue drives it: begin, collectives + compute on the stream, end.

    Unless ``starved``, the GPU is still in the hold when the host finishes enqueuing (done(start)
    is False at end()); ``gpu_done`` then lets the GPU finish the pass."""
    sampled = timer.begin(mode, tokens, requests)
    for ms in allreduce_ms:
        timer.timed_call("all_reduce", clock.run, (ms,), {})
    for ms, ran in fused:
        timer.timed_call("allreduce_norm", lambda m=ms,
                         r=ran: (clock.run(m), ("norm" if r else None))[1],
                         (), {}, applied=lambda out: out is not None)
    clock.run(compute_ms)
    host.s += enqueue_ms / 1000.0
    clock.completed = math.inf if starved else 0
    timer.end()
    clock.completed = math.inf if gpu_done else 0
    return sampled


def _timer(interval=2, log_interval_s=10.0, **kw):
    clock, host = FakeClock(), HostClock()
    logs = []
    cfg = TimingConfig.from_flags(True, interval, log_interval_s, tp_size=2, tp_rank=0,
                                  model_name="m")
    t = PassTimer(cfg, clock, log=logs.append, host_clock=host, **kw)
    return t, clock, host, logs


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------
def test_config_from_flags():
    c = TimingConfig.from_flags(True, 7, 2.5, tp_size=4, tp_rank=3, model_name="k2",
                                export_metrics=True)
    assert (c.enabled, c.interval, c.log_interval_s, c.tp_size, c.tp_rank, c.model_name,
            c.export_metrics, c.log_rank) == (True, 7, 2.5, 4, 3, "k2", True, False)
    assert TimingConfig.from_flags(False).interval == timing.DEFAULT_INTERVAL
    with pytest.raises(AttributeError):
        c.interval = 3  # frozen


@pytest.mark.parametrize("args,match", [
    ((True, -5, 1.0), r"--verify-timing-interval must be an integer >= 0 \(0: budgeted\); got -5"),
    ((True, 2.5, 1.0),
     r"--verify-timing-interval must be an integer >= 0 \(0: budgeted\); got 2.5"),
    ((True, True, 1.0),
     r"--verify-timing-interval must be an integer >= 0 \(0: budgeted\); got True"),
    ((True, 10, -1.0), r"--verify-timing-log-interval must be a number of seconds >= 0; got -1.0"),
    ((True, 10, float("nan")),
     r"--verify-timing-log-interval must be a number of seconds >= 0; got nan"),
    ((True, 10, "5"), r"--verify-timing-log-interval must be a number of seconds >= 0; got '5'"),
    (("yes", 10, 1.0), r"--enable-verify-timing takes no value \(a switch\); got 'yes'"),
])
def test_bad_flags_name_the_flag(args, match):
    with pytest.raises(ValueError, match=match):
        TimingConfig.from_flags(*args)


# --------------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------------
def test_sampler_every_nth_pass_per_mode():
    s = Sampler(3)
    got = [(m, s.should_sample(m)) for m in ["verify"] * 7 + ["decode"] * 3]
    # verify passes 3 and 6, decode pass 3
    assert [i for i, (m, x) in enumerate(got) if x] == [2, 5, 9]
    assert s.passes == {"verify": 1, "decode": 0}  # passes since each mode's last sample
    one = Sampler(1)
    assert all(one.should_sample("decode") for _ in range(5))
    with pytest.raises(ValueError, match="unknown pass mode 'extend'"):
        s.should_sample("extend")


def test_two_ranks_sample_the_same_passes():
    """Every TP rank must make the same eager/graph choice for a pass, or
    collectives would mismatch."""
    modes = ["decode", "verify", "verify", "decode", "verify"] * 40
    a, b = Sampler(7), Sampler(7)
    assert [a.should_sample(m) for m in modes] == [b.should_sample(m) for m in modes]


# --------------------------------------------------------------------------------------------------
# Records, percentiles, aggregation
# --------------------------------------------------------------------------------------------------
def test_build_record_splits_pass():
    r = build_record("verify", 30.0,
                     [("all_reduce", 0.2)] * 100 + [("allreduce_norm", 0.25)] * 20, 8, 1)
    assert r.allreduce_calls == 100 and r.fused_calls == 20 and r.comm_calls == 120
    assert r.allreduce_ms == pytest.approx(20.0) and r.fused_ms == pytest.approx(5.0)
    assert r.comm_ms == pytest.approx(25.0) and r.compute_ms == pytest.approx(5.0)
    assert (r.tokens, r.requests, r.mode) == (8, 1, "verify")
    with pytest.raises(ValueError, match="unknown span kind 'nccl'"):
        build_record("verify", 1.0, [("nccl", 0.1)], 1, 1)
    with pytest.raises(ValueError, match="unknown pass mode 'prefill'"):
        build_record("prefill", 1.0, [], 1, 1)


def test_percentile_matches_linear_interpolation():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 5.0 and percentile(xs, 50) == 3.0
    assert percentile(xs, 90) == pytest.approx(4.6)  # numpy.percentile([1..5], 90) = 4.6
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_means_add_up():
    recs = [build_record("verify", p, [("all_reduce", a)], t, 1)
            for p, a, t in [(30, 24, 8), (32, 26, 8), (28, 22, 9)]]
    s = summarize("verify", recs)
    assert s.samples == 3
    assert (s.pass_ms == pytest.approx(30.0) and s.comm_ms == pytest.approx(24.0)
            and s.compute_ms == pytest.approx(6.0))
    assert s.pass_ms == pytest.approx(s.comm_ms + s.compute_ms)
    assert s.tokens == pytest.approx(25 / 3) and s.comm_share == pytest.approx(0.8)
    assert s.us_per_call == pytest.approx(24000.0)
    assert s.p50_pass_ms == 30 and s.p90_pass_ms == pytest.approx(31.6)


def test_aggregator_window_and_totals():
    ag = Aggregator()
    ag.add(build_record("decode", 10, [], 1, 1))
    ag.add(build_record("verify", 30, [], 8, 1))
    ag.drop("verify")
    summaries, dropped = ag.flush()
    assert [s.mode for s in summaries] == ["verify", "decode"] and dropped == 1
    assert ag.empty() and ag.window_dropped == 0
    assert ag.total == {"verify": 1, "decode": 1} and ag.total_dropped == {"verify": 1, "decode": 0}


# --------------------------------------------------------------------------------------------------
# The log line (exact format)
# --------------------------------------------------------------------------------------------------
def test_log_line_exact_format():
    v = [build_record("verify", 30.1, [("all_reduce", 24.9 / 122)] * 122, 8, 1)]
    d = [build_record("decode", 9.8,
                      [("all_reduce", 0.02)] * 100 + [("allreduce_norm", 0.02)] * 22, 1, 1)] * 2
    line = format_log_line([summarize("verify", v), summarize("decode", d)], tp_rank=0,
                           tp_size=2, dropped=1)
    assert line == (
        "Verify timing [tp 0/2], "
        "verify: 30.1 ms, all-reduce 24.9 ms (83%), 8 tok, 1 req, compute 5.2 ms, 122 calls 204.1 "
        "us/call, p90 30.1 ms, n 1 | "
        "decode: 9.8 ms, all-reduce 2.4 ms (25%), 1 tok, 1 req, compute 7.4 ms, 122 calls 20.0 "
        "us/call (fused 22 calls 0.4 ms), p90 9.8 ms, n 2, dropped 1"
    )


def test_log_line_fractional_counts():
    recs = [build_record("verify", 10.0, [("all_reduce", 1.0)], t, r) for t, r in [(8, 1), (16, 2)]]
    line = format_log_line([summarize("verify", recs)], tp_rank=1, tp_size=8, dropped=0)
    assert line == ("Verify timing [tp 1/8], verify: 10.0 ms, all-reduce 1.0 ms (10%), 12 tok, 1.5 "
                    "req, compute 9.0 ms, 1 calls 1000.0 us/call, p90 10.0 ms, n 2, dropped 0")


# --------------------------------------------------------------------------------------------------
# PassTimer end to end with the fake clock
# --------------------------------------------------------------------------------------------------
def test_only_sampled_passes_make_marks_and_records():
    t, clock, host, logs = _timer(interval=2)
    seqs = []
    for _ in range(4):
        before = clock.seq
        sampled = _pass(t, clock, host, allreduce_ms=[2.0, 2.0, 2.0], compute_ms=4.0)
        seqs.append((sampled, clock.seq - before))
    # unsampled passes record no mark at all; sampled: hold start, start, 2 per all-reduce, end
    assert seqs == [(False, 0), (True, 9), (False, 0), (True, 9)]
    t.poll()
    assert len(t.records) == 2
    r = t.records[0]
    assert (r.pass_ms == pytest.approx(10.0) and r.comm_ms == pytest.approx(6.0)
            and r.compute_ms == pytest.approx(4.0))
    assert r.allreduce_calls == 3 and (r.tokens, r.requests, r.mode) == (8, 1, "verify")


def test_hold_is_outside_the_pass_and_declined_fused_calls_do_not_count():
    t, clock, host, _ = _timer(interval=1)
    _pass(t, clock, host, allreduce_ms=[1.0], fused=[(0.5, True), (0.3, False)], compute_ms=2.0)
    t.poll()
    (r,) = t.records
    # 1 + 0.5 + 0.3 (declined, still GPU time) + 2
    assert clock.holds and r.pass_ms == pytest.approx(3.8)
    assert (r.allreduce_calls, r.fused_calls) == (1, 1)
    assert r.fused_ms == pytest.approx(0.5) and r.compute_ms == pytest.approx(2.3)


def test_nested_collective_is_timed_once():
    t, clock, host, _ = _timer(interval=1)
    t.begin("decode", 1, 1)

    def outer():
        clock.run(1.0)
        # e.g. a fused op falling back inside itself
        t.timed_call("all_reduce", clock.run, (2.0,), {})

    t.timed_call("allreduce_norm", outer, (), {})
    clock.completed = 0
    t.end()
    clock.completed = math.inf
    t.poll()
    (r,) = t.records
    assert (r.fused_calls, r.allreduce_calls) == (1, 0) and r.fused_ms == pytest.approx(3.0)


def test_pending_until_gpu_passes_the_end_mark():
    t, clock, host, _ = _timer(interval=1)
    _pass(t, clock, host, allreduce_ms=[1.0], gpu_done=False)
    t.poll()
    assert len(t.pending) == 1 and not t.records
    clock.completed = math.inf
    t.poll()
    assert len(t.pending) == 0 and len(t.records) == 1


def test_starved_pass_is_dropped_and_hold_grows():
    t, clock, host, _ = _timer(interval=1)
    target0 = t.hold.target_ms
    # The GPU reached the start mark before the host finished enqueuing:
    # done(start) is True at end().
    _pass(t, clock, host, allreduce_ms=[1.0], enqueue_ms=40.0, starved=True)
    t.poll()
    assert not t.records and t.aggregator.total_dropped["verify"] == 1
    assert t.hold.target_ms == pytest.approx(min(t.hold.max_ms, 2 * max(target0, 40.0)))


def test_not_starved_when_host_finishes_first():
    t, clock, host, _ = _timer(interval=1)
    _pass(t, clock, host, allreduce_ms=[1.0], enqueue_ms=12.0)  # GPU still held when end() runs
    t.poll()
    assert len(t.records) == 1 and t.aggregator.total_dropped["verify"] == 0
    assert t.hold.target_ms == pytest.approx(18.0)  # 1.5 x the 12 ms host enqueue


def test_hold_calibrates_cycles_per_ms():
    h = HoldController(min_ms=1.0, max_ms=100.0, cycles_per_ms=1.0e6)
    h.observe(cycles=4_000_000, hold_ms=2.0, enqueue_ms=10.0, starved=False)
    assert h.cycles_per_ms == pytest.approx(2.0e6) and h.target_ms == pytest.approx(15.0)
    assert h.cycles() == 30_000_000
    h.observe(cycles=1, hold_ms=0.0, enqueue_ms=0.1, starved=False)  # no measurement: rate kept
    assert h.cycles_per_ms == pytest.approx(2.0e6) and h.target_ms == 1.0  # floor at min_ms
    h2 = HoldController(min_ms=1.0, max_ms=50.0)
    h2.observe(cycles=10, hold_ms=1.0, enqueue_ms=400.0, starved=True)
    assert h2.target_ms == 50.0  # capped


def test_end_to_end_hold_uses_measured_rate():
    t, clock, host, _ = _timer(interval=1)
    _pass(t, clock, host, enqueue_ms=10.0)
    t.poll()
    assert t.hold.cycles_per_ms == pytest.approx(clock.true_cycles_per_ms)
    _pass(t, clock, host, enqueue_ms=10.0)
    assert clock.holds[-1] == int(15.0 * clock.true_cycles_per_ms)


def test_abort_forgets_the_open_pass():
    t, clock, host, _ = _timer(interval=1)
    assert t.begin("verify", 8, 1)
    t.abort()
    t.end()
    t.poll()
    assert t.open is None and not t.pending and not t.records


def test_periodic_log_line_uses_host_clock():
    t, clock, host, logs = _timer(interval=1, log_interval_s=10.0)
    _pass(t, clock, host, allreduce_ms=[2.0] * 10, compute_ms=5.0)
    t.poll()
    assert logs == []  # 10 s have not passed
    host.s += 10.0
    t.poll()
    assert logs == ["Verify timing [tp 0/2], verify: 25.0 ms, all-reduce 20.0 ms (80%), 8 tok, 1 "
                    "req, compute 5.0 ms, 10 calls 2000.0 us/call, p90 25.0 ms, n 1, dropped 0, 1 "
                    "in 1 passes sampled"]
    host.s += 100.0
    t.poll()
    assert len(logs) == 1  # empty window: no line


def test_only_rank_zero_logs():
    clock, host, logs = FakeClock(), HostClock(), []
    cfg = TimingConfig.from_flags(True, 1, 1.0, tp_size=2, tp_rank=1)
    t = PassTimer(cfg, clock, log=logs.append, host_clock=host)
    _pass(t, clock, host, allreduce_ms=[1.0])
    host.s += 5
    t.poll()
    assert logs == [] and len(t.records) == 1


# --------------------------------------------------------------------------------------------------
# Prometheus metrics (real prometheus_client, private registry)
# --------------------------------------------------------------------------------------------------
def test_metrics_names_labels_buckets():
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.CollectorRegistry()
    cfg = TimingConfig.from_flags(True, 1, 0, tp_size=2, tp_rank=1, model_name="qwen",
                                  export_metrics=True)
    m = VerifyMetrics(prometheus_client, cfg, registry=reg)
    m.observe(build_record("verify", 30.0,
                           [("all_reduce", 0.2)] * 100 + [("allreduce_norm", 0.25)] * 20, 8, 1))
    m.observe(build_record("decode", 4.0, [("all_reduce", 0.02)] * 50, 1, 1))
    m.dropped("verify")
    lab = {"model_name": "qwen", "mode": "verify", "tp_size": "2", "tp_rank": "1"}
    g = reg.get_sample_value
    assert g("sglang:verify_pass_seconds_count", lab) == 1
    assert g("sglang:verify_pass_seconds_sum", lab) == pytest.approx(0.030)
    assert g("sglang:verify_allreduce_seconds_sum", lab) == pytest.approx(0.025)
    assert g("sglang:verify_fused_allreduce_norm_seconds_sum", lab) == pytest.approx(0.005)
    assert g("sglang:verify_compute_seconds_sum", lab) == pytest.approx(0.005)
    assert g("sglang:verify_allreduce_share_sum", lab) == pytest.approx(25 / 30)
    assert g("sglang:verify_pass_tokens_sum", lab) == 8
    assert g("sglang:verify_pass_requests_sum", lab) == 1
    assert g("sglang:verify_allreduce_calls_sum", lab) == 120
    # a 30 ms pass falls in the 0.03 s bucket, not in 0.025
    assert g("sglang:verify_pass_seconds_bucket", dict(lab, le="0.03")) == 1
    assert g("sglang:verify_pass_seconds_bucket", dict(lab, le="0.025")) == 0
    assert g("sglang:verify_timing_samples_total", dict(lab, outcome="recorded")) == 1
    assert g("sglang:verify_timing_samples_total", dict(lab, outcome="dropped")) == 1
    dec = dict(lab, mode="decode")
    assert g("sglang:verify_allreduce_seconds_sum", dec) == pytest.approx(0.001)
    assert g("sglang:verify_timing_samples_total", dict(dec, outcome="dropped")) is None
    names = {mf.name for mf in reg.collect()}
    assert names == {
        "sglang:verify_pass_seconds", "sglang:verify_allreduce_seconds",
        "sglang:verify_fused_allreduce_norm_seconds", "sglang:verify_compute_seconds",
        "sglang:verify_allreduce_share", "sglang:verify_pass_tokens", "sglang:verify_pass_requests",
        "sglang:verify_allreduce_calls", "sglang:verify_timing_samples",
        "sglang:verify_rank_wait_seconds",
    }
    for mf in reg.collect():
        for s in mf.samples:
            assert ({"model_name", "mode", "tp_size", "tp_rank"}
                    <= set(s.labels)), (mf.name, s.labels)
    assert list(timing.SECONDS_BUCKETS) == sorted(timing.SECONDS_BUCKETS)


def test_timer_feeds_metrics():
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.CollectorRegistry()
    clock, host = FakeClock(), HostClock()
    cfg = TimingConfig.from_flags(True, 1, 0, tp_size=2, tp_rank=0, model_name="m",
                                  export_metrics=True)
    t = PassTimer(cfg, clock, metrics=VerifyMetrics(prometheus_client, cfg, registry=reg),
                  host_clock=host)
    _pass(t, clock, host, mode="decode", tokens=4, requests=4, allreduce_ms=[0.5, 0.5])
    t.poll()
    lab = {"model_name": "m", "mode": "decode", "tp_size": "2", "tp_rank": "0"}
    assert reg.get_sample_value("sglang:verify_allreduce_seconds_sum", lab) == pytest.approx(0.001)
    assert reg.get_sample_value("sglang:verify_pass_tokens_sum", lab) == 4


# --------------------------------------------------------------------------------------------------
# TP > 1: collective time vs waiting for other ranks
# --------------------------------------------------------------------------------------------------
def test_across_ranks_takes_the_last_arrival_per_call():
    # rank 0 reached call 0 2.0 ms early and call 2 0.5 ms early; rank 1 was early at call 1
    r0 = [("all_reduce", 2.010), ("all_reduce", 0.010), ("allreduce_norm", 0.512)]
    r1 = [("all_reduce", 0.011), ("all_reduce", 0.310), ("allreduce_norm", 0.012)]
    spans, wait = across_ranks(r0, [r0, r1])
    assert spans == [("all_reduce", 0.011), ("all_reduce", 0.010), ("allreduce_norm", 0.012)]
    assert wait == pytest.approx(1.999 + 0.5)
    spans1, wait1 = across_ranks(r1, [r0, r1])
    assert spans1 == spans  # both ranks report the same collective times
    assert wait1 == pytest.approx(0.3)


def test_across_ranks_refuses_unpaired_calls():
    a = [("all_reduce", 1.0), ("all_reduce", 1.0)]
    assert across_ranks(a, [a, a[:1]]) is None
    assert across_ranks(a, [a, [("all_reduce", 1.0), ("allreduce_norm", 1.0)]]) is None
    assert across_ranks(a, []) is None


def test_exchange_splits_wait_and_completes_at_next_begin():
    logs = []
    clock0, host = FakeClock(), HostClock()
    payloads = {}
    cfg0 = TimingConfig.from_flags(True, 1, 0, tp_size=2, tp_rank=0, model_name="m")
    # rank 1's payload is fixed in advance (as if gathered): its calls took 0.02 ms each, no waiting
    payloads[1] = {"starved": False, "spans": [("all_reduce", 0.02), ("all_reduce", 0.02)]}

    def exchange0(payload):
        payloads[0] = payload
        return [payloads[0], payloads[1]]

    t0 = PassTimer(cfg0, clock0, log=logs.append, host_clock=host, exchange=exchange0)
    # rank 0 waits 3 ms in its first all-reduce (rank 1 arrived late), then runs in step
    _pass(t0, clock0, host, mode="verify", tokens=8, allreduce_ms=[3.02, 0.02], compute_ms=1.0,
          gpu_done=False)
    t0.poll()  # with an exchange, poll never completes a pass (ranks must complete together)
    assert not t0.records and len(t0.pending) == 1
    t0.begin("verify", 8, 1)  # next timed pass: wait for the end mark, exchange, record
    assert getattr(clock0, "waited", 0) == 1 and not t0.pending
    r = t0.records[-1]
    assert r.allreduce_ms == pytest.approx(0.04)
    assert r.wait_ms == pytest.approx(3.0)
    assert r.pass_ms == pytest.approx(4.04)
    assert r.busy_ms == pytest.approx(1.04)
    assert r.compute_ms == pytest.approx(1.0)


def test_exchange_drops_on_every_rank_when_one_rank_starved():
    clock, host = FakeClock(), HostClock()
    cfg = TimingConfig.from_flags(True, 1, 0, tp_size=2, tp_rank=0, model_name="m")
    seen = []

    def exchange(payload):
        seen.append(payload)
        return [payload, {"starved": True, "spans": payload["spans"]}]

    t = PassTimer(cfg, clock, host_clock=host, exchange=exchange)
    _pass(t, clock, host, allreduce_ms=[0.1, 0.1])
    t.begin("verify", 8, 1)
    assert len(seen) == 1 and seen[0]["starved"] is False
    assert not t.records
    assert t.aggregator.total_dropped["verify"] == 1


def test_exchange_with_unpaired_calls_keeps_raw_spans():
    clock, host = FakeClock(), HostClock()
    cfg = TimingConfig.from_flags(True, 1, 0, tp_size=2, tp_rank=0, model_name="m")
    t = PassTimer(cfg, clock, host_clock=host,
                  exchange=lambda p: [p, {"starved": False, "spans": p["spans"][:1]}])
    _pass(t, clock, host, allreduce_ms=[0.5, 0.5], compute_ms=1.0)
    t.begin("verify", 8, 1)
    assert t.unpaired == 1
    assert t.records[-1].allreduce_ms == pytest.approx(1.0) and t.records[-1].wait_ms == 0.0


def test_log_line_shows_rank_wait_and_busy_pass():
    r = build_record("verify", 13.0, [("all_reduce", 0.01)] * 61, 8, 1, wait_ms=10.0)
    s = summarize("verify", [r])
    line = format_log_line([s], 0, 2, 0)
    assert line == ("Verify timing [tp 0/2], verify: 3.0 ms, all-reduce 0.6 ms (20%), 8 tok, 1 "
                    "req, compute 2.4 ms, 61 calls 10.0 us/call, rank wait 10.0 ms, p90 3.0 ms, n "
                    "1, dropped 0")


# --------------------------------------------------------------------------------------------------
# Overhead budget: the interval widens so that samples cost at most OVERHEAD_BUDGET of the host time
# --------------------------------------------------------------------------------------------------
def test_widened_interval():
    assert widened_interval(500, 20.0, 2.0) == 2000  # 20 ms per sample, 2 ms passes, 0.5 %
    # slow passes: the flag's interval already suffices
    assert widened_interval(500, 20.0, 30.0) == 500
    assert widened_interval(100, 0.0, 2.0) == 100 and widened_interval(100, 5.0, 0.0) == 100
    assert widened_interval(10, 1.0, 1.0, budget=0.01) == 100


def _ordinary(t, host, ms, mode="decode"):
    assert t.begin(mode, 1, 1) is False
    host.s += ms / 1000.0


def test_interval_widens_to_the_measured_sample_cost_on_one_rank(monkeypatch):
    monkeypatch.setattr(timing, "AUTO_FLOOR", 10)
    clock, host = FakeClock(), HostClock()
    cfg = TimingConfig.from_flags(True, 0, 0, tp_size=1, tp_rank=0, model_name="m")
    assert cfg.budgeted and cfg.floor == 10
    t = PassTimer(cfg, clock, host_clock=host)
    for _ in range(9):
        _ordinary(t, host, 2.0)  # 2 ms passes
    assert t.begin("decode", 1, 1) is True  # the 10th pass is sampled
    t.end()
    host.s += 12.0 / 1000.0  # the sampled pass took 12 ms of host time instead of 2
    _ordinary(t, host, 2.0)
    assert t.sample_costs[-1] == pytest.approx(10.0)
    assert t.sampler.interval == 1000  # 10 ms / (0.005 * 2 ms)
    assert t.overhead_estimate() == pytest.approx(0.005)


def test_an_explicit_interval_is_kept_and_its_overhead_reported():
    clock, host = FakeClock(), HostClock()
    cfg = TimingConfig.from_flags(True, 10, 0, tp_size=1, tp_rank=0, model_name="m")
    assert not cfg.budgeted and cfg.floor == 10
    t = PassTimer(cfg, clock, host_clock=host)
    for _ in range(9):
        _ordinary(t, host, 2.0)
    assert t.begin("decode", 1, 1) is True
    t.end()
    host.s += 12.0 / 1000.0
    _ordinary(t, host, 2.0)
    assert t.sampler.interval == 10 and t.overhead_estimate() == pytest.approx(10.0 / (10 * 2.0))


def test_ranks_adopt_rank_zeros_interval_at_the_exchange(monkeypatch):
    monkeypatch.setattr(timing, "AUTO_FLOOR", 3)
    clock, host = FakeClock(), HostClock()
    cfg = TimingConfig.from_flags(True, 0, 0, tp_size=2, tp_rank=1, model_name="m")
    got = []

    def exchange(payload):
        got.append(payload["interval"])
        return [{"starved": False, "spans": payload["spans"], "interval": 777}, payload]

    t = PassTimer(cfg, clock, host_clock=host, exchange=exchange)
    for _ in range(2):
        _ordinary(t, host, 2.0)
    assert t.begin("decode", 1, 1) is True
    t.end()
    host.s += 0.05
    # completes the sample: exchange, then rank 0's interval
    assert t.begin("decode", 1, 1) is False
    assert got == [3] and t.sampler.interval == 777
    assert t.proposed_interval > 3  # this rank's own proposal goes out with the next exchange


def test_idle_gaps_count_neither_as_periods_nor_as_sample_cost(monkeypatch):
    monkeypatch.setattr(timing, "AUTO_FLOOR", 4)
    clock, host = FakeClock(), HostClock()
    t = PassTimer(TimingConfig.from_flags(True, 0, 0, tp_size=1, tp_rank=0, model_name="m"), clock,
                  host_clock=host)
    for _ in range(3):
        _ordinary(t, host, 2.0)
    host.s += 30.0  # the server was idle for 30 s between two requests
    assert t.begin("decode", 1, 1) is True  # 4th pass: sampled
    assert sorted(t.periods) == pytest.approx([2.0, 2.0])  # the gap before it is not a period
    t.end()
    host.s += 45.0  # idle again right after the sample
    _ordinary(t, host, 2.0)
    assert not t.sample_costs and t.sampler.interval == 4  # no cost measured from an idle gap


def test_flag_help_texts_survive_argparse_formatting():
    """SGLang hands these texts to argparse, which treats '%' as a format character."""
    import argparse

    ap = argparse.ArgumentParser()
    for i, text in enumerate((timing.HELP_ENABLE, timing.HELP_INTERVAL, timing.HELP_LOG_INTERVAL)):
        ap.add_argument(f"--x{i}", help=text)
    import re

    assert "0.5 percent" in re.sub(r"\s+", " ", ap.format_help())
