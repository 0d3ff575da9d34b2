"""On a GPU: does the start-up warm-up compile every variant of the spec step's slot
kernel that serving meets?

Runs ``warmup.warm_spec_kernels`` on a stand-in worker (a req_to_token pool of the check's row
length on the GPU, batch sizes up to 8, widths 1, 2, 4, 8), then calls SGLang's
``assign_req_to_token_pool`` the way the scheduler's spec-decode allocation does (int32 lengths, the
slots a slice of a free list at an even and at an odd offset) for batch sizes 1-8, and counts the
kernel's in-memory compile cache before and after: a call the warm-up missed adds an entry (it would
compile, or load from disk, mid-serving).

    PYTHONPATH=python:$HOME/site python3 scripts/gpu/check_warm_variants.py [--json OUT] \\
        [--aligned-only]

Exit status 1 when a call met a variant the warm-up had not compiled (or the
warm-up's output mismatched).
"""
from __future__ import annotations

import argparse
import json
import sys


def cache_entries(kernel) -> int:
    caches = getattr(kernel, "device_caches", None)
    if caches is None:
        raise SystemExit("this Triton keeps no device_caches on its JIT functions: cannot count "
                         "variants")
    return sum(len(c[0]) for c in caches.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the counts here")
    ap.add_argument("--pool-len", type=int, default=32780,
                    help="req_to_token row length (the check's servers)")
    ap.add_argument("--aligned-only", action="store_true",
                    help="warm as before run28's fix: the slots only "
                    "16-byte aligned (to see what that misses)")
    args = ap.parse_args(argv)
    import types

    import torch
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

    from fastverify.glue import warmup

    if args.aligned_only:
        warmup.FREE_LIST_OUT = frozenset()
    dev = torch.device("cuda")
    pool = torch.zeros(4, args.pool_len, dtype=torch.int32, device=dev)
    runner = types.SimpleNamespace(req_to_token_pool=types.SimpleNamespace(req_to_token=pool))
    worker = types.SimpleNamespace(model_runner=runner, max_batch_size=8, draft_token_num=8)
    before = cache_entries(assign_req_to_token_pool)
    res = warmup.warm_spec_kernels(worker, widths=(1, 2, 4, 8))
    warmed = cache_entries(assign_req_to_token_pool)
    free = torch.arange(10_000, dtype=torch.int64, device=dev)  # the allocator's free list
    calls = []
    for bs in range(1, 9):
        for offset in (0, 1):  # pages taken before: an even or an odd count
            n = bs * 8
            out = free[offset:offset + n]
            rpi = torch.arange(bs, dtype=torch.int64, device=dev) % 4
            cur = torch.full((bs,), 16, dtype=torch.int32, device=dev)
            before_call = cache_entries(assign_req_to_token_pool)
            assign_req_to_token_pool[(bs,)](rpi, pool, cur, cur + 8, out, args.pool_len,
                                            warmup._next_power_of_2(bs))
            torch.cuda.synchronize()
            calls.append({"bs": bs, "aligned": out.data_ptr() % 16 == 0,
                          "new_variant": cache_entries(assign_req_to_token_pool) > before_call})
    report = {"warm_up": {k: v for k, v in res.items() if k != "mismatches"},
              "mismatches": res.get("mismatches"),
              "entries_before": before, "entries_after_warm_up": warmed,
              "entries_after_calls": cache_entries(assign_req_to_token_pool), "calls": calls,
              "missed": [c for c in calls if c["new_variant"]]}
    print(json.dumps(report, indent=1, default=str))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=str)
    return 1 if report["missed"] or report["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
