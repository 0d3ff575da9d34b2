"""lab/path_probe_share.py splits an auto server's steps on the plain path into the probes' share
and the rest, against a plain server's steps, from step-trace records."""
import json

import pytest

import path_probe_share


def _write(folder, periods, launches, kind, probes=None):
    """Decode launch records at bs 1 with the given periods and launch times (ms), and where
    ``probes`` is given, the tracer's probe mark of each."""
    folder.mkdir()
    t, lines = 100.0, []
    for i, (period, launch) in enumerate(zip(periods, launches)):
        probe = bool(probes and probes[i])
        lines.append(json.dumps(["R", t, t + launch / 1000.0, "DECODE", 1, kind, 1, probe, {},
                                 "greedy"]))
        t += period / 1000.0
    (folder / "steps-1.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder)


def test_the_probes_and_the_two_steps_after_each_carry_the_paths_excess(tmp_path, capsys):
    base = _write(tmp_path / "A", [1.0] * 200, [0.7] * 200, None)
    # every 20th path step probes (+0.4 ms in its launch) and the step after it is 0.1 ms slower;
    # the rest cost what plain's steps cost
    periods, launches = [], []
    for i in range(200):
        probe, after = i % 20 == 5, i % 20 == 6
        periods.append(1.0 + (0.4 if probe else 0.1 if after else 0.0))
        launches.append(0.7 + (0.4 if probe else 0.0))
    auto = _write(tmp_path / "auto", periods, launches, "path")
    out = tmp_path / "s.json"
    assert path_probe_share.main([base, auto, "--json", str(out)]) == 0
    r = json.loads(out.read_text())["servers"][auto]
    assert r["probe_steps"] == 10 and r["path_steps"] == 199 and r["how"] == "launch"
    assert abs(r["away_over_base_ms"]) < 1e-9
    assert abs(r["probes_over_ms"] - 10 * 0.5) < 1e-6
    assert abs(r["path_over_base_ms"] - r["probes_per_path_step_ms"]) < 1e-9
    assert "auto" in capsys.readouterr().out


def test_a_server_without_path_steps_is_refused(tmp_path, capsys):
    base = _write(tmp_path / "A", [1.0] * 50, [0.7] * 50, None)
    plain = _write(tmp_path / "P", [1.0] * 50, [0.7] * 50, None)
    assert path_probe_share.main([base, plain]) == 2
    assert "too few steady steps" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        path_probe_share.main([base, plain, "--after", "-1"])
    assert e.value.code == 2


def test_the_tracers_probe_marks_are_read_where_a_trace_has_them(tmp_path):
    """A probe that took no longer than other steps' launches is still a probe where the tracer
    marked it; a slow launch that did not probe is not one."""
    base = _write(tmp_path / "A", [1.0] * 100, [0.7] * 100, None)
    probes = [i % 20 == 5 for i in range(100)]
    slow = [i % 20 == 15 for i in range(100)]  # a slow launch, no probe
    periods = [1.0 + (0.2 if p else 0.0) for p in probes]
    launches = [0.7 + (0.5 if s else 0.0) for s in slow]
    auto = _write(tmp_path / "auto", periods, launches, "path", probes)
    r = path_probe_share.share(path_probe_share.steady(path_probe_share.load_server(base)[1], 1,
                                                       None),
                               path_probe_share.steady(path_probe_share.load_server(auto)[1], 1,
                                                       "path"), 0.2, 2)
    assert r["how"] == "marked" and r["probe_steps"] == 5
    assert abs(r["probes_over_ms"] - 5 * 0.2) < 1e-6
