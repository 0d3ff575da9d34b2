"""lab/gpu/tidy_out.sh: an evaluation's results folder left with what the GPU machine hands back."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

KEPT = ["summary.txt", "summary.json", "timeline.txt", "evaluate.tar.xz", "eval_none.png",
        "eval_reference-kimi-tp8.png"]
MOVED = ["pyspy_none.A.txt", "pyspy_none.A.top.txt", "pyspy_none.P.vs.A.txt", "stretches.txt",
         "steptrace_none.txt", "steptrace_none.json", "summary.txt.bak", "evaluate.tar.xz.tmp",
         "old_eval_none.png"]


def _tidy(out: Path, dest: Path):
    return subprocess.run(["bash", str(ROOT / "lab/gpu/tidy_out.sh"), str(out), str(dest)],
                          capture_output=True, text=True, timeout=30)


def test_keeps_the_summary_timeline_plots_and_tarball_and_moves_the_rest_unchanged(tmp_path):
    out, dest = tmp_path / "out", tmp_path / "eval" / "out"
    out.mkdir()
    (out / "sub").mkdir()  # a folder stays where it is
    for name in KEPT + MOVED:
        (out / name).write_text(f"content of {name}\n")
    r = _tidy(out, dest)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(KEPT + ["sub"])
    assert sorted(p.name for p in dest.iterdir()) == sorted(MOVED)
    for name in MOVED:
        assert (dest / name).read_text() == f"content of {name}\n"


def test_warns_and_fails_when_more_than_eight_files_would_be_kept(tmp_path):
    out, dest = tmp_path / "out", tmp_path / "dest"
    out.mkdir()
    names = ["summary.txt", "summary.json", "timeline.txt", "evaluate.tar.xz"] + [
        f"eval_profile{i}.png" for i in range(5)]
    for name in names:
        (out / name).write_text("x")
    r = _tidy(out, dest)
    assert r.returncode == 1
    assert "9 files" in r.stdout
    assert len(list(out.iterdir())) == 9


def test_an_empty_results_folder_is_left_as_it_is(tmp_path):
    out, dest = tmp_path / "out", tmp_path / "dest"
    out.mkdir()
    r = _tidy(out, dest)
    assert r.returncode == 0 and not list(out.iterdir()) and dest.is_dir()
