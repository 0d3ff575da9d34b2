"""lab/gpu/cpu_probe.py: topology read from a made-up sysfs tree, the pair verdict,
and a real short run."""
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "gpu" / "cpu_probe.py"
spec = importlib.util.spec_from_file_location("cpu_probe", SCRIPT)
cpu_probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_probe)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads sysfs, sets affinity")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def test_topology_of_a_two_node_guest_with_hyperthreads(tmp_path):
    # 4 CPUs: cores 0 and 1 on package 0, each with two threads (0,2 and 1,3); node 0
    # holds 0-1, node 1 holds 2-3
    _write(tmp_path / "cpu" / "online", "0-3")
    for cpu, core, sib in ((0, 0, "0,2"), (1, 1, "1,3"), (2, 0, "0,2"), (3, 1, "1,3")):
        base = tmp_path / "cpu" / f"cpu{cpu}" / "topology"
        _write(base / "physical_package_id", "0")
        _write(base / "core_id", str(core))
        _write(base / "thread_siblings_list", sib)
    _write(tmp_path / "node" / "node0" / "cpulist", "0-1")
    _write(tmp_path / "node" / "node1" / "cpulist", "2-3")
    (tmp_path / "node" / "possible").write_text("0-1\n")  # not a node folder: ignored
    topo = cpu_probe.topology(str(tmp_path))
    assert sorted(topo) == [0, 1, 2, 3]
    assert topo[2] == {"package": 0, "core": 0, "siblings": [0, 2], "node": 1}
    assert topo[1]["node"] == 0 and topo[3]["siblings"] == [1, 3]


def test_topology_without_the_optional_files(tmp_path):
    _write(tmp_path / "cpu" / "online", "0")
    (tmp_path / "cpu" / "cpu0" / "topology").mkdir(parents=True)
    assert cpu_probe.topology(str(tmp_path)) == {0: {"package": None, "core": None,
                                                     "siblings": None, "node": None}}


def test_sharing_names_only_the_cpus_past_the_threshold():
    assert cpu_probe.sharing(5.0, {1: 5.2, 2: 5.74, 3: 5.76, 4: 9.0}) == [3, 4]
    assert cpu_probe.sharing(5.0, {1: 5.2}) == []


def test_render_reports_each_part():
    result = {"logical": 2, "physical": 1,
              "topology": {0: {"package": 0, "core": 0, "siblings": [0, 1],
                               "node": 0}},
              "per_cpu": {0: 5.0, 1: 6.0}, "sleep_cpu": 0, "after_sleep": {0: 5.0, 20: 7.5},
              "pairs": {0: {0: 5.0, 1: 9.0}}}
    text = cpu_probe.render(result)
    assert "  0        0    0    0 0,1        5.00" in text
    assert "  1     None None None -          6.00" in text
    assert "work alone: median 5.50 ms, min 5.00, max 6.00" in text
    assert "20 ms -> 7.50" in text
    assert "pairs on cpu 0 (alone 5.00 ms): slower than 1.15x with [1]; worst cpu 1 9.00 ms" in text


def test_a_short_real_run_writes_every_part(tmp_path, capsys):
    out = tmp_path / "probe.json"
    assert cpu_probe.main(["--reps", "1", "--bases", "0", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    cpus = sorted(os.sched_getaffinity(0))
    assert sorted(int(c) for c in data["per_cpu"]) == cpus
    assert all(t > 0 for t in data["per_cpu"].values())
    assert sorted(int(k) for k in data["after_sleep"]) == list(cpu_probe.SLEEPS_MS)
    if 0 in cpus:
        # the base alone, then every other CPU
        assert sorted(int(c) for c in data["pairs"]["0"]) == cpus
    assert os.sched_getaffinity(0) == set(cpus)  # the probe gives the process its CPUs back
    assert "work alone" in capsys.readouterr().out


def test_pick_ranks_each_cpu_by_its_slowest_pass():
    passes = [{0: 7.0, 1: 15.0, 2: 7.2, 3: 6.9}, {0: 7.1, 1: 7.0, 2: 7.3, 3: 16.0}]
    assert cpu_probe.pick(passes, 2) == [0, 2]  # 3 was fast once, then slow; 1 the other way round
    assert cpu_probe.pick(passes, 1) == [0]


def test_pick_on_the_command_line_ends_with_the_cpus(tmp_path, capsys):
    assert cpu_probe.main(["--reps", "1", "--bases", "", "--pick", "1", "--json",
                           str(tmp_path / "p.json")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("CPUS ") and int(last[5:]) in os.sched_getaffinity(0)
    assert len(json.loads((tmp_path / "p.json").read_text())["pick_passes"]) == 2
