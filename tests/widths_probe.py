"""Subprocess probe of patched SGLang (patches 0005 + 0008) for
tests/test_verify_runtime.py; prints one JSON line.

Run with the patched sglang first on PYTHONPATH and tests/stubs after it:
    python widths_probe.py MODEL_DIR
The model runner, the target forward and the sampling kernel are stand-ins (no GPU here); the
worker's draft path, width switch, runtime build under SGLang's own spec-settings mutation point,
and the step's bookkeeping are the patched SGLang code.
"""
import json
import sys
import types

import torch

model = sys.argv[1]
out = {}

from sglang.srt.server_args import prepare_server_args  # noqa: E402

base = ["--model-path", model, "--device", "cuda", "--speculative-algorithm", "NGRAM",
        "--speculative-num-draft-tokens", "8", "--attention-backend", "triton"]


def resolve(argv):
    sa = prepare_server_args(argv)
    if hasattr(sa, "resolve_once"):  # 0.5.23 resolves explicitly
        sa.resolve_once()
    return sa


for name, extra in {
    "ok": ["--speculative-ngram-verify-mode", "chain",
           "--speculative-ngram-verify-widths", "1,2,4,8"],
    "default": ["--speculative-ngram-verify-mode", "chain"],
    "missing_k": ["--speculative-ngram-verify-mode", "chain",
                  "--speculative-ngram-verify-widths", "1,2,4"],
    "tree": ["--speculative-ngram-verify-widths", "1,8"],
    "garbage": ["--speculative-ngram-verify-mode", "chain",
                "--speculative-ngram-verify-widths", "two,8"],
}.items():
    try:
        sa = resolve(base + extra)
        out[f"args_{name}"] = {"widths": sa.speculative_ngram_verify_widths}
    except Exception as e:
        out[f"args_{name}"] = {"error": f"{type(e).__name__}: {e}"}

sa = resolve(base + ["--speculative-ngram-verify-mode", "chain",
                     "--speculative-ngram-verify-widths", "1,2,4,8"])
from sglang.srt import runtime_context as rc  # noqa: E402

if hasattr(rc, "get_spec"):  # 0.5.23: the spec settings live in the published config
    rc.publish(sa, role="test")
    spec_k = lambda: rc.get_spec().speculative_num_draft_tokens  # noqa: E731
else:
    spec_k = lambda: sa.speculative_num_draft_tokens  # noqa: E731

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.speculative import ngram_worker as nw  # noqa: E402
from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus  # noqa: E402

import ngram_stand_ins  # noqa: E402  (tests/, next to this script)

D = 8
built = []


class Runner:
    """Stands in for SGLang's verify graph runner class; records the spec settings
    seen at construction."""

    def __init__(self, mr, *, attn_backend, speculative_num_steps, speculative_num_draft_tokens):
        self.width = speculative_num_draft_tokens
        built.append({"width": speculative_num_draft_tokens, "steps": speculative_num_steps,
                      "spec_k_seen": spec_k(), "backend": attn_backend})


def get_backend(init_new_workspace=False):
    return f"backend@{spec_k()}/new={init_new_workspace}"


mr = types.SimpleNamespace(attn_backend="backend@8",
                           decode_cuda_graph_runner=object.__new__(Runner),
                           init_new_workspace=False, server_args=sa, watermark_state=None,
                           _get_attention_backend=get_backend)
mr.decode_cuda_graph_runner.width = D
seen_in_forward = []


class Target:
    model_runner = mr

    def forward_batch_generation(self, batch, is_verify=False, **kw):
        seen_in_forward.append({"runner_width": mr.decode_cuda_graph_runner.width,
                                "backend": mr.attn_backend, "tokens": int(batch.input_ids.numel())})
        logits = types.SimpleNamespace(next_token_logits=torch.zeros(1, 4))
        return types.SimpleNamespace(logits_output=logits, can_run_cuda_graph=True)


# the target after x is (x // 10 + 1) * 10; greedy chain verify in torch
ngram_stand_ins.install(nw)

corpus = NgramCorpus(max_trie_depth=12, draft_token_num=D, min_bfs_breadth=1, max_bfs_breadth=8,
                     match_type="BFS", capacity=100000)
corpus.batch_put([[10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110], [5, 15, 25]])
corpus.synchronize()

w = ngram_stand_ins.bare_worker(nw, sa, mr, Target(), corpus, D, overlap=True)
base_views = w.draft_tokens_batch
w.init_cuda_graphs()  # patched: SGLang's (no-op for n-gram) then build_runtimes
out["built"] = built
out["spec_k_after_build"] = spec_k()
out["widths"] = sorted(w._fv_widths.runtimes)


def req(rid, p, o):
    return types.SimpleNamespace(rid=rid, origin_input_ids=p, origin_input_ids_unpadded=p,
                                 output_ids=o, is_retracted=False)


def step(reqs, seq, spec_info):
    batch = types.SimpleNamespace(
        reqs=reqs, forward_mode=ForwardMode.DECODE, seq_lens=torch.tensor(seq),
        seq_lens_cpu=torch.tensor(seq),
        req_pool_indices=torch.arange(len(reqs)),
        req_to_token_pool=types.SimpleNamespace(req_to_token=None),
        spec_info=spec_info, has_grammar=False, grammar_needs_sync=lambda: False,
        return_logprob=False)
    res = w.forward_batch_generation(batch)
    return {
        "verified_tokens": seen_in_forward[-1],
        "draft": batch.input_ids.tolist(),
        "result_stride": res.speculative_num_draft_tokens,
        "next_token_ids": res.next_token_ids.tolist(),
        "accept_lens": res.accept_lens.tolist(),
        "carried_stride": res.next_draft_input.draft_token_num,
        "carried": res.next_draft_input.accept_tokens.tolist(),
        "after": {"draft_token_num": w.draft_token_num,
                  "runner_width": mr.decode_cuda_graph_runner.width,
                  "backend": mr.attn_backend, "views_restored": w.draft_tokens_batch is base_views},
    }, res


def empty_info(bs):
    return types.SimpleNamespace(accept_tokens=torch.zeros(bs * D, dtype=torch.int64),
                                 accept_lens=torch.zeros(bs, dtype=torch.int64))


# step 1: no request matches anything -> width 1 (the plain decode token through verify)
out["step_nomatch"], _ = step([req("a", [7, 1, 2], [3]), req("b", [8, 4], [9])], [4, 3],
                              empty_info(2))
# step 2: one request matches 20 30 40 50 ... (chain of 7), one does not -> width 8
out["step_long"], r2 = step([req("c", [1, 2], [10]), req("d", [8, 4], [9])], [3, 3], empty_info(2))
# step 3: the previous step's carried tokens (stride 8) spliced in by the overlap path; 5 15
# -> draft [25] -> width 2
out["step_short"], _ = step([req("e", [3, 3], [5]), req("f", [6, 6], [6])], [3, 3], empty_info(2))
# step 4: requests c, d again; overlap mode splices step 2's carried tokens
# (stride 8) into the context
out["step_splice"], _ = step([req("c", [1, 2], [10]), req("d", [8, 4], [9])], [11, 4],
                             r2.next_draft_input)
out["stats"] = w._fv_widths.stats.summary()
print("PROBE " + json.dumps(out, default=str))
