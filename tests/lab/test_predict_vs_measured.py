"""lab/predict_vs_measured.py on a made-up evaluation summary with known numbers."""
import datetime as dt
import json

import predict_vs_measured as pvm  # lab/ is on sys.path (tests/conftest.py)
import pytest

from fastverify import passcost

PROFILE = "reference-kimi-tp8"
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc).timestamp()


def _args(algo=None, d=None, mode="tree", widths=None):
    return {"speculative_algorithm": algo, "speculative_num_draft_tokens": d,
            "speculative_ngram_verify_mode": mode, "speculative_ngram_verify_widths": widths}


def _summary(flags=f"--emulate-pass-cost-compute --emulate-pass-cost {PROFILE}"):
    servers = [{"name": "A", "server_args": _args()},
               {"name": "tree", "server_args": _args("NGRAM", 8)},
               {"name": "chain", "server_args": _args("NGRAM", 4, "chain")},
               {"name": "chain_w", "server_args": _args("NGRAM", 8, "chain", "1,2,4,8")},
               {"name": "auto_w", "server_args": _args("NGRAM", 8, "auto", "1,2,4,8")}]

    def cell(c):
        return {"set": "grounded", "c": c, "ignore_eos": True, "servers": {
            "A": {"requests": 5, "decode_tps_median": 80.0, "accept_length": None},
            "tree": {"requests": 5, "decode_tps_median": 40.0, "accept_length": 1.5,
                     "decode": {"ratio": 0.5}},
            "chain": {"requests": 5, "decode_tps_median": 50.0, "accept_length": 2.0},
            "chain_w": {"requests": 5, "decode_tps_median": 60.0, "accept_length": 1.4},
            "auto_w": {"requests": 5, "decode_tps_median": 79.0, "accept_length": 1.05}}}
    return {"groups": [{"group": "g", "group_flags": flags, "baseline": "A",
                        "servers": servers, "cells": [cell(1), cell(4)]}]}


def _raw_and_logs(tmp_path):
    raw = {"passes": [{"server": "chain_w", "set": "grounded", "c": 1, "t_start": T0,
                       "duration_s": 4.0},
                      {"server": "chain_w", "set": "grounded", "c": 4, "t_start": T0 + 20,
                       "duration_s": 3.0}]}
    stamp = dt.datetime.fromtimestamp

    def line(t, hist):
        ts = stamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        return f"[{ts}] n-gram verify widths: steps by width {hist}, verified tok/step 3.0\n"
    (tmp_path / "g.chain_w.log").write_text(
        line(T0 - 30, "{1: 40}")  # warm-up: outside every pass
        + line(T0 + 1.2, "{1: 30, 8: 10}") + line(T0 + 3.5, "{1: 10, 4: 5, 8: 25}")
        + "[x] Decode batch, accept len: 1.2\n" + line(T0 + 21, "{1: 4, 8: 36}"))
    return raw


def _rows(result):
    return {(r["server"], r["c"]): r for r in result["groups"][0]["rows"]}


def test_known_numbers(tmp_path):
    raw = _raw_and_logs(tmp_path)
    result = pvm.compare(_summary(), tmp_path, raw)
    rows = _rows(result)
    prof = passcost.load_profile(PROFILE)
    plain = 1000.0 / prof.pass_ms(1)
    assert rows[("A", 1)]["pred_tok_s"] == pytest.approx(plain)
    assert rows[("A", 1)]["err_tok_s_pct"] == pytest.approx(100 * (plain - 80) / 80)
    assert rows[("A", 1)]["meas_vs_plain"] == pytest.approx(1.0)
    tree = rows[("tree", 1)]
    assert tree["pred_tok_s"] == pytest.approx(1.5 / prof.pass_ms(8) * 1000)
    assert tree["step_ms_left_out"] == pytest.approx(1000 * 1.5 / 40 - prof.pass_ms(8))
    assert tree["meas_vs_plain"] == 0.5  # the summary's paired ratio wins over medians
    assert tree["err_vs_plain_pct"] == pytest.approx(100 * (tree["pred_tok_s"] / plain - 0.5)
                                                     / 0.5)
    chain = rows[("chain", 1)]  # 4 draft tokens -> chain3, a verify pass of 4 tokens
    assert chain["shape"] == "chain3"
    assert chain["pred_tok_s"] == pytest.approx(2.0 / prof.pass_ms(4) * 1000)
    assert chain["meas_vs_plain"] == pytest.approx(50 / 80)
    cw = rows[("chain_w", 1)]  # steps 1: 40, 4: 5, 8: 35 -> 50 % verified
    assert cw["widths_steps"] == {"1": 40, "4": 5, "8": 35}
    assert cw["verified_share"] == pytest.approx(0.5)
    step = 0.5 * prof.pass_ms(8) + 0.5 * prof.pass_ms(1)
    assert cw["pred_tok_s"] == pytest.approx(1.4 / step * 1000, rel=1e-3)
    assert "chain7+widths=1.4000@0.5000" in cw["advise"]
    auto = rows[("auto_w", 1)]  # chain7 at 1.05 loses: the controller stays at plain
    assert auto["pred_tok_s"] == pytest.approx(plain)
    assert result["groups"][0]["widths_steps_outside_passes"] == {"chain_w": 40}


def test_c4_predicted_per_request_with_four_requests_per_pass(tmp_path):
    """A c=4 cell is asked with --concurrency 4: a pass of n tokens per request is one of 4 n."""
    rows = _rows(pvm.compare(_summary(), tmp_path, _raw_and_logs(tmp_path)))
    prof = passcost.load_profile(PROFILE)
    plain4 = 1000.0 / prof.pass_ms(4)
    assert rows[("A", 4)]["pred_tok_s"] == pytest.approx(plain4)
    assert "--concurrency 4" in rows[("A", 4)]["advise"]
    tree = rows[("tree", 4)]
    assert tree["pred_tok_s"] == pytest.approx(tree["accept_length"] * 1000 / prof.pass_ms(32))
    assert rows[("chain_w", 4)]["verified_share"] == pytest.approx(0.9)
    for name in ("A", "tree", "chain", "chain_w", "auto_w"):
        r = rows[(name, 4)]
        assert "why_not" not in r and r["err_tok_s_pct"] is not None


def test_widths_without_logs_not_predicted():
    rows = _rows(pvm.compare(_summary()))
    assert "no share of verified steps" in rows[("chain_w", 1)]["why_not"]
    assert rows[("tree", 1)]["pred_tok_s"] > 0


def test_summary_widths_entry_used():
    s = _summary()
    s["groups"][0]["cells"][0]["servers"]["chain_w"]["widths_steps"] = {"1": 1, "8": 3}
    assert _rows(pvm.compare(s))[("chain_w", 1)]["verified_share"] == pytest.approx(0.75)


def test_comm_only_and_no_emulation_refused():
    rows = _rows(pvm.compare(_summary(f"--emulate-pass-cost {PROFILE}")))
    assert "communication only" in rows[("tree", 1)]["why_not"]
    rows = _rows(pvm.compare(_summary("")))
    assert "no pass-cost emulation" in rows[("A", 1)]["why_not"]
    rows = _rows(pvm.compare(_summary(""), profile_override=PROFILE))
    assert rows[("tree", 1)]["pred_tok_s"] > 0


def test_cli_writes_json_and_table(tmp_path, capsys):
    raw = _raw_and_logs(tmp_path)
    (tmp_path / "s.json").write_text(json.dumps(_summary()))
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    out_j, out_t = tmp_path / "p.json", tmp_path / "p.txt"
    rc = pvm.main([str(tmp_path / "s.json"), "--logs", str(tmp_path), "--raw",
                   str(tmp_path / "raw.json"), "--json", str(out_j), "--txt", str(out_t)])
    assert rc == 0
    got = json.loads(out_j.read_text())
    assert got["repro_command"].startswith("python lab/predict_vs_measured.py")
    assert "chain7+widths" in out_t.read_text() and "grounded c=4" in out_t.read_text()


def test_cli_errors(tmp_path, capsys):
    assert pvm.main([str(tmp_path / "missing.json")]) == 2
    assert "file not found" in capsys.readouterr().err
    (tmp_path / "s.json").write_text("{}")
    assert pvm.main([str(tmp_path / "s.json"), "--logs", str(tmp_path)]) == 2
    assert "--logs needs --raw" in capsys.readouterr().err


def test_each_group_reads_the_raw_record_of_its_own_name(tmp_path):
    raw = _raw_and_logs(tmp_path)  # the log lines of group g, placed by g's passes
    other = {"group": "h", "passes": [dict(p, t_start=p["t_start"] + 1000) for p in raw["passes"]]}
    summary = _summary()
    placed = _rows(pvm.compare(summary, tmp_path, [other, dict(raw, group="g")]))
    assert placed[("chain_w", 1)]["verified_share"] is not None
    # only the other group's record: g's lines fall in no pass window, no share
    unplaced = _rows(pvm.compare(summary, tmp_path, [other]))
    assert unplaced[("chain_w", 1)]["verified_share"] is None
    assert placed[("chain_w", 1)]["verified_share"] == \
        _rows(pvm.compare(summary, tmp_path, raw))[("chain_w", 1)]["verified_share"]
