"""fastverify.replay: trace validation, greedy acceptance, cost model, and replays
through SGLang's own corpus."""
import argparse
import json

import pytest

from fastverify import replay as rp

# --------------------------------------------------------------------------------- trace validation


def _write(tmp_path, text, name="t.jsonl"):
    p = tmp_path / name
    p.write_text(text)
    return p


GOOD = '{"prompt_ids": [1, 2], "output_ids": [3, 4]}\n'


@pytest.mark.parametrize(
    "text, match",
    [
        (GOOD + "{not json\n", r"t\.jsonl:2: not valid JSON"),
        (GOOD + GOOD + "[1, 2]\n", r"t\.jsonl:3: expected a JSON object per line, got list"),
        (GOOD + '{"prompt_ids": [1]}\n', r"t\.jsonl:2: missing key 'output_ids'"),
        ('{"output_ids": [1]}\n', r"t\.jsonl:1: missing key 'prompt_ids'"),
        (GOOD + '\n{"prompt_ids": [1, "a"], "output_ids": [2]}\n',
         r"t\.jsonl:3: 'prompt_ids'\[1\] must be a non-negative integer"),
        ('{"prompt_ids": [1], "output_ids": [2, -5]}\n',
         r"t\.jsonl:1: 'output_ids'\[1\] must be a non-negative"),
        ('{"prompt_ids": [1], "output_ids": [true]}\n', r"t\.jsonl:1: 'output_ids'\[0\] must be"),
        ('{"prompt_ids": [1], "output_ids": "abc"}\n', r"t\.jsonl:1: 'output_ids' must be a list"),
        ('{"prompt_ids": [], "output_ids": [2]}\n', r"t\.jsonl:1: 'prompt_ids' is empty"),
        (GOOD + '{"meta": {"model": "x"}}\n',
         r"t\.jsonl:2: a \{\"meta\": ...\} header is only allowed as the first line"),
        ("\n\n", r"t\.jsonl: no requests"),
    ],
)
def test_trace_errors_name_the_line(tmp_path, text, match):
    with pytest.raises(rp.TraceError, match=match):
        rp.load_trace(_write(tmp_path, text))


def test_trace_missing_file(tmp_path):
    with pytest.raises(rp.TraceError, match="trace file not found"):
        rp.load_trace(tmp_path / "nope.jsonl")


def test_trace_header_and_extra_keys(tmp_path):
    t = rp.load_trace(_write(tmp_path,
                             '{"meta": {"model": "m"}}\n' + '{"kind": "code", "prompt_ids": [5], '
                                       '"output_ids": [6, 7, 8]}\n\n' + GOOD))
    assert t.meta == {"model": "m"}
    assert [r.line for r in t.requests] == [2, 4]
    assert t.requests[0].prompt_ids == (5,) and t.requests[0].output_ids == (6, 7, 8)
    assert t.decode_tokens == 2 + 1


# -------------------------------------------------------------------------------- greedy acceptance
# Hand-drawn tree (node: token), root 0 holds the last context token:
#        0:9
#       /    \
#     1:5    2:7
#     |      /  \
#    3:6   4:8  5:4
#                |
#               6:2
TREE_TOKENS = [9, 5, 7, 6, 8, 4, 2]
TREE_PARENTS = [-1, 0, 0, 1, 2, 2, 5]


def _mask(parents):
    return rp._mask_from_parents(parents)


def test_tree_parents_from_mask():
    assert rp.tree_parents(_mask(TREE_PARENTS)) == TREE_PARENTS


@pytest.mark.parametrize(
    "target, accepted",
    [
        ([7, 4, 2, 1], [2, 5, 6]),  # deepest branch fully matched; bonus is target[3]
        ([7, 8, 3], [2, 4]),
        ([5, 6, 6], [1, 3]),
        ([5, 7], [1]),  # 7 is a child of the root, not of node 1
        ([3], []),
        ([7, 4], [2, 5]),  # target shorter than the branch: capped by what the recording holds
    ],
)
def test_greedy_accept_tree(target, accepted):
    assert rp.greedy_accept_tree(TREE_TOKENS, TREE_PARENTS, target) == accepted


def test_real_candidate_detection():
    assert not rp.has_real_candidate([9, 0, 0, 0], [-1, 0, 0, 0])
    assert rp.has_real_candidate([9, 3, 0, 0], [-1, 0, 0, 0])


# --------------------------------------------------------------------------------------- cost model


def test_cost_table_math_by_hand():
    cost = rp.parse_cost_table({"decode_ms": 10.0, "verify_ms": {"1": 10.0, "2": 11.0, "8": 14.0}})
    assert cost.measured_pass_ms(1) == 10.0 and cost.measured_pass_ms(8) == 14.0
    # linear between 2 and 8: 12.5
    assert cost.measured_pass_ms(5) == pytest.approx(11.0 + (14.0 - 11.0) * 3 / 6)
    # 4 steps of one stream: accept lengths 1, 3, 2, 1 (7 tokens); every step verifies 8 tokens;
    # with gating the two no-match steps are plain decodes and the two others verify 8.
    res = rp.ReplayResult(rp.ReplayConfig("tree", 8), accept_lens=[1, 3, 2, 1],
                          matched=[False, True, True, False],
                          draft_lens=[0, 5, 2, 0], step_static=[8, 8, 8, 8],
                          step_planned=[1, 8, 8, 1], step_bs=[1, 1, 1, 1])
    p = rp.predict(res, cost)
    assert p["no_spec_tokens_per_s"] == pytest.approx(100.0)  # 1 / 10 ms
    assert p["tokens_per_s"] == pytest.approx(7 / (4 * 14.0) * 1000)  # 125.0
    assert p["gated_tokens_per_s"] == pytest.approx(7 / (10 + 14 + 14 + 10) * 1000)  # 145.83
    assert p["speedup"] == pytest.approx(1.25)


def test_cost_table_errors(tmp_path):
    with pytest.raises(rp.CostTableError, match="missing key 'verify_ms'"):
        rp.parse_cost_table({"decode_ms": 3})
    with pytest.raises(rp.CostTableError, match=r"'decode_ms' must be a positive number"):
        rp.parse_cost_table({"decode_ms": -1, "verify_ms": {"1": 1}})
    with pytest.raises(rp.CostTableError, match=r"'verify_ms' key 'eight' is not an integer count"):
        rp.parse_cost_table({"decode_ms": 1, "verify_ms": {"eight": 1}})
    cost = rp.parse_cost_table({"decode_ms": 1, "verify_ms": {"2": 1, "4": 2}}, "c.json")
    with pytest.raises(rp.CostTableError, match="c.json: no verify time for 9 tokens"):
        cost.measured_pass_ms(9)
    with pytest.raises(rp.CostTableError, match="not valid JSON"):
        rp.load_cost_table(_write(tmp_path, "{", "c.json"))
    res = rp.ReplayResult(rp.ReplayConfig("tree", 2), accept_lens=[1, 1], step_static=[4],
                          step_planned=[2], step_bs=[2])
    with pytest.raises(rp.CostTableError, match="--concurrency 1"):
        rp.predict(res, cost)


def test_config_errors():
    with pytest.raises(ValueError, match="mode must be one of tree, chain"):
        rp.ReplayConfig("fan", 4)
    with pytest.raises(ValueError, match="--match-type must be one of BFS, PROB"):
        rp.ReplayConfig("tree", 4, match_type="LRU")
    with pytest.raises(ValueError, match="tree width"):
        rp.ReplayConfig("tree", 1)
    with pytest.raises(ValueError, match="--chain-lengths must be >= 1"):
        rp.ReplayConfig("chain", 0)


def test_cli_bad_trace_exits_2(tmp_path, capsys):
    bad = _write(tmp_path, GOOD + "oops\n")
    assert rp.main([str(bad)]) == 2
    assert "t.jsonl:2: not valid JSON" in capsys.readouterr().err


# ----------------------------------------------------------------------- replays through the corpus
# Prompt 1 2 3, then a period of five new tokens repeated three times.
HAND = ('{"prompt_ids": [1, 2, 3], "output_ids": [10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11, '
        '12, 13, 14]}\n')


@pytest.fixture(scope="module")
def corpus_factory():
    pytest.importorskip("sglang.srt.speculative.cpp_ngram.ngram_corpus")
    return rp.sglang_corpus_factory


@pytest.fixture(scope="module")
def hand_trace(tmp_path_factory):
    p = tmp_path_factory.mktemp("hand") / "hand.jsonl"
    p.write_text(HAND)
    return rp.load_trace(p)


# Expected accept lengths, worked out by hand from the server's protocol (query = last
# 18 context tokens, insert the same window after each verify, prompts never inserted)
# and the corpus' BFS rule:
#   g=1..5 (contexts end in 10..14): each last token is new to the corpus -> no match,
#     accept 1 (5 steps).
#   d=8, g=6: context ends "14 10"; only the suffix [10] matches; it continues 11 12 13 14
#     (window of step g=5), the draft is 10|11 12 13 14 + 3 pads; all four match (target
#     11 12 13 14), bonus 10 -> 5.
#   d=8, g=11: deepest suffix [10 11 12 13 14 10] has no child; suffix [10] now continues
#     11 12 13 14 10, but only 3 drafts fit before the recording's end (a bonus token must
#     remain) -> 4. Total 5 + 5 + 4 = 14 tokens.
#   d=4, g=6: 3 drafts 11 12 13 all match, bonus 14 -> 4.
#   d=4, g=10: context ends "...13 14"; every matching suffix continues only with 10
#     (windows end there) -> the draft is 14|10 + 2 pads; 10 matches, bonus 11 -> 2.
#   d=4, g=12: deepest suffix [10 11 12 13 14 10 11] continues 12 13 14; 2 may be accepted
#     before the end -> 3.
HAND_EXPECTED = {
    ("tree", 8): [1, 1, 1, 1, 1, 5, 4],
    ("tree", 4): [1, 1, 1, 1, 1, 4, 2, 3],
    ("chain", 4): [1, 1, 1, 1, 1, 5, 4],  # d=5: the tree is already one path: 11 12 13 14 at g=6
    ("chain", 2): [1, 1, 1, 1, 1, 3, 3, 3],  # d=3: 11 12 | 14 10 | 12 13, each fully accepted
}


@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.parametrize("mode, size", list(HAND_EXPECTED))
def test_hand_trace_exact_accept_lengths(corpus_factory, hand_trace, mode, size):
    cfg = rp.ReplayConfig(mode, size)
    res = rp.replay(hand_trace, cfg, corpus_factory)
    assert res.accept_lens == HAND_EXPECTED[(mode, size)]
    # the replay reproduces the recording, token for token
    assert res.tokens == hand_trace.decode_tokens == 14
    d = cfg.corpus_draft_tokens
    assert res.step_static == [d] * res.steps
    # gating: the five no-match steps are plain decodes, the others verify d
    assert res.step_planned == [1] * 5 + [d] * (res.steps - 5)


class RecordingCorpus:
    """The real corpus, with its inserts and state erasures recorded (to check
    the server protocol)."""

    def __init__(self, inner):
        self.inner, self.puts, self.erased, self.gets = inner, [], [], []

    def synchronize(self):
        self.inner.synchronize()

    def batch_get(self, rids, queries, total_lens):
        self.gets.append((list(rids), [list(q) for q in queries], list(total_lens)))
        return self.inner.batch_get(rids, queries, total_lens)

    def batch_put(self, queries):
        self.puts.append([list(q) for q in queries])
        self.inner.batch_put(queries)

    def erase_match_state(self, rids):
        self.erased.append(list(rids))
        self.inner.erase_match_state(rids)


@pytest.mark.sglang
@pytest.mark.slow
def test_server_protocol_two_streams(corpus_factory, tmp_path):
    trace = rp.load_trace(_write(tmp_path, HAND + '{"prompt_ids": [7], "output_ids": [8, 9, 8]}\n'))
    made = []

    def factory(cfg):
        made.append(RecordingCorpus(corpus_factory(cfg)))
        return made[-1]

    cfg = rp.ReplayConfig("tree", 4, max_trie_depth=3, concurrency=2)
    res = rp.replay(trace, cfg, factory)
    rec = made[0]
    # last 3 context tokens; prompt + g
    assert rec.gets[0] == (["r0", "r1"], [[2, 3, 10], [7, 8]], [4, 2])
    assert rec.puts[0] == rec.gets[0][1]  # the server inserts the query windows after verify
    assert all(put == get[1] for put, get in zip(rec.puts, rec.gets))
    assert len(res.step_bs) == len(rec.gets) and res.step_bs[0] == 2
    assert ["r1"] in rec.erased  # the short request leaves first and its match state is erased
    assert res.tokens == trace.decode_tokens


@pytest.mark.sglang
@pytest.mark.slow
def test_default_trace_sane(corpus_factory):
    trace = rp.load_trace(rp.DEFAULT_TRACE)
    assert len(trace.requests) >= 12 and trace.meta.get("model_file", "").endswith(".gguf")
    for cfg in (rp.ReplayConfig("chain", 1), rp.ReplayConfig("tree", 8)):
        res = rp.replay(trace, cfg, corpus_factory)
        s = res.summary()
        assert res.tokens == trace.decode_tokens
        assert 1.0 <= s["mean_accept_length"]
        assert max(res.accept_lens) <= cfg.corpus_draft_tokens
        assert 0.0 < s["match_rate"] < 1.0
        assert s["gated_tokens_per_step"] <= s["verified_tokens_per_step"]
        if cfg.mode == "chain":
            assert max(res.accept_lens) <= 2 and s["mean_accept_length"] <= 2
        else:
            assert s["verified_tokens_per_step"] == 8  # stock tree: every step verifies all 8 nodes
            # real outputs repeat themselves: the tree earns something
            assert s["mean_accept_length"] > 1.05


@pytest.mark.sglang
@pytest.mark.slow
def test_cli_json_and_cost_prediction(corpus_factory, tmp_path, capsys):
    trace = _write(tmp_path, HAND, "hand.jsonl")
    cost = _write(tmp_path,
                  json.dumps({"decode_ms": 10, "verify_ms": {"2": 11, "8": 14}}), "cost.json")
    out = tmp_path / "r.json"
    argv = [str(trace), "--mode", "tree", "--draft-tokens", "8", "--cost-table", str(cost),
            "--json", str(out)]
    assert rp.main(argv) == 0
    saved = json.loads(out.read_text())
    row = saved["results"][0]
    assert saved["repro_command"] == "fastverify replay " + " ".join(argv)
    assert (row["steps"] == 7 and row["tokens"] == 14
            and row["accept_length_hist"] == {"1": 5, "4": 1, "5": 1})
    # 7 verify passes of 8 tokens at 14 ms
    assert row["tokens_per_s"] == pytest.approx(14 / (7 * 14) * 1000)
    assert row["gated_tokens_per_s"] == pytest.approx(14 / (5 * 10 + 2 * 14) * 1000)
    assert "tree d=8" in capsys.readouterr().out


def test_cost_table_from_microbenchmark_json():
    bench = {"summary": {"rows": [
        {"backend": "nccl", "tokens": 1, "pass_us": 2000.0, "error": None},
        {"backend": "nccl", "tokens": 8, "pass_us": 2600.0, "error": None},
        {"backend": "symm-oneshot", "tokens": 1, "pass_us": 1000.0, "error": None},
        {"backend": "symm-oneshot", "tokens": 8, "pass_us": 1200.0, "error": None},
        {"backend": "flashinfer-ar", "tokens": 1, "pass_us": None, "error": "absent"},
    ]}}
    with pytest.raises(rp.CostTableError, match=r"--cost-backend \(nccl, symm-oneshot\)"):
        rp.parse_cost_table(bench, "b.json")
    with pytest.raises(rp.CostTableError,
                       match=r"b.json: backend 'flashinfer-ar' not in the file; "
                             r"allowed: nccl, symm"):
        rp.parse_cost_table(bench, "b.json", "flashinfer-ar")
    cost = rp.parse_cost_table(bench, "b.json", "symm-oneshot")
    assert cost.decode_ms(1) == 1.0 and cost.measured_pass_ms(8) == 1.2
    assert cost.measured_pass_ms(4) == pytest.approx(1.0 + 0.2 * 3 / 7)
    with pytest.raises(rp.CostTableError, match="b.json .nccl.: no verify time for 16 tokens"):
        # the controller would extrapolate; replay refuses
        rp.parse_cost_table(bench, "b.json", "nccl").measured_pass_ms(16)
    no_single = {"summary": {"rows": [{"backend": "nccl", "tokens": 8, "pass_us": 2600.0}]}}
    with pytest.raises(rp.CostTableError, match="no decode time for one request"):
        rp.parse_cost_table(no_single, "b.json")


def test_cost_tables_are_read_by_the_controller_parser(tmp_path):
    """One reader for both tools: every form the server flag takes works
    here, with the same table."""
    from fastverify import costs
    form1 = {"decode_ms": {"1": 12.2, "8": 13.0}, "verify_ms": {"2": 14.8, "8": 30.0}}
    cost = rp.parse_cost_table({"gpu": "H200", "cost_table": form1})
    assert cost == costs.parse_cost_table(form1, "<cost table> ['cost_table']")
    assert cost.decode_ms(1) == 12.2 and dict(cost.verify) == {2: 14.8, 8: 30.0}
    p = _write(tmp_path, json.dumps(form1), "t.json")
    assert rp.load_cost_table(p).verify == costs.load_cost_table(p).verify
    with pytest.raises(rp.CostTableError, match="--cost-table .*missing.json: file not found"):
        rp.load_cost_table(tmp_path / "missing.json")


def test_progress_falls_back_to_plain_lines(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    update, close = rp._progress_bar(10, "tree d=8")
    for _ in range(10):
        update(1)
    close()
    err = capsys.readouterr().err
    assert "[replay] tree d=8: 1/10 tokens" in err and "[replay] tree d=8: 10/10 tokens" in err


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(RuntimeError, match=r"--plot .*out.png: matplotlib is not installed"):
        rp.plot([], str(tmp_path / "out.png"), "t")


def test_from_json_replot_needs_no_corpus(tmp_path, capsys):
    saved = {"repro_command": "fastverify replay x", "trace": {"path": "x.jsonl"},
             "cost_table": None,
             "results": [{"label": "tree d=8", "mode": "tree", "num_draft_tokens": 8, "steps": 7,
                          "mean_accept_length": 2.0, "verified_tokens_per_step": 8.0,
                          "gated_tokens_per_step": 3.0,
                          "match_rate": 0.286, "accept_length_hist": {"1": 5, "4": 1, "5": 1}}]}
    p = _write(tmp_path, json.dumps(saved), "r.json")
    assert rp.main(["--from-json", str(p)]) == 0
    out = capsys.readouterr().out
    assert "tree d=8" in out and "2.000" in out
    assert rp.main(["--from-json", str(_write(tmp_path, "{}", "bad.json"))]) == 2


# ------------------------------------------------------------------------ input checks, profile
def _refuse_corpus(cfg):
    raise AssertionError("the corpus was started before the options were checked")


def test_token_ids_outside_int32_are_refused_by_name(tmp_path):
    ok = rp.load_trace(_write(tmp_path, '{"prompt_ids": [1], "output_ids": [2147483647, 5]}\n'))
    assert ok.requests[0].output_ids[0] == rp.TOKEN_ID_MAX
    with pytest.raises(rp.TraceError, match=r"t\.jsonl:1: 'output_ids'\[0\] = 2147483648 is "
                                            r"outside the int32 token ids .*0\.\.2147483647"):
        rp.load_trace(_write(tmp_path, '{"prompt_ids": [1], "output_ids": [2147483648, 5]}\n'))


def test_short_outputs_are_counted_and_a_trace_of_only_them_is_an_error(tmp_path):
    t = rp.load_trace(_write(tmp_path, GOOD + '{"prompt_ids": [1], "output_ids": []}\n'
                             + '{"prompt_ids": [1], "output_ids": [7]}\n'))
    assert [r.line for r in t.short_requests] == [2, 3] and t.decode_tokens == 1
    with pytest.raises(rp.TraceError, match=r"all 2 requests have an empty or one-token output.*"
                                            r"no decode step to replay"):
        rp.load_trace(_write(tmp_path, '{"prompt_ids": [1], "output_ids": []}\n'
                             '{"prompt_ids": [1], "output_ids": [3]}\n'))


def test_bom_accepted_and_missing_files_named(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert rp.load_trace(p).requests[0].output_ids == (3, 4)
    with pytest.raises(rp.TraceError, match=r"nope\.jsonl: trace file not found"):
        rp.load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(rp.TraceError, match=r"trace file not found \(a folder\)"):
        rp.load_trace(tmp_path)
    (tmp_path / "latin.jsonl").write_bytes(b'{"prompt_ids": [1], "output_ids": [2, 3]} \xe9\n')
    with pytest.raises(rp.TraceError, match=r"latin\.jsonl: not UTF-8 text"):
        rp.load_trace(tmp_path / "latin.jsonl")


@pytest.mark.parametrize("extra, match", [
    (["--concurrency", "4", "--cost-table", "COST"], r"--cost-table predicts the tokens/s of one "
                                                     r"stream; it needs --concurrency 1 \(got 4\)"),
    (["--concurrency", "2", "--profile", "reference-kimi-tp8"], r"--profile .*--concurrency 1"),
    (["--profile", "nope"], r"--profile nope: no such file and no built-in profile"),
    (["--profile", "reference-kimi-tp8", "--cost-table", "COST"], r"give one"),
])
def test_incompatible_options_refused_before_the_replay(tmp_path, capsys, extra, match):
    import re
    trace = _write(tmp_path, GOOD)
    cost = _write(tmp_path, json.dumps({"decode_ms": 10, "verify_ms": {"2": 11, "8": 14}}),
                  "c.json")
    argv = [str(trace)] + [str(cost) if a == "COST" else a for a in extra]
    p = argparse.ArgumentParser()
    rp._fill_parser(p)
    assert rp.run_cli(p.parse_args(argv), corpus_factory=_refuse_corpus) == 2
    assert re.search(match, capsys.readouterr().err)


def test_warm_up_keeps_the_no_gpu_warning_out(caplog):
    import logging

    def factory(cfg):
        for name in ("sglang.jit_kernel.utils.arch", "sglang.kernels.jit.utils.arch"):
            logging.getLogger(name).warning("Cannot detect CUDA architecture.")
            logging.getLogger(name).warning("something else")
        return "corpus"
    said = []
    with caplog.at_level(logging.WARNING):
        assert rp.warm_up(factory, rp.ReplayConfig("tree", 8), said.append) == "corpus"
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["something else", "something else"]  # only that one line is dropped
    assert said == []  # a stand-in corpus has no start-up to announce


@pytest.mark.sglang
def test_cli_profile_and_short_outputs_reported(corpus_factory, tmp_path, capsys):
    trace = _write(tmp_path, HAND + '{"prompt_ids": [4], "output_ids": [9]}\n', "hand.jsonl")
    assert rp.main([str(trace), "--mode", "chain", "--chain-lengths", "2",
                    "--profile", "reference-kimi-tp8"]) == 0
    out = capsys.readouterr()
    assert "# cost table profile reference-kimi-tp8: no speculation 82.0 tok/s" in out.out
    assert "1 with an empty or one-token output not replayed" in out.out
    assert "1 of 2 requests have an empty or one-token output (no decode step) and are not " \
           "replayed: lines 2" in out.err
    assert "Cannot detect CUDA architecture" not in out.err
