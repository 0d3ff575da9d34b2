"""Start-up compilation of the Triton kernels that SGLang's n-gram speculative step
runs outside CUDA graphs.

Two kernels of that step take ``next_power_of_2(batch size)`` as a compile-time constant: the
scheduler's ``assign_req_to_token_pool`` (the KV slots a decode step reserves for its drafts) and
``assign_extend_cache_locs`` (the worker reading those slots, and moving the accepted tokens' KV).
Two more, in the move of the accepted tokens' KV after each verify pass, take
``next_power_of_2(batch size x verify width)``: ``fill_accept_out_cache_loc`` and the KV pool's
``copy_all_layer_kv_cache_tiled`` (the latter also specialises on its slot count being 1 or a
multiple of 16). Triton compiles a kernel the first time it meets a new value of such a constant,
or new argument types, so on a machine whose Triton cache does not hold them yet, the first step at
batch size 2, then 3, then 5, ... stops the whole batch while they compile (110-450 ms steps in the
GPU runs, inside the n-gram step and the batch preparation, never in a plain server, whose decode
step writes its slots with torch indexing). Here every bucket up to the worker's largest batch runs
each kernel once with arguments of the types the server's own calls use (the scheduler passes its
lengths as int32, the worker as int64; the same ``req_to_token`` row length, the other compile-time
constant; the scheduler's slots, a slice of the allocator's free list, both 16-byte aligned and
not), and the KV pool moves slot 0 (the padding slot) onto itself once for every slot count a
verify step can move, so that compilation happens before serving; with Triton's on-disk cache a
later start only loads them.

In auto verify mode the plain decode step's own two kernels (``plain_step``) are compiled too, once
per variant a server meets (their batch size is a runtime argument).

Called from ``verify_runtime.build_runtimes`` (patch 0008's seam in
``NGRAMWorker.init_cuda_graphs``), so every n-gram server of the series warms alike. Nothing fails
start-up: a kernel that cannot be found or run is logged and skipped.
"""
from __future__ import annotations

import importlib
import logging
import os
import time

logger = logging.getLogger("fastverify.warmup")

# (module, kernel, dtype of the lengths its callers pass): the step's Triton kernels with
# next_power_of_2(batch size) as a tl.constexpr; both pinned SGLang versions define them
# with the signature (req_pool_indices, req_to_token, start_offset, end_offset,
# out_cache_loc, pool_len: constexpr,
# bs_upper: constexpr). The scheduler's spec-decode allocation (eagle_utils,
# alloc_for_spec_decode) builds its lengths as int32; the worker passes batch.seq_lens (int64). A
# call with other types compiles anew.
KERNELS = (
    ("sglang.srt.mem_cache.allocation", "assign_req_to_token_pool", "int32"),
    ("sglang.kernels.ops.speculative.cache_locs", "assign_extend_cache_locs", "int64"),
)
# Kernels whose out_cache_loc is the allocator's answer: a slice of its free list (page size 1:
# free_pages[:n]), at whatever offset earlier allocations left, so its address is 16-byte
# aligned or not from one step to the next, and Triton compiles a variant for each (pointer
# alignment is part of its cache key; run26/run28 met the unaligned one mid-serving after an
# aligned warm-up). Warmed with both.
FREE_LIST_OUT = frozenset({"assign_req_to_token_pool"})
# The accepted tokens' slots (spec_utils.move_accept_tokens_to_target_kvcache): (accept_index
# int32, out_cache_loc int64, accept_out_cache_loc int64, size_upper: constexpr =
# next_power_of_2(bs x width))
ACCEPT_FILL = ("sglang.kernels.ops.speculative.eagle", "fill_accept_out_cache_loc")


def buckets(max_bs: int) -> list:
    """The values next_power_of_2(bs) takes for bs = 1..max_bs."""
    out, b = [], 1
    while True:
        out.append(b)
        if b >= max_bs:
            return out
        b *= 2


def accept_sizes(max_bs: int, widths) -> list:
    """Every count of accepted-token slots a verify step moves: batch size x verify width."""
    return sorted({b * int(w) for b in range(1, max_bs + 1) for w in widths})


def _kernels(kernels=KERNELS) -> list:
    """(name, kernel, dtype of its callers' lengths: int64 unless the table says)
    of each kernel found."""
    import torch

    found = []
    for module_name, name, *lens in kernels:
        try:
            fn = getattr(importlib.import_module(module_name), name, None)
        except Exception as e:  # noqa: BLE001 - a missing or broken module must not stop the server
            logger.info("kernel warm-up: %s.%s not importable (%s)", module_name, name, e)
            continue
        if fn is None:
            logger.info("kernel warm-up: %s has no %s", module_name, name)
            continue
        found.append((name, fn, getattr(torch, lens[0]) if lens else torch.int64))
    return found


def _kv_pool(worker):
    """The KV pool whose ``move_kv_cache`` moves the accepted tokens (the worker's allocator's, as
    SGLang's move reads it), or None."""
    alloc = getattr(worker, "token_to_kv_pool_allocator", None)
    if alloc is not None and hasattr(alloc, "get_kvcache"):
        return alloc.get_kvcache()
    return getattr(getattr(worker, "model_runner", None), "token_to_kv_pool", None)


def _next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def warm_spec_kernels(worker, max_bs: int | None = None, width: int | None = None, device=None,
                      kernels=KERNELS, clock=time.perf_counter, widths=None, accept=ACCEPT_FILL,
                      plain: bool = False) -> dict:
    """Run each kernel of ``kernels`` once per batch-size bucket up to ``max_bs`` (default: the
    worker's ``max_batch_size``, its most running requests) on scratch tensors: one ``req_to_token``
    row of the server's row length and dtype, every request on that row with ``width`` (default: the
    worker's draft tokens) slots of its own, the lengths in the dtype the kernel's callers use. Then
    the accepted tokens' move for every slot count batch size x verify width (``widths``, default
    ``(width,)``): ``accept``'s kernel once per power-of-two bucket on scratch tensors, and the
    worker's KV pool moving slot 0 onto itself (``move_kv_cache``, SGLang's own call path) once per
    count. ``plain`` (auto verify mode): the plain decode step's kernels as well
    (``plain_step.warm``). Each kernel run's output is checked against what it must produce; a
    mismatch is logged. Every new bucket compiles once on a machine whose Triton cache lacks it (up
    to a second each), so the time is logged. Returns what was done: {"kernels", "buckets", "moves",
    "seconds", "mismatches", "plain_variants"}, or {"skipped": reason}."""
    import torch

    pool = getattr(getattr(getattr(worker, "model_runner", None), "req_to_token_pool", None),
                   "req_to_token", None)
    if pool is None:
        return {"skipped": "no req_to_token pool"}
    device = device if device is not None else pool.device
    if torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return {"skipped": f"device {device} runs no Triton kernels"}
    max_bs = int(max_bs if max_bs is not None else getattr(worker, "max_batch_size", 0) or 0)
    width = int(width if width is not None else getattr(worker, "draft_token_num", 0) or 0)
    if max_bs < 1 or width < 1:
        return {"skipped": f"batch size {max_bs} / width {width}"}
    found = _kernels(kernels)
    fill = _kernels((accept,)) if accept else []
    kv = _kv_pool(worker)
    if not found and not fill and kv is None and not plain:
        return {"skipped": "no kernel found"}
    t0 = clock()
    pool_len = int(pool.shape[1])
    # slot j of the row: j
    row = torch.arange(pool_len, dtype=pool.dtype, device=device).view(1, pool_len)
    done, mismatches = [], []
    for name, kernel, lens in found:
        try:
            for b in buckets(max_bs):
                n = b * width
                idx = torch.zeros(b, dtype=torch.int64, device=device)  # every request on row 0 ...
                # ... request i at slots i * width .. (i + 1) * width (wrapped in a
                # row too short for them all)
                start = ((torch.arange(b, dtype=torch.int64, device=device) * width)
                         % max(pool_len - width, 1)).to(lens)
                end = start + width
                # a free-list slice at an odd offset is not 16-byte aligned: a variant of its own
                for offset in ((0, 1) if name in FREE_LIST_OUT else (0,)):
                    scratch = row.clone()
                    if name == "assign_extend_cache_locs":  # row slots -> the packed list
                        out = torch.zeros(n + offset, dtype=torch.int64, device=device)[offset:]
                        kernel[(b,)](idx, scratch, start, end, out, pool_len, b)
                        got, want = out, torch.arange(n, dtype=torch.int64, device=device)
                    else:  # the packed list -> row slots
                        out = (torch.arange(n + offset, dtype=torch.int64, device=device)
                               + 7)[offset:]
                        kernel[(b,)](idx, scratch, start, end, out, pool_len, b)
                        got, want = scratch[0, :n].to(torch.int64), out
                    if n <= pool_len - width and not torch.equal(got.cpu(), want.cpu()):
                        mismatches.append((name, b) + (("unaligned",) if offset else ()))
            done.append(name)
        except Exception as e:  # noqa: BLE001 - a warm-up must never stop the server
            logger.warning("kernel warm-up: %s failed (%s: %s); it compiles on first use "
                           "instead", name,
                           type(e).__name__, e)
    sizes = accept_sizes(max_bs, widths if widths else (width,))
    for name, kernel, _ in fill:
        try:
            for u in sorted({_next_power_of_2(n) for n in sizes}):
                # slot i of the accepted list takes the draft slot index[i] (reversed here); -1 is a
                # rejected draft, which the kernel skips, packing the rest
                index = torch.arange(u, dtype=torch.int32, device=device).flip(0)
                if u > 1:
                    index[-1] = -1
                locs = torch.arange(u, dtype=torch.int64, device=device) + 11
                out = torch.zeros(u, dtype=torch.int64, device=device)
                kernel[(u,)](index, locs, out, u)
                want = torch.zeros(u, dtype=torch.int64, device=device)
                kept = index[index >= 0].to(torch.int64)
                want[:kept.numel()] = locs[kept]
                if not torch.equal(out.cpu(), want.cpu()):
                    mismatches.append((name, u))
            done.append(name)
        except Exception as e:  # noqa: BLE001
            logger.warning("kernel warm-up: %s failed (%s: %s); it compiles on first use "
                           "instead", name,
                           type(e).__name__, e)
    moves = 0
    if kv is not None and hasattr(kv, "move_kv_cache"):
        try:
            for n in sizes:  # slot 0 (the padding slot) onto itself: no KV changes
                kv.move_kv_cache(torch.zeros(n, dtype=torch.int64, device=device),
                                 torch.zeros(n, dtype=torch.int64, device=device))
                moves += 1
            done.append("move_kv_cache")
        except Exception as e:  # noqa: BLE001
            logger.warning("kernel warm-up: move_kv_cache failed (%s: %s); it compiles on first "
                           "use instead",
                           type(e).__name__, e)
    plain_variants = 0
    if plain:
        try:
            from fastverify import plain_step

            res = plain_step.warm(device, width, pool.dtype)
            if "skipped" in res:
                logger.info("kernel warm-up: plain step kernels skipped (%s)", res["skipped"])
            else:
                mismatches.extend(("plain_step", m) for m in res["mismatches"])
                done.append("plain_step")
                plain_variants = res["variants"]
                logger.info("kernel warm-up: plain step kernels, %d variants, launched directly "
                            "after the first: %s",
                            plain_variants, "off (" + res["direct_off"] + ")"
                            if res.get("direct_off")
                            else f"checked for {res.get('direct_checked', 0)}")
        except Exception as e:  # noqa: BLE001
            logger.warning("kernel warm-up: plain step kernels failed (%s: %s); they compile on "
                           "first use instead",
                           type(e).__name__, e)
    if mismatches:
        logger.warning("kernel warm-up: unexpected output from %s", mismatches)
    seconds = clock() - t0
    logger.info("kernel warm-up: %s for batch-size buckets %s and %d accepted-slot counts in %.2f "
                "s",
                ", ".join(done) or "nothing", buckets(max_bs), moves, seconds)
    return {"kernels": done, "buckets": buckets(max_bs), "moves": moves, "seconds": seconds,
            "mismatches": mismatches, "plain_variants": plain_variants}
