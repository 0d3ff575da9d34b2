"""lab/summarize_results.py on made-up run folders and on the runs kept whole (auto/run6, run10)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab"))
import summarize_results as sr  # noqa: E402

RUNS = ROOT / "benchmark" / "results" / "h200x2" / "auto"


def _client(path: Path, levels):
    path.write_text(json.dumps({"repro_command": "serving.py run", "levels": [
        {"name": name, "concurrency": c,
         "summary": {"requests": 4, "errors": 0, "output_tok_per_s": rate, "ttft_ms_median": 40.0,
                     "tpot_ms_median": 4.5, "accept_length_mean": acc, "verify_steps": None}}
        for name, c, rate, acc in levels]}))


def test_auto_runs_keep_commit_flags_and_the_verdict(tmp_path, capsys):
    run = tmp_path / "run7"
    run.mkdir()
    (tmp_path / "run12").mkdir()  # no client results: reported, not dropped
    (tmp_path / "run12" / "timeline.txt").write_text("[1s] unpacked; commit abc1234\n")
    (tmp_path / "notes").mkdir()  # not a run folder
    (run / "timeline.txt").write_text("[3s] unpacked; py-spy: none; commit 359222f\n")
    (run / "env.txt").write_text("NVIDIA H200, 580.159.04\n\n2.11.0+cu130 0.5.16\n")
    (run / "commands.txt").write_text(
        "m_plain: PYTHONPATH=/x python3 -m sglang.launch_server --tp 2 --port 23010 "
        "--model-path /m\n"
        "m_auto: FASTVERIFY_STEP_TRACE=/t FASTVERIFY_X=1 python3 -m sglang.launch_server --tp 2 "
        "--port 23090 --speculative-ngram-verify-mode auto\n")
    for server, rate in (("m_plain", 100.0), ("m_auto", 99.0)):
        _client(run / f"{server}_sampled_r1.json", [("c=1", 1, rate, None)])
    out = tmp_path / "summary"
    assert sr.main(["auto", str(tmp_path), "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert list(data["runs"]) == ["run7", "run12"]  # numeric order, non-run folders left out
    got = data["runs"]["run7"]
    assert got["commit"] == "359222f" and got["environment"][0] == "NVIDIA H200, 580.159.04"
    assert got["servers"]["m_auto"] == {"env": ["FASTVERIFY_X=1"],
                                        "flags": "--tp 2 --speculative-ngram-verify-mode auto"}
    row = got["verdicts"]["m_auto"][0]
    assert row["auto_vs_plain"] == pytest.approx(0.99) and not row["met"]
    assert "no client results" in data["runs"]["run12"]["note"]
    text = out.with_suffix(".txt").read_text()
    assert "run7 (commit 359222f)" in text
    assert "m_auto 0.990x plain, 0.990x best: NOT met" in text
    assert data["repro_command"].startswith("python lab/summarize_results.py auto ")


def test_client_levels_apart_by_name_and_tables_where_no_json(tmp_path):
    _client(tmp_path / "s_tree.json", [("c=1", 1, 291.0, 2.27), ("long8000", 1, 636.0, 7.63)])
    (tmp_path / "s_tree.txt").write_text(
        "# serving benchmark  tag=s_tree\n  c=1  1 0 9 9.0 1.0 1.0 1.0 1.0 - -\n")
    (tmp_path / "over_r1.txt").write_text(
        "# serving benchmark  tag=over_r1\n"
        "  level  reqs  err  out tok   tok/s  TTFT ms    p99  TPOT ms   p99  accept  steps\n"
        "    c=1     6    0     1800   438.2     33.9   36.3     2.18  2.31       -      -\n"
        "    c=4     8    0     3200  2359.9    100.0  522.1     1.19  1.68    8.00    400\n")
    (tmp_path / "other.txt").write_text("not a client table\n")
    data = sr.summarize_client(tmp_path)
    # the JSON wins over its own table; a text file that is no client table is not read
    assert set(data["results"]) == {"s_tree.json", "over_r1.txt"}
    tree = data["results"]["s_tree.json"]["levels"]
    assert tree["c=1"]["output_tok_per_s"] == 291.0
    assert tree["long8000"]["accept_length_mean"] == 7.63  # a level of the same concurrency, apart
    table = data["results"]["over_r1.txt"]["levels"]
    assert table["c=1"] == {"requests": 6, "errors": 0, "output_tok_per_s": 438.2,
                            "ttft_ms_median": 33.9, "tpot_ms_median": 2.18,
                            "accept_length_mean": None, "verify_steps": None}
    assert table["c=4"]["accept_length_mean"] == 8.0 and table["c=4"]["verify_steps"] == 400


def test_the_stored_summary_holds_the_verdict_of_the_kept_runs():
    """The committed auto/summary.json was made from the raw files; for the two runs whose client
    results stayed it must agree with a fresh reading of them."""
    stored = json.loads((RUNS / "summary.json").read_text())["runs"]
    for name in ("run6", "run10"):
        fresh = sr.judge(RUNS / name, "m_auto")
        assert stored[name]["verdicts"]["m_auto"] == json.loads(json.dumps(fresh))


def test_bad_folder(tmp_path, capsys):
    assert sr.main(["client", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert "not a folder" in capsys.readouterr().err
