"""fastverify.glue.timing_hook: flag off = no event and no record; flag on =
spans inside sampled passes.

The first half needs no SGLang (fake runners, a fake device clock). The second half imports the
patched SGLang (``make test`` applies the series first; run by hand with
PYTHONPATH=<a patched copy of the folder holding sglang/>) and drives the real patched
GroupCoordinator.all_reduce and the real flags.
"""
from __future__ import annotations

import argparse
import math
from types import SimpleNamespace

import pytest
import torch

from fastverify import timing
from fastverify.glue import timing_hook
from fastverify.timing import PassTimer, TimingConfig


class CountingEvent:
    """Stands in for torch.cuda.Event: counts constructions and records."""

    made = 0
    recorded = 0

    def __init__(self, *a, **kw):
        type(self).made += 1

    def record(self, *a, **kw):
        type(self).recorded += 1


@pytest.fixture
def counting_events(monkeypatch):
    CountingEvent.made = CountingEvent.recorded = 0
    monkeypatch.setattr(torch.cuda, "Event", CountingEvent)
    return CountingEvent


class Mode:
    def __init__(self, name):
        self.name = name

    def is_target_verify(self):
        return self.name == "verify"

    def is_decode(self):
        return self.name == "decode"


def fake_batch(mode="verify", bs=2, k=4):
    n = bs * k if mode == "verify" else bs
    return SimpleNamespace(forward_mode=Mode(mode), input_ids=torch.zeros(n, dtype=torch.int64),
                           batch_size=bs)


def fake_runner(enable=False, draft=False):
    args = SimpleNamespace(enable_verify_timing=enable, verify_timing_interval=1,
                           verify_timing_log_interval=0.0,
                           served_model_name="m", enable_metrics=False)
    return SimpleNamespace(server_args=args, is_draft_worker=draft)


class TickClock:
    """A device clock whose stream time advances 1 ms per mark; the GPU never starves."""

    def __init__(self):
        self.t, self.seq, self.completed = 0.0, 0, math.inf

    def mark(self):
        self.t += 1.0
        self.seq += 1
        return (self.t, self.seq)

    def done(self, m):
        return m[1] < self.completed

    def elapsed_ms(self, a, b):
        return b[0] - a[0]

    def hold(self, cycles):
        pass


def runner_with_fake_timer(interval=1):
    """A runner whose timer (flag on) uses a fake clock; returns (runner, timer, clock)."""
    clock = TickClock()
    timer = PassTimer(TimingConfig.from_flags(True, interval, 0.0), clock)
    runner = fake_runner(enable=True)
    setattr(runner, timing_hook._ATTR, timer)
    return runner, timer, clock


def run_pass(runner, batch, clock, body):
    with timing_hook.pass_scope(runner, batch):
        clock.completed = 0  # GPU still in the hold while the host enqueues
        body()
    clock.completed = math.inf


# --------------------------------------------------------------------------------------------------
# Without SGLang
# --------------------------------------------------------------------------------------------------
def test_flag_off_scope_is_the_shared_null_context(counting_events):
    r = fake_runner(enable=False)
    calls = []
    wrapped = timing_hook.timed_collective("all_reduce")(lambda x: calls.append(x) or x)
    for mode in ("verify", "decode", "verify"):
        scope = timing_hook.pass_scope(r, fake_batch(mode))
        assert scope is timing_hook._NULL
        with scope:
            assert timing_hook._ACTIVE is None and not timing_hook.eager_pass()
            assert timing_hook.graph_or_eager(True) is True
            assert wrapped(7) == 7
    assert calls == [7, 7, 7]
    assert getattr(r, timing_hook._ATTR) is None  # decided once, cached on the runner
    assert (counting_events.made, counting_events.recorded) == (0, 0)


def test_draft_runner_and_untimed_modes_are_not_timed():
    assert timing_hook.timer_for(fake_runner(enable=True, draft=True)) is None
    runner, timer, clock = runner_with_fake_timer()
    assert timing_hook.pass_scope(runner, fake_batch("extend")) is timing_hook._NULL
    assert timer.sampler.passes == {"verify": 0, "decode": 0}


def test_flag_on_without_cuda_is_off(caplog):
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    r = fake_runner(enable=True)
    with caplog.at_level("WARNING"):
        assert timing_hook.pass_scope(r, fake_batch()) is timing_hook._NULL
    assert "--enable-verify-timing needs CUDA" in caplog.text


def test_sampled_pass_runs_eager_and_times_collectives():
    runner, timer, clock = runner_with_fake_timer(interval=2)
    ar = timing_hook.timed_collective("all_reduce")(lambda x: x)
    fused = timing_hook.timed_collective("allreduce_norm")(
        lambda ran: ("norm", "res") if ran else (None, None))
    seen = []

    def body():
        seen.append((timing_hook.eager_pass(), timing_hook.graph_or_eager(False)))
        ar(1), ar(2), fused(True), fused(False)

    for _ in range(2):
        run_pass(runner, fake_batch("verify", bs=2, k=4), clock, body)
    # pass 1 untimed (graph as usual), pass 2 sampled
    assert seen == [(False, False), (True, False)]
    assert timing_hook._ACTIVE is None
    timer.poll()
    (r,) = timer.records
    assert (r.mode, r.tokens, r.requests, r.allreduce_calls,
            r.fused_calls) == ("verify", 8, 2, 2, 1)
    # TickClock: 1 ms per mark; start .. end spans 2 + 2 + 2 + 2 (declined
    # fused still brackets) marks
    assert r.allreduce_ms == 2.0 and r.fused_ms == 1.0 and r.pass_ms == 9.0


def test_forward_that_raises_leaves_nothing_open():
    runner, timer, clock = runner_with_fake_timer(interval=1)
    with pytest.raises(RuntimeError, match="boom"):
        with timing_hook.pass_scope(runner, fake_batch("decode")):
            assert timing_hook.eager_pass()
            raise RuntimeError("boom")
    assert timing_hook._ACTIVE is None and timer.open is None and not timer.pending


def test_fused_applied():
    f = timing_hook._fused_applied
    assert f(("n", "r")) and f(torch.zeros(1)) and not f(None) and not f((None, None))


def test_bad_kind_and_bad_flags():
    with pytest.raises(ValueError, match="unknown collective kind 'reduce_scatter'"):
        timing_hook.timed_collective("reduce_scatter")
    args = SimpleNamespace(enable_verify_timing=True, verify_timing_interval=-1,
                           verify_timing_log_interval=30.0)
    with pytest.raises(ValueError,
                       match=r"--verify-timing-interval must be an integer >= 0 \(0: budgeted\); "
                             r"got -1"):
        timing_hook.check_flags(args)
    timing_hook.check_flags(SimpleNamespace())  # an SGLang without our flags: defaults, no error


# --------------------------------------------------------------------------------------------------
# With the patched SGLang
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def parallel_state():
    pytest.importorskip("sglang")
    from sglang.srt.distributed import parallel_state as ps

    if not hasattr(ps.GroupCoordinator.all_reduce, "__wrapped__"):
        pytest.skip("patch 0006-verify-timing is not applied to this SGLang (make test applies the "
                    "series)")
    return ps


@pytest.mark.sglang
def test_patched_all_reduce_flag_off_records_nothing(parallel_state, counting_events):
    gc = object.__new__(parallel_state.GroupCoordinator)
    gc.world_size = 1  # all_reduce returns its input: the wrapper is what is under test
    x = torch.ones(4)
    assert timing_hook._ACTIVE is None
    assert gc.all_reduce(x) is x
    assert (counting_events.made, counting_events.recorded) == (0, 0)
    # positive control: the same call inside a sampled pass is bracketed by two marks
    runner, timer, clock = runner_with_fake_timer(interval=1)
    run_pass(runner, fake_batch("decode", bs=1), clock, lambda: gc.all_reduce(x))
    timer.poll()
    (r,) = timer.records
    assert r.allreduce_calls == 1 and r.allreduce_ms == 1.0


@pytest.mark.sglang
def test_patched_fused_entry_points_are_wrapped(parallel_state):
    from sglang.srt.layers import flashinfer_comm_fusion as fcf

    assert hasattr(parallel_state.GroupCoordinator.fused_allreduce_rmsnorm, "__wrapped__")
    assert hasattr(fcf.flashinfer_allreduce_residual_rmsnorm, "__wrapped__")
    gc = object.__new__(parallel_state.GroupCoordinator)
    gc.ca_comm = None  # not ROCm: SGLang declines the fused call (returns None) -> not counted
    runner, timer, clock = runner_with_fake_timer(interval=1)
    run_pass(runner, fake_batch("verify"), clock,
             lambda: gc.fused_allreduce_rmsnorm(torch.ones(2), torch.ones(2), torch.ones(2), 1e-6))
    timer.poll()
    (r,) = timer.records
    assert r.fused_calls == 0 and r.allreduce_calls == 0


@pytest.mark.sglang
def test_flags_parse_and_validate(parallel_state):
    from sglang.srt import server_args as sa

    parser = argparse.ArgumentParser()
    sa.ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "dummy", "--enable-verify-timing",
                            "--verify-timing-interval", "50", "--verify-timing-log-interval", "5"])
    assert (ns.enable_verify_timing, ns.verify_timing_interval,
            ns.verify_timing_log_interval) == (True, 50, 5.0)
    ns = parser.parse_args(["--model-path", "dummy"])
    assert (ns.enable_verify_timing, ns.verify_timing_interval) == (False, timing.DEFAULT_INTERVAL)
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "dummy", "--verify-timing-interval", "often"])
    args = SimpleNamespace(**vars(parser.parse_args(["--model-path", "dummy",
                                                     "--verify-timing-interval", "-1"])))
    with pytest.raises(ValueError,
                       match=r"--verify-timing-interval must be an integer >= 0 \(0: budgeted\); "
                             r"got -1"):
        timing_hook.check_flags(args)
