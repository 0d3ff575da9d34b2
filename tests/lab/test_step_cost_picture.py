"""lab/step_cost_picture.py: the pieces of a step add up to its busy time, and each is the
difference of the spans it names."""
import json

import pytest

import step_cost_picture as scp


def _auto_lean():
    return {"busy_mean": 3.0, "spans_mean_ms": {
        "schedule": 0.36, "target_step": 0.84, "ngram_step": 1.48, "plain_step": 1.44,
        "plain_decode": 1.28, "plain_inputs": 0.14, "plain_outputs": 0.06, "corpus_put": 0.08,
        "probe_behind": 0.02, "lookup_behind": 0.0}}


def test_an_auto_step_splits_into_the_plain_steps_pieces():
    ps = dict(scp.pieces(_auto_lean()))
    assert sum(ps.values()) == pytest.approx(3.0)
    assert ps["controller bookkeeping"] == pytest.approx(1.44 - 1.28)
    assert ps["save/restore, result shaping"] == pytest.approx(1.28 - 0.84 - 0.14 - 0.06 - 0.08
                                                               - 0.02)
    assert ps["n-gram worker entry"] == pytest.approx(1.48 - 1.44)
    assert ps["rest (result processing, launch, loop)"] == pytest.approx(3.0 - 0.36 - 1.48)


def test_plain_and_fixed_mode_servers_have_fewer_pieces():
    plain = scp.pieces({"busy_mean": 2.2, "spans_mean_ms": {"schedule": 0.3,
                                                            "target_step": 0.8}})
    assert [lb for lb, _ in plain] == ["schedule", "forward call",
                                       "rest (result processing, launch, loop)"]
    assert sum(ms for _, ms in plain) == pytest.approx(2.2)
    chain = dict(scp.pieces({"busy_mean": 4.0, "spans_mean_ms": {
        "schedule": 0.34, "target_step": 0.8, "ngram_step": 2.5, "plain_step": 0.002}}))
    assert chain["n-gram worker (lookup, verify, accept)"] == pytest.approx(1.7)
    assert "controller bookkeeping" not in chain and sum(chain.values()) == pytest.approx(4.0)


def test_cli_takes_a_kind_where_a_server_has_it_and_names_a_missing_server(tmp_path, capsys):
    doc = {"results": {"A": {"decode": {"busy_mean": 2.2, "spans_mean_ms": {
        "schedule": 0.3, "target_step": 0.8}}},
        "auto": {"decode": {"busy_mean": 9.0, "spans_mean_ms": {}},
                 "by_kind": {"lean": _auto_lean()}}}}
    f = tmp_path / "trace.json"
    f.write_text(json.dumps(doc))
    rows = scp.table(doc, ["A", "auto"], "lean")
    assert rows["auto"][0] == "lean steps" and rows["A"][0] == "decode steps"
    assert scp.main([str(f), "--png", str(tmp_path / "x.png"), "--servers", "A,nope"]) == 2
    assert "no server nope" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert scp.main([str(f), "--png", str(tmp_path / "p.png"), "--kind", "lean"]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0
    assert "auto (lean steps): schedule 0.360" in capsys.readouterr().out
