#!/usr/bin/env python3
"""Per-kernel regression benchmarks of the verify path on one GPU.

Kernels: residual add + RMSNorm (unfused torch ops and one fused Triton kernel) at verify token counts,
chain and tree mask / position construction, greedy chain and tree acceptance. Each is checked against a
reference (fp32 for the norm, plain Python for the rest) before it is timed; a wrong kernel is reported and
not timed. Times are medians of CUDA-event-timed CUDA-graph replays (``--calls`` calls per graph).

A reference measured in the same run (a 64 MiB device-to-device copy) lets ``compare.py`` judge ratios
rather than absolute times, which drift between machines of one kind.

  python benchmark/kernels/run.py --json benchmark/results/h200/kernels.json
  python benchmark/kernels/compare.py benchmark/results/h200/kernels.json new.json --threshold 0.15
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from fastverify.bench import common
from fastverify.bench.kernels import addnorm
from fastverify.bench.kernels import verify_ops as V

SCRIPT = "benchmark/kernels/run.py"
FORMAT = "fastverify-kernel-bench/1"


def kernel_names(hidden: int, tokens: Sequence[int], shapes: Sequence[Sequence[int]]) -> List[str]:
    names = []
    for t in tokens:
        names += [f"add_rmsnorm_torch/T={t}/H={hidden}", f"add_rmsnorm_fused/T={t}/H={hidden}"]
    for bs, k in shapes:
        names += [f"chain_mask/bs={bs}/k={k}", f"chain_positions/bs={bs}/k={k}", f"tree_mask/bs={bs}/k={k}",
                  f"tree_positions/bs={bs}/k={k}", f"greedy_accept_chain/bs={bs}/k={k}",
                  f"greedy_accept_tree/bs={bs}/k={k}"]
    return names


def _time(fn: Callable[[], Any], calls: int, replays: int, graph: bool = True) -> float:
    """us per call: a CUDA graph of ``calls`` calls, median over ``replays`` replays (eager when
    graph=False)."""
    return common.time_gpu_us(fn, replays, calls=calls, graph=graph)["median_us"]


def run(args) -> Dict[str, Any]:
    import torch

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.cuda.set_stream(torch.cuda.Stream())
    rng = random.Random(7)
    results: Dict[str, Any] = {}
    wrong: List[str] = []

    src = torch.randn(64 << 20 >> 1, device=dev, dtype=torch.bfloat16)  # 64 MiB
    dst = torch.empty_like(src)
    ref_us = _time(lambda: dst.copy_(src), 5, args.replays)
    src = dst = None  # free the 128 MiB

    H = args.hidden
    eps = 1e-6
    w = (1 + 0.1 * torch.randn(H, device=dev)).to(torch.bfloat16)
    for t in args.tokens:
        x = torch.randn(t, H, device=dev, dtype=torch.bfloat16)
        r = torch.randn(t, H, device=dev, dtype=torch.bfloat16)
        ref_o, ref_r = addnorm.add_rmsnorm_ref(x, r, w, eps)
        for name, fn in (("add_rmsnorm_torch", addnorm.add_rmsnorm_torch),
                         ("add_rmsnorm_fused", addnorm.add_rmsnorm_fused)):
            key = f"{name}/T={t}/H={H}"
            o, ro = fn(x, r, w, eps)
            err = max(float((o.float() - ref_o).norm() / ref_o.norm()), float((ro.float() - ref_r).norm() / ref_r.norm()))
            if not (err <= 1e-2):
                wrong.append(key)
                results[key] = {"error": f"wrong result: rel err {err:.3g}"}
                continue
            results[key] = {"us": _time(lambda: fn(x, r, w, eps), args.calls, args.replays), "rel_err": err}

    for bs, k in args.shapes:
        seq_lens_l = [rng.randrange(16, 64) for _ in range(bs)]
        parents_l = [V.random_tree(k, rng) for _ in range(bs)]
        draft_l = [[rng.randrange(4) for _ in range(k)] for _ in range(bs)]
        target_l = [[rng.randrange(4) for _ in range(k)] for _ in range(bs)]
        seq_lens = torch.tensor(seq_lens_l, device=dev)
        parents = torch.tensor(parents_l, device=dev)
        draft = torch.tensor(draft_l, device=dev)
        target = torch.tensor(target_l, device=dev)
        cases = [
            ("chain_mask", lambda: V.chain_mask(seq_lens, k), V.chain_mask_ref(seq_lens_l, k), False),
            ("chain_positions", lambda: V.chain_positions(seq_lens, k),
             [L + i for L in seq_lens_l for i in range(k)], True),
            ("tree_mask", lambda: V.tree_mask(seq_lens, parents), V.tree_mask_ref(seq_lens_l, parents_l), False),
            ("tree_positions", lambda: V.tree_positions(seq_lens, parents),
             V.tree_positions_ref(seq_lens_l, parents_l), False),
            ("greedy_accept_chain", lambda: V.greedy_accept_chain(draft, target),
             V.greedy_accept_chain_ref(draft_l, target_l), True),
            ("greedy_accept_tree", lambda: V.greedy_accept_tree(draft, target, parents),
             V.greedy_accept_tree_ref(draft_l, target_l, parents_l), False),
        ]
        for name, fn, ref, graphable in cases:
            key = f"{name}/bs={bs}/k={k}"
            got = fn().tolist()
            if got != ref:
                wrong.append(key)
                results[key] = {"error": "wrong result"}
                continue
            # ops that read sizes on the host (.tolist(), nonzero) cannot be captured: timed eagerly
            results[key] = {"us": _time(fn, args.calls, args.replays, graph=graphable),
                            "mode": "graph" if graphable else "eager"}
    for v in results.values():
        if "us" in v:
            v["ref_ratio"] = v["us"] / ref_us
    return {"format": FORMAT, "reference": {"name": "copy_64MiB", "us": ref_us}, "kernels": results,
            "wrong": wrong}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description="per-kernel regression benchmarks (one GPU)")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tokens", default="8,64,512", help="token counts for add+RMSNorm")
    ap.add_argument("--shapes", default="1x8,8x8,32x16", help="bs x k for mask/position/acceptance kernels")
    ap.add_argument("--calls", type=int, default=20, help="calls per timed graph")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="list the kernels and exit")
    args = ap.parse_args(argv)
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
        args.shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        if any(len(s) != 2 or min(s) <= 0 for s in args.shapes):
            raise ValueError
    except ValueError:
        ap.error("--tokens: comma list of integers; --shapes: comma list of BSxK, e.g. 1x8,8x8")
    if args.dry_run:
        print("\n".join(kernel_names(args.hidden, args.tokens, args.shapes)))
        return 0
    try:
        common.require_gpus(1, "kernels/run.py")
    except common.NoGpuError as e:
        return common.exit_no_gpu(e)
    common.enforce_no_multicast()
    out = run(args)
    info = common.collect_env()
    print(common.format_preamble(info, {"argv": " ".join(argv)},
                                 [f"reference: {out['reference']['name']} = {out['reference']['us']:.1f} us",
                                  "us: median per call of CUDA-graph replays (mode eager: host-synchronizing ops)"]))
    rows = [[k, v.get("us"), v.get("ref_ratio"), v.get("mode", "graph"), v.get("error", "")]
            for k, v in out["kernels"].items()]
    print(common.format_table(["kernel", "us", "x ref", "mode", "error"], rows, floatfmt="{:.3f}"))
    print(f"# wrong results: {len(out['wrong'])}")
    out["env"] = info
    if args.json:
        common.write_json(args.json, out, common.repro_command(argv, SCRIPT))
    return 1 if out["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
