"""Subprocess probe of patched SGLang (patch 0005) for
tests/test_ngram_glue.py; prints one JSON line.

Run with the patched sglang first on PYTHONPATH and tests/stubs after it:
    python ngram_probe.py MODEL_DIR
"""
import json
import sys
import types

import torch

model = sys.argv[1]
out = {}

from sglang.srt.server_args import prepare_server_args  # noqa: E402


def resolved(argv):
    sa = prepare_server_args(argv)
    if hasattr(sa, "resolve_once"):  # 0.5.23 resolves explicitly
        sa.resolve_once()
        return sa.resolved_dict()
    return vars(sa)


base = ["--model-path", model, "--device", "cuda", "--speculative-algorithm", "NGRAM",
        "--speculative-num-draft-tokens", "8", "--page-size", "16", "--attention-backend", "triton"]
for mode in ("tree", "chain"):
    try:
        r = resolved(base + ["--speculative-ngram-verify-mode", mode])
        out[f"args_{mode}"] = {k: r[k]
                               for k in ("speculative_ngram_verify_mode", "speculative_eagle_topk",
                                         "speculative_num_steps", "speculative_num_draft_tokens")}
    except Exception as e:  # tree with topk 10 + page 16 + triton is rejected by stock SGLang
        out[f"args_{mode}"] = {"error": f"{type(e).__name__}: {e}"}

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.speculative import ngram_worker as nw  # noqa: E402
from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus  # noqa: E402

import ngram_stand_ins  # noqa: E402  (tests/, next to this script)

nw.assign_extend_cache_locs_func = lambda **kw: torch.zeros(
    kw["batch_size"] * kw["draft_token_num"], dtype=torch.int64)
nw.prepare_mamba_track_for_verify = lambda batch: None
D = 8
corpus = NgramCorpus(max_trie_depth=12, draft_token_num=D, min_bfs_breadth=1, max_bfs_breadth=8,
                     match_type="BFS", capacity=100000)
corpus.batch_put([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 44, 55, 66, 77, 88, 99, 100]])
corpus.synchronize()
for mode in ("tree", "chain"):
    w = ngram_stand_ins.bare_worker(nw, None, None, None, corpus, D, overlap=False, mode=mode)

    def req(rid, p, o):
        return types.SimpleNamespace(rid=f"{mode}-{rid}", origin_input_ids=p,
                                     origin_input_ids_unpadded=p, output_ids=o)

    reqs = [req("a", [9, 1, 2], [3]), req("b", [7, 3], [44]), req("c", [5, 6], [999])]
    seq = [4, 3, 3]
    batch = types.SimpleNamespace(
        reqs=reqs, forward_mode=ForwardMode.DECODE, seq_lens=torch.tensor(seq),
        seq_lens_cpu=torch.tensor(seq),
        req_pool_indices=torch.arange(3),
        req_to_token_pool=types.SimpleNamespace(req_to_token=None),
        spec_info=types.SimpleNamespace(accept_tokens=torch.zeros(3 * D, dtype=torch.int64),
                                        accept_lens=torch.zeros(3, dtype=torch.int64)),
        has_grammar=False, grammar_needs_sync=lambda: False,
    )
    w._prepare_for_speculative_decoding(batch)
    si = batch.spec_info
    w.on_verify_complete_cpu([2, 0, 0], batch_size=3)
    out[f"worker_{mode}"] = {
        "forward_mode": str(batch.forward_mode),
        "draft": si.draft_token.reshape(3, D).tolist(),
        "mask_is_none": si.custom_mask is None,
        "device": str(si.device),
        "positions": si.positions.reshape(3, D).tolist(),
        "next_token": si.retrieve_next_token.tolist(),
        "next_sibling": si.retrieve_next_sibling.tolist(),
        "retrieve_index": si.retrieve_index.tolist(),
        "stats": w._fv.stats.summary(),
    }
print("PROBE " + json.dumps(out, default=str))
