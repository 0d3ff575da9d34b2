"""glue/auto.py on stand-in worker objects (no SGLang import): flag checks, the per-step width
choice with per-request gating and the runtime swap through patch 0008's verify_runtime."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

from fastverify.chain import chain_mask
from fastverify.costs import LEAN, CostTable, StepCosts
from fastverify.glue import auto
from fastverify.glue.verify_runtime import VIEW_LISTS, VerifyRuntime, WidthRuntimes
from fastverify.widths import parse_widths

K = 4


def _spec(tmp_path, table, **kw):
    p = tmp_path / "costs.json"
    p.write_text(json.dumps(table))
    base = dict(speculative_ngram_verify_mode="auto", speculative_num_draft_tokens=K,
                speculative_ngram_match_type="BFS",
                speculative_ngram_verify_widths="1,2,4", speculative_ngram_auto_cost_table=str(p),
                speculative_ngram_auto_hysteresis=0.03, enable_metrics=False,
                decode_log_interval=40)
    base.update(kw)
    return SimpleNamespace(**base)


def _worker(widths=(1, 2, 4)):
    w = SimpleNamespace(model_runner=SimpleNamespace(attn_backend="attn4",
                                                     decode_cuda_graph_runner=None),
                        draft_token_num=K, speculative_num_draft_tokens=K, enable_overlap=False,
                        _prev_decode_rids=set())  # (as NGRAMWorker.__init__ sets it)
    runtimes = {x: VerifyRuntime(x, f"attn{x}", None,
                                 {name: f"views{x}" for name, *_ in VIEW_LISTS})
                for x in widths}
    w._fv_widths = WidthRuntimes(parse_widths(",".join(map(str, widths)), K, "auto"), runtimes, K)
    return w


# the plain decode runtime (a GPU build in the server)
PLAIN = VerifyRuntime(1, "attn-plain", None, {})
CHEAP = {"decode_ms": {"1": 10, "64": 10}, "verify_ms": {"1": 10, "256": 10.5}}  # verify ~ free
# 3x at 8 tokens
DEAR = {"decode_ms": {"1": 10, "64": 12}, "verify_ms": {"1": 10, "8": 30, "256": 900}}


def _drafts(rows):
    """Chain-format drafts [bs*K] (root then the chain, zero-padded) and the
    lower-triangular mask."""
    toks = np.zeros((len(rows), K), dtype=np.int64)
    for i, r in enumerate(rows):
        toks[i, 1:1 + len(r)] = r
    return toks.reshape(-1), chain_mask(len(rows), K).reshape(-1)


def _run(worker, spec, streams, steps, draft_of):
    """Greedy decode of fixed `streams` (the target's output); each step the drafter
    proposes draft_of(s, n)."""
    auto.setup(worker, spec, plain=PLAIN)
    reqs = [SimpleNamespace(rid=f"r{i}", output_ids=list(s[:1])) for i, s in enumerate(streams)]
    widths = []
    for _ in range(steps):
        batch = SimpleNamespace(reqs=reqs, has_grammar=False)
        rows = [draft_of(streams[i], len(r.output_ids)) for i, r in enumerate(reqs)]
        toks, mask = _drafts(rows)
        out_t, out_m = auto.step_drafts(worker, batch, toks, mask, len(reqs))
        width = worker.draft_token_num
        widths.append(width)
        assert worker.model_runner.attn_backend == f"attn{width}"
        assert len(out_t) == len(reqs) * width and len(out_m) == len(reqs) * width * width
        # verify: accept the longest prefix of the truncated chain that matches the
        # stream, plus a bonus token
        for i, r in enumerate(reqs):
            chain = out_t.reshape(len(reqs), width)[i, 1:]
            n = len(r.output_ids)
            acc = 0
            while (acc < len(chain) and n + acc < len(streams[i])
                   and chain[acc] == streams[i][n + acc]):
                acc += 1
            r.output_ids = list(streams[i][:n + acc + 1])
        from fastverify.glue.verify_runtime import finish_step
        import torch
        finish_step(worker, torch.zeros(len(reqs) * width, dtype=torch.int64), len(reqs))
        assert worker.draft_token_num == K
    return widths


def test_perfect_drafts_pick_the_widest_chain_when_verify_is_cheap(tmp_path):
    streams = [list(range(100, 400)), list(range(500, 800))]
    widths = _run(_worker(), _spec(tmp_path, CHEAP), streams, 40,
                  lambda s, n: s[n:n + K - 1])  # the drafter predicts the next K-1 tokens exactly
    assert widths[0] == 1  # cold start: nothing seen yet
    assert widths[-10:] == [K] * 10


def test_a_speculating_step_puts_a_stretchs_held_back_output_after_its_lookup(tmp_path):
    """A stretch left for a real lookup holds its last output back (`plain_path.leave`); the
    worker's step that looks up for real puts it once its drafts are there (step_drafts), not
    before its lookup, and only once."""
    worker = _worker()
    puts = []
    worker.ngram_corpus = SimpleNamespace(batch_put=puts.append)
    streams = [list(range(100, 400))]
    _run(worker, _spec(tmp_path, CHEAP), streams, 2, lambda s, n: s[n:n + K - 1])
    state = worker._fv_auto
    state.pending_put = [[7, 8, 9]]
    reqs = [SimpleNamespace(rid="r0", output_ids=streams[0][:50])]
    toks, mask = _drafts([streams[0][50:53]])
    auto.step_drafts(worker, SimpleNamespace(reqs=reqs, has_grammar=False), toks, mask, 1)
    assert puts == [[[7, 8, 9]]] and state.pending_put is None
    auto.step_drafts(worker, SimpleNamespace(reqs=reqs, has_grammar=False), toks, mask, 1)
    assert puts == [[[7, 8, 9]]]


def test_useless_drafts_keep_width_one(tmp_path):
    streams = [list(range(100, 400))]
    widths = _run(_worker(), _spec(tmp_path, DEAR), streams, 60, lambda s, n: [7, 7, 7])
    assert widths == [1] * 60


def _two_streams(tmp_path, draft_of=lambda s, n: s[n:n + K - 1]):
    """A worker whose gain model learnt two greedy streams (30 steps, verifying cheap, drafts by
    ``draft_of``), the streams, and their two requests 200 tokens in."""
    streams = [list(range(100, 400)), list(range(500, 800))]
    worker = _worker()
    _run(worker, _spec(tmp_path, CHEAP), streams, 30, draft_of)
    reqs = [SimpleNamespace(rid="r0", output_ids=streams[0][:200]),
            SimpleNamespace(rid="r1", output_ids=streams[1][:200])]
    return worker, streams, reqs


def test_unmatched_request_is_gated_to_no_draft(tmp_path):
    worker, streams, reqs = _two_streams(
        tmp_path, lambda s, n: s[n:n + K - 1] if s[0] == 100 else [])
    toks, mask = _drafts([streams[0][200:203], []])
    out_t, _ = auto.step_drafts(worker, SimpleNamespace(reqs=reqs, has_grammar=False),
                                toks, mask, 2)
    w = worker.draft_token_num
    assert w > 1
    rows = out_t.reshape(2, w)
    assert list(rows[0, 1:]) == streams[0][200:200 + w - 1] and not rows[1, 1:].any()


def test_widest_chain_for_everyone_verifies_the_drafts_as_looked_up(tmp_path):
    """At width k with every request taking part nothing is cut (the step skips the truncation):
    the drafts come back as the lookup gave them, which is what truncating them with each
    request's own length gives."""
    from fastverify.widths import truncate_drafts

    worker, streams, reqs = _two_streams(tmp_path)
    # the second chain one token short
    toks, mask = _drafts([streams[0][200:203], streams[1][200:202]])
    out_t, out_m = auto.step_drafts(worker, SimpleNamespace(reqs=reqs, has_grammar=False),
                                    toks, mask, 2)
    assert worker.draft_token_num == K and worker._fv_auto.controller.last.speculate == (True, True)
    ref_t, ref_m = truncate_drafts(toks, mask, K, K, [3, 2])
    assert np.array_equal(out_t, ref_t) and np.array_equal(out_m, ref_m)
    assert np.array_equal(out_t, toks) and np.array_equal(out_m, mask)


def test_flag_checks(tmp_path):
    spec = _spec(tmp_path, CHEAP)
    assert auto.validate_server_args(spec).chain_widths == (2, 4)
    with pytest.raises(ValueError, match="--speculative-ngram-verify-widths with 1"):
        auto.validate_server_args(_spec(tmp_path, CHEAP, speculative_ngram_verify_widths="2,4"))
    with pytest.raises(ValueError, match="--speculative-ngram-verify-widths with 1"):
        auto.validate_server_args(_spec(tmp_path, CHEAP, speculative_ngram_verify_widths=None))
    with pytest.raises(ValueError, match="--speculative-ngram-auto-hysteresis"):
        auto.validate_server_args(_spec(tmp_path, CHEAP, speculative_ngram_auto_hysteresis=0.9))
    with pytest.raises(ValueError,
                       match="--speculative-ngram-auto-cost-table needs "
                             "--speculative-ngram-verify-mode auto"):
        auto.validate_server_args(_spec(tmp_path, CHEAP, speculative_ngram_verify_mode="chain"))
    with pytest.raises(ValueError,
                       match="--speculative-ngram-auto-cost-table .*missing key 'verify_ms'"):
        auto.validate_server_args(_spec(tmp_path, {"decode_ms": 1}))
    assert auto.validate_server_args(_spec(tmp_path, CHEAP, speculative_ngram_verify_mode="tree",
                                           speculative_ngram_verify_widths=None,
                                           speculative_ngram_auto_cost_table=None)) is None


def test_not_auto_is_a_no_op(tmp_path):
    worker = _worker()
    assert auto.setup(worker, _spec(tmp_path, CHEAP, speculative_ngram_verify_mode="chain")) is None
    toks, mask = _drafts([[1, 2, 3]])
    out = auto.step_drafts(worker, SimpleNamespace(reqs=[], has_grammar=False), toks, mask, 1)
    assert out[0] is toks and out[1] is mask


def test_calibrate_worker_needs_graphs(tmp_path):
    from fastverify.costs import CostTableError
    with pytest.raises(CostTableError, match="CUDA graphs are off"):
        auto.calibrate_worker(_worker())


# ------------------------------------------------------------- patched SGLang (series through 0007)
@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from probe_support import patched_sglang, run_probe, tiny_model

    folder, _version = patched_sglang(tmp_path_factory)
    return run_probe("auto_probe.py", tiny_model(tmp_path_factory), folder)


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_server_args(probe):
    assert probe["ok"] == {"speculative_ngram_verify_mode": "auto", "speculative_eagle_topk": 1,
                           "speculative_num_steps": 7, "speculative_ngram_auto_hysteresis": 0.03}
    assert "--speculative-ngram-verify-widths with 1" in probe["no_widths"]["error"]
    assert ("--speculative-ngram-auto-hysteresis must be in [0, 0.5)"
            in probe["bad_hysteresis"]["error"])
    assert "needs --speculative-ngram-verify-mode auto" in probe["table_without_auto"]["error"]


@pytest.fixture(scope="module")
def step_probe(tmp_path_factory):
    from probe_support import patched_sglang, run_probe, tiny_model

    folder, _version = patched_sglang(tmp_path_factory)
    costs = tmp_path_factory.mktemp("costs")
    (costs / "dear.json").write_text(json.dumps({"decode_ms": {"1": 1, "4": 1},
                                                 "verify_ms": {"1": 1, "64": 200}}))
    (costs / "cheap.json").write_text(json.dumps({"decode_ms": {"1": 1, "4": 1},
                                                  "verify_ms": {"1": 1, "64": 1.01}}))
    return run_probe("auto_step_probe.py", tiny_model(tmp_path_factory), folder,
                     extra_env={"FV_PROBE_COSTS": str(costs)})


def _plain_greedy(first, n):
    out = [first]
    while len(out) < n:
        out.append((out[-1] // 10 + 1) * 10)
    return out


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_steps_without_speculation_run_as_plain_decode_and_stay_lossless(step_probe):
    # verify ~200x a decode: no speculation; lookups only as backed-off probes
    run = step_probe["dear"]
    steps = run["steps"]
    # every request's last step gave it one token (here: all are new), so drafts are looked up on
    # the host's tokens without waiting for a step in flight: at once for the new requests; then the
    # probe due 2 steps later waits until the 3 steps right after the prefill have passed (step 4 of
    # 12), the next comes 4 steps after it (step 8); none pays, so every step is a plain one
    assert [s["kind"] for s in steps] == ["lean"] * 12
    assert [i for i, s in enumerate(steps) if s["gets"]] == [0, 3, 7]
    # the first lookup is decided on (it could have been verified at once); the later ones
    # could not pay even if they matched in full, so they are probes made after the step's
    # launch, before its corpus put
    assert (run["metrics"]["auto_behind_lookups_total"] == 1
            and run["metrics"]["auto_probe_lookups_total"] == 2)
    # their periods measure what a probe costs
    assert [i for i, s in enumerate(steps) if s["probe"]] == [3, 7]
    assert steps[0]["events"] == ["get", "forward", "put"]
    assert steps[3]["events"] == steps[7]["events"] == ["forward", "get", "put"]
    assert steps[1]["events"] == steps[2]["events"] == ["forward", "put"]
    for i in (0, 3, 7):
        (ids, contexts, totals), = steps[i]["gets"]
        assert ids == ["a", "b"]
        out_a = [10] + _plain_greedy(20, i)[:i]  # request a's output before step i: 10, 20, ...
        assert contexts[0] == ([7, 1, 2] + out_a)[-12:] and totals[0] == 3 + len(out_a)
    lean = [s for s in steps if s["kind"] == "lean"]
    # 1 of them decided on drafts
    assert len(lean) == 12 and run["metrics"]["auto_lean_steps_total"] == 11
    for s in lean:
        f, seq = s["forward"], s["seq_lens_before"]
        # SGLang's plain decode pass: DECODE mode, no spec_info, the DECODE graphs (built
        # while the runner read as not speculative) and their own attention backend, the
        # plain sampler (not verify)
        assert not f["verify"] and f["mode"] == "DECODE" and not f["spec_info"]
        assert f["mr_algorithm"] == f["batch_algorithm"] == f["runner_algorithm"] == "NONE"
        assert f["width"] == 1 and f["attn_backend"] == "backend/NONE"
        # seq_lens count the new token; its KV slot is the first one reserved for this step's drafts
        assert (f["seq_lens"] == f["seq_lens_cpu"] == [n + 1 for n in seq]
                and f["seq_lens_sum"] == sum(seq) + 2)
        assert f["out_cache_loc"] == [1000 * i + n for i, n in enumerate(seq)]
        # the result reads as a verify step that accepted no draft, one token per request
        assert s["accept_lens"] == [1, 1] and s["step_width"] == 1 and s["after_k"] == 8
        assert s["published"] == [[n + 1 for n in seq]]
        # nothing carried: the corpus update reads the host tokens only
        assert s["prev_token_ids"] == []
        # and the batch and the model runner are as they were
        assert s["restored"] == {"mr_algorithm": "NGRAM", "batch_algorithm": "NGRAM",
                                 "attn_backend": "backend@8",
                                 "runner_width": 8, "seq_lens": seq, "spec_info": True,
                                 "input_ids": None, "out_cache_loc": None}
    # the DECODE forward left its early read-done event, and the plain step took it away: the
    # scheduler then waits for the whole step before its stream gathers the step's accept tokens
    # (a request leaving or joining the batch)
    assert all(s["forward"].get("read_done_set") and s["read_done_left"] == [None, None]
               for s in lean)
    # the plain step's input is each request's last accepted token, gathered on the device
    assert steps[1]["input"] == [20, 20] and steps[2]["input"] == [30, 30]
    # the corpus still learns the output during plain steps (SGLang's own update, host tokens)
    assert lean[-1]["puts"] and lean[-1]["puts"][0][0][-1] == run["outputs"]["a"][-2]
    assert run["outputs"]["a"] == _plain_greedy(10, len(steps) + 1)
    assert run["outputs"]["b"] == [13] + _plain_greedy(20, len(steps))
    assert run["costs"]["measured"]["lean/bs2/w1"] == pytest.approx(2.0)


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_plain_decode_graphs_are_captured_after_the_extra_widths(step_probe):
    """Auto's plain decode runtime (DECODE graphs, captured while the runner reads as not
    speculative) is built once, after the verify widths 1, 2, 4."""
    assert step_probe["built"] == [[1, "NGRAM"], [2, "NGRAM"], [4, "NGRAM"], [1, "NONE"]]


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_plain_steps_without_a_host_copy_of_the_lengths(step_probe):
    """With patch 0009 the scheduler hands chain and auto steps no host lengths (seq_lens_cpu
    and seq_lens_sum None): the plain step leaves them None (SGLang's device-only path) and
    decodes the same tokens."""
    run, ref = step_probe["dear_no_host_lens"], step_probe["dear"]
    lean = [s for s in run["steps"] if s["kind"] == "lean"]
    assert len(lean) == 12
    for s in lean:
        f = s["forward"]
        assert f["mode"] == "DECODE" and f["seq_lens_cpu"] is None and f["seq_lens_sum"] is None
        assert f["seq_lens"] == [n + 1 for n in s["seq_lens_before"]]
    assert run["outputs"] == ref["outputs"]


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_auto_learns_during_plain_steps_and_speculates(step_probe):
    run = step_probe["cheap"]  # the corpus holds the stream up to 390; verify costs about a decode
    steps = run["steps"]
    kinds = [(s["kind"], s["width"]) for s in steps]
    # looked up once (on the host's tokens: the step stays plain), lean until that draft resolved (7
    # of 7 right), then full chains while the corpus knows the continuation, and back to lean steps
    # once it does not (past 390 the lookup finds no match)
    assert kinds[0] == kinds[1] == ("lean", 1) and steps[0]["gets"]
    full = [s for s in steps if s["width"] == 8]
    assert len(full) >= 3 and all(s["accept_lens"] == [8, 8] for s in full), kinds
    assert steps[-1]["kind"] == "lean" and max(s["input"][0] for s in full) < 400
    n_out = len(run["outputs"]["a"])
    assert run["outputs"]["a"] == _plain_greedy(10, n_out)
    assert run["outputs"]["b"] == [13] + _plain_greedy(20, len(run["outputs"]["b"]) - 1)
    assert n_out > len(steps) + 1  # speculation emitted more than one token per step


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_overlap_lookups_behind_the_token_in_flight_stay_lossless(step_probe):
    """Overlap mode, as served: the host lacks the tokens of the step in flight. After a step that
    gave every request one token, drafts are looked up on the host's tokens (no wait), shifted past
    the token in flight, and verified from it (its root written on the device)."""
    dear, cheap = step_probe["dear_overlap"], step_probe["cheap_overlap"]
    assert [s["kind"] for s in dear["steps"]] == ["lean"] * 12
    (ids, contexts, totals), = dear["steps"][3]["gets"]
    # before step 4 the host has three tokens of request a (10, 20, 30); 40 is in flight
    assert contexts[0] == [7, 1, 2, 10, 20, 30] and totals[0] == 6
    assert dear["outputs"] == step_probe["dear"]["outputs"]
    steps = cheap["steps"]
    first = next(i for i, s in enumerate(steps) if s["kind"] == "spec")
    assert steps[first - 1]["kind"] == "lean" and steps[first]["width"] == 8
    (ids, contexts, totals), (_, again, totals2) = steps[first]["gets"]
    host_a = contexts[0][3:]  # request a's tokens on the host; the next one is in flight
    root = host_a[-1] + 10
    # asked again on the host's tokens and the corpus' guess of the token in flight
    assert again[0] == (contexts[0] + [root])[-12:] and totals2[0] == totals[0] + 1
    # each row: the token in flight (written on the device), then the corpus'
    # chain past it, full length
    assert steps[first]["input"][:8] == [root + 10 * j for j in range(8)]
    # every draft accepted: they continue the token in flight
    assert steps[first]["accept_lens"] == [8, 8]
    assert cheap["metrics"]["auto_behind_lookups_total"] >= 2
    n_out = len(cheap["outputs"]["a"])
    assert n_out > len(steps) + 1
    assert cheap["outputs"]["a"] == _plain_greedy(10, n_out)
    assert cheap["outputs"]["b"] == [13] + _plain_greedy(20, len(cheap["outputs"]["b"]) - 1)


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_new_requests_after_speculation_paid_verify_the_right_chain(step_probe):
    """Two requests join (their prefill's token in flight) once speculation pays. The corpus offers
    two continuations of request c's prompt, so its guess of c's token in flight is unsure and the
    step looks up for real (after the token); the guesses must not leave the corpus' match state
    behind either (a later lookup extends it by the tokens its length says were added). Every draft
    of the step is accepted, and the output is the target's."""
    run = step_probe["cheap_overlap_join"]
    steps = run["steps"]
    first = steps[12]
    assert first["kind"] == "spec" and first["width"] == 8
    # three corpus queries: behind (the prompts), on the guesses, then the worker's own
    # after the token in flight
    assert [g[1] for g in first["gets"]] == [[[7, 50], [5, 50]], [[7, 50, 61], [5, 50, 60]],
                                             [[7, 50, 60], [5, 50, 60]]]
    assert first["input"] == [60 + 10 * j for j in range(8)] * 2 and first["accept_lens"] == [8, 8]
    assert all(s["accept_lens"] == [8, 8] for s in steps[13:16])
    assert run["outputs"]["c"] == run["outputs"]["d"] == _plain_greedy(60, len(run["outputs"]["c"]))


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_first_lookup_that_could_only_probe_waits_out_the_steps_after_the_prefill(
        step_probe):
    """Two requests join a load on which not even full matches would be verified (verify ~200x a
    decode) after the gain model has seen drafts: the decode step launched right after their
    prefill (before the scheduler processes the prefill's result, so before their first token is
    sent) makes no lookup, nor do the two after it (the host's work of the steps right after a
    prefill is not hidden behind the GPU's); the fourth looks them up behind its token in flight.
    Output stays the target's."""
    run = step_probe["dear_overlap_join"]
    steps = run["steps"]
    assert [s["kind"] for s in steps] == ["lean"] * 14
    # a cold start looks up at once
    assert [i for i, s in enumerate(steps[:8]) if s["gets"]] == [0, 3, 7]
    # then probes 2, 4, ... steps apart
    assert [i for i, s in enumerate(steps) if s["gets"]][3:] == [11, 13]
    (ids, contexts, totals) = steps[11]["gets"][0]
    # the host has each prompt, its prefill's token (60) and those of steps 8 and
    # 9; step 10's is in flight
    assert (ids == ["c", "d"] and contexts == [[7, 50, 60, 70, 80], [5, 50, 60, 70, 80]]
            and totals == [5, 5])
    assert run["outputs"]["c"] == run["outputs"]["d"] == _plain_greedy(60, len(run["outputs"]["c"]))


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_requests_from_two_prefills_in_a_row_are_looked_up_from_what_the_host_has(
        step_probe):
    """c joined one prefill before d: when the decode step is launched the host has c's first
    token and lacks d's. c's draft is its own lookup (no guess), d's is guessed past its token in
    flight; both verify in full."""
    run = step_probe["cheap_overlap_join_apart"]
    first = run["steps"][12]
    assert first["kind"] == "spec" and first["width"] == 8
    # c is asked on its prompt and first token; d's prompt alone, then with the
    # corpus' guess (60, right)
    assert [g[1] for g in first["gets"]] == [[[7, 50, 60], [5, 50]], [[7, 50, 60], [5, 50, 60]]]
    assert first["input"] == [60 + 10 * j for j in range(8)] * 2 and first["accept_lens"] == [8, 8]
    assert run["outputs"]["c"] == run["outputs"]["d"] == _plain_greedy(60, len(run["outputs"]["c"]))


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_every_corpus_query_meets_the_puts_of_every_step_before_it(step_probe):
    """Counted over every run of the probe (plain steps, speculation, overlap, requests joining):
    when the corpus is asked (the worker's own lookup, one behind the token in flight, a probe), it
    has received one context per request of every earlier decode step, whatever kind of step
    put it (a probe asks before its own step's put)."""
    runs = [r for r in step_probe.values() if isinstance(r, dict) and "steps" in r]
    assert len(runs) >= 7
    for run in runs:
        put, expected, asked = 0, 0, 0
        for step in run["steps"]:
            puts = iter(step["puts"])
            for event in step["events"]:
                if event == "put":
                    put += len(next(puts))
                elif event == "get":
                    asked += 1
                    assert put == expected, (put, expected)
            expected += len(step["seq_lens_before"])
            assert put <= expected
        assert asked


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_plain_step_puts_what_sglangs_own_update_puts(step_probe):
    """A plain step's corpus put is SGLang's own (nothing carried), built from
    the prompt's tail only."""
    sglang_put, ours = step_probe["same_put"]
    assert ours == sglang_put
    assert ours[0] == (list(range(100, 130)) + [1, 2, 3])[-12:]
    assert ours[1] == list(range(48, 60)) and ours[2] == [8, 9, 10]


def test_chains_past_the_token_in_flight_ask_the_corpus_again_on_its_guess():
    """The host's context ends one token before the token in flight: the corpus' first chain
    guesses that token, and the chain for the next position is the corpus' answer on the context
    extended by the guess."""
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]

    class Corpus:
        calls = []

        erased = []

        def synchronize(self):
            pass

        def erase_match_state(self, ids):
            Corpus.erased.append(list(ids))

        def batch_get(self, ids, contexts, totals):
            Corpus.calls.append((list(contexts), list(totals)))
            k = 4
            tokens, mask = [], []
            for ctx in contexts:
                last = ctx[-1]
                # a chain: root, then the text after the root's first occurrence (no match: nothing)
                after = text[text.index(last) + 1:text.index(last) + k] if last in text else []
                row = [last] + after + [0] * (k - 1 - len(after))
                tokens += row
                m = np.tril(np.ones((k, k), dtype=np.int32))
                for j in range(1 + len(after), k):
                    m[j, :] = 0
                    m[j, j] = 1
                mask += m.reshape(-1).tolist()
            return np.array(tokens), np.array(mask)

    w = SimpleNamespace(max_trie_depth=12, ngram_corpus=Corpus(), _fv=SimpleNamespace(
        config=SimpleNamespace(match_type="BFS")),
                        _efficient_concat_last_n=lambda a, b, n: (a + b)[-n:])
    reqs = [SimpleNamespace(rid="a", origin_input_ids=[1, 2], origin_input_ids_unpadded=[1, 2],
                            output_ids=[3, 4]),
            SimpleNamespace(rid="b", origin_input_ids=[99], origin_input_ids_unpadded=[99],
                            output_ids=[])]
    tokens, _mask, unsure = auto.chains_past_the_token_in_flight(
        w, SimpleNamespace(reqs=reqs), 4, [1, 1])
    assert unsure.tolist() == [False, False]  # one next token each (or none)
    # a: host 1 2 3 4, the corpus guesses 5 in flight; asked on ... 4 5: root 5, chain 6 7 8
    # b: no match, so no guess and no draft (its root a placeholder)
    assert tokens.tolist() == [5, 6, 7, 8, 99, 0, 0, 0]
    assert Corpus.calls[1] == ([[1, 2, 3, 4, 5], [99]], [5, 1])
    assert Corpus.erased == [["a"]]  # the guessed request's match state is not left to be extended
    # request a with its last token on the host (it joined in an earlier prefill):
    # its own chain, one query
    Corpus.calls.clear()
    tokens, _mask, _unsure = auto.chains_past_the_token_in_flight(
        w, SimpleNamespace(reqs=reqs), 4, [0, 1])
    assert tokens.tolist() == [4, 5, 6, 7, 99, 0, 0, 0] and len(Corpus.calls) == 1


def _tree_corpus(children):
    """A stand-in corpus whose tree for any context is the root with the given children
    (k = 4), each a leaf."""
    class Corpus:
        calls = 0

        def synchronize(self):
            pass

        def erase_match_state(self, ids):
            pass

        def batch_get(self, ids, contexts, totals):
            Corpus.calls += 1
            k = 4
            tokens, mask = [], []
            for ctx in contexts:
                row = [ctx[-1]] + list(children) + [0] * (k - 1 - len(children))
                m = np.eye(k, dtype=np.int32)
                m[:, 0] = 1
                tokens += row
                mask += m.reshape(-1).tolist()
            return np.array(tokens), np.array(mask)
    return Corpus()


def test_root_choices_counts_the_next_tokens_a_tree_offers():
    from fastverify.chain import root_choices

    k = 4
    one = np.tril(np.ones((k, k), dtype=np.int32))  # a chain: one next token
    two = np.eye(k, dtype=np.int32)
    two[:, 0] = 1  # root with three children
    tokens = np.array([[9, 5, 6, 7], [9, 5, 6, 0], [9, 0, 0, 0]])
    masks = np.stack([one, two, two])  # the corpus pads with token-0 leaves under the root
    assert root_choices(tokens.reshape(-1), masks.reshape(-1), k).tolist() == [1, 2, 0]


def test_a_token_in_flight_the_corpus_is_unsure_of_is_looked_up_for_real_where_drafts_pay(tmp_path):
    """Two continuations after the host's context: the guess of the token in flight may be wrong.
    Where drafts that match in full pay (a repetitive load), the step looks up for real
    (lookup_behind gives None and records nothing); where they do not, the guess stands."""
    state = auto.setup(_worker(), _spec(tmp_path, {"decode_ms": {"1": 10},
                                                   "verify_ms": {"1": 10, "64": 10.1}}),
                       plain=PLAIN)
    ctl = state.controller
    reqs = [SimpleNamespace(rid="a", origin_input_ids=[1, 2], origin_input_ids_unpadded=[1, 2],
                            output_ids=[3])]
    batch = SimpleNamespace(reqs=reqs)

    def worker(children):
        return SimpleNamespace(max_trie_depth=12, ngram_corpus=_tree_corpus(children),
                               enable_overlap=True,
                               _fv=SimpleNamespace(config=SimpleNamespace(match_type="BFS")),
                               _efficient_concat_last_n=lambda a, b, n: (a + b)[-n:])
    state.in_flight_rids = frozenset({"a"})  # a's last token is in flight
    # nothing accepted yet: the guess stands
    assert auto.lookup_behind(worker([5, 6]), state, batch) is not None
    for _ in range(8):
        ctl.observe("x", auto.DraftFeatures(7, 1), 7)  # full matches are accepted in full
    state.features.clear()
    assert auto.lookup_behind(worker([5, 6]), state, batch) is None and "a" not in state.features
    found = auto.lookup_behind(worker([5]), state, batch)  # one next token: looked up behind
    assert found is not None and found[2] and "a" in state.features
    # a's last token on the host: nothing to guess, its own lookup
    state.in_flight_rids = frozenset()
    found = auto.lookup_behind(worker([5, 6]), state, batch)
    assert found is not None and not found[2]


def test_requests_that_sample_are_told_apart_from_greedy_ones(tmp_path):
    """A request samples when its top_k is over 1 (SGLang turns temperature 0 into top_k 1);
    `_sync_requests` tells the controller when it joins, and its drafts' features say so. After a
    greedy load whose full matches were accepted, a greedy request whose token in flight the corpus
    is unsure of is looked up for real; a sampled one's guess stands (its drafts are judged by
    sampled requests' only), and its draft is marked."""
    state = auto.setup(_worker(), _spec(tmp_path, {"decode_ms": {"1": 10},
                                                   "verify_ms": {"1": 10, "64": 10.1}}),
                       plain=PLAIN)
    ctl = state.controller

    def req(rid, top_k):
        return SimpleNamespace(rid=rid, origin_input_ids=[1, 2], origin_input_ids_unpadded=[1, 2],
                               output_ids=[3], sampling_params=SimpleNamespace(top_k=top_k))
    assert [auto.samples(r)
            for r in (req("a", 1), req("b", 1 << 30), req("c", 40), SimpleNamespace(rid="d"))] \
        == [False, True, True, False]
    worker = SimpleNamespace(max_trie_depth=12, ngram_corpus=_tree_corpus([5, 6]),
                             enable_overlap=True,
                             _fv=SimpleNamespace(config=SimpleNamespace(match_type="BFS")),
                             _efficient_concat_last_n=lambda a, b, n: (a + b)[-n:])
    for _ in range(8):
        ctl.observe("x", auto.DraftFeatures(7, 1), 7)  # greedy full matches accepted in full
    for rid, top_k, for_real in (("g", 1, True), ("s", 1 << 30, False)):
        batch = SimpleNamespace(reqs=[req(rid, top_k)])
        auto._sync_requests(state, batch)
        assert ctl.samples(rid) == (top_k > 1)
        state.in_flight_rids = frozenset({rid})
        found = auto.lookup_behind(worker, state, batch)
        assert (found is None) == for_real
    assert state.features["s"].sampled and found[4][0].features.sampled
    assert not ctl.samples("g")  # g left the batch: forgotten


def test_metrics_are_exported_as_gauges(tmp_path):
    prom = pytest.importorskip("prometheus_client")
    worker = _worker()
    spec = _spec(tmp_path, CHEAP, enable_metrics=True, decode_log_interval=5)
    streams = [list(range(100, 400))]
    _run(worker, spec, streams, 20, lambda s, n: s[n:n + K - 1])
    value = prom.REGISTRY.get_sample_value("sglang:fastverify_ngram_auto_steps_total")
    assert value == 20.0  # exported every 5 steps; the last export was at step 20
    assert prom.REGISTRY.get_sample_value("sglang:fastverify_ngram_auto_chain_k") == K - 1


def test_controller_costs_are_a_frozen_copy_shared_at_fixed_steps(tmp_path):
    """Each rank measures its own step periods; the controller must only ever see the copy shared at
    a fixed step count, or ranks would decide differently between two synchronisations."""
    worker = _worker()
    state = auto.setup(worker, _spec(tmp_path, DEAR), plain=PLAIN)
    shared = []
    # one rank: its own measurements are "rank 0's"
    state.sync_costs = lambda c: (shared.append(c), c)[1]
    now = [0.0]
    state.clock = lambda: now[0]
    before = state.controller.costs
    for i in range(state.controller.cfg.cost_sync_steps):
        state.last_step = ("lean", 1, 1)
        auto._tick(state)
        now[0] += 0.004
    assert (len(shared) == 1 and state.controller.costs is not state.costs
            and state.controller.costs is not before)
    frozen = state.controller.costs.decode_ms(1)
    assert frozen == pytest.approx(4.0)
    for _ in range(40):  # later measurements change this rank's model, not the controller's copy
        state.last_step = ("lean", 1, 1)
        auto._tick(state)
        now[0] += 0.010
    assert state.costs.decode_ms(1) > frozen and state.controller.costs.decode_ms(1) == frozen


def test_plain_decode_puts_the_batch_and_runner_back_when_the_forward_fails():
    import enum

    import torch

    class Algo(enum.Enum):
        NONE = 0
        NGRAM = 1

    class Boom(RuntimeError):
        pass

    class Target:
        def forward_batch_generation(self, batch, **kw):
            assert batch.spec_info is None and batch.spec_algorithm is Algo.NONE
            assert (worker.model_runner.spec_algorithm is Algo.NONE
                    and worker.model_runner.attn_backend == "plain")
            raise Boom("out of memory")

    worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend="verify",
                                                          decode_cuda_graph_runner="g8",
                                                          spec_algorithm=Algo.NGRAM),
                             target_worker=Target())
    info = SimpleNamespace(accept_tokens=torch.tensor([5, 0, 6, 0]),
                           accept_lens=torch.tensor([1, 1]))
    seq = torch.tensor([3, 4])
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")],
                            spec_info=info,
                            seq_lens=seq, seq_lens_cpu=None, seq_lens_sum=None, orig_seq_lens=None,
                            input_ids=None,
                            out_cache_loc=None, spec_algorithm=Algo.NGRAM,
                            req_pool_indices=torch.tensor([0, 1]),
                            req_to_token_pool=SimpleNamespace(
                                req_to_token=torch.arange(20).view(2, 10)))
    with pytest.raises(Boom):
        auto.run_plain_decode(worker, batch, VerifyRuntime(1, "plain", "g1", {}), 2)
    mr = worker.model_runner
    assert (mr.attn_backend, mr.decode_cuda_graph_runner,
            mr.spec_algorithm) == ("verify", "g8", Algo.NGRAM)
    assert batch.spec_info is info and batch.seq_lens is seq and batch.spec_algorithm is Algo.NGRAM
    assert batch.input_ids is None and batch.out_cache_loc is None


def test_tick_remembers_whether_the_last_decode_step_was_plain(tmp_path):
    state = auto.setup(_worker(), _spec(tmp_path, DEAR), plain=PLAIN)
    for last, expect in ((("lean", 2, 1), True), (("spec", 2, 4), False), (None, False),
                         (("lean", 1, 1), True)):
        state.last_step = last
        auto._tick(state)
        assert state.lean_before is expect and state.last_step is None


@pytest.mark.parametrize("roots_first", [False, True])
def test_plain_decode_roots_after_a_plain_step_match_the_gathered_ones(roots_first):
    """After a plain step every accept length is 1: the first accept token of each request
    is its root, the same token root_tokens gathers; after a verify step (lengths > 1)
    only the gather is right."""
    import enum

    import torch

    class Algo(enum.Enum):
        NONE = 0
        NGRAM = 1

    seen = []

    class Target:
        def forward_batch_generation(self, batch, **kw):
            seen.append(batch.input_ids.clone())
            return SimpleNamespace(next_token_ids=torch.tensor([7, 8], dtype=torch.int32))

    worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend="verify",
                                                          decode_cuda_graph_runner="g8",
                                                          spec_algorithm=Algo.NGRAM),
                             target_worker=Target(),
                             _prev_decode_rids=set(), prev_token_ids=[], prev_accept_lens=[],
                             max_trie_depth=4,
                             _efficient_concat_last_n=lambda a, b, n: (a + b)[-n:],
                             ngram_corpus=SimpleNamespace(erase_match_state=lambda r: None,
                                                          batch_put=lambda t: None))

    def batch_with(accept_lens):
        info = SimpleNamespace(accept_tokens=torch.tensor([5, 9, 9, 6, 9, 9], dtype=torch.int32),
                               accept_lens=torch.tensor(accept_lens, dtype=torch.int32))
        reqs = [SimpleNamespace(rid=r, origin_input_ids=[1, 2], output_ids=[3]) for r in ("a", "b")]
        return SimpleNamespace(reqs=reqs, spec_info=info,
                               seq_lens=torch.tensor([3, 4]), seq_lens_cpu=None, seq_lens_sum=None,
                               orig_seq_lens=None, input_ids=None, out_cache_loc=None,
                               spec_algorithm=Algo.NGRAM, req_pool_indices=torch.tensor([0, 1]),
                               req_to_token_pool=SimpleNamespace(
                                   req_to_token=torch.arange(20).view(2, 10)))

    info_type = type("Info", (), {"__init__": lambda self, **kw: self.__dict__.update(kw)})
    b = batch_with([1, 1])
    b.spec_info = info_type(**vars(b.spec_info))
    res = auto.run_plain_decode(worker, b, VerifyRuntime(1, "plain", "g1", {}), 3,
                                roots_first=roots_first)
    assert seen[-1].tolist() == [5, 6] and seen[-1].dtype == torch.int64
    assert (res.accept_lens.tolist() == [1, 1]
            and res.next_draft_input.accept_tokens.tolist() == [7, 0, 0, 8, 0, 0])
    # lengths 2 and 3 (a verify step before): the gather finds the last accepted tokens; roots_first
    # reads the first ones (the caller's promise that every length is 1 is what makes that right)
    b = batch_with([2, 3])
    b.spec_info = info_type(**vars(b.spec_info))
    auto.run_plain_decode(worker, b, VerifyRuntime(1, "plain", "g1", {}), 3,
                          roots_first=roots_first)
    assert seen[-1].tolist() == ([5, 6] if roots_first else [9, 9])


def test_step_costs_snapshot_is_frozen_and_shares_the_table():
    """The controller's copy of the measured costs (shared every cost_sync_steps): later records
    do not reach it, its estimates are its own, and the table is the same object."""
    table = CostTable(decode=((1, 1.0), (4, 1.2)), verify=((1, 1.0), (32, 5.0)), source="t")
    live = StepCosts(table, window=8, min_samples=1)
    for ms in (2.0, 2.2, 2.4):
        live.record(LEAN, 1, 1, ms)
    snap = live.snapshot()
    before = snap.step_ms(LEAN, 1, 1)
    for _ in range(8):
        live.record(LEAN, 1, 1, 9.0)
    assert snap.step_ms(LEAN, 1, 1) == before and live.step_ms(LEAN, 1, 1) == 9.0
    assert snap.samples(LEAN, 1, 1) == 3 and snap.table is table and snap.version == 3


def test_tick_records_a_period_only_after_a_step_of_its_class(tmp_path):
    """The period from a step's start to the next one's is its cost only where the step before it
    was of its class (overlap scheduling shifts a GPU-bound period by one step): a chain trial among
    plain steps, the plain step after it and the first step after a prefill are not recorded."""
    state = auto.setup(_worker(), _spec(tmp_path, DEAR), plain=PLAIN)
    now = [0.0]
    state.clock = lambda: now[0]
    steps = [("lean", 1, 1), ("lean", 1, 1), ("spec", 1, 8), ("lean", 1, 1), ("lean", 1, 1),
             ("spec", 1, 8), ("spec", 1, 8), ("spec", 1, 8), ("lean", 1, 1), None,
             ("lean", 1, 1), ("lean", 1, 1)]
    for i, step in enumerate(steps):
        if step is None:  # a prefill
            auto.not_a_decode_step(state)
            continue
        auto._tick(state)  # records the period of the step before this one
        state.last_step = step
        now[0] += 0.001 * (i + 1)
    auto._tick(state)
    measured = state.costs.to_json()["measured"]
    # lean after lean: steps 1 and 4 (2 and 5 ms) and, after the prefill, step 11 (12 ms);
    # spec after spec: steps 6 and 7 (7 and 8 ms)
    assert state.costs.samples("lean", 1, 1) == 3 and state.costs.samples("spec", 1, 8) == 2
    assert measured["spec/bs1/w8"] == pytest.approx(7.5)
    assert measured["lean/bs1/w1"] == pytest.approx(5.0)


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_shadow_score_of_a_verified_draft_is_what_its_verify_accepted(step_probe):
    """The calibration compares the gain model's expectation with each verified draft's shadow
    score (capped at the tokens verified); that score must be what the verify pass itself accepted,
    with and without overlap (drafts recorded one step behind), requests joining included."""
    checked, partial = 0, 0
    for name in ("cheap", "cheap_overlap", "cheap_overlap_join", "cheap_overlap_join_apart",
                 "wrong", "wrong_overlap"):
        run = step_probe[name]
        assert run["resolved_verified"], name  # these loads verify drafts
        for r in run["resolved_verified"]:
            step = run["steps"][r["step"]]
            assert step["kind"] == "spec", (name, r)
            real = step["accept_lens"][step["rids"].index(r["rid"])] - 1
            assert min(r["shadow"], r["keep"]) == real, (name, r, step["accept_lens"])
            checked += 1
            partial += real < r["keep"]
    assert checked >= 8 and partial >= 2  # drafts that failed part-way were checked too


def test_a_finished_request_logs_what_its_verified_drafts_were_expected_to_accept(tmp_path):
    """`_sync_requests` scores a verified draft (tagged with what it was expected to accept and how
    many of its tokens were verified) for the calibration and for its request; when the request
    leaves the batch the controller logs the request's sums."""
    state = auto.setup(_worker(), _spec(tmp_path, CHEAP), plain=PLAIN)
    logged = []
    state.controller._log = logged.append
    req = SimpleNamespace(rid="a", origin_input_ids=[1, 2], origin_input_ids_unpadded=[1, 2],
                          output_ids=[3], sampling_params=SimpleNamespace(top_k=1))
    auto._sync_requests(state, SimpleNamespace(reqs=[req]))
    # a draft of 3 tokens after position 1, all verified, expected to accept 2.5: two accepted
    state.shadow.record("a", 1, auto.DraftFeatures(3, 1), [7, 8, 9])
    state.shadow.tag_last("a", (2.5, 3))
    req.output_ids = [3, 7, 8, 5, 6]
    auto._sync_requests(state, SimpleNamespace(reqs=[req]))
    assert logged == []
    auto._sync_requests(state, SimpleNamespace(reqs=[]))  # it finished
    assert logged == [{"request": "a", "verified_drafts": 1, "expected_tokens": 2.5,
                       "accepted_tokens": 2.0}]


def test_a_step_verifies_at_the_narrowest_width_that_holds_its_longest_draft(tmp_path):
    """The controller chose the widest chain (its expectation follows the requests' history), but
    the longest draft kept this step is one token: the step runs at width 2, the drafts as they
    would be verified at the chosen width less the padding past them (chain mode never verifies
    that padding either). With no draft kept it runs at width 1."""
    from fastverify.widths import truncate_drafts

    worker, streams, reqs = _two_streams(tmp_path)
    toks, mask = _drafts([streams[0][200:201], streams[1][200:201]])
    out_t, out_m = auto.step_drafts(worker, SimpleNamespace(reqs=reqs, has_grammar=False),
                                    toks, mask, 2)
    d = worker._fv_auto.controller.last
    assert d.option.width == K and d.speculate == (True, True)
    assert worker.draft_token_num == 2
    ref_t, ref_m = truncate_drafts(toks, mask, K, 2, [1, 1])
    assert np.array_equal(out_t, ref_t) and np.array_equal(out_m, ref_m)
    toks, mask = _drafts([[], []])
    auto.step_drafts(worker, SimpleNamespace(reqs=reqs, has_grammar=False), toks, mask, 2)
    assert worker.draft_token_num == 1


def test_the_narrowest_width_is_chain_modes_choice_for_every_kept_draft():
    """`auto._narrowest` answers without building chain mode's plan where the option's own width
    holds the longest kept draft exactly (the steady memorised step); every answer is still
    `widths.choose_width`'s, the narrowest captured width that holds the drafts."""
    import itertools

    from fastverify.widths import choose_width

    worker = _worker(widths=(1, 2, 4))
    cfg = worker._fv_widths.config
    for width in (2, 4):
        for keep in itertools.product(range(width), repeat=2):
            assert auto._narrowest(worker, width, list(keep)) == choose_width(keep, cfg)[0], keep


def test_a_rows_chain_length_is_what_chain_draft_lengths_reads():
    # auto's per-row length (a loop over the step's few rows) against the batch reader in widths
    import numpy as np

    from fastverify.glue import auto
    from fastverify.widths import chain_draft_lengths

    rng = np.random.default_rng(3)
    for k in (2, 4, 8):
        for _ in range(200):
            rows = rng.integers(0, 3, size=(4, k))  # zeros often, inside a chain too
            want = chain_draft_lengths(rows.reshape(-1), k).tolist()
            assert [auto._chain_length(r) for r in rows.tolist()] == want


def test_a_drafts_features_are_one_instance_per_value():
    from fastverify.gains import DraftFeatures
    from fastverify.glue import auto

    f = auto._features(3, False)
    assert f == DraftFeatures(3, 1, False) and auto._features(3, False) is f
    assert auto._features(0, True) == DraftFeatures(0, 0, True)


def test_a_requests_view_is_one_instance_while_its_features_stay(tmp_path):
    w = _worker()
    state = auto.setup(w, _spec(tmp_path, CHEAP), plain=PLAIN)
    state.features["a"] = auto._features(3, False)
    v = auto.view(state, "a")
    assert v.req_id == "a" and v.features is state.features["a"] and auto.view(state, "a") is v
    state.features["a"] = auto._features(2, False)
    assert auto.view(state, "a") is not v and auto.view(state, "a").features.match_len == 2
    # a request that left the batch is forgotten with its features
    state.prev_rids = frozenset({"a"})
    auto._sync_requests(state, SimpleNamespace(reqs=[]))
    assert "a" not in state.views and "a" not in state.features
