"""CPU tests of the kernel regression gate: the compare's per-entry thresholds and normalization
(made-up benchmark JSONs with known verdicts), the repeat/median logic of the benchmark (a fake
timer), the N-times gate loop, and the CPU rehearsal of `fastverify bench gate`."""

from __future__ import annotations

import json
import re

import pytest
import torch

from fastverify.bench.kernels import compare as cmp
from fastverify.bench.kernels import gate
from fastverify.bench.kernels import run as krun

V2 = "fastverify-kernel-bench/2"


def _v2(ref, host_ref, kernels):
    """kernels: name -> (us, mode); thresholds as the benchmark states them."""
    return {"format": V2, "reference": {"name": "copy", "us": ref},
            "host_reference": {"name": "sync", "us": host_ref},
            "kernels": {k: krun.entry(us, mode) for k, (us, mode) in kernels.items()}}


def _row(rows, name):
    return next(r for r in rows if r["kernel"] == name)


BASE = _v2(100.0, 20.0, {"g": (10.0, "graph"), "e": (50.0, "eager")})


def test_host_drift_cancels_for_eager_entries_and_device_drift_for_graph_ones():
    # the host 1.8x slower, the device unchanged: the eager entry follows the host reference
    cur = _v2(100.0, 36.0, {"g": (10.0, "graph"), "e": (90.0, "eager")})
    rows, ok = cmp.compare(BASE, cur, 0.15)
    assert ok and _row(rows, "e")["ratio"] == pytest.approx(1.0)
    assert _row(rows, "e")["basis"] == "/host ref" and _row(rows, "g")["basis"] == "/copy"
    # the device 2x slower: the graph entry follows the copy
    rows, ok = cmp.compare(BASE, _v2(200.0, 20.0, {"g": (20.0, "graph"), "e": (50.0, "eager")}),
                           0.15)
    assert ok and _row(rows, "g")["ratio"] == pytest.approx(1.0)


@pytest.mark.parametrize("g_us,e_us,verdict", [
    (11.4, 50.0, "ok ok"),            # graph 1.14x <= 1.15
    (11.6, 50.0, "REGRESSED ok"),     # graph 1.16x > 1.15
    (10.0, 95.0, "ok ok"),            # eager 1.9x <= 2.0 (host-bound limit)
    (10.0, 105.0, "ok REGRESSED"),    # eager 2.1x > 2.0
])
def test_per_entry_limits_from_the_baseline(g_us, e_us, verdict):
    cur = _v2(100.0, 20.0, {"g": (g_us, "graph"), "e": (e_us, "eager")})
    rows, ok = cmp.compare(BASE, cur, 0.15)
    assert " ".join(_row(rows, k)["status"] for k in ("g", "e")) == verdict
    assert ok == (verdict == "ok ok")
    assert _row(rows, "g")["limit"] == pytest.approx(1.15)
    assert _row(rows, "e")["limit"] == pytest.approx(2.0)


def test_a_threshold_stated_by_the_baseline_wins_over_the_flags():
    base = _v2(100.0, 20.0, {"g": (10.0, "graph")})
    base["kernels"]["g"].update(threshold=0.05, threshold_why="tight on purpose")
    rows, ok = cmp.compare(base, _v2(100.0, 20.0, {"g": (10.6, "graph")}), threshold=0.5)
    assert not ok and _row(rows, "g")["why"] == "tight on purpose"


def test_old_format_baseline_gets_the_mode_defaults_and_the_copy():
    old = {"format": "fastverify-kernel-bench/1", "reference": {"name": "copy", "us": 100.0},
           "kernels": {"g": {"us": 10.0}, "e": {"us": 50.0, "mode": "eager"}}}
    cur = _v2(100.0, 20.0, {"g": (10.0, "graph"), "e": (90.0, "eager")})
    rows, ok = cmp.compare(old, cur, 0.15, host_threshold=0.5)
    e = _row(rows, "e")
    assert e["basis"] == "/copy (no host ref)" and e["ratio"] == pytest.approx(1.8)
    assert e["limit"] == pytest.approx(1.5) and e["status"] == "REGRESSED" and not ok
    assert e["why"] == cmp.DEFAULT_WHY["eager"]
    assert _row(rows, "g")["why"] == cmp.DEFAULT_WHY["graph"]
    assert cmp.compare(old, cur, 0.15)[1]  # the default host limit, 2x, passes 1.8x


def test_a_changed_timing_mode_asks_for_a_new_baseline_and_does_not_fail():
    cur = _v2(100.0, 20.0, {"g": (10.0, "graph"), "e": (3.0, "graph")})
    rows, ok = cmp.compare(BASE, cur, 0.15)
    assert ok and _row(rows, "e")["status"] == "REBASELINE (mode eager -> graph)"
    assert _row(rows, "e")["ratio"] is None
    assert "1 entry need a new baseline" in cmp.verdict(rows, ok)


def test_printed_table_explains_every_limit(tmp_path, capsys):
    b, c = tmp_path / "b.json", tmp_path / "c.json"
    b.write_text(json.dumps(BASE))
    c.write_text(json.dumps(_v2(100.0, 20.0, {"g": (12.0, "graph"), "e": (60.0, "eager")})))
    assert cmp.main([str(b), str(c)]) == 1
    out = capsys.readouterr().out
    legend = dict(re.findall(r"^# \[(\d)\] (.+)$", out, re.M))
    assert legend == {"1": krun.THRESHOLDS["graph"][1], "2": krun.THRESHOLDS["eager"][1]}
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln[:2] in ("g ", "e ")}
    assert rows["g"][5:8] == ["1.150", "/copy", "[1]"] and rows["g"][-1] == "REGRESSED"
    assert rows["e"][5:9] == ["2.000", "/host", "ref", "[2]"] and rows["e"][-1] == "ok"
    assert "# result: FAIL; worst g 1.20x (limit 1.15); g REGRESSED 1.20x" in out


def test_compare_rejects_a_negative_host_threshold(tmp_path):
    b = tmp_path / "b.json"
    b.write_text(json.dumps(BASE))
    with pytest.raises(SystemExit):
        cmp.main([str(b), str(b), "--host-threshold", "-1"])


# ----------------------------------------------------------------------------- repeat / median

TINY = ["--hidden", "64", "--tokens", "8", "--shapes", "1x8", "--calls", "2", "--replays", "2"]


def test_runs_keep_the_median_of_every_entry_with_a_fake_timer():
    """Run r of 3 times every call at (5, 1, 3)[r] x the timer's per-kind base: the combined
    result is the median (3x) for every entry and both references, every run under runs_us."""
    state = {"run": 0}
    scale = (5.0, 1.0, 3.0)
    seen = []

    def timer(fn, calls, replays, graph):
        seen.append(graph)
        return scale[state["run"]] * (10.0 if graph else 7.0)

    def progress(_msg):
        state["run"] += 1

    args = krun.parse_args(TINY + ["--runs", "3"])
    out = krun.run(args, timer=timer, dev=torch.device("cpu"), progress=progress)
    assert out["format"] == V2 and out["runs"] == 3
    assert out["reference"]["us"] == 30.0 and out["reference"]["runs_us"] == [50.0, 10.0, 30.0]
    assert out["host_reference"]["us"] == 21.0
    cm = out["kernels"]["chain_mask/bs=1/k=8"]
    assert cm["mode"] == "eager" and cm["us"] == 21.0 and cm["runs_us"] == [35.0, 7.0, 21.0]
    assert cm["ref_ratio"] == pytest.approx(1.0) and cm["threshold"] == 1.0
    tp = out["kernels"]["tree_positions/bs=1/k=8"]
    assert tp["mode"] == "graph" and tp["us"] == 30.0 and tp["threshold"] == 0.15
    # on a CPU the Triton kernel is not run (and not counted wrong); every other entry is timed
    assert out["kernels"]["add_rmsnorm_fused/T=8/H=64"] == {"error": "not run: needs Triton, GPU"}
    assert out["wrong"] == [] and len(seen) == 3 * (2 + 7)


def test_a_kernel_wrong_in_one_run_is_wrong(monkeypatch):
    calls = {"n": 0}
    real = krun.V.greedy_accept_chain

    def flaky(draft, target):
        calls["n"] += 1
        out = real(draft, target)
        return out + 1 if calls["n"] == 2 else out  # the second run's check sees a wrong answer

    monkeypatch.setattr(krun.V, "greedy_accept_chain", flaky)
    args = krun.parse_args(TINY + ["--runs", "3"])
    out = krun.run(args, timer=lambda *a: 1.0, dev=torch.device("cpu"))
    assert out["wrong"] == ["greedy_accept_chain/bs=1/k=8"]
    assert out["kernels"]["greedy_accept_chain/bs=1/k=8"] == {"error": "wrong result"}


def test_bad_runs_flag_is_named():
    with pytest.raises(SystemExit):
        krun.parse_args(["--runs", "0"])


# ----------------------------------------------------------------------------- the N-times gate

def test_gate_loop_prints_one_verdict_per_time_and_the_count(tmp_path):
    currents = iter([
        _v2(100.0, 20.0, {"g": (10.5, "graph"), "e": (50.0, "eager")}),
        _v2(100.0, 20.0, {"g": (13.0, "graph"), "e": (50.0, "eager")}),   # graph 1.3x
        _v2(100.0, 40.0, {"g": (10.0, "graph"), "e": (120.0, "eager")}),  # host 2x: 1.2x
    ])
    lines = []
    res = gate.gate_loop(lambda: next(currents), BASE, 3,
                         {"threshold": 0.15, "host_threshold": 1.0}, tmp_path, lines.append)
    assert [ln.split(":")[1].split(";")[0].strip() for ln in lines[:3]] == ["PASS", "FAIL", "PASS"]
    assert lines[3] == "# gate: passes 2 of 3" and res["passed"] == 2
    assert res["entries"]["g"]["ratios"] == pytest.approx([1.05, 1.3, 1.0])
    assert res["entries"]["e"]["ratios"] == pytest.approx([1.0, 1.0, 1.2])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "compare_1.txt", "compare_2.txt", "compare_3.txt",
        "kernels_1.json", "kernels_2.json", "kernels_3.json"]
    assert "g REGRESSED 1.30x" in (tmp_path / "compare_2.txt").read_text()
    assert "max ratio" in gate.spread_table(res)


def test_gate_rehearsal_on_cpu_runs_the_whole_command(tmp_path, capsys):
    """`fastverify bench gate --rehearse`: the stored baseline is checked, a CPU baseline is
    measured first, then N benchmark + compare times, one verdict each, files under --out-dir."""
    from fastverify.bench import cli

    base = tmp_path / "stored.json"
    base.write_text(json.dumps(BASE))
    out = tmp_path / "gate"
    rc = cli.main(["bench", "gate", str(base), "--rehearse", "--times", "2", "--out-dir",
                   str(out), "--runs", "1"] + TINY)
    text = capsys.readouterr().out
    verdicts = re.findall(r"^time (\d)/2: (PASS|FAIL)", text, re.M)
    assert [v[0] for v in verdicts] == ["1", "2"]
    passed = sum(v[1] == "PASS" for v in verdicts)
    assert f"# gate: passes {passed} of 2" in text and rc == (0 if passed == 2 else 1)
    doc = json.loads((out / "gate.json").read_text())
    assert doc["rehearsal"] and doc["times"] == 2 and len(doc["verdicts"]) == 2
    assert json.loads((out / "baseline.json").read_text())["format"] == V2
    assert (out / "gate.txt").read_text().count("\ntime ") == 2
    assert gate.main([str(tmp_path / "none.json"), "--rehearse"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without GPUs")
def test_gate_refuses_without_a_gpu_unless_rehearsing(tmp_path, capsys):
    base = tmp_path / "stored.json"
    base.write_text(json.dumps(BASE))
    assert gate.main([str(base), "--out-dir", str(tmp_path / "o")]) == 2
    assert "needs 1 CUDA GPU(s)" in capsys.readouterr().err


@pytest.mark.gpu
def test_the_graph_entries_capture_in_a_cuda_graph():
    from fastverify.bench import common
    from fastverify.bench.kernels import verify_ops as V

    dev = torch.device("cuda", 0)
    seq = torch.tensor([20, 30], device=dev)
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]], device=dev)
    draft = torch.tensor([[0, 1, 2, 3], [0, 1, 1, 1]], device=dev)
    for fn in (lambda: V.tree_positions(seq, parents),
               lambda: V.greedy_accept_tree(draft, draft, parents),
               lambda: V.chain_positions(seq, 4)):
        assert common.time_gpu_us(fn, 3, calls=2, graph=True)["median_us"] > 0
