"""lab/gpu/pyspy_top.py: inclusive and self shares from a raw py-spy profile."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("pyspy_top", ROOT / "lab" / "gpu" / "pyspy_top.py")
pyspy_top = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pyspy_top)


def test_inclusive_counts_a_recursive_function_once_per_stack(tmp_path, capsys):
    raw = ["main (a.py:1);step (b.py:5);step (b.py:9);lookup (c.py:3) 3",
           "main (a.py:1);step (b.py:5);sample (d.py:7) 1",
           "main (a.py:1);idle (e.py:2) 6", ""]
    total, incl, own = pyspy_top.summarise(raw)
    assert total == 10
    assert incl["step (b.py)"] == 4 and incl["main (a.py)"] == 10 and incl["lookup (c.py)"] == 3
    assert own == {"lookup (c.py)": 3, "sample (d.py)": 1, "idle (e.py)": 6}
    p = tmp_path / "prof.txt"
    p.write_text("\n".join(raw))
    assert pyspy_top.main([str(p), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "10 samples" in out and "100.0%  main (a.py)" in out and " 60.0%  idle (e.py)" in out


def test_against_compares_host_time_per_function_largest_difference_first(tmp_path, capsys):
    base = ["main (a.py:1);step (b.py:5) 200", "main (a.py:1);idle (e.py:2) 200"]
    this = ["main (a.py:1);step (b.py:5) 220", "main (a.py:1);idle (e.py:2) 190",
            "main (a.py:1);step (b.py:5);extra (f.py:3) 40"]
    t, b = pyspy_top.summarise(this), pyspy_top.summarise(base)
    lines = pyspy_top.compare(t, b, rate=200.0)
    # all samples: 450 vs 400 at 200/s -> 2250 vs 2000 ms; step: 260 vs 200 samples -> +300 ms
    assert lines[1].split()[:3] == ["2250.00", "2000.00", "+250.00"]
    assert lines[2].split()[:3] == ["1300.00", "1000.00", "+300.00"] and "step (b.py)" in lines[2]
    assert "main (a.py)" in lines[3] and "extra (f.py)" in lines[4] and "idle (e.py)" in lines[5]
    # per step: 1000 steps each -> 0.3 s over 1000 steps = 300 us/step
    per = pyspy_top.compare(t, b, rate=200.0, steps=1000, base_steps=1000)
    assert "us/step" in per[0] and per[2].split()[2] == "+300.00"
    pt, pb = tmp_path / "t.txt", tmp_path / "b.txt"
    pt.write_text("\n".join(this))
    pb.write_text("\n".join(base))
    assert pyspy_top.main([str(pt), "--against", str(pb), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "(450 samples)" in out and "(400 samples)" in out and out.count("\n") == 6


def test_against_reads_each_servers_decode_steps_from_a_step_trace_summary(tmp_path, capsys):
    base = ["main (a.py:1);step (b.py:5) 200"]
    this = ["main (a.py:1);step (b.py:5) 300"]
    pt, pb, st = tmp_path / "t.txt", tmp_path / "b.txt", tmp_path / "steptrace.json"
    pt.write_text("\n".join(this))
    pb.write_text("\n".join(base))
    st.write_text(json.dumps({"results": {"A": {"decode": {"steps": 1000}},
                                          "auto_never": {"decode": {"steps": 2000}}}}))
    assert pyspy_top.main([str(pt), "--against", str(pb), "--steptrace", str(st),
                           "--names", "auto_never,A"]) == 0
    out = capsys.readouterr().out.splitlines()
    # this: 300 samples / 200 per s / 2000 steps = 750 us a step; base: 200 / 200 / 1000 = 1000
    assert "us/step" in out[1]
    assert out[2].split()[:3] == ["750.00", "1000.00", "-250.00"]
    # the names swapped give other counts, so other numbers: the names are read, not the order
    assert pyspy_top.main([str(pt), "--against", str(pb), "--steptrace", str(st),
                           "--names", "A,auto_never"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[:3] == ["1500.00", "500.00",
                                                                   "+1000.00"]
    # a server the summary does not hold: a clear error naming the servers it does
    assert pyspy_top.main([str(pt), "--against", str(pb), "--steptrace", str(st),
                           "--names", "auto_w,A"]) == 1
    err = capsys.readouterr().err
    assert "auto_w" in err and "A, auto_never" in err
    with pytest.raises(SystemExit):
        pyspy_top.main([str(pt), "--against", str(pb), "--steptrace", str(st)])
    with pytest.raises(SystemExit):
        pyspy_top.main([str(pt), "--against", str(pb), "--steptrace", str(st), "--names", "A,P",
                        "--steps", "1", "--base-steps", "1"])


def test_a_frame_name_with_a_line_break_is_one_record(tmp_path, capsys):
    """py-spy writes a frame's name as it is, line breaks included (seen in a profile of SGLang's
    scheduler): the record goes on on the next line, and only its last line ends in the count."""
    raw = ["main (a.py:1);report (m.py:7);            rstd,",
           " (0);inc (values.py:115) 2",
           "main (a.py:1);step (b.py:5) 3", ""]
    total, incl, own = pyspy_top.summarise(raw)
    assert total == 5 and incl["main (a.py)"] == 5 and incl["report (m.py)"] == 2
    assert own["inc (values.py)"] == 2 and own["step (b.py)"] == 3
    p = tmp_path / "cut.txt"
    p.write_text("main (a.py:1);step (b.py:5) 3\nmain (a.py:1);report (m.py:7);   rstd,\n")
    assert pyspy_top.main([str(p)]) == 1
    assert "last record has no count" in capsys.readouterr().err


def test_under_splits_one_functions_samples_by_the_calls_it_made(tmp_path, capsys):
    raw = ["main (a.py:1);probe (p.py:3);lookup (c.py:9);get (c.py:20) 6",
           "main (a.py:1);probe (p.py:3);reduce (r.py:4) 3",
           "main (a.py:1);probe (p.py:3) 1",
           "main (a.py:1);step (b.py:5) 90", ""]
    total, first, paths = pyspy_top.under(raw, "probe (p.py)")
    assert total == 10 and first == {"lookup (c.py)": 6, "reduce (r.py)": 3, "(self)": 1}
    assert paths["lookup (c.py) > get (c.py)"] == 6
    p = tmp_path / "prof.txt"
    p.write_text("\n".join(raw))
    # 10 samples at 1000 a second over 5 calls: 2 ms a call, 1.2 of them in lookup
    args = ["--under", "probe (p.py)", "--rate", "1000", "--calls", "5"]
    assert pyspy_top.main([str(p)] + args) == 0
    out = capsys.readouterr().out
    assert "10 samples under probe (p.py), 2000.0 us a call" in out
    assert " 60.0%       6   1200.0  lookup (c.py)" in out
    assert pyspy_top.main([str(p), "--under", "absent (x.py)"]) == 1
    with pytest.raises(SystemExit):
        pyspy_top.main([str(p), "--calls", "3"])
