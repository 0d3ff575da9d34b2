"""Pure-torch ``reconstruct_indices_from_tree_mask`` for CPU tests (the real op is a CUDA kernel).

Semantics (per request ``b``, node ``i``, ``d`` = draft_token_num; ``tree_mask[b, i, j]`` is 1 iff
node ``j`` is an ancestor of node ``i`` or ``i`` itself; nodes are in breadth-first order):
    positions[b*d + i]          = verified_seq_len[b] + number of strict ancestors of i
    retrieve_index[b, i]        = b*d + i
    retrieve_next_token[b, i]   = the first (lowest-index) child of i, -1 if i is a leaf
    retrieve_next_sibling[b, i] = the next node after i with the same parent, -1 if none (and
                                  for the root)
The parent of i is its strict ancestor with the largest index. Outputs are
written in place, like the op.
"""
import torch


def reconstruct_indices_from_tree_mask(
    tree_mask, verified_seq_len, positions, retrieve_index, retrieve_next_token,
    retrieve_next_sibling, batch_size, draft_token_num,
):
    bs, d = int(batch_size), int(draft_token_num)
    m = tree_mask.reshape(-1)[: bs * d * d].reshape(bs, d, d).to(torch.bool)  # [bs, d, d]
    strict = m & torch.ones(d, d, dtype=torch.bool, device=m.device).tril(-1)  # [bs, d, d] j < i
    depth = strict.sum(dim=2)  # [bs, d]
    positions[: bs * d].copy_((verified_seq_len[:bs].to(torch.int64)[:, None] + depth).reshape(-1))
    idx = torch.arange(d, device=m.device)
    # [bs, d]
    parent = torch.where(strict, idx[None, None, :],
                         torch.full_like(idx, -1)[None, None, :]).amax(dim=2)
    retrieve_index[:bs].copy_(torch.arange(bs * d, device=m.device).reshape(bs, d))
    nxt = torch.full((bs, d), -1, dtype=torch.int64, device=m.device)
    sib = torch.full((bs, d), -1, dtype=torch.int64, device=m.device)
    for b in range(bs):
        for i in range(d - 1, 0, -1):  # reverse order: the last write is the lowest index
            p = int(parent[b, i])
            nxt[b, p] = i
        last_child = {}
        for i in range(d - 1, 0, -1):
            p = int(parent[b, i])
            sib[b, i] = last_child.get(p, -1)
            last_child[p] = i
    retrieve_next_token[:bs].copy_(nxt)
    retrieve_next_sibling[:bs].copy_(sib)
