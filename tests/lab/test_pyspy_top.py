"""lab/gpu/pyspy_top.py: inclusive and self shares from a raw py-spy profile."""
import importlib.util
from pathlib import Path

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
