"""fastverify.emulator and fastverify.glue.emulator_hook: the wait per pass, calibration,
self-check, flags.

The device is a model (FakeDevice): a spin of c cycles takes overhead + c / (cycles per us) of
device time, timed the way CUDA events time it. The calibration and self-check code under test is
the server's own; only the device is modelled. The last part imports the patched SGLang (patch 0011)
and drives its real seams with a stand-in device.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
from types import SimpleNamespace

import pytest
import torch

from fastverify import emulator, passcost
from fastverify.emulator import (CalibrationError, EmulatorConfig, EmulatorError, PassEmulator,
                                 calibrate, config_from_flags, pass_tokens, self_check)
from fastverify.glue import emulator_hook

REF = "reference-kimi-tp8"


class FakeDevice:
    """A device with a clock of `cycles_per_us` (= MHz). Eager spins cost `overhead_us` of launch on
    the stream, graph-replayed ones `graph_overhead_us`, times `graph_factor`; `noise` is a relative
    jitter."""

    def __init__(self, cycles_per_us=1980.0, overhead_us=3.0, graph_overhead_us=1.0,
                 graph_factor=1.0, noise=0.0, seed=0):
        self.cycles_per_us, self.overhead_us = cycles_per_us, overhead_us
        self.graph_overhead_us, self.graph_factor = graph_overhead_us, graph_factor
        self.noise, self.rng = noise, random.Random(seed)
        self.now = 0.0  # device time, us
        self.spins = []
        self._graph = False

    def spin(self, cycles):
        self.spins.append(int(cycles))
        launch = self.graph_overhead_us if self._graph else self.overhead_us
        t = launch + cycles / self.cycles_per_us
        if self._graph:
            t *= self.graph_factor
        self.now += t * (1.0 + self.noise * self.rng.uniform(-1.0, 1.0))

    def time_us(self, fn, reps, graph=False):
        out = []
        for _ in range(reps):
            self._graph = graph
            t0 = self.now
            fn()
            out.append(self.now - t0)
            self._graph = False
        return out

    def mark(self):
        return self.now

    def elapsed_us(self, a, b):
        return b - a


def ref_json():
    return json.loads((passcost.PROFILE_DIR / f"{REF}.json").read_text())


# --------------------------------------------------------------------------------------------------
# Profile -> wait
# --------------------------------------------------------------------------------------------------
def test_wait_is_the_profiles_pass_time_at_every_token_count():
    prof = passcost.load_profile(REF)
    comm, full = EmulatorConfig(prof, False), EmulatorConfig(prof, True)
    for n in range(1, 200):
        assert comm.wait_us(n) == pytest.approx(prof.comm_ms(n) * 1000.0)
        both_ms = prof.comm_ms(n) + prof.compute_pass_ms(n)
        assert full.wait_us(n) == pytest.approx(both_ms * 1000.0)
    assert comm.wait_us(0) == full.wait_us(0) == 0.0
    # the file's own points, read independently of passcost's interpolation
    obj = ref_json()
    for key, us in obj["allreduce_us"].items():
        assert comm.wait_us(int(key)) == pytest.approx(obj["allreduces_per_pass"] * us)
    # between two points (2 and 4 tokens) the per-call cost is linear: 3 tokens is their mean
    mid = (obj["allreduce_us"]["2"] + obj["allreduce_us"]["4"]) / 2
    assert comm.wait_us(3) == pytest.approx(obj["allreduces_per_pass"] * mid)


def test_reference_profile_reproduces_the_report_on_paper():
    """Plain decode 82 tok/s (one token a pass), a verify pass of EAGLE-3's 4-token chain ~30 ms of
    which ~25 ms in the all-reduces."""
    cfg = config_from_flags(REF, compute=True)
    assert 1e6 / cfg.wait_us(1) == pytest.approx(82.0, rel=0.01)
    assert cfg.wait_us(4) / 1000 == pytest.approx(30.0, rel=0.01)
    assert config_from_flags(REF).wait_us(4) / 1000 == pytest.approx(25.0, rel=0.01)


def test_pass_tokens_by_kind():
    assert pass_tokens("decode", 4) == 4
    assert pass_tokens("verify", 4, width=8) == 32
    assert pass_tokens("prefill", 3, extend_tokens=517) == 517
    assert pass_tokens("idle", 0) == 0
    with pytest.raises(ValueError,
                       match="pass kind 'draft'; expected decode, verify, prefill or idle"):
        pass_tokens("draft", 1)


def test_table_and_banner_say_what_is_emulated():
    cfg = config_from_flags(REF)
    assert cfg.banner() == (f"pass-cost emulation ACTIVE: profile {REF} (comm); "
                            "timings are emulated, not measurements")
    assert "comm+compute" in config_from_flags(REF, True).banner()
    line = cfg.table((1, 64, 128))
    assert f"1:{cfg.wait_us(1) / 1000:.2f} " in line and "128:" in line and "* extrapolated" in line
    assert "*" not in cfg.table((1, 64))


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------
def test_flag_off_and_on():
    assert config_from_flags(None) is None and config_from_flags("  ") is None
    cfg = config_from_flags(REF, compute=True)
    assert cfg.profile.name == REF and cfg.compute and cfg.mode == "comm+compute"


def test_unknown_profile_names_the_flag_and_the_built_ins():
    with pytest.raises(EmulatorError, match=r"--emulate-pass-cost no-such: no such file and no "
                                            r"built-in profile of that name \(built in: "
                                            r".*reference-kimi-tp8"):
        config_from_flags("no-such")


def test_bad_profile_file(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text("{not json")
    with pytest.raises(EmulatorError, match=r"--emulate-pass-cost .*broken.json: not valid JSON"):
        config_from_flags(str(p))
    p.write_text(json.dumps({"allreduces_per_pass": 10}))
    with pytest.raises(EmulatorError, match=r"--emulate-pass-cost .*: missing key 'allreduce_us'"):
        config_from_flags(str(p))


def test_compute_flag_needs_a_profile_with_compute(tmp_path):
    with pytest.raises(EmulatorError, match=r"--emulate-pass-cost-compute needs "
                                            r"--emulate-pass-cost PROFILE \(built in: "
                                            r".*reference-kimi-tp8"):
        config_from_flags(None, compute=True)
    p = tmp_path / "comm_only.json"
    p.write_text(json.dumps({"name": "comm-only", "allreduces_per_pass": 10,
                             "allreduce_us": {"1": 20}}))
    assert config_from_flags(str(p)).wait_us(1) == pytest.approx(200.0)
    with pytest.raises(EmulatorError,
                       match=r"--emulate-pass-cost-compute: profile comm-only .* has no "
                             r"compute_ms"):
        config_from_flags(str(p), compute=True)


# --------------------------------------------------------------------------------------------------
# Calibration and self-check against a modelled device
# --------------------------------------------------------------------------------------------------
def test_calibration_recovers_the_clock_and_the_overhead():
    dev = FakeDevice(cycles_per_us=1755.0, overhead_us=4.0, noise=0.002)
    cal = calibrate(dev, max_us=80_000.0)
    assert cal.cycles_per_us == pytest.approx(1755.0, rel=0.005)
    assert cal.overhead_us == pytest.approx(4.0, abs=2.0)
    assert len(cal.points) == 6 and cal.max_residual < 0.01
    # the cycles for a wait of 7 ms: what the device needs to spend 7 ms, launch included
    assert cal.cycles_for(7000.0) == pytest.approx((7000.0 - 4.0) * 1755.0, rel=0.005)
    assert cal.cycles_for(0.0) == 0 and cal.cycles_for(-1.0) == 0


def test_self_check_passes_on_a_calibrated_device():
    dev = FakeDevice(noise=0.005)
    cfg = config_from_flags(REF, compute=True)
    cal = calibrate(dev, max_us=cfg.wait_us(64))
    results = self_check(dev, cal, cfg, tokens=(1, 8, 64))
    assert [(r.tokens, r.graph) for r in results] == [(1, False), (1, True), (8, False), (8, True),
                                                      (64, False), (64, True)]
    assert all(abs(r.error) < 0.01 for r in results)
    assert results[0].target_us == cfg.wait_us(1)


def test_self_check_fails_when_the_clock_slows_by_ten_percent_after_calibration():
    dev = FakeDevice()
    cfg = config_from_flags(REF)
    cal = calibrate(dev, max_us=cfg.wait_us(64))
    dev.cycles_per_us *= 0.9  # the clock dropped: every wait now runs 1/0.9 = +11 % long
    with pytest.raises(CalibrationError,
                       match=r"--emulate-pass-cost reference-kimi-tp8: the self-check failed.*more "
                             r"than 5 %: 1 tokens \(eager\): profile 7.198 ms, measured 7.99\d ms "
                             r"\(\+11.1 %\).*The server does not start"):
        self_check(dev, cal, cfg, tokens=(1, 64))


def test_self_check_fails_when_only_graph_replays_are_off():
    dev = FakeDevice(graph_factor=1.10)  # eager spins as calibrated, replayed ones 10 % long
    cfg = config_from_flags(REF)
    cal = calibrate(dev, max_us=cfg.wait_us(8))
    with pytest.raises(CalibrationError) as e:
        self_check(dev, cal, cfg, tokens=(1, 8))
    msg = str(e.value)
    assert "1 tokens (graph): profile 7.198 ms" in msg and "(+10.0 %)" in msg
    assert "1 tokens (eager): profile 7.198 ms, measured 7.198 ms (+0.0 %)" in msg


def test_self_check_within_tolerance_at_four_percent_passes():
    dev = FakeDevice(graph_factor=1.04)
    cfg = config_from_flags(REF)
    cal = calibrate(dev, max_us=cfg.wait_us(8))
    results = self_check(dev, cal, cfg, tokens=(1, 8))
    assert max(r.error for r in results) == pytest.approx(0.04, abs=0.002)


class BusyAtFirstDevice(FakeDevice):
    """Replayed spins run 10 % long during the first `busy_calls` timings with graph=True (another
    process on the device for a moment), as calibrated afterwards."""

    def __init__(self, busy_calls, **kw):
        super().__init__(**kw)
        self.busy_calls = busy_calls

    def time_us(self, fn, reps, graph=False):
        if graph and self.busy_calls > 0:
            self.busy_calls -= 1
            self.graph_factor = 1.10
        out = super().time_us(fn, reps, graph)
        self.graph_factor = 1.0
        return out


def test_a_round_disturbed_once_is_repeated_and_a_device_off_every_time_fails():
    cfg = config_from_flags(REF)
    notes = []
    cal, checks = emulator.calibrate_and_check(BusyAtFirstDevice(busy_calls=1), cfg, (1, 8),
                                               log=notes.append)
    assert len(notes) == 1 and "calibration round 1 of 3 failed, again" in notes[0]
    assert all(abs(r.error) < 0.01 for r in checks) and len(checks) == 4
    notes.clear()
    with pytest.raises(CalibrationError, match=r"\(graph\): profile 7.198 ms, measured 7.91\d ms"):
        emulator.calibrate_and_check(FakeDevice(graph_factor=1.10), cfg, (1, 8), log=notes.append)
    assert len(notes) == 2


class KneeDevice(FakeDevice):
    """Spins past `knee` cycles run at 80 % of the clock (a device that throttles long kernels)."""

    def __init__(self, knee, **kw):
        super().__init__(**kw)
        self.knee = knee

    def spin(self, cycles):
        extra = max(cycles - self.knee, 0)
        super().spin(cycles + 0.25 * extra)


def test_calibration_refuses_a_spin_that_is_not_linear():
    with pytest.raises(CalibrationError, match=r"spin time is not linear in cycles \(worst "
                                               r"point .* off the "
                                               r"line, allowed 2 %\)"):
        calibrate(KneeDevice(knee=2_000_000), max_us=50_000.0)


# --------------------------------------------------------------------------------------------------
# The runtime side
# --------------------------------------------------------------------------------------------------
def make_emulator(dev=None, compute=False, **kw):
    dev = dev or FakeDevice()
    cfg = config_from_flags(REF, compute)
    cal = calibrate(dev, max_us=cfg.wait_us(8))
    return PassEmulator(cfg, cal, dev, **kw), dev


def test_wait_spins_the_calibrated_cycles_once_per_pass():
    em, dev = make_emulator()
    dev.spins.clear()
    assert em.wait(0) == 0.0 and dev.spins == []
    assert em.wait(4) == em.config.wait_us(4)
    assert dev.spins == [em.calibration.cycles_for(em.config.wait_us(4))]
    t0 = dev.now
    em.wait(1)
    assert dev.now - t0 == pytest.approx(em.config.wait_us(1), rel=0.001)
    em.wait(100)
    assert em.extrapolated_tokens == {100}


def test_samples_report_the_real_pass_and_short_waits():
    t = [0.0]
    em, dev = make_emulator(sample_every=1, clock=lambda: t[0], log_interval_s=30.0)
    assert em.take_sample()
    start = dev.mark()
    dev.now += 1500.0  # the served model's own pass: 1.5 ms
    em.wait(1)
    em.record("decode", 1, in_graph=True, start=start, end=dev.mark())
    start = dev.mark()
    dev.now += 800.0  # a pass whose wait did not run (as if the clock had doubled)
    em.record("verify", 8, in_graph=True, start=start, end=dev.mark())
    assert not em.due()
    t[0] = 31.0
    assert em.due()
    line = em.summary()
    assert line.startswith(em.config.banner())
    assert f"decode 1 passes, wait {em.config.wait_us(1) / 1000:.2f} ms/pass" in line
    assert "real 1.50 ms + wait (n=1)" in line
    assert "1 sampled passes were SHORTER than their wait" in line
    assert not em.due() and "no passes" in em.summary()


def test_one_pass_in_sample_every_is_timed():
    em, _ = make_emulator(sample_every=4)
    assert [em.take_sample() for _ in range(8)] == [False, False, False, True] * 2


def test_metrics_gauge_and_counters():
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.CollectorRegistry()
    cfg = config_from_flags(REF)
    m = emulator.EmulatorMetrics(prometheus_client, cfg, tp_rank=0, worst_check_error=0.012,
                                 registry=reg)
    lab = {"profile": REF, "mode": "comm", "tp_rank": "0"}
    assert reg.get_sample_value("sglang:pass_cost_emulation_active", lab) == 1.0
    assert reg.get_sample_value("sglang:pass_cost_emulation_selfcheck_error", lab) == 0.012
    em, _ = make_emulator(metrics=m)
    em.record("decode", 2, in_graph=True)
    em.record("decode", 2, in_graph=False)
    assert reg.get_sample_value("sglang:pass_cost_emulated_passes_total",
                                dict(lab, kind="decode", path="graph")) == 1.0
    assert reg.get_sample_value("sglang:pass_cost_emulated_wait_seconds_total",
                                dict(lab, kind="decode")) == pytest.approx(2 * cfg.wait_us(2) / 1e6)


# --------------------------------------------------------------------------------------------------
# The glue, on stand-in SGLang objects
# --------------------------------------------------------------------------------------------------
class Mode:
    def __init__(self, name):
        self.name = name

    def is_target_verify(self):
        return self.name == "verify"

    def is_decode(self):
        return self.name == "decode"

    def is_idle(self):
        return self.name == "idle"

    def is_split_prefill(self):
        return self.name == "split_prefill"


def batch(mode, tokens, bs=1):
    return SimpleNamespace(forward_mode=Mode(mode), batch_size=bs,
                           input_ids=torch.zeros(tokens, dtype=torch.int64))


def runner(profile=REF, compute=False, draft=False, k=8):
    args = SimpleNamespace(emulate_pass_cost=profile, emulate_pass_cost_compute=compute,
                           enable_metrics=False, speculative_algorithm="NGRAM",
                           speculative_num_draft_tokens=k)
    return SimpleNamespace(server_args=args, is_draft_worker=draft, capture_tail_hooks=[],
                           decode_cuda_graph_runner=None)


def test_flag_off_installs_nothing_and_waits_nothing():
    r, dev = runner(profile=None), FakeDevice()
    assert emulator_hook.install(r, device=dev) is None and r.capture_tail_hooks == []
    assert emulator_hook.pass_scope(r, batch("decode", 1)) is emulator_hook._NULL
    emulator_hook.eager_wait(r, batch("decode", 1))
    assert dev.spins == []


def test_draft_runner_never_waits():
    r, dev = runner(draft=True), FakeDevice()
    assert emulator_hook.install(r, device=dev) is None
    assert r.capture_tail_hooks == [] and dev.spins == []


def test_install_checks_one_token_the_widest_verify_and_64(caplog):
    r, dev = runner(k=6), FakeDevice()
    with caplog.at_level("WARNING"):
        em = emulator_hook.install(r, device=dev)
    assert [c.tokens for c in em.checks] == [1, 1, 6, 6, 64, 64]
    assert len(r.capture_tail_hooks) == 1
    text = caplog.text
    assert "pass-cost emulation ACTIVE: profile reference-kimi-tp8 (comm)" in text
    assert "self-check within 5 %" in text and "calibration: 1980.0 cycles/us" in text


def test_install_refuses_to_start_on_a_device_that_is_off():
    r = runner()
    dev = FakeDevice(graph_factor=1.10)
    with pytest.raises(CalibrationError, match="the self-check failed.*The server does not start"):
        emulator_hook.install(r, device=dev)
    assert r.capture_tail_hooks == []


def test_capture_hook_waits_at_the_graphs_token_count():
    r, dev = runner(), FakeDevice()
    capturing = [False]
    em = emulator_hook.install(r, device=dev, capturing=lambda: capturing[0])
    hook = r.capture_tail_hooks[0]
    graph_runner = SimpleNamespace(bs=4)
    dev.spins.clear()
    hook(graph_runner, None, batch("verify", 32, bs=4), 32)  # a warm-up run before the capture
    assert dev.spins == []
    capturing[0] = True
    hook(graph_runner, None, batch("verify", 32, bs=4), 32)  # a verify graph: 4 requests, width 8
    assert dev.spins == [em.cycles(32)]
    # a replay of that graph: no Python wait, the pass is counted at the graph's 32 tokens
    r.decode_cuda_graph_runner = graph_runner
    with emulator_hook.pass_scope(r, batch("verify", 24, bs=3)):  # 3 requests in the bs-4 graph
        pass
    assert dev.spins == [em.cycles(32)]
    assert em._window.passes == {"verify": 1}
    assert em._window.wait_ms["verify"] == pytest.approx(em.config.wait_us(32) / 1000)


@pytest.mark.parametrize("mode,tokens,bs",
                         [("decode", 3, 3), ("verify", 8, 2), ("prefill", 517, 2)])
def test_eager_pass_waits_at_its_token_count(mode, tokens, bs):
    r, dev = runner(), FakeDevice()
    em = emulator_hook.install(r, device=dev)
    dev.spins.clear()
    fb = batch(mode, tokens, bs)
    with emulator_hook.pass_scope(r, fb):
        emulator_hook.eager_wait(r, fb)
    assert dev.spins == [em.cycles(tokens)]
    assert em._window.passes == {mode: 1}
    assert em._window.wait_ms[mode] == pytest.approx(em.config.wait_us(tokens) / 1000)


def test_pass_scope_times_one_pass_in_sample_every():
    r, dev = runner(), FakeDevice()
    em = emulator_hook.install(r, device=dev)
    em.sample_every = 2
    for _ in range(4):
        fb = batch("decode", 2, bs=2)
        with emulator_hook.pass_scope(r, fb):
            dev.now += 700.0  # the served model's pass
            emulator_hook.eager_wait(r, fb)
    (samples,) = em._window.samples.values()
    assert len(samples) == 2
    for total, wait_us in samples:
        assert wait_us == em.config.wait_us(2)
        assert total - wait_us == pytest.approx(700.0, abs=5.0)  # the spin lands within its launch


def test_split_prefill_and_idle_do_not_wait():
    r, dev = runner(), FakeDevice()
    emulator_hook.install(r, device=dev)
    dev.spins.clear()
    for fb in (batch("split_prefill", 100), batch("idle", 0)):
        with emulator_hook.pass_scope(r, fb):
            emulator_hook.eager_wait(r, fb)
    assert dev.spins == []


# --------------------------------------------------------------------------------------------------
# With the patched SGLang (patch 0011)
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_runner_module():
    pytest.importorskip("sglang")
    from sglang.srt.model_executor import model_runner as mr

    if not hasattr(mr, "emulator_hook"):
        pytest.skip("patch 0011-pass-cost-emulator is not applied to this SGLang "
                    "(make test applies the series)")
    return mr


@pytest.mark.sglang
def test_flags_parse_and_validate(model_runner_module):
    from sglang.srt import server_args as sa

    parser = argparse.ArgumentParser()
    sa.ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "dummy", "--emulate-pass-cost", REF,
                            "--emulate-pass-cost-compute"])
    assert (ns.emulate_pass_cost, ns.emulate_pass_cost_compute) == (REF, True)
    ns = parser.parse_args(["--model-path", "dummy"])
    assert (ns.emulate_pass_cost, ns.emulate_pass_cost_compute) == (None, False)
    assert "--emulate-pass-cost-compute" in parser.format_help()
    emulator_hook.check_flags(ns)
    bad = SimpleNamespace(**dict(vars(ns), emulate_pass_cost="pcie-someday"))
    with pytest.raises(EmulatorError,
                       match=r"--emulate-pass-cost pcie-someday: .*built in: .*" + REF):
        emulator_hook.check_flags(bad)


class GraphRunnerStub:
    def __init__(self, can):
        self.can, self.executed = can, 0

    def can_run_graph(self, fb):
        return self.can

    def execute(self, fb, pp_proxy_tensors=None):
        self.executed += 1
        return "graph-out"


class EagerRunnerStub:
    def __init__(self):
        self.executed = 0

    def execute(self, fb, pp_proxy_tensors=None):
        self.executed += 1
        return "eager-out"


def bare_model_runner(mr, can_graph):
    """A real (patched) ModelRunner object with only what _forward_raw reads on the plain TP=1
    path."""
    r = object.__new__(mr.ModelRunner)
    r.device = "cuda"
    r.attn_backend = None
    r.decode_cuda_graph_runner = GraphRunnerStub(can_graph)
    r.prefill_cuda_graph_runner = None
    r.eager_runner = EagerRunnerStub()
    r.hisparse_coordinator = None
    r.model = SimpleNamespace(shared_experts_config=None)
    r._prepare_eager_forward_batch = lambda fb: None
    r._maybe_execute_deferred_mamba_cow_and_clear = lambda fb: None
    return r


class SglMode(Mode):
    def is_cuda_graph(self):
        return self.name in ("decode", "verify", "idle")

    def is_extend(self, include_draft_extend_v2=False):
        return self.name in ("prefill", "verify")


def sgl_batch(mode, tokens, bs):
    return SimpleNamespace(forward_mode=SglMode(mode), batch_size=bs,
                           input_ids=torch.zeros(tokens, dtype=torch.int64),
                           global_num_tokens_cpu=None, token_indices_to_pool=None,
                           moe_num_token_non_padded=None)


@pytest.mark.sglang
@pytest.mark.parametrize("can_graph,mode,tokens,bs",
                         [(False, "decode", 2, 2), (False, "verify", 16, 2),
                          (False, "prefill", 40, 1), (True, "verify", 16, 2)])
def test_patched_forward_raw_waits_only_outside_decode_graphs(model_runner_module, monkeypatch,
                                                              can_graph, mode, tokens, bs):
    mr = model_runner_module
    r = bare_model_runner(mr, can_graph)
    if hasattr(mr, "get_model"):  # 0.5.23 reads the published model config bag around the pass
        bag = SimpleNamespace(override=lambda **kw: contextlib.nullcontext())
        monkeypatch.setattr(mr, "get_model", lambda: bag)
    args = runner().server_args
    waits = []
    em = SimpleNamespace(wait=waits.append, eager_tokens=None)
    r.__dict__[emulator_hook._ATTR] = em
    r.server_args = args
    try:
        out = r._forward_raw(sgl_batch(mode, tokens, bs), None)
    except Exception as e:  # pragma: no cover - a seam moved: say which
        pytest.fail(f"the patched _forward_raw could not run on the stand-in runner: {e!r}")
    assert out.logits_output == ("graph-out" if can_graph else "eager-out")
    # a replayed decode/verify graph carries its wait inside; every other pass waits once, at its
    # tokens
    assert waits == ([] if can_graph else [tokens])


@pytest.mark.sglang
def test_patched_model_runner_seams_in_order(model_runner_module):
    import inspect

    mr = model_runner_module
    init = inspect.getsource(mr.ModelRunner.__init__)
    assert init.index("self.capture_tail_hooks = []") < init.index("emulator_hook.install(self)")
    assert init.index("self.forward_stream = ") < init.index("emulator_hook.install(self)")
    forward = inspect.getsource(mr.ModelRunner.forward)
    assert "emulator_hook.pass_scope(self, forward_batch)" in forward
    raw = inspect.getsource(mr.ModelRunner._forward_raw)
    graph_return = raw.index("self.decode_cuda_graph_runner.execute(")
    assert graph_return < raw.index("emulator_hook.eager_wait(")
    last = "return ModelRunnerOutput(logits_output=ret, can_run_graph=can_run_graph)"
    assert raw.rstrip().endswith(last)


# --------------------------------------------------------------------------------------------------
# On the GPU machine (`pytest -m gpu tests/test_emulator.py`, about half a minute): the real spin
# --------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", passcost.builtin_names())
def test_cuda_spin_calibrates_and_passes_its_self_check(name):
    dev = emulator_hook.CudaSpinDevice()
    cal, checks = emulator.calibrate_and_check(dev, config_from_flags(name), (1, 8, 64))
    assert 500 < cal.cycles_per_us < 3000  # an SM clock in MHz
    assert len(checks) == 6 and all(abs(r.error) <= emulator.TOLERANCE for r in checks)


@pytest.mark.gpu
def test_cuda_graph_captured_with_the_hook_replays_pass_plus_wait():
    dev = emulator_hook.CudaSpinDevice()
    cfg = config_from_flags(REF)
    cal, _ = emulator.calibrate_and_check(dev, cfg, (1, 8))
    em = PassEmulator(cfg, cal, dev)
    hook = emulator_hook._CaptureTail(em)  # the real "is the stream capturing" test
    x = torch.randn(512, 512, device="cuda")

    def forward():
        y = x @ x
        hook(SimpleNamespace(), y, SimpleNamespace(batch_size=1), 8)  # a verify pass of width 8
        return y

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        forward()  # a warm-up run: no wait
    torch.cuda.synchronize()
    assert hook.graph_tokens == {}
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        forward()
    bare = torch.cuda.CUDAGraph()
    with torch.cuda.graph(bare):
        x @ x
    with_wait = statistics.median(dev.time_us(g.replay, 5))
    without = statistics.median(dev.time_us(bare.replay, 5))
    assert with_wait - without == pytest.approx(cfg.wait_us(8), rel=emulator.TOLERANCE)
