"""lab/path_host_time.py runs on the CPU tests' stand-ins: its batch reaches the plain path, every
case is timed, and the JSON carries the environment and the repro command."""
import json

import path_host_time


def test_the_host_time_run_writes_every_case(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert path_host_time.main(["--bs", "2", "--number", "20", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["what"].strip() for r in data["rows"]][:2] == ["choose_path, middle of a stretch",
                                                             "step around the forward"]
    assert len(data["rows"]) == 6 and all(r["us_per_call"] > 0 for r in data["rows"])
    assert data["environment"]["bs"] == 2
    assert data["repro_command"].startswith("python lab/path_host_time.py --bs 2")
    assert "us  choose_path" in capsys.readouterr().out
