"""Stand-ins for the GPU-only pieces of SGLang's n-gram worker step, shared by the probe scripts
that drive the patched NGRAMWorker on the CPU (ngram_probe.py, widths_probe.py, auto_step_probe.py).

The target is a fixed function: after token x it predicts (x // 10 + 1) * 10 (so 10, 20, 30, ... is
its greedy continuation). Sampling is the torch reference of greedy chain verification
(fastverify.verify_ref.greedy_verify_chain), not SGLang's kernel; the KV-cache moves, stream
bookkeeping and mamba state hooks do nothing (no KV cache exists here).
"""
import torch

from fastverify.verify_ref import greedy_verify_chain


def target_next(x) -> int:
    return (int(x) // 10 + 1) * 10


def greedy_chain_sample(verify_input, batch, logits_output, *a, **kw):
    """eagle_sample's contract for a greedy chain verify against `target_next`."""
    bs, w = verify_input.retrieve_index.shape
    cand = verify_input.draft_token.reshape(bs, w)
    pred = torch.tensor([[target_next(cand[b, i]) for i in range(w)] for b in range(bs)])
    res = greedy_verify_chain(cand, pred)
    return pred.reshape(-1), res.accept_len.to(torch.int32), res.accept_index


def install(nw) -> None:
    """Replace the GPU-only helpers the ngram_worker module calls in a step."""
    for name in ("record_stream_for_v2_verify", "commit_mamba_states_after_verify",
                 "move_accept_tokens_to_target_kvcache", "prepare_mamba_track_for_verify"):
        setattr(nw, name, lambda *a, **kw: None)
    nw.set_time_batch = lambda *a, **kw: None
    nw.eagle_sample = greedy_chain_sample
    nw.assign_extend_cache_locs_func = lambda **kw: torch.zeros(
        kw["batch_size"] * kw["draft_token_num"], dtype=torch.int64)


def bare_worker(nw, server_args, model_runner, target, corpus, k: int, overlap: bool,
                mode: str = "chain"):
    """An NGRAMWorker built without its constructor (which needs a GPU model): the attributes a
    decode step reads, SGLang's own draft buffers (_init_preallocated_tensors) and patch 0005's
    verify hook in `mode` (tree or chain). server_args, model_runner and target may be None for a
    probe that only prepares drafts."""
    from fastverify.chain import ChainConfig
    from fastverify.glue.ngram import NgramVerifyHook

    w = object.__new__(nw.NGRAMWorker)
    w.server_args = server_args
    w.model_runner = model_runner
    w._target_worker = target
    w.draft_token_num = w.speculative_num_draft_tokens = k
    w.max_trie_depth = 12
    w.enable_overlap = overlap
    w.device = "cpu"
    w.max_batch_size = 4
    w.ngram_corpus = corpus
    w._init_preallocated_tensors()
    w._fv = NgramVerifyHook(ChainConfig(mode=mode, num_draft_tokens=k, match_type="BFS"))
    w.adaptive_controller = None
    w._prev_decode_rids = set()
    w.token_to_kv_pool_allocator = None
    return w
