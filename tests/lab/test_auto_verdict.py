"""lab/auto_verdict.py on recorded GPU runs (benchmark/results/h200x2/auto)
and on made-up folders."""
import json
from pathlib import Path

import auto_verdict as av  # lab/ is on sys.path (tests/conftest.py)
import pytest

ROOT = Path(__file__).resolve().parents[2]

RUNS = ROOT / "benchmark" / "results" / "h200x2" / "auto"


def _rows(folder, goal=0.98):
    return {(r["load"], r["concurrency"]): r for r in av.verdict(av.collect(folder), goal)}


def test_run10_gpu_bound_model():
    rows = _rows(RUNS / "run10")
    nonrep = rows[("sampled", 1)]
    assert nonrep["best"] == "m_plain" and nonrep["servers"]["m_auto"]["median"] == 207.7
    assert nonrep["auto_vs_plain"] == pytest.approx(207.7 / 210.3, abs=1e-3) and not nonrep["met"]
    rep = rows[("greedy", 4)]
    assert rep["best"] == "m_auto" and rep["auto_vs_best"] == 1.0 and rep["met"]
    assert set(rep["servers"]) == {"m_plain", "m_auto", "m_auto_sync", "m_chain_w"}


def test_run6_medians_over_three_rounds():
    rows = _rows(RUNS / "run6")
    plain = rows[("sampled", 1)]["servers"]["m_plain"]
    assert (plain["median"], plain["min"], plain["max"],
            plain["rounds"]) == (323.6, 310.9, 339.1, 3)
    assert rows[("greedy", 4)]["best"] == "m_chain"
    assert not any(r["met"] for r in rows.values())


def _level(c, rate):
    return {"concurrency": c, "summary": {"output_tok_per_s": rate}}


def test_goal_needs_both_the_share_of_the_best_and_no_speculation(tmp_path):
    for name, rate in {"m_plain_sampled_r1": 100.0, "m_auto_sampled_r1": 101.0,
                       "m_chain_sampled_r1": 103.0,
                       "m_plain_greedy_r1": 100.0, "m_auto_greedy_r1": 300.0,
                       "m_chain_greedy_r1": 310.0}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"levels": [_level(1, rate)]}))
    (tmp_path / "m_plain.metrics.txt").write_text("not a result")
    rows = _rows(tmp_path)
    assert rows[("sampled", 1)]["met"]  # 101 / 103 = 0.981 of the best and above no speculation
    assert not rows[("greedy", 1)]["met"]  # 300 / 310 = 0.968
    assert not _rows(tmp_path, goal=0.99)[("sampled", 1)]["met"]


def test_cli(tmp_path, capsys):
    assert (av.main([str(tmp_path)]) == 2
            and "no <server>_<load>_r<round>.json" in capsys.readouterr().err)
    out = tmp_path / "v.json"
    assert av.main([str(RUNS / "run10"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "goal met in 2 of 4 columns" in text and "NOT MET" in text
    assert len(json.loads(out.read_text())["rows"]) == 4


def test_a_second_server_without_speculation_gives_the_floor_and_auto_meets_the_faster(tmp_path):
    """m_plain2 (same flags, another process): the column reports how far apart the two land, and
    auto is held to the faster of them, whichever name it has."""
    for name, rate in {"m_plain_sampled_r1": 100.0, "m_plain2_sampled_r1": 102.0,
                       "m_auto_sampled_r1": 101.0,
                       "m_plain_greedy_r1": 100.0, "m_auto_greedy_r1": 300.0}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"levels": [_level(1, rate)]}))
    rows = _rows(tmp_path)
    nonrep = rows[("sampled", 1)]
    assert nonrep["plain_spread"] == pytest.approx(100.0 / 102.0, abs=1e-3)
    assert nonrep["auto_vs_plain"] == pytest.approx(101.0 / 102.0, abs=1e-3) and not nonrep["met"]
    assert "plain_spread" not in rows[("greedy", 1)] and rows[("greedy", 1)]["met"]
    assert "the slower at 0.980x the faster" in av.format_rows(list(rows.values()), 0.98)


def _req(i, latency, tpot=None, ttft=0.05, tokens=200, prompt=None):
    return {"prompt_id": prompt or f"p{i}", "index": i, "latency_s": latency,
            "output_tokens": tokens,
            "ttft_s": ttft, "tpot_s": tpot if tpot is not None else (latency - ttft) / (tokens - 1)}


def test_paired_requests_tell_below_from_level():
    """Each request of auto set against the same request of m_plain: 2 % slower on every request is
    below no speculation beyond the requests' spread; +-2 % at random around equal is level.
    Requests that do not pair (another prompt, another length) are left out."""
    import random

    plain = [_req(i, 1.0 + 0.01 * i) for i in range(16)]
    slower = [_req(i, (1.0 + 0.01 * i) * 1.02) for i in range(16)]
    r = av.paired_ratio(slower, plain)
    assert r["n"] == 16 and r["speed"] == pytest.approx(1 / 1.02, abs=1e-4) and r["side"] == "below"
    assert r["hi"] < 1.0 and r["tpot"] < 1.0 and r["ttft_ms"] == pytest.approx(0.0)
    rng = random.Random(3)
    noisy = [_req(i, (1.0 + 0.01 * i) * (1 + rng.choice((-0.02, 0.02)))) for i in range(16)]
    r = av.paired_ratio(noisy, plain)
    assert r["side"] == "level" and r["lo"] < 1.0 < r["hi"]
    odd = slower[:2] + [_req(2, 1.0, prompt="other"), _req(3, 1.0, tokens=150)]
    assert av.paired_ratio(odd, plain)["n"] == 2
    assert av.paired_ratio(odd[2:], plain) is None
    faster = [_req(i, (1.0 + 0.01 * i) / 1.02, ttft=0.04) for i in range(16)]
    r = av.paired_ratio(faster, plain)
    assert r["side"] == "above" and r["ttft_ms"] == pytest.approx(-10.0)


def test_paired_rounds_in_the_cli(tmp_path, capsys):
    plain = [_req(i, 1.0 + 0.01 * i) for i in range(8)]
    for rnd, factor in (("r1", 1.02), ("r2", 1.0)):
        auto = [_req(i, (1.0 + 0.01 * i) * factor) for i in range(8)]
        for name, reqs in (("m_plain", plain), ("m_auto", auto)):
            level = dict(_level(1, 100.0), requests=reqs)
            (tmp_path / f"{name}_sampled_{rnd}.json").write_text(json.dumps({"levels": [level]}))
    pairs = av.paired(tmp_path)
    assert set(pairs) == {("sampled", 1)} and pairs[("sampled", 1)]["r1"]["side"] == "below"
    assert (pairs[("sampled", 1)]["r2"]["side"] == "level"
            and pairs[("sampled", 1)]["r2"]["lo"] == 1.0)
    out = tmp_path / "v.json"
    assert av.main([str(tmp_path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "paired per request, r1: auto 0.9804x no speculation" in text
    assert "auto below no speculation in 1, level in 1, above in 0 of 2 round columns" in text
    assert json.loads(out.read_text())["rows"][0]["paired"]["r1"]["n"] == 8


def test_paired_on_a_recorded_run():
    """run10 (GPU-bound model, one round): auto below no speculation beyond the requests' spread on
    both non-repetitive columns (0.988x and 0.981x per request), above it on the repetitive ones."""
    pairs = av.paired(RUNS / "run10")
    assert [pairs[("sampled", c)]["r1"]["side"] for c in (1, 4)] == ["below", "below"]
    assert pairs[("sampled", 1)]["r1"]["hi"] < 1.0 and pairs[("sampled", 1)]["r1"]["n"] == 8
    assert [pairs[("greedy", c)]["r1"]["side"] for c in (1, 4)] == ["above", "above"]


def _run_with_two_autos(folder):
    """m_auto and m_auto_op (the same mode, other settings) beside m_plain; per request m_auto 2 %
    slower than m_plain on the sampled load, m_auto_op level with it."""
    plain = [_req(i, 1.0 + 0.01 * i) for i in range(12)]
    rates = {"m_plain": {"greedy": 300.0, "sampled": 200.0},
             "m_auto": {"greedy": 905.0, "sampled": 196.0},
             "m_auto_op": {"greedy": 965.0, "sampled": 199.6}}
    factor = {"m_plain": 1.0, "m_auto": 1.02, "m_auto_op": 1.0}
    for server, by_load in rates.items():
        for load, rate in by_load.items():
            reqs = [_req(i, (1.0 + 0.01 * i) * factor[server])
                    for i in range(12)] if load == "sampled" else plain
            level = dict(_level(1, rate), requests=reqs)
            (folder / f"{server}_{load}_r1.json").write_text(json.dumps({"levels": [level]}))


def test_other_auto_servers_are_listed_but_not_competitors(tmp_path):
    """Judging either auto server, the other is the same mode with other settings, not a rival for
    the best: m_auto is the best on the greedy load although m_auto_op is faster there."""
    _run_with_two_autos(tmp_path)
    rows = _rows(tmp_path)
    rep = rows[("greedy", 1)]
    assert rep["best"] == "m_auto" and rep["met"] and rep["variants"] == ["m_auto_op"]
    op = {(r["load"], r["concurrency"]): r
          for r in av.verdict(av.collect(tmp_path), auto="m_auto_op")}
    assert op[("greedy", 1)]["best"] == "m_auto_op" and op[("greedy", 1)]["variants"] == ["m_auto"]
    assert op[("sampled", 1)]["auto_vs_plain"] == pytest.approx(199.6 / 200.0, abs=1e-3)
    assert not op[("sampled", 1)]["met"] and rows[("sampled", 1)]["auto_vs_best"] == 0.98
    assert av.paired(tmp_path, auto="m_auto_op")[("sampled", 1)]["r1"]["side"] == "level"
    assert av.paired(tmp_path)[("sampled", 1)]["r1"]["side"] == "below"


def test_auto_flag_in_the_cli(tmp_path, capsys):
    _run_with_two_autos(tmp_path)
    assert av.main([str(tmp_path), "--auto", "m_auto_op"]) == 0
    text = capsys.readouterr().out
    assert "auto (m_auto_op): 1.000x the best, 3.217x no speculation" in text
    assert "(auto, other settings: not a competitor)" in text
    assert "goal met in 1 of 2 columns" in text
