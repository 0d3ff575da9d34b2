"""Subprocess probe of patched SGLang (the whole series) for
tests/test_glue_auto.py; prints one JSON line.

Run with the patched sglang first on PYTHONPATH and tests/stubs after it:
    python auto_step_probe.py MODEL_DIR
env FV_PROBE_COSTS: a folder with dear.json (verify far dearer than decode) and
cheap.json (verify ~ decode).

Decodes with the patched NGRAMWorker in auto mode (the real n-gram corpus, the patched step with its
plain decode steps, 0008's runtime switch, 0007's controller glue) against a stand-in target whose
greedy output after token x is (x // 10 + 1) * 10. The model runner, the forward and the sampling
kernel are stand-ins (no GPU here); verify sampling is the torch reference of greedy chain
verification, a plain decode pass returns the target's next token. The host clock of the
controller's step timing is a fake: a plain decode step takes 2 ms, one with a lookup 5 ms. Runs
without overlap (each step's result processed before the next step) and with it (one step late, as
SGLang's overlap scheduler does: the host lacks the tokens of the step in flight).
"""
import json
import os
import sys
import types

import torch

model = sys.argv[1]
costs_dir = os.environ["FV_PROBE_COSTS"]
D = 8
out = {}

from sglang.srt.server_args import prepare_server_args  # noqa: E402

base = ["--model-path", model, "--device", "cuda", "--speculative-algorithm", "NGRAM",
        "--speculative-num-draft-tokens", str(D), "--attention-backend", "triton",
        "--speculative-ngram-verify-mode", "auto", "--speculative-ngram-verify-widths", "1,2,4,8"]

from sglang.srt import runtime_context as rc  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.speculative import ngram_worker as nw  # noqa: E402
from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

import ngram_stand_ins  # noqa: E402  (tests/, next to this script)


BUILT = []  # (width, algorithm) of every graph runner built, in order
READ_DONE = ("war_fastpath_read_done_event", "shared_read_done_event")


class Runner:
    def __init__(self, mr, *, attn_backend, speculative_num_steps, speculative_num_draft_tokens):
        self.width = speculative_num_draft_tokens
        # what SGLang's runner reads to pick its capture mode
        self.algorithm = mr.spec_algorithm.name
        BUILT.append((self.width, self.algorithm))


# the target after x is (x // 10 + 1) * 10; greedy chain verify in torch
ngram_stand_ins.install(nw)


def run(table, steps, corpus_text, host_lens=True, overlap=False, join_at=None, join_apart=False):
    sa = prepare_server_args(base + ["--speculative-ngram-auto-cost-table",
                                     os.path.join(costs_dir, table)])
    if hasattr(sa, "resolve_once"):  # 0.5.23: resolved settings live in the published config
        sa.resolve_once()
        rc.publish(sa, role="test")
    forwards = []
    events = []  # the order of forwards, corpus puts and corpus queries
    mr = types.SimpleNamespace(attn_backend="backend@8",
                               decode_cuda_graph_runner=object.__new__(Runner),
                               init_new_workspace=False, server_args=sa, watermark_state=None,
                               _get_attention_backend=lambda init_new_workspace=False: "backend",
                               spec_algorithm=SpeculativeAlgorithm.NGRAM)
    mr.decode_cuda_graph_runner.width = D
    mr._get_attention_backend = lambda init_new_workspace=False: f"backend/{mr.spec_algorithm.name}"
    mr.decode_cuda_graph_runner.algorithm = "NGRAM"

    class Target:
        model_runner = mr

        def forward_batch_generation(self, batch, is_verify=False, **kw):
            runner = mr.decode_cuda_graph_runner
            events.append("forward")
            forwards.append({"width": runner.width, "input": batch.input_ids.tolist(),
                             "verify": is_verify,
                             "runner_algorithm": runner.algorithm,
                             "mr_algorithm": mr.spec_algorithm.name,
                             "batch_algorithm": batch.spec_algorithm.name,
                             "mode": batch.forward_mode.name,
                             "seq_lens": batch.seq_lens.tolist(), "seq_lens_cpu": None
                             if batch.seq_lens_cpu is None else batch.seq_lens_cpu.tolist(),
                             "seq_lens_sum": batch.seq_lens_sum,
                             "out_cache_loc": batch.out_cache_loc.tolist(),
                             "spec_info": batch.spec_info is not None,
                             "attn_backend": mr.attn_backend})
            if batch.forward_mode.name == "DECODE":
                # SGLang's DECODE graph replay leaves its early read-done event for the
                # scheduler's write-after-read barrier (0.5.16's name, 0.5.23's)
                for name in READ_DONE:
                    setattr(mr, name, "read-done@" + batch.forward_mode.name)
                forwards[-1]["read_done_set"] = True
            logits = types.SimpleNamespace(next_token_logits=torch.zeros(1, 4))
            res = types.SimpleNamespace(logits_output=logits, can_run_cuda_graph=True)
            if not is_verify:  # the plain sampler: the target's next token
                res.next_token_ids = torch.tensor([ngram_stand_ins.target_next(x)
                                                   for x in batch.input_ids])
            return res

    corpus = NgramCorpus(max_trie_depth=12, draft_token_num=D, min_bfs_breadth=1, max_bfs_breadth=8,
                         match_type="BFS", capacity=100000)
    corpus.batch_put(corpus_text)
    corpus.synchronize()
    # without overlap, results are processed before the next step (output_ids complete); with it,
    # one step late (a step's tokens reach output_ids after the next step was launched, as in
    # SGLang's overlap scheduler)
    w = ngram_stand_ins.bare_worker(nw, sa, mr, Target(), corpus, D, overlap=overlap)
    w.init_cuda_graphs()  # patched: runtimes per width (0008), then the auto controller (0007)
    state = w._fv_auto
    now = [0.0]
    state.clock = lambda: now[0]
    # each verified draft's tag carries the step that verified it; when the draft resolves, its
    # shadow score is kept beside that step's real accept length (the calibration compares the two)
    step_now = [None]
    resolved = []
    real_tag, real_advance = state.shadow.tag_last, state.shadow.advance_tagged
    state.shadow.tag_last = lambda rid, tag: real_tag(rid, tuple(tag) + (step_now[0],))

    def advance_tagged(rid, tokens, length=None):
        done = real_advance(rid, tokens, length)
        for _f, ca, _ta, tag in done:
            if tag is not None:
                resolved.append({"rid": rid, "step": tag[2], "keep": tag[1], "shadow": ca})
        return done
    state.shadow.advance_tagged = advance_tagged
    puts = []
    real_put = corpus.batch_put
    corpus.batch_put = lambda toks: (puts.append([list(t) for t in toks]), events.append("put"),
                                     real_put(toks))[2]
    gets = []  # every lookup: (request ids, contexts, total lengths)
    real_get = corpus.batch_get
    corpus.batch_get = lambda ids, toks, lens: (
        gets.append([list(ids), [list(t) for t in toks], list(lens)]),
        events.append("get"), real_get(ids, toks, lens))[2]

    reqs = [types.SimpleNamespace(rid="a", origin_input_ids=[7, 1, 2],
                                  origin_input_ids_unpadded=[7, 1, 2],
                                  output_ids=[10], is_retracted=False),
            types.SimpleNamespace(rid="b", origin_input_ids=[5, 3],
                                  origin_input_ids_unpadded=[5, 3],
                                  output_ids=[13], is_retracted=False)]
    info = types.SimpleNamespace(
        accept_tokens=torch.tensor([10] + [0] * (D - 1) + [13] + [0] * (D - 1)),
        accept_lens=torch.tensor([1, 1]))
    log = []
    in_flight = [[] for _ in reqs]  # overlap: the last step's tokens, not in output_ids yet
    # each request's first token (its prefill's) is still in flight at its first decode step
    if overlap:
        in_flight = [r.output_ids for r in reqs]
        for r in reqs:
            r.output_ids = []
    # the worker's step sees every forward the scheduler launches, prefills too
    # (here only their requests)
    def prefill(rs):
        return w.forward_batch_generation.__globals__["fv_auto"].plain_step(
            w, types.SimpleNamespace(reqs=rs, forward_mode=ForwardMode.EXTEND,
                                     spec_algorithm=SpeculativeAlgorithm.NGRAM))

    prefill(reqs)
    for step_i in range(steps):
        if step_i == join_at:
            # the first requests finished; two new ones join, each prompt ending inside the corpus'
            # stream, each one's first token (from its prefill) in flight
            reqs = [types.SimpleNamespace(rid="c", origin_input_ids=[7, 50],
                                          origin_input_ids_unpadded=[7, 50],
                                          output_ids=[], is_retracted=False),
                    types.SimpleNamespace(rid="d", origin_input_ids=[5, 50],
                                          origin_input_ids_unpadded=[5, 50],
                                          output_ids=[], is_retracted=False)]
            in_flight = [[60], [60]]
            prefill(reqs)
            # c's prefill ran one forward earlier: its result is processed, its token on the host
            if join_apart:
                prefill(reqs[:1])
                prefill(reqs[1:])
                reqs[0].output_ids, in_flight[0] = [60], []
            info = types.SimpleNamespace(
                accept_tokens=torch.tensor([60] + [0] * (D - 1) + [60] + [0] * (D - 1)),
                accept_lens=torch.tensor([1, 1]))
        seq = [len(r.origin_input_ids) + len(r.output_ids) + len(t)
               for r, t in zip(reqs, in_flight)]
        # KV slot of request i at position j: 1000 * i + j
        slots = 1000 * torch.arange(len(reqs)).view(-1, 1) + torch.arange(64).view(1, -1)
        batch = types.SimpleNamespace(
            reqs=reqs, forward_mode=ForwardMode.DECODE, seq_lens=torch.tensor(seq),
            seq_lens_cpu=torch.tensor(seq) if host_lens else None, seq_lens_sum=sum(seq)
            if host_lens else None, orig_seq_lens=None, input_ids=None, out_cache_loc=None,
            spec_algorithm=SpeculativeAlgorithm.NGRAM,
            req_pool_indices=torch.arange(len(reqs)),
            req_to_token_pool=types.SimpleNamespace(req_to_token=slots),
            spec_info=info, has_grammar=False, grammar_needs_sync=lambda: False,
            return_logprob=False)
        n_puts, n_gets, n_events = len(puts), len(gets), len(events)
        step_now[0] = step_i
        published = []
        res = w.forward_batch_generation(batch, on_publish=published.append)
        kind = state.last_step[0]
        # a plain step that looked drafts up behind its launch (its own cost kind)
        probed = kind == "probe"
        kind = "lean" if probed else kind
        lens = res.accept_lens.tolist()
        stride = res.next_draft_input.draft_token_num
        acc = res.next_draft_input.accept_tokens.view(len(reqs), stride)
        for i, r in enumerate(reqs):
            if overlap:
                r.output_ids, in_flight[i] = r.output_ids + in_flight[i], acc[i, :lens[i]].tolist()
            else:
                r.output_ids = r.output_ids + acc[i, :lens[i]].tolist()
        f = forwards[-1]
        log.append({"kind": kind, "probe": probed, "width": f["width"], "input": f["input"],
                    "rids": [r.rid for r in reqs],
                    "forward": f,
                    "accept_lens": lens, "prev_token_ids": list(getattr(w, "prev_token_ids", [])),
                    "puts": puts[n_puts:], "gets": gets[n_gets:], "events": events[n_events:],
                    "after_k": w.draft_token_num, "step_width": res.speculative_num_draft_tokens,
                    "published": [t.tolist() for t in published], "seq_lens_before": seq,
                    "restored": {"mr_algorithm": mr.spec_algorithm.name,
                                 "batch_algorithm": batch.spec_algorithm.name,
                                 "attn_backend": mr.attn_backend,
                                 "runner_width": mr.decode_cuda_graph_runner.width,
                                 "seq_lens": batch.seq_lens.tolist(),
                                 "spec_info": batch.spec_info is info,
                                 "input_ids": batch.input_ids,
                                 "out_cache_loc": batch.out_cache_loc}})
        # what the scheduler's barrier would find after the step (it clears the event)
        log[-1]["read_done_left"] = [getattr(mr, name, None) for name in READ_DONE]
        for name in READ_DONE:
            setattr(mr, name, None)
        info = res.next_draft_input
        now[0] += 0.002 if kind == "lean" else 0.005
    return {"steps": log, "outputs": {r.rid: r.output_ids + t for r, t in zip(reqs, in_flight)},
            "metrics": state.controller.metrics(), "costs": state.costs.to_json(),
            "resolved_verified": resolved}


stream = [10 * i for i in range(1, 40)]
out["dear"] = run("dear.json", 12, [[9, 9, 9]])
out["built"] = list(BUILT)  # the graph runners the worker's start-up built, in order
out["cheap"] = run("cheap.json", 16, [stream])
# patch 0009: chain-shaped verify keeps no host copy of the lengths (the scheduler
# hands seq_lens_cpu = None)
out["dear_no_host_lens"] = run("dear.json", 12, [[9, 9, 9]], host_lens=False)
# overlap mode (as served): lookups after a plain step are made behind the token in
# flight and shifted past it
out["dear_overlap"] = run("dear.json", 12, [[9, 9, 9]], host_lens=False, overlap=True)
out["cheap_overlap"] = run("cheap.json", 16, [stream], host_lens=False, overlap=True)
# drafts that fail part-way: the corpus continues the stream wrongly every few tokens (the target
# after 50 is 60, the corpus says 65, ...), so verifies accept 0-3 of their tokens
wrong = [10, 20, 30, 40, 50, 65, 70, 80, 95, 100, 110, 125, 130, 140, 155, 160, 170, 185, 190]
out["wrong"] = run("cheap.json", 24, [wrong])
out["wrong_overlap"] = run("cheap.json", 24, [wrong], host_lens=False, overlap=True)
# new requests join after speculation paid; the corpus also knows another continuation of "7 50"
# (61, 62, ...), so its guess of request c's token in flight is unsure
out["cheap_overlap_join"] = run("cheap.json", 20,
                                [stream, [3, 7, 50, 61, 62, 63, 64, 65, 66, 67, 68]],
                                host_lens=False, overlap=True, join_at=12)
# new requests join a load whose drafts do not pay (verify far dearer): their first lookup, which
# could only be a probe, waits one step (off the path of their first token)
out["dear_overlap_join"] = run("dear.json", 14, [[9, 9, 9]], host_lens=False,
                               overlap=True, join_at=8)
# c and d from two prefills in a row (the first's result is processed before the
# decode step), one continuation
out["cheap_overlap_join_apart"] = run("cheap.json", 20, [stream], host_lens=False,
                                      overlap=True, join_at=12, join_apart=True)



def same_put():
    """A plain step's corpus put (fv_auto.corpus_put_host) against SGLang's own
    _update_ngram_corpus with nothing carried, for a prompt longer than the corpus depth, a short
    one, and an empty output."""
    sa = prepare_server_args(base + ["--speculative-ngram-auto-cost-table",
                                     os.path.join(costs_dir, "dear.json")])
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
        rc.publish(sa, role="test")
    puts = []
    corpus = types.SimpleNamespace(batch_put=lambda toks: puts.append([list(t) for t in toks]))
    w = ngram_stand_ins.bare_worker(nw, sa, None, None, corpus, D, overlap=True)
    long_prompt = list(range(100, 130))
    reqs = [types.SimpleNamespace(rid="x", origin_input_ids=long_prompt,
                                  origin_input_ids_unpadded=long_prompt, output_ids=[1, 2, 3]),
            types.SimpleNamespace(rid="y", origin_input_ids=[5, 6],
                                  origin_input_ids_unpadded=[5, 6], output_ids=list(range(40, 60))),
            types.SimpleNamespace(rid="z", origin_input_ids=[8, 9, 10],
                                  origin_input_ids_unpadded=[8, 9, 10], output_ids=[])]
    batch = types.SimpleNamespace(reqs=reqs, has_grammar=False, grammar_needs_sync=lambda: False)
    w.prev_token_ids, w.prev_accept_lens = [], [0] * len(reqs)
    w._update_ngram_corpus(batch)
    nw.fv_auto.corpus_put_host(w, batch)
    return puts


out["same_put"] = same_put()
print("PROBE " + json.dumps(out, default=str))
