"""fastverify advise: the reference box's answer from the command line alone, the JSON and PNG
outputs, the per-shape math, and a clear error for each bad input before any work."""
import argparse
import json
import shlex

import pytest

from fastverify import advise, cli
from fastverify.passcost import PassCostError

# the reference box (CONTEXT): 122 all-reduces, ~205 us each in the 3-4 token verify pass, ~230 us
# at 8 tokens, compute ~5 ms, plain decode 12.2 ms; EAGLE-3 chain of 3 at accept 2.0, ~3 ms drafting
REFERENCE = ["--allreduces", "122", "--allreduce-us", "4:205,8:230", "--plain-ms", "12.2",
             "--compute-ms", "5", "--accept", "tree8=1.3-1.5",
             "--drafter", "eagle3:k=3,accept=2.0,step_ms=1.0"]


def _run(tmp_path, argv, capsys):
    out = tmp_path / "advice.json"
    rc = cli.main(["advise", *argv, "--json", str(out)])
    text = capsys.readouterr()
    assert rc == 0, text.err
    return json.loads(out.read_text()), text.out


def _row(rep, shape):
    return next(r for r in rep["rows"] if r["shape"] == shape)


def test_reference_box_from_the_command_line_alone(tmp_path, capsys):
    rep, out = _run(tmp_path, REFERENCE, capsys)
    assert rep["plain"]["tok_s"] == pytest.approx(82.0, rel=0.005)
    tree = _row(rep, "tree8")
    assert tree["accept_length"] == [1.3, 1.5]
    assert all(abs(t / 41.0 - 1) <= 0.15 for t in tree["tok_s"]), tree  # measured: 41
    eagle = _row(rep, "eagle3 chain3")
    assert eagle["tok_s"][0] == pytest.approx(60.0, rel=0.15)  # measured: 60
    assert eagle["extra_ms_per_step"] == pytest.approx(3.0)
    for r in rep["rows"]:
        if r["kind"] != "auto":
            assert all(v < 1.0 for v in r["vs_plain"]), r  # every shape a loss, by how much
    assert rep["recommendation"]["shape"] == "plain"
    assert "recommended: plain decoding" in out
    assert "eagle3 chain3 starts to pay once one all-reduce of its 4-token verify pass" in out
    # x* = (accept * plain_ms - compute - drafting) / allreduces: what the
    # verify all-reduce must reach
    assert eagle["pays_below_allreduce_us"][0] == pytest.approx((2.0 * 12.2 - 5 - 3) / 122 * 1000,
                                                                rel=1e-3)


def test_a_losing_shape_reports_its_own_rate_not_plains(tmp_path, capsys):
    rep, _ = _run(tmp_path, REFERENCE, capsys)
    tree = _row(rep, "tree8")
    pass_ms = 122 * 0.230 + 5.0
    assert tree["tok_s"] == pytest.approx([1.3 / pass_ms * 1000, 1.5 / pass_ms * 1000], rel=1e-3)
    assert _row(rep, "auto")["tok_s"] == pytest.approx([rep["plain"]["tok_s"]])  # no chain typed


def test_pays_below_is_where_the_shape_meets_plain():
    prof = advise.passcost.load_profile("reference-kimi-tp8")
    for width, accept, extra in ((8, 1.4, 0.0), (4, 2.0, 3.0), (2, 1.3, 0.5)):
        f = advise.typed_form(prof, width, accept, extra)
        x = f.pays_below_us(122, prof.pass_ms(1))
        assert f.tok_s(122, x) == pytest.approx(1000 / prof.pass_ms(1), rel=1e-9)
        assert f.tok_s(122, 0.9 * x) > f.tok_s(122, x) > f.tok_s(122, 1.1 * x)
    never = advise.typed_form(prof, 8, 1.01, 20.0)
    assert never.pays_below_us(122, prof.pass_ms(1)) == 0.0  # not even free all-reduces


def test_replay_form_sums_the_steps():
    prof = advise.passcost.from_numbers(10, {1: 100.0, 4: 400.0}, 2.0)
    # three steps: a plain decode (1 token in a 1-token pass), two verify passes of 4 tokens
    f = advise.replay_form(prof, [1, 3, 2], [1, 4, 4], 0.5)
    assert f.tokens == 6 and f.steps == 3 and f.verify_passes == 2
    assert f.time_ms(10) == pytest.approx(prof.pass_ms(1) + 2 * prof.pass_ms(4) + 1.5)
    assert f.ar_now_us == pytest.approx(400.0)


def test_typed_chain_with_widths_is_the_mean_of_its_steps():
    """chainK+widths=A@M: M of the steps verify K + 1 tokens, the rest are plain decode steps; the
    same as replaying such steps."""
    prof = advise.passcost.load_profile("reference-kimi-tp8")
    (kind, k, vals, match), = advise.parse_accept("chain1+widths=1.3@0.75")
    assert (kind, k, vals, match) == ("chain+widths", 1, (1.3,), 0.75)
    row = advise.typed_rows(prof, [(kind, k, vals, match)], 0.0, "x")[0]
    steps = advise.replay_form(prof, [1, 1, 2, 1.2], [1, 2, 2, 2], 0.0)  # 3 of 4 steps verify
    assert row.forms[0].time_ms(122) == pytest.approx(steps.time_ms(122) / 4)
    assert row.label == "chain1+widths" and "--speculative-ngram-verify-widths 1,2" in row.flags
    with pytest.raises(advise.AdviseError, match=r"chain1\+widths needs =ACCEPT@MATCHED"):
        advise.parse_accept("chain1+widths=1.3")
    with pytest.raises(advise.AdviseError, match=r"unknown shape 'tree8\+widths'"):
        advise.parse_accept("tree8+widths=1.3@0.5")


def test_json_fields_and_repro_command(tmp_path, capsys):
    rep, _ = _run(tmp_path, REFERENCE, capsys)
    assert {"repro_command", "preamble", "costs", "plain", "acceptance", "rows",
            "recommendation"} <= set(rep)
    assert rep["costs"]["profile"]["allreduces_per_pass"] == 122
    assert any("from --plain-ms" in line for line in rep["preamble"])
    row = _row(rep, "eagle3 chain3")
    assert {"shape", "kind", "verify_tokens", "accept_length", "tok_s", "vs_plain", "step_ms",
            "allreduce_us_now", "pays_below_allreduce_us", "flags"} <= set(row)
    assert "--speculative-num-steps 3" in row["flags"]
    cmd = shlex.split(rep["repro_command"])
    assert cmd[:2] == ["fastverify", "advise"]
    again = tmp_path / "again.json"
    argv = cmd[2:]
    argv[argv.index("--json") + 1] = str(again)
    assert cli.main(["advise", *argv]) == 0
    assert json.loads(again.read_text())["rows"] == rep["rows"]


def test_png_written(tmp_path, capsys):
    png = tmp_path / "sub" / "advice.png"
    png.parent.mkdir()
    assert cli.main(["advise", *REFERENCE, "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"# wrote {png}" in capsys.readouterr().out


def test_profile_route_and_a_shape_that_pays(tmp_path, capsys):
    rep, out = _run(tmp_path, ["--profile", "pcie-ipc-sm120", "--accept", "chain3=1.4,tree8=1.3"],
                    capsys)
    chain = _row(rep, "chain3")
    assert chain["vs_plain"][0] > 1.03
    assert rep["recommendation"]["shape"] == "chain3"
    assert "--speculative-ngram-verify-mode chain --speculative-num-draft-tokens 4" in out
    assert "--speculative-ngram-verify-mode auto" in rep["recommendation"]["also"]
    assert _row(rep, "auto")["tok_s"][0] == pytest.approx(chain["tok_s"][0], rel=1e-6)


def test_bench_route_and_compute_from_the_bench_column(tmp_path, capsys):
    bench = str(advise.passcost.PROFILE_DIR.parents[3] / "benchmark" / "results" / "h200x2"
                / "allreduce_kimi.json")
    rep, out = _run(tmp_path, ["--bench", bench + "#nccl", "--accept", "chain1=1.5"], capsys)
    assert "bfloat16 on 2x NVIDIA H200" in out
    rep2, _ = _run(tmp_path, ["--profile", "reference-kimi-tp8", "--compute-ms", bench,
                              "--accept", "chain1=1.5"], capsys)
    assert rep2["plain"]["ms_per_token"] == pytest.approx(122 * 0.059 + 4.859, abs=0.01)


def _args(argv):
    p = argparse.ArgumentParser()
    advise._fill_parser(p)
    return p.parse_args(argv)


def _fail_factory(cfg):
    raise AssertionError("the corpus was started before the flags were checked")


@pytest.mark.parametrize("argv, match", [
    ([], r"no costs: give --profile NAME\|PATH \(built in: .*reference-kimi-tp8"),
    (["--profile", "pcie-ipc-sm120", "--allreduce-us", "1:5"], r"more than one route"),
    (["--profile", "nope"], r"--profile nope: no such file and no built-in profile"),
    (["--profile", "pcie-ipc-sm120", "--plain-ms", "12"], r"--plain-ms goes with typed-in"),
    (["--profile", "pcie-ipc-sm120", "--allreduces", "12"], r"--allreduces goes with"),
    (["--allreduce-us", "1:59"], r"--allreduce-us needs --allreduces N"),
    (["--allreduces", "122", "--allreduce-us", "fast"], r"--allreduce-us 'fast': expected"),
    (["--allreduces", "122", "--allreduce-us", "4:205", "--compute-ms", "x:y"],
     r"--compute-ms 'x:y'"),
    (["--profile", "pcie-ipc-sm120", "--compute-ms", "/no/such.json"],
     r"--compute-ms /no/such.json: file not found"),
    (["--bench", "/no/bench.json"], r"--bench /no/bench.json: file not found"),
    (["--bench", str(advise.passcost.PROFILE_DIR / "pcie-ipc-sm120.json")],
     r"not a `fastverify bench allreduce --json` result .*goes to --profile"),
    (["--profile", "pcie-ipc-sm120", "--accept", "fork8=1.2"], r"unknown shape 'fork8'; allowed"),
    (["--profile", "pcie-ipc-sm120", "--accept", "chain1=2.5"],
     r"chain1 accept length 2.5 is outside 1..2"),
    (["--profile", "pcie-ipc-sm120", "--accept", "tree8=lots"], r"is not a number or a range"),
    (["--profile", "pcie-ipc-sm120", "--accept", "tree8=1.5-1.3"], r"low-high"),
    (["--profile", "pcie-ipc-sm120", "--accept", "tree8"], r"is not SHAPE=ACCEPT"),
    (["--profile", "pcie-ipc-sm120", "--accept", "tree8=1.3,tree8=1.4"], r"tree8 given twice"),
    (["--profile", "pcie-ipc-sm120", "--drafter", "medusa:k=3,accept=2,step_ms=1"],
     r"drafter kind 'medusa' unknown; allowed: eagle, eagle3, standalone"),
    (["--profile", "pcie-ipc-sm120", "--drafter", "eagle3:accept=2,step_ms=1"], r"missing k="),
    (["--profile", "pcie-ipc-sm120", "--drafter", "eagle3:k=3,accept=2"],
     r"as step_ms= \(per draft step\) or draft_ms="),
    (["--profile", "pcie-ipc-sm120", "--drafter", "eagle3:k=3,accept=5,step_ms=1"],
     r"accept length 5 is outside 1..4"),
    (["--profile", "pcie-ipc-sm120", "--drafter", "eagle3:k=3,acc=2,step_ms=1"],
     r"keys are k, accept, step_ms"),
    (["--profile", "pcie-ipc-sm120", "--trace", "t.jsonl", "--accept", "tree8=1.3"],
     r"--trace and --accept both"),
    (["--profile", "pcie-ipc-sm120", "--trace", "/no/trace.jsonl"],
     r"--trace: /no/trace.jsonl: trace file not found"),
    (["--profile", "pcie-ipc-sm120", "--lookup-ms", "-1", "--accept", "tree8=1.3"],
     r"--lookup-ms -1.0: expected"),
    (["--profile", "pcie-ipc-sm120", "--accept", "tree8=1.3", "--json", "/no/dir/a.json"],
     r"does not exist"),
    (["--profile", "pcie-ipc-sm120", "--accept", "tree8=1.3", "--concurrency", "0"],
     r"--concurrency 0: expected an integer >= 1"),
])
def test_bad_inputs_are_clear_errors_before_any_work(argv, match):
    with pytest.raises((advise.AdviseError, PassCostError), match=match):
        advise.build(_args(argv), corpus_factory=_fail_factory, say=lambda m: None)


def test_bad_input_through_the_cli_exits_2(capsys):
    assert cli.main(["advise", "--profile", "pcie-ipc-sm120", "--accept", "tree1=1"]) == 2
    assert "error: --accept: tree1: a tree needs >= 2 tokens" in capsys.readouterr().err


def test_trace_route_replays_through_sglangs_corpus(tmp_path):
    """Acceptance from a trace (SGLang's own corpus): a request that repeats itself accepts drafts,
    and the chain + widths row verifies fewer tokens than the chain that always verifies k + 1."""
    pytest.importorskip("sglang.srt.speculative.cpp_ngram.ngram_corpus")
    from fastverify import replay as rp
    trace = tmp_path / "t.jsonl"
    loop = [5, 6, 7, 8] * 30
    trace.write_text(json.dumps({"prompt_ids": [1, 2, 5, 6, 7, 8], "output_ids": loop}) + "\n"
                     + json.dumps({"prompt_ids": [3], "output_ids": list(range(10, 70))}) + "\n")
    args = _args(["--profile", "pcie-ipc-sm120", "--trace", str(trace), "--chain-lengths", "1,3"])
    adv = advise.build(args, corpus_factory=rp.sglang_corpus_factory, say=lambda m: None)
    rows = {r.label: r for r in adv.rows}
    assert set(rows) == {"tree8", "chain1", "chain1+widths", "chain3", "chain3+widths", "auto"}
    assert rows["chain3"].accept()[0] > 1.5
    n = adv.profile.allreduces_per_pass
    assert rows["chain3+widths"].forms[0].verify_passes < rows["chain3"].forms[0].verify_passes
    assert rows["chain3+widths"].tok_s(n)[0] > rows["chain3"].tok_s(n)[0]
    assert rows["auto"].auto_tok_s >= 0.98 * adv.plain_tok_s
    assert "replayed: t.jsonl" in rows["chain3"].acceptance


def test_concurrency_puts_that_many_requests_in_every_pass(tmp_path, capsys):
    """--concurrency 4: every request in the same shape each step, so a verify pass of 8 tokens
    per request is the profile's pass of 32, plain's step its pass of 4; tok/s per request."""
    from fastverify import passcost
    prof = passcost.load_profile("reference-kimi-tp8")
    rep, out = _run(tmp_path, ["--profile", "reference-kimi-tp8", "--accept", "tree8=1.4",
                               "--concurrency", "4"], capsys)
    assert rep["plain"]["tok_s"] == pytest.approx(1000.0 / prof.pass_ms(4), rel=1e-3)
    assert _row(rep, "tree8")["tok_s"][0] == pytest.approx(1.4 * 1000.0 / prof.pass_ms(32),
                                                           rel=1e-3)
    assert "each of 4 streams decoded together" in out and "4 requests per pass" in out
    assert "--concurrency 4" in rep["repro_command"]
    one, _ = _run(tmp_path, ["--profile", "reference-kimi-tp8", "--accept", "tree8=1.4"], capsys)
    assert one["plain"]["tok_s"] == pytest.approx(1000.0 / prof.pass_ms(1), rel=1e-3)
