"""Stand-ins for the GPU-only pieces of SGLang's n-gram worker step, shared by the probe scripts that drive
the patched NGRAMWorker on the CPU (widths_probe.py, auto_step_probe.py).

The target is a fixed function: after token x it predicts (x // 10 + 1) * 10 (so 10, 20, 30, ... is its
greedy continuation). Sampling is the torch reference of greedy chain verification
(fastverify.verify_ref.greedy_verify_chain), not SGLang's kernel; the KV-cache moves, stream bookkeeping and
mamba state hooks do nothing (no KV cache exists here).
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
    nw.assign_extend_cache_locs_func = lambda **kw: torch.zeros(kw["batch_size"] * kw["draft_token_num"],
                                                                dtype=torch.int64)
