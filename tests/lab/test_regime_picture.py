"""lab/regime_picture.py: the swept pass-cost model against hand arithmetic, and the crossings."""
import json

import pytest

import regime_picture as rp
from fastverify import passcost


def _prediction(tree=1.5, chain=1.4, share=0.5, r_plain=0.0, r_tree=0.0, r_chain=0.0):
    rows = [{"set": "all", "c": 1, "server": "A", "shape": "plain", "accept_length": None,
             "verified_share": None, "step_ms_left_out": r_plain},
            {"set": "all", "c": 1, "server": "tree", "shape": "tree8", "accept_length": tree,
             "verified_share": None, "step_ms_left_out": r_tree},
            {"set": "all", "c": 1, "server": "chain_w", "shape": "chain7+widths",
             "accept_length": chain, "verified_share": share, "step_ms_left_out": r_chain},
            {"set": "all", "c": 4, "server": "A", "shape": "plain", "accept_length": None,
             "verified_share": None, "step_ms_left_out": 99.0}]
    return {"groups": [{"profile": "reference-kimi-tp8", "rows": rows}]}


def _summary(ratios):
    servers = {k: {"decode": {"ratio": v, "ci95": [v - 0.01, v + 0.01]}, "accept_length": 1.2}
               for k, v in ratios.items()}
    return {"groups": [{"cells": [{"set": "all", "c": 1, "servers": servers},
                                  {"set": "all", "c": 4, "servers": {}}]}]}


def test_the_model_is_the_profiles_passes_plus_the_residual():
    p = passcost.load_profile("reference-kimi-tp8")
    _, rows = rp._rows(_prediction(r_plain=1.0, r_tree=6.0, r_chain=2.0))
    m = rp.model(p, rows, 1.0)
    assert m["plain"] == pytest.approx(1000.0 / (p.pass_ms(1) + 1.0))
    assert m["tree"] == pytest.approx(1.5 * 1000.0 / (p.pass_ms(8) + 6.0))
    step = 0.5 * p.pass_ms(8) + 0.5 * p.pass_ms(1) + 2.0
    assert m["chain_w"] == pytest.approx(1.4 * 1000.0 / step)
    assert m["auto"] == max(m["plain"], m["chain_w"])
    # no residual and no all-reduces: compute alone (5 ms a pass at every size)
    free = rp.model(p, rows, 0.0, residual=False)
    assert free["tree"] / free["plain"] == pytest.approx(1.5)


def test_crossings_are_where_a_mode_meets_plain(tmp_path):
    pred, summ = _prediction(), _summary({"tree": 0.5, "chain_w": 0.7, "auto_w": 0.98})
    doc = rp.build(summ, pred)
    p = passcost.load_profile("reference-kimi-tp8")
    x = doc["crosses_plain_below_us"]["tree_profile_only"]
    # at the crossing the tree's 1.5 tokens per 8-token pass equal plain's per-token pass
    s = x / p.ar_us(8)
    def at(scale):
        return (1.5 * 1000 / (p.compute_pass_ms(8) + p.allreduces_per_pass * scale * p.ar_us(8)
                              / 1000)) / (1000 / (p.compute_pass_ms(1) + p.allreduces_per_pass
                                                  * scale * p.ar_us(1) / 1000))
    assert at(s) > 1.0 > at(s * 10 ** (1 / 40.0))
    assert doc["measured_at_profile"]["auto_w"]["ratio"] == 0.98
    assert doc["x_profile_us"] == pytest.approx(p.ar_us(8))
    assert set(doc["profiles_at_8_tokens_us"]) == set(passcost.builtin_names())


def test_cli_writes_the_picture_and_names_a_bad_file(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "s.json").write_text(json.dumps(_summary({"tree": 0.5})))
    (tmp_path / "p.json").write_text(json.dumps(_prediction()))
    assert rp.main([str(tmp_path / "s.json"), str(tmp_path / "p.json"), "--png",
                    str(tmp_path / "r.png"), "--json", str(tmp_path / "r.json")]) == 0
    assert (tmp_path / "r.png").stat().st_size > 1000
    assert "tree_profile_only: above plain below" in capsys.readouterr().out
    assert rp.main([str(tmp_path / "nope.json"), str(tmp_path / "p.json"), "--png",
                    str(tmp_path / "x.png")]) == 2


def _emulated(profile, ratios):
    s = _summary(ratios)
    s["groups"][0]["group_flags"] = ("--emulate-pass-cost-compute --emulate-pass-cost " + profile
                                     if profile else "")
    return s


def test_other_profiles_are_drawn_at_their_own_cost(tmp_path, capsys):
    ipc = _emulated("pcie-ipc-sm120", {"tree": 1.1, "auto_w": 1.2})
    none = _emulated(None, {"tree": 0.7})  # not emulated: no place on the axis
    same = _emulated("reference-kimi-tp8", {"tree": 0.1})  # the swept profile: its own points
    doc = rp.build(_summary({"tree": 0.5}), _prediction(), [ipc, none, same])
    assert set(doc["measured_other_profiles"]) == {"pcie-ipc-sm120"}
    m = doc["measured_other_profiles"]["pcie-ipc-sm120"]
    assert m["x_us"] == pytest.approx(passcost.load_profile("pcie-ipc-sm120").ar_us(8))
    assert m["servers"]["auto_w"]["ratio"] == 1.2
    assert doc["measured_at_profile"]["tree"]["ratio"] == 0.5
    pytest.importorskip("matplotlib")
    for name, d in (("s", _summary({"tree": 0.5})), ("p", _prediction()), ("i", ipc)):
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
    assert rp.main([str(tmp_path / "s.json"), str(tmp_path / "p.json"), "--png",
                    str(tmp_path / "r.png"), "--also", str(tmp_path / "i.json")]) == 0
    assert "measured auto_w: 1.200 x plain at" in capsys.readouterr().out
    bad = _emulated("no-such-profile", {"tree": 1.0})
    (tmp_path / "b.json").write_text(json.dumps(bad))
    assert rp.main([str(tmp_path / "s.json"), str(tmp_path / "p.json"), "--png",
                    str(tmp_path / "x.png"), "--also", str(tmp_path / "b.json")]) == 2
