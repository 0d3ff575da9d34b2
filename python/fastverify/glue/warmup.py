"""Start-up compilation of the Triton kernels that SGLang's n-gram speculative step runs outside CUDA graphs.

Two kernels of that step take ``next_power_of_2(batch size)`` as a compile-time constant: the scheduler's
``assign_req_to_token_pool`` (the KV slots a decode step reserves for its drafts) and
``assign_extend_cache_locs`` (the worker reading those slots, and moving the accepted tokens' KV). Triton
compiles a kernel the first time it meets a new value of such a constant, so on a machine whose Triton cache
does not hold them yet, the first step at batch size 2, then 3, then 5, ... stops the whole batch while they
compile (120-450 ms steps in the GPU runs, inside the n-gram step and the batch preparation, never in a plain
server, whose decode step writes its slots with torch indexing). Here every bucket up to the worker's
largest batch runs each kernel once on scratch tensors shaped like the server's own (the same dtypes and
``req_to_token`` row length, the other compile-time constant), so that compilation happens before serving;
with Triton's on-disk cache a later start only loads them.

Called from ``verify_runtime.build_runtimes`` (patch 0008's seam in ``NGRAMWorker.init_cuda_graphs``), so
every n-gram server of the series warms alike. ``FASTVERIFY_WARM_KERNELS=0`` turns it off (for an A/B run).
Nothing fails start-up: a kernel that cannot be found or run is logged and skipped.
"""
from __future__ import annotations

import importlib
import logging
import os
import time

logger = logging.getLogger("fastverify.warmup")

ENV = "FASTVERIFY_WARM_KERNELS"
# (module, kernel): the step's Triton kernels with next_power_of_2(batch size) as a tl.constexpr; both pinned
# SGLang versions define them with the signature (req_pool_indices, req_to_token, start_offset, end_offset,
# out_cache_loc, pool_len: constexpr, bs_upper: constexpr)
KERNELS = (
    ("sglang.srt.mem_cache.allocation", "assign_req_to_token_pool"),
    ("sglang.kernels.ops.speculative.cache_locs", "assign_extend_cache_locs"),
)


def buckets(max_bs: int) -> list:
    """The values next_power_of_2(bs) takes for bs = 1..max_bs."""
    out, b = [], 1
    while True:
        out.append(b)
        if b >= max_bs:
            return out
        b *= 2


def _kernels(kernels=KERNELS) -> list:
    found = []
    for module_name, name in kernels:
        try:
            fn = getattr(importlib.import_module(module_name), name, None)
        except Exception as e:  # noqa: BLE001 - a missing or broken module must not stop the server
            logger.info("kernel warm-up: %s.%s not importable (%s)", module_name, name, e)
            continue
        if fn is None:
            logger.info("kernel warm-up: %s has no %s", module_name, name)
            continue
        found.append((name, fn))
    return found


def warm_spec_kernels(worker, max_bs: int | None = None, width: int | None = None, device=None,
                      kernels=KERNELS, clock=time.perf_counter) -> dict:
    """Run each kernel of ``kernels`` once per batch-size bucket up to ``max_bs`` (default: the worker's
    ``max_batch_size``, its most running requests) on scratch tensors: one ``req_to_token`` row of the
    server's row length and dtype, every request on that row with ``width`` (default: the worker's draft
    tokens) slots of its own. Each run's output is checked against what the kernel must produce (the slots
    gathered in order, or written in order); a mismatch is logged. Every bucket compiles once on a machine
    whose Triton cache lacks it (up to a second each), so the time is logged. Returns what was done:
    {"kernels", "buckets", "seconds", "mismatches"}, or {"skipped": reason}."""
    if os.environ.get(ENV, "1") == "0":
        return {"skipped": f"{ENV}=0"}
    import torch

    pool = getattr(getattr(getattr(worker, "model_runner", None), "req_to_token_pool", None), "req_to_token", None)
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
    if not found:
        return {"skipped": "no kernel found"}
    t0 = clock()
    pool_len = int(pool.shape[1])
    row = torch.arange(pool_len, dtype=pool.dtype, device=device).view(1, pool_len)  # slot j of the row: j
    done, mismatches = [], []
    for name, kernel in found:
        try:
            for b in buckets(max_bs):
                n = b * width
                idx = torch.zeros(b, dtype=torch.int64, device=device)  # every request on row 0 ...
                # ... request i at slots i * width .. (i + 1) * width (wrapped in a row too short for them all)
                start = (torch.arange(b, dtype=torch.int64, device=device) * width) % max(pool_len - width, 1)
                end = start + width
                scratch = row.clone()
                if name == "assign_extend_cache_locs":  # row slots -> the packed list
                    out = torch.zeros(n, dtype=torch.int64, device=device)
                    kernel[(b,)](idx, scratch, start, end, out, pool_len, b)
                    got, want = out, torch.arange(n, dtype=torch.int64, device=device)
                else:  # the packed list -> row slots
                    out = torch.arange(n, dtype=torch.int64, device=device) + 7
                    kernel[(b,)](idx, scratch, start, end, out, pool_len, b)
                    got, want = scratch[0, :n].to(torch.int64), out
                if n <= pool_len - width and not torch.equal(got.cpu(), want.cpu()):
                    mismatches.append((name, b))
            done.append(name)
        except Exception as e:  # noqa: BLE001 - a warm-up must never stop the server
            logger.warning("kernel warm-up: %s failed (%s: %s); it compiles on first use instead", name,
                           type(e).__name__, e)
    if mismatches:
        logger.warning("kernel warm-up: unexpected output from %s", mismatches)
    seconds = clock() - t0
    logger.info("kernel warm-up: %s for batch-size buckets %s in %.2f s", ", ".join(done) or "nothing",
                buckets(max_bs), seconds)
    return {"kernels": done, "buckets": buckets(max_bs), "seconds": seconds, "mismatches": mismatches}
