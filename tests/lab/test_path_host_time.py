"""lab/path_host_time.py runs on the CPU tests' stand-ins: its batch reaches the plain path, every
case is timed, and the JSON carries the environment and the repro command."""
import json

import path_host_time


def test_the_host_time_run_writes_every_case(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert path_host_time.main(["--bs", "2", "--number", "20", "--asks", "5",
                                "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["what"].strip() for r in data["rows"]][:2] == ["choose_path, middle of a stretch",
                                                             "step around the forward"]
    assert len(data["rows"]) == 8 and all(r["us_per_call"] > 0 for r in data["rows"])
    assert data["rows"][-2]["what"] == "the controller's ask at a lookup due (median of 5)"
    assert data["rows"][-1]["what"].strip().startswith("the same where the costs' copy stays")
    assert data["environment"]["bs"] == 2 and data["environment"]["asks"] == 5
    assert data["repro_command"].startswith("python lab/path_host_time.py --bs 2")
    assert "us  choose_path" in capsys.readouterr().out


def test_each_timed_ask_counts_the_stretch_then_extends_it_or_answers(monkeypatch):
    """Each timed ask is what `plain_path._lookup_due` asks of the controller: the stretch's steps
    counted, then either more steps before the lookup (a probe held for credit) or the answer for
    the lookup due; both happen over a few asks."""
    from fastverify.controller import Controller

    counted, answered = [], []
    note, answer = Controller.note_plain_path, Controller.lookup_on_plain_path
    monkeypatch.setattr(Controller, "note_plain_path",
                        lambda self, bs, n, ends=True: counted.append(n) or note(self, bs, n, ends))

    def answering(self, *a, **k):
        answered.append(answer(self, *a, **k))
        return answered[-1]

    monkeypatch.setattr(Controller, "lookup_on_plain_path", answering)
    assert path_host_time.ask_us(2, 7) > 0
    assert len(counted) == 7 and all(n >= 0 for n in counted)
    assert 1 <= len(answered) < 7 and set(answered) <= {"probe", "held", "lookup"}
