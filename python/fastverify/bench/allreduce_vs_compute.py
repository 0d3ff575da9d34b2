#!/usr/bin/env python3
"""Where one verify pass spends its time: the per-layer all-reduces against the
GEMMs, per all-reduce backend.

For each verify width k (tokens per request) and batch size, the pass has ``tokens = bs * k``
rows. One pass is built from the profile's per-layer work at TP-sharded shapes: each layer's
GEMMs, the all-reduce of ``[tokens, hidden]`` after the row-parallel ones (o_proj,
down_proj), then the residual add + RMSNorm (fused into the all-reduce where the backend
can). Reported per backend and size:

- compute-only pass (GEMMs + add/RMSNorm, no all-reduce), all-reduce-only (the pass's
  all-reduces back to back, plain and with add+RMSNorm), the interleaved pass, the all-reduce
  share of the pass, per-call latency;
- under CUDA graphs (how the server runs decode and verify: CUDA events around graph replays,
  medians) and eager (launch overhead).

Every backend's result is checked against an fp32 reference sum (and fp32 add+RMSNorm) before any
timing, eager and graph-replayed; wrong results are counted and reported.

Backends (each runs in its own group of processes: NCCL reads its variables once,
at communicator creation):
  nccl              torch.distributed NCCL, default settings
  nccl-tuned        a sweep of NCCL_PROTO x channels x NCCL_BUFFSIZE; the best per size is written
                    as a --nccl-tuning-profile JSON (--write-nccl-profile)
  symm-oneshot/-twoshot  torch symmetric-memory all-reduce (no multicast:
                         TORCH_SYMM_MEM_DISABLE_MULTICAST=1)
  flashinfer-ar / flashinfer-fused / flashinfer-fused-1shot  FlashInfer trtllm kAllReduce and
                    kARResidualRMSNorm (auto and forced one-shot)
  flashinfer-pcie   FlashInfer 0.7.x PCIe IPC all-reduce
  sglang-custom     reported "absent" unless sgl_kernel is importable (it is only listed)
  nccl-p2p-off      EMULATION of a PCIe-like regime on an NVLink machine:
                    NCCL_P2P_DISABLE=1 (SHM transport)

Example (2 GPUs):
  python benchmark/allreduce_vs_compute.py --profile kimi-k2.5 --shard-tp 8 --batch-sizes 1,4 \
      --json out.json --png out.png --write-nccl-profile nccl_profile.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fastverify import profiles as P
from fastverify.bench import common

SCRIPT = "benchmark/allreduce_vs_compute.py"
DEFAULT_WIDTHS = (1, 2, 4, 8, 16, 32, 64)
ALL_BACKENDS = ("nccl", "nccl-tuned", "symm-oneshot", "symm-twoshot", "flashinfer-ar",
                "flashinfer-fused",
                "flashinfer-fused-1shot", "flashinfer-pcie", "sglang-custom", "nccl-p2p-off")
FUSED_BACKENDS = ("flashinfer-fused", "flashinfer-fused-1shot")
EMULATION_NOTE = ("nccl-p2p-off is an EMULATION of a PCIe-like regime on the NVLink machine "
                  "(NCCL_P2P_DISABLE=1: peer traffic staged through host shared memory), not a "
                  "PCIe measurement")
NCCL_PROFILE_FORMAT = "fastverify-nccl-profile/1"
REL_TOL = 1e-2  # bf16 outputs against an fp32 reference: relative Frobenius error


# ========================================================================== plan (CPU-side, tested)

def parse_int_list(text: str, flag: str) -> List[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"error: {flag}: expected comma-separated integers, got "
                         f"{text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise SystemExit(f"error: {flag}: expected positive integers, got {text!r}")
    return vals


def parse_backends(text: str) -> List[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    if names == ["all"]:
        return list(ALL_BACKENDS)
    bad = [b for b in names if b not in ALL_BACKENDS]
    if bad or not names:
        raise SystemExit(f"error: --backends: unknown {bad or text!r}; allowed: all or "
                         f"{', '.join(ALL_BACKENDS)}")
    return names


def nccl_sweep_settings(protos: Sequence[str], channels: Sequence[int],
                        buffsizes: Sequence[str]) -> List[Dict[str, str]]:
    """The NCCL variable sets of the sweep (protocol x channels x buffer size);
    'default' leaves it unset."""
    out = []
    for proto, ch, buf in itertools.product(protos, channels, buffsizes):
        env = {"NCCL_PROTO": proto, "NCCL_MIN_NCHANNELS": str(ch), "NCCL_MAX_NCHANNELS": str(ch)}
        if buf != "default":
            env["NCCL_BUFFSIZE"] = str(int(buf))
        out.append(env)
    return out


def token_counts(widths: Sequence[int], batch_sizes: Sequence[int]) -> List[int]:
    return sorted({k * bs for k in widths for bs in batch_sizes})


def build_plan(args: argparse.Namespace) -> Dict[str, Any]:
    profile = P.load_profile_arg(args.profile)
    shard_tp = args.shard_tp or args.world
    # fail early, with the profile's own message, if the shapes do not shard
    gemms = [P.layer_gemms(profile, shard_tp, layer) for layer in range(profile.num_layers)]
    tokens = token_counts(args.widths, args.batch_sizes)
    jobs: List[Dict[str, Any]] = []
    b = set(args.backends)
    if getattr(args, "compute_only", False):
        b = set()
        jobs.append({"name": "compute", "env": {}, "variants": [], "compute": True, "pass": False})
    elif "nccl" in b or args.compute:
        jobs.append({"name": "nccl", "env": {}, "variants": ["nccl"], "compute": args.compute,
                     "pass": True})
    sym = [v for v in ("symm-oneshot", "symm-twoshot") if v in b]
    if sym:
        jobs.append({"name": "symm", "env": {}, "variants": sym, "compute": False, "pass": True})
    fi = [v for v in ("flashinfer-ar", "flashinfer-fused", "flashinfer-fused-1shot") if v in b]
    if fi:
        jobs.append({"name": "flashinfer", "env": {}, "variants": fi, "compute": False,
                     "pass": True, "pythonpath": args.flashinfer_site})
    if "flashinfer-pcie" in b:
        jobs.append({"name": "flashinfer-pcie", "env": {}, "variants": ["flashinfer-pcie"],
                     "compute": False, "pass": True, "pythonpath": args.flashinfer_pcie_site})
    if "nccl-p2p-off" in b:
        jobs.append({"name": "nccl-p2p-off", "env": {"NCCL_P2P_DISABLE": "1"},
                     "variants": ["nccl-p2p-off"],
                     "compute": False, "pass": True, "emulation": EMULATION_NOTE})
    # last: many small jobs, one per setting (NCCL reads its variables once per process)
    if "nccl-tuned" in b:
        for env in nccl_sweep_settings(args.nccl_protos, args.nccl_channels, args.nccl_buffsizes):
            tag = ",".join(f"{k.replace('NCCL_', '')}={v}" for k, v in env.items()
                           if k != "NCCL_MIN_NCHANNELS")
            jobs.append({"name": f"nccl-tuned[{tag}]", "env": env, "variants": ["nccl"],
                         "compute": False, "pass": False, "sweep": True})
    n_ar = profile.allreduces_per_pass
    summaries = {t: P.pass_summary(profile, shard_tp, t) for t in tokens}
    return {
        "profile": profile.to_dict(),
        "shard_tp": shard_tp,
        "world": args.world,
        "widths": list(args.widths),
        "batch_sizes": list(args.batch_sizes),
        "tokens": tokens,
        "allreduces_per_pass": n_ar,
        "gemms_per_layer": {str(i): [g.__dict__ for g in gemms[i]]
                            for i in sorted({0, profile.num_layers - 1})},
        "pass_counts": {str(t): summaries[t] for t in tokens},
        "jobs": jobs,
        "sglang_custom": "sglang-custom" in b,
        "compute_only": bool(getattr(args, "compute_only", False)),
    }


def print_plan(plan: Dict[str, Any]) -> None:
    prof = plan["profile"]
    print(f"# plan: profile {prof['name']} ({prof['num_layers']} layers, hidden "
          f"{prof['hidden_size']}), per-rank shapes at TP {plan['shard_tp']}, all-reduce over "
          f"{plan['world']} GPU(s)")
    print(f"# {plan['allreduces_per_pass']} all-reduces per pass; widths k={plan['widths']} x "
          f"batch sizes {plan['batch_sizes']} -> tokens {plan['tokens']}")
    rows = []
    for t in plan["tokens"]:
        s = plan["pass_counts"][str(t)]
        rows.append([t, s["allreduce_bytes_each"] / 1024, s["weight_bytes"] / 1e9,
                     s["gemm_flops"] / 1e12])
    print(common.format_table(["tokens", "AR KiB/call", "weights GB/pass", "GEMM TFLOP/pass"], rows,
                              floatfmt="{:.3f}"))
    for j in plan["jobs"]:
        extra = f" env={j['env']}" if j["env"] else ""
        print(f"# job {j['name']}: variants {j['variants']}{extra}"
              + (" [+compute]" if j.get("compute") else ""))
    if plan["sglang_custom"]:
        print("# sglang-custom: measured only if sgl_kernel is importable on the GPU machine")


# ============================================================================ per-rank worker (GPU)

class _Ctx:
    """Everything one rank needs: device, groups, the profile's weights and activation stand-ins."""

    def __init__(self, rank: int, world: int, port: int, plan: Dict[str, Any],
                 opts: Dict[str, Any]):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank, self.world = rank, world
        torch.cuda.set_device(rank)
        self.dev = torch.device("cuda", rank)
        import datetime

        # a rank that fails alone must not leave its peer waiting for the default 10-30 minutes
        tmo = datetime.timedelta(seconds=opts.get("collective_timeout_s", 60))
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, device_id=self.dev, timeout=tmo)
        self.group = dist.group.WORLD
        self.cpu_group = dist.new_group(backend="gloo", timeout=tmo)
        self.stream = torch.cuda.Stream()
        torch.cuda.set_stream(self.stream)
        self.plan, self.opts = plan, opts
        self.profile = P.ModelProfile(**plan["profile"])
        self.hidden = self.profile.hidden_size
        self.eps = self.profile.rms_norm_eps
        self.dtype = torch.bfloat16
        self.max_tokens = max(plan["tokens"])
        g = torch.Generator(device=self.dev)
        g.manual_seed(1234)  # same weights on both ranks is not required; same gamma is
        self.gamma = (1.0 + 0.1 * torch.randn(self.hidden, generator=g, device=self.dev)
                      ).to(self.dtype)
        self.weights = None

    def barrier(self):
        self.dist.barrier(group=self.cpu_group)

    def agree(self, value: float, op: str = "min") -> float:
        """The same number on every rank (over the CPU group), so no rank takes another branch."""
        t = self.torch.tensor([float(value)], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=getattr(self.dist.ReduceOp, op.upper()), group=self.cpu_group)
        return float(t.item())

    # ---- the inputs every rank can reproduce, so the reference needs no communication
    def rank_input(self, r: int, tokens: int, salt: int):
        torch = self.torch
        g = torch.Generator(device=self.dev)
        g.manual_seed(10007 * salt + 101 * r + tokens)
        return torch.randn(tokens, self.hidden, generator=g, device=self.dev, dtype=torch.float32)

    def ref_sum(self, tokens: int, salt: int):
        return sum(self.rank_input(r, tokens, salt).to(self.dtype).float()
                   for r in range(self.world))

    # ---- profile weights (rotated over a few slots: each layer still streams its full bytes)
    def build_weights(self):
        torch = self.torch
        tp = self.plan["shard_tp"]
        slots = self.opts["weight_slots"]
        self.layer_kinds = []
        kinds: Dict[Tuple, List] = {}
        for layer in range(self.profile.num_layers):
            gemms = P.layer_gemms(self.profile, tp, layer)
            key = tuple((g.name, g.k, g.n, g.experts) for g in gemms)
            if key not in kinds:
                kinds[key] = gemms
            self.layer_kinds.append(key)
        self.weights = {}
        for key, gemms in kinds.items():
            n_slots = slots if sum(1 for k in self.layer_kinds if k == key) > 1 else 1
            for s in range(n_slots):
                ws = []
                for gm in gemms:
                    shape = (gm.experts, gm.k, gm.n) if gm.experts > 1 else (gm.k, gm.n)
                    w = torch.empty(shape, device=self.dev, dtype=self.dtype).normal_(
                        0, 1.0 / math.sqrt(gm.k))
                    ws.append(w)
                self.weights[(key, s)] = (gemms, ws)
        self.slot_count = {key: (slots if sum(1 for k in self.layer_kinds if k == key) > 1 else 1)
                           for key in kinds}
        # activation stand-ins for GEMM inputs that are not the hidden state
        # ([max_tokens * topk, k])
        self.act = {}
        topk = max(1, self.profile.num_experts_per_tok)
        for key, gemms in kinds.items():
            for gm in gemms:
                rows = (self.max_tokens * (topk if gm.experts > 1 else 1)
                        + (gm.experts if gm.experts > 1 else 0))
                if gm.k not in self.act or self.act[gm.k].shape[0] < rows:
                    self.act[gm.k] = torch.randn(rows, gm.k, device=self.dev, dtype=self.dtype)

    def layer_half(self, layer: int, x, tokens: int, half: int):
        """The GEMMs of one half-layer (0: attention, 1: MLP/MoE); returns the
        [tokens, hidden] partial sum."""
        torch = self.torch
        key = self.layer_kinds[layer]
        gemms, ws = self.weights[(key, layer % self.slot_count[key])]
        split = next(i for i, g in enumerate(gemms) if g.allreduce_after) + 1
        part = range(0, split) if half == 0 else range(split, len(gemms))
        out = None
        shared = None
        up = None
        for i in part:
            gm, w = gemms[i], ws[i]
            if gm.experts > 1:
                active = P.active_experts_int(gm.experts, gm.topk, tokens)
                m = math.ceil(tokens * gm.topk / active)
                a = (self.act[gm.k][: active * m].view(active, m, gm.k)
                     if gm.name != "experts_down" or up is None else up[..., : gm.k])
                y = torch.bmm(a, w[:active])  # [active, m, n]
                if gm.name == "experts_gate_up":
                    up = y
                if gm.allreduce_after:
                    flat = y.view(-1, gm.n)[: tokens * gm.topk].view(tokens, gm.topk, gm.n)
                    out = flat.sum(dim=1)  # [tokens, hidden]
                    if shared is not None:
                        out = out + shared
            else:
                a = x if gm.k == self.hidden else self.act[gm.k][:tokens]
                y = a @ w  # [tokens, n]
                if gm.name == "shared_down":
                    shared = y
                if gm.allreduce_after:
                    out = y
        return out


def _make_variant(ctx: _Ctx, name: str):
    """Returns (ar(x) -> y, ar_norm(x, residual) -> (norm_out, residual_out) or None, info)."""
    torch, dist = ctx.torch, ctx.dist
    H = ctx.hidden

    if name in ("nccl", "nccl-p2p-off"):
        def ar(x):
            dist.all_reduce(x, group=ctx.group)
            return x
        return ar, None, {}
    if name in ("symm-oneshot", "symm-twoshot"):
        import torch.distributed._symmetric_memory as symm_mem

        gname = ctx.group.group_name
        try:
            symm_mem.enable_symm_mem_for_group(gname)
        except Exception:  # noqa: BLE001 - not needed on torch >= 2.11
            pass
        buf = symm_mem.empty(ctx.max_tokens * H, dtype=ctx.dtype, device=ctx.dev)
        hdl = symm_mem.rendezvous(buf, group=gname)
        ops = torch.ops.symm_mem
        info = {"multicast_ptr": int(getattr(hdl, "multicast_ptr", 0) or 0)}
        if info["multicast_ptr"]:
            raise RuntimeError("symmetric memory reports a multicast pointer; multicast must stay "
                               "off")
        if name == "symm-oneshot":
            def ar(x):
                b = buf[: x.numel()].view_as(x)
                b.copy_(x)
                out = torch.empty_like(x)
                ops.one_shot_all_reduce_out(b, "sum", gname, out)
                return out
        else:
            def ar(x):
                b = buf[: x.numel()].view_as(x)
                b.copy_(x)
                ops.two_shot_all_reduce_(b, "sum", gname)
                return b
        return ar, None, info
    if name.startswith("flashinfer-") and name != "flashinfer-pcie":
        import flashinfer
        import flashinfer.comm as comm

        ws = ctx.opts.setdefault("_fi_ws", None)
        if ws is None:
            ws = comm.create_allreduce_fusion_workspace(
                backend="trtllm", world_size=ctx.world, rank=ctx.rank, max_token_num=ctx.max_tokens,
                hidden_dim=H, dtype=ctx.dtype, gpus_per_node=ctx.world, group=ctx.group)
            ctx.opts["_fi_ws"] = ws
        pat = comm.AllReduceFusionPattern
        oneshot = True if name == "flashinfer-fused-1shot" else None

        def ar(x):
            out = torch.empty_like(x)
            comm.allreduce_fusion(input=x, workspace=ws, pattern=pat.kAllReduce,
                                  launch_with_pdl=True, output=out, use_oneshot=None, fp32_acc=True)
            return out

        def ar_norm(x, residual):
            norm_out = torch.empty_like(x)
            res_out = torch.empty_like(x)
            comm.allreduce_fusion(input=x, workspace=ws, pattern=pat.kARResidualRMSNorm,
                                  launch_with_pdl=True,
                                  residual_out=res_out, norm_out=norm_out, residual_in=residual,
                                  rms_gamma=ctx.gamma, rms_eps=ctx.eps, use_oneshot=oneshot,
                                  fp32_acc=True)
            return norm_out, res_out
        info = {"flashinfer": flashinfer.__version__,
                "workspace_backend": getattr(ws, "backend", "?")}
        return ar, (ar_norm if name in FUSED_BACKENDS else None), info
    if name == "flashinfer-pcie":
        import flashinfer
        from flashinfer.comm import PcieIpcAllReduceWorkspace

        ws = PcieIpcAllReduceWorkspace(group=ctx.group, max_numel=ctx.max_tokens * H,
                                       dtype=ctx.dtype)
        cfgs = ws.prepare([(t, H) for t in ctx.plan["tokens"]], dtype=ctx.dtype)
        unsupported = [t for (t, _), c in cfgs.items() if c is None]

        def ar(x):
            out = torch.empty_like(x)
            ws.all_reduce(x, out=out)
            return out
        return ar, None, {"flashinfer": flashinfer.__version__, "profile": ws.profile,
                          "unsupported_tokens": unsupported}
    raise ValueError(name)


def _rel_err(out, ref) -> float:
    o = out.float()
    if not bool(o.isfinite().all()):
        return float("inf")
    return float((o - ref).norm() / ref.norm().clamp_min(1e-12))


def _check(ctx: _Ctx, ar, ar_norm, tokens: int, salt: int) -> Dict[str, Any]:
    """Eager and graph-replayed checks against the fp32 reference; returns errors and pass/fail."""
    torch = ctx.torch
    from fastverify.bench.kernels.addnorm import add_rmsnorm_ref

    res: Dict[str, Any] = {}
    ref = ctx.ref_sum(tokens, salt)
    x = ctx.rank_input(ctx.rank, tokens, salt).to(ctx.dtype)
    y = ar(x.clone())
    torch.cuda.synchronize()
    res["ar_eager_err"] = _rel_err(y, ref)
    # graph-replayed: capture one call on a static input, replay on fresh data written into it
    static = torch.empty_like(x)
    static.copy_(x)
    s = ctx.stream
    for _ in range(2):
        static.copy_(x)
        ar(static)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
        gy = ar(static)
    x2 = ctx.rank_input(ctx.rank, tokens, salt + 7).to(ctx.dtype)
    ref2 = ctx.ref_sum(tokens, salt + 7)
    static.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    res["ar_graph_err"] = _rel_err(gy, ref2)
    del g
    if ar_norm is not None:
        resid = ctx.rank_input(0, tokens, salt + 3).to(ctx.dtype)  # same residual on every rank
        n_out, r_out = ar_norm(x.clone(), resid)
        torch.cuda.synchronize()
        ref_n, ref_r = add_rmsnorm_ref(ref.to(ctx.dtype), resid, ctx.gamma, ctx.eps)
        res["norm_err"] = _rel_err(n_out, ref_n)
        res["residual_err"] = _rel_err(r_out, ref_r)
    res["ok"] = all(v <= REL_TOL for k, v in res.items() if k.endswith("_err"))
    return res


def _sizes_loop(ctx: _Ctx, job: Dict[str, Any], variant: str, out: Dict[str, Any]) -> None:
    torch = ctx.torch
    from fastverify.bench.kernels.addnorm import add_rmsnorm_fused, add_rmsnorm_torch

    n_ar = ctx.plan["allreduces_per_pass"]
    ar, ar_norm, info = _make_variant(ctx, variant)
    vres = out.setdefault("variants", {}).setdefault(variant, {"info": info, "sizes": {}})
    replays = ctx.opts["replays"]
    for t in ctx.plan["tokens"]:
        rec: Dict[str, Any] = {}
        vres["sizes"][str(t)] = rec
        try:
            chk = _check(ctx, ar, ar_norm, t, salt=t)
            rec["check"] = chk
            chk["ok_all_ranks"] = bool(ctx.agree(1.0 if chk["ok"] else 0.0, "min"))
            if not chk["ok_all_ranks"]:
                rec["error"] = "wrong result"
                continue
            # values stay finite over 122 sums
            x = ctx.rank_input(ctx.rank, t, 99).to(ctx.dtype).mul_(1e-3)
            resid = ctx.rank_input(0, t, 98).to(ctx.dtype)

            def ar_chain():
                y = x
                for _ in range(n_ar):
                    y = ar(y)
                return y

            def arnorm_chain(norm_fn):
                def fn():
                    h, r = x, resid
                    for _ in range(n_ar):
                        if norm_fn is None:
                            h, r = ar_norm(h, r)
                        else:
                            h, r = norm_fn(ar(h), r, ctx.gamma, ctx.eps)
                    return h
                return fn

            tg = common.time_gpu_us(ar_chain, replays, graph=True, stream=ctx.stream,
                                    sync=ctx.barrier)
            rec["ar_graph_us_per_call"] = tg["median_us"] / n_ar
            del tg
            te = common.time_gpu_us(ar_chain, max(5, replays // 4), sync=ctx.barrier)
            rec["ar_eager_us_per_call"] = te["median_us"] / n_ar
            if ar_norm is not None:
                tn = common.time_gpu_us(arnorm_chain(None), replays, graph=True, stream=ctx.stream,
                                        sync=ctx.barrier)
                rec["arnorm_graph_us_pass"] = tn["median_us"]
                del tn
            elif not job.get("sweep"):
                tn = common.time_gpu_us(arnorm_chain(add_rmsnorm_fused), replays, graph=True,
                                        stream=ctx.stream, sync=ctx.barrier)
                # all-reduce, then one fused add+RMSNorm kernel
                rec["arnorm_graph_us_pass"] = tn["median_us"]
                del tn
                if variant == "nccl":
                    tu = common.time_gpu_us(arnorm_chain(add_rmsnorm_torch), replays, graph=True,
                                            stream=ctx.stream, sync=ctx.barrier)
                    # all-reduce, then add and norm as torch ops
                    rec["arnorm_unfused_graph_us_pass"] = tu["median_us"]
                    del tu
            if job.get("pass") and ctx.opts["passes"]:
                rec.update(_time_pass(ctx, t, ar, ar_norm, with_ar=True))
        except Exception as e:  # noqa: BLE001 - record, keep going
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()[-2000:]
        torch.cuda.empty_cache()


def _time_pass(ctx: _Ctx, tokens: int, ar, ar_norm, with_ar: bool) -> Dict[str, Any]:
    torch = ctx.torch
    from fastverify.bench.kernels.addnorm import add_rmsnorm_fused

    if ctx.weights is None:
        ctx.build_weights()
    L = ctx.profile.num_layers
    x0 = ctx.rank_input(ctx.rank, tokens, 55).to(ctx.dtype)
    r0 = ctx.rank_input(0, tokens, 56).to(ctx.dtype)

    def one_pass():
        h, r = x0, r0
        for layer in range(L):
            for half in (0, 1):
                part = ctx.layer_half(layer, h, tokens, half)  # [tokens, hidden] partial sum
                if not with_ar:
                    h, r = add_rmsnorm_fused(part, r, ctx.gamma, ctx.eps)
                elif ar_norm is not None:
                    h, r = ar_norm(part, r)
                else:
                    h, r = add_rmsnorm_fused(ar(part), r, ctx.gamma, ctx.eps)
        return h

    # a first eager pass sizes the number of replays (~budget_s per measurement)
    t0 = time.perf_counter()
    one_pass()
    torch.cuda.synchronize()
    est = max(1e-4, time.perf_counter() - t0)
    replays = int(min(ctx.opts["pass_replays"],
                      max(5, ctx.opts["pass_budget_s"] / ctx.agree(est, "max"))))
    tg = common.time_gpu_us(one_pass, replays, graph=True, stream=ctx.stream, sync=ctx.barrier,
                            pre_capture_warmup=1, warmup=2)
    key = "pass_graph_us" if with_ar else "compute_graph_us"
    out = {key: tg["median_us"], key + "_replays": replays}
    del tg
    torch.cuda.empty_cache()
    return out


def _worker(rank: int, world: int, port: int, plan: Dict[str, Any], job: Dict[str, Any],
            opts: Dict[str, Any], queue) -> None:
    out: Dict[str, Any] = {"job": job["name"], "rank": rank}
    try:
        for k, v in job.get("env", {}).items():
            os.environ[k] = v
        common.enforce_no_multicast()
        if job.get("pythonpath"):
            for d in reversed(job["pythonpath"].split(os.pathsep)):
                sys.path.insert(0, d)
        ctx = _Ctx(rank, world, port, plan, opts)
        out["env"] = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_SYMM"))}
        if job.get("compute"):
            comp = out.setdefault("compute", {})
            for t in plan["tokens"]:
                try:
                    comp[str(t)] = _time_pass(ctx, t, None, None, with_ar=False)["compute_graph_us"]
                except Exception as e:  # noqa: BLE001
                    comp[str(t)] = None
                    out.setdefault("errors", []).append(f"compute {t}: {type(e).__name__}: {e}")
        for variant in job["variants"]:
            try:
                _sizes_loop(ctx, job, variant, out)
            except Exception as e:  # noqa: BLE001 - a backend that cannot start is reported, not fatal
                out.setdefault("variants", {})[variant] = {
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()[-3000:]}
        if rank == 0:
            queue.put(out)  # before the teardown, which can be slow
        ctx.barrier()
        ctx.dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        out["fatal"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-3000:]
        queue.put(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(mp_ctx, plan, job, opts, timeout_s: float) -> Dict[str, Any]:
    q = mp_ctx.Queue()
    port = _free_port()
    procs = [mp_ctx.Process(target=_worker, args=(r, plan["world"], port, plan, job, opts, q))
             for r in range(plan["world"])]
    t0 = time.time()
    for p in procs:
        p.start()
    result: Optional[Dict[str, Any]] = None
    fatal = []
    deadline = t0 + timeout_s
    while time.time() < deadline:
        try:
            msg = q.get(timeout=1.0)
        except Exception:  # noqa: BLE001 - queue.Empty
            if all(not p.is_alive() for p in procs):
                try:
                    msg = q.get(timeout=2.0)
                except Exception:  # noqa: BLE001
                    break
            else:
                continue
        if msg.get("fatal"):
            fatal.append(msg)  # the other ranks would wait forever in a collective: stop the job
            break
        result = msg
        break
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.time()) if result else 5.0)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    if result is None:
        result = {"job": job["name"], "error": "timeout" if time.time() >= deadline
                  else "no result",
                  "fatal": [f.get("fatal") for f in fatal],
                  "traceback": [f.get("traceback") for f in fatal]}
    result["wall_s"] = round(time.time() - t0, 1)
    result["job_env"] = job.get("env", {})
    return result


# =================================================================== aggregation (CPU-side, tested)

def best_nccl_per_size(sweep_results: Sequence[Dict[str, Any]],
                       tokens: Sequence[int]) -> Dict[int, Dict[str, Any]]:
    """For each token count, the sweep setting with the lowest graph per-call
    latency among correct runs."""
    best: Dict[int, Dict[str, Any]] = {}
    for res in sweep_results:
        sizes = res.get("variants", {}).get("nccl", {}).get("sizes", {})
        for t in tokens:
            rec = sizes.get(str(t)) or {}
            us = rec.get("ar_graph_us_per_call")
            if us is None or rec.get("error"):
                continue
            if t not in best or us < best[t]["us"]:
                best[t] = {"us": us, "env": dict(res.get("job_env", {}))}
    return best


def nccl_profile_payload(best: Dict[int, Dict[str, Any]], hidden: int, dtype_bytes: int,
                         source: Dict[str, Any],
                         default_us: Optional[Dict[int, float]] = None) -> Dict[str, Any]:
    """The --nccl-tuning-profile document (fastverify.nccl format).

    "by_size": the best sweep setting per all-reduce size, with NCCL's default time at that size
    when it was measured in the same run. "env": the setting that wins the most sizes among those
    where it beats the default (all sizes when the default was not measured).
    ``source["beats_default_sizes"]`` says at how many sizes the sweep beat the default: 0 means the
    defaults are already best on this machine.
    """
    if not best:
        raise ValueError("no correct NCCL sweep results to build a tuning profile from")
    default_us = default_us or {}
    better = {t: b for t, b in best.items() if t not in default_us or b["us"] < default_us[t]}
    pool = better or best
    wins: Dict[str, List[float]] = {}
    for t, b in pool.items():
        wins.setdefault(json.dumps(b["env"], sort_keys=True), []).append(b["us"])
    overall = max(wins.items(), key=lambda kv: (len(kv[1]), -sum(kv[1])))[0]
    by_size = []
    for t in sorted(best):
        row = {"bytes": t * hidden * dtype_bytes, "tokens": t, "best": best[t]["env"],
               "us": round(best[t]["us"], 2)}
        if t in default_us:
            row["default_us"] = round(default_us[t], 2)
        by_size.append(row)
    src = dict(source)
    if default_us:
        src["beats_default_sizes"] = f"{len(better)} of {len(best)}"
    return {"format": NCCL_PROFILE_FORMAT, "env": json.loads(overall), "source": src,
            "by_size": by_size}


def write_nccl_profile(path: str, payload: Dict[str, Any]) -> str:
    """Through fastverify.nccl.write_profile (which validates by reading back)
    when the library has it."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        from fastverify import nccl as fv_nccl  # type: ignore
    except ImportError:
        fv_nccl = None
    if fv_nccl is not None and hasattr(fv_nccl, "write_profile"):
        fv_nccl.write_profile(path, payload["env"], payload["source"], payload["by_size"])
        return "fastverify.nccl.write_profile"
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")
    return "json"


def emit_nccl_profile(path: str, plan: Dict[str, Any], summary: Dict[str, Any],
                      info: Dict[str, Any], command: str) -> Dict[str, Any]:
    payload = nccl_profile_payload(summary["nccl_best"], plan["profile"]["hidden_size"], 2, source={
        "gpu": ", ".join(info.get("gpus", [])), "nccl": info.get("nccl", ""),
        "date": info.get("date_utc", ""), "command": command,
        "note": "best per size over the sweep (CUDA-graph per-call medians); env = the setting "
                "that wins the most sizes where it beats NCCL's defaults"},
                default_us=summary.get("nccl_default"))
    how = write_nccl_profile(path, payload)
    beats = payload["source"].get("beats_default_sizes", "?")
    print(f"# NCCL tuning profile written to {path} ({how}); the sweep beats NCCL's defaults at "
          f"{beats} sizes")
    return payload


def summarize(plan: Dict[str, Any], results: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Rows per (backend, tokens): per-call latency, pass totals, shares; plus the
    target checks at k=8."""
    n_ar = plan["allreduces_per_pass"]
    compute: Dict[str, Optional[float]] = {}
    for r in results:
        if r.get("compute"):
            compute.update(r["compute"])
    rows = []
    wrong = 0
    per_backend: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for r in results:
        if r.get("job", "").startswith("nccl-tuned"):
            continue
        for vname, v in (r.get("variants") or {}).items():
            for ts, rec in (v.get("sizes") or {}).items():
                t = int(ts)
                if rec.get("error") == "wrong result":
                    wrong += 1
                per_backend.setdefault(vname, {})[t] = rec
    sweep = [r for r in results if r.get("job", "").startswith("nccl-tuned")]
    for r in sweep:
        for rec in (r.get("variants", {}).get("nccl", {}).get("sizes", {}) or {}).values():
            if rec.get("error") == "wrong result":
                wrong += 1
    best = best_nccl_per_size(sweep, plan["tokens"])
    default_us = {t: rec["ar_graph_us_per_call"] for t, rec in per_backend.get("nccl", {}).items()
                  if rec.get("ar_graph_us_per_call") is not None and not rec.get("error")}
    for t, b in best.items():
        per_backend.setdefault("nccl-tuned", {})[t] = {"ar_graph_us_per_call": b["us"],
                                                       "best_env": b["env"]}
    for vname in sorted(per_backend, key=lambda n: ALL_BACKENDS.index(n)
                        if n in ALL_BACKENDS else 99):
        for t in plan["tokens"]:
            rec = per_backend[vname].get(t)
            if rec is None:
                continue
            comp = compute.get(str(t))
            pas = rec.get("pass_graph_us")
            share = (pas - comp) / pas if (pas and comp) else None
            rows.append({
                "backend": vname, "tokens": t, "error": rec.get("error"),
                "ar_graph_us": rec.get("ar_graph_us_per_call"),
                "ar_eager_us": rec.get("ar_eager_us_per_call"),
                "ar_only_pass_us": (rec["ar_graph_us_per_call"] * n_ar)
                if rec.get("ar_graph_us_per_call") else None,
                "arnorm_pass_us": rec.get("arnorm_graph_us_pass"),
                "arnorm_unfused_pass_us": rec.get("arnorm_unfused_graph_us_pass"),
                "compute_us": comp, "pass_us": pas, "ar_share": share,
            })
    if plan.get("compute_only"):
        for t in plan["tokens"]:
            rows.append({"backend": "compute-only", "tokens": t, "error": None, "ar_graph_us": None,
                         "ar_eager_us": None, "ar_only_pass_us": None, "arnorm_pass_us": None,
                         "arnorm_unfused_pass_us": None, "compute_us": compute.get(str(t)),
                         "pass_us": None, "ar_share": None})
    targets = evaluate_targets(plan, rows)
    return {"rows": rows, "wrong_results": wrong, "targets": targets, "nccl_best": best,
            "nccl_default": default_us}


def evaluate_targets(plan: Dict[str, Any], rows: Sequence[Dict[str, Any]],
                     k: int = 8) -> Dict[str, Any]:
    """The issue's targets at k=8 (tokens = 8 * the smallest batch size)."""
    t = k * min(plan["batch_sizes"])
    at = [r for r in rows if r["tokens"] == t and not r.get("error")]
    unfused = [r for r in at if r["backend"] not in FUSED_BACKENDS
               and r["backend"] != "nccl-p2p-off" and r["ar_graph_us"] is not None]
    fused = [r for r in at if r["backend"] in FUSED_BACKENDS and r["arnorm_pass_us"]]
    nccl = next((r for r in at if r["backend"] == "nccl"), None)
    out: Dict[str, Any] = {"tokens": t}
    if unfused:
        b = min(unfused, key=lambda r: r["ar_graph_us"])
        out["best_unfused"] = {"backend": b["backend"], "us_per_call": b["ar_graph_us"],
                               "target_us": 8.0, "met": b["ar_graph_us"] <= 8.0}
    if fused:
        b = min(fused, key=lambda r: r["arnorm_pass_us"])
        per_call = b["arnorm_pass_us"] / plan["allreduces_per_pass"]
        out["best_fused"] = {"backend": b["backend"], "us_per_call": per_call, "target_us": 10.0,
                             "met": per_call <= 10.0}
        if nccl and nccl.get("arnorm_unfused_pass_us"):
            sp = nccl["arnorm_unfused_pass_us"] / b["arnorm_pass_us"]
            out["pass_speedup_vs_nccl_unfused"] = {"nccl_us": nccl["arnorm_unfused_pass_us"],
                                                   "fused_us": b["arnorm_pass_us"], "speedup": sp,
                                                   "target": 3.0, "met": sp >= 3.0}
        if nccl and nccl.get("arnorm_pass_us"):
            out["pass_speedup_vs_nccl_fused_addnorm_kernel"] = {
                "nccl_us": nccl["arnorm_pass_us"], "fused_us": b["arnorm_pass_us"],
                "speedup": nccl["arnorm_pass_us"] / b["arnorm_pass_us"]}
    return out


TABLE_COLS = ["backend", "tokens", "AR us/call", "eager us", "AR-only us", "AR+norm us",
              "compute us", "pass us", "AR share"]


def table_rows(summary: Dict[str, Any]) -> List[List[Any]]:
    rows = []
    for r in summary["rows"]:
        if r.get("error"):
            rows.append([r["backend"], r["tokens"], r["error"][:40], None, None, None,
                         None, None, None])
            continue
        share = f"{100 * r['ar_share']:.0f}%" if r.get("ar_share") is not None else "-"
        rows.append([r["backend"], r["tokens"], r["ar_graph_us"], r["ar_eager_us"],
                     r["ar_only_pass_us"],
                     r["arnorm_pass_us"], r["compute_us"], r["pass_us"], share])
    return rows


def plot_png(path: str, plan: Dict[str, Any], summary: Dict[str, Any]) -> bool:
    """Stacked bars per backend and k (smallest batch size): compute vs
    all-reduce time of one pass."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    bs = min(plan["batch_sizes"])
    ks = plan["widths"]
    rows = [r for r in summary["rows"] if r.get("pass_us") and r.get("compute_us")
            and not r.get("error")]
    backends = [b for b in ALL_BACKENDS if any(r["backend"] == b for r in rows)]
    if not backends:
        return False
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(ks) * len(backends) / 3), 5))
    width = 0.8 / len(backends)
    for i, b in enumerate(backends):
        xs, comp, comm_ = [], [], []
        for j, k in enumerate(ks):
            r = next((r for r in rows if r["backend"] == b and r["tokens"] == k * bs), None)
            if r is None:
                continue
            xs.append(j + i * width)
            comp.append(r["compute_us"] / 1e3)
            comm_.append(max(0.0, r["pass_us"] - r["compute_us"]) / 1e3)
        ax.bar(xs, comp, width, color=f"C{i}", alpha=0.45)
        ax.bar(xs, comm_, width, bottom=comp, color=f"C{i}", label=b, hatch="//", edgecolor="k",
               linewidth=0.3)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ks))])
    ax.set_xticklabels([f"k={k}" for k in ks])
    ax.set_ylabel("ms per verify pass (light: compute, hatched: all-reduce)")
    prof = plan["profile"]
    ax.set_title(f"{prof['name']}: {plan['allreduces_per_pass']} all-reduces/pass, shapes at TP "
                 f"{plan['shard_tp']}, {plan['world']} GPUs, batch {bs}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ============================================================================ CLI

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="kimi-k2.5",
                    help=f"built-in profile ({', '.join(P.BUILTIN_PROFILES)}) or a path to a HF "
                         "config.json")
    ap.add_argument("--shard-tp", type=int, default=0,
                    help="TP size whose per-rank GEMM shapes are used (default: the number of "
                         "GPUs). A value above the GPU count emulates that deployment's per-rank "
                         "compute")
    ap.add_argument("--world", type=int, default=2,
                    help="GPUs (ranks) in the all-reduce group (default 2)")
    ap.add_argument("--widths", default=",".join(map(str, DEFAULT_WIDTHS)), help="verify widths k")
    ap.add_argument("--batch-sizes", default="1", help="batch sizes (tokens = k x batch)")
    ap.add_argument("--backends", default="all",
                    help=f"all or a comma list of: {', '.join(ALL_BACKENDS)}")
    ap.add_argument("--no-compute", dest="compute", action="store_false",
                    help="skip the compute-only pass")
    ap.add_argument("--compute-only", action="store_true",
                    help="only the compute-only pass (runs on 1 GPU with --world 1): the GEMM side "
                         "of the split")
    ap.add_argument("--no-passes", dest="passes", action="store_false",
                    help="only all-reduce timings, no interleaved passes")
    ap.add_argument("--replays", type=int, default=30,
                    help="timed graph replays per all-reduce measurement")
    ap.add_argument("--pass-replays", type=int, default=20,
                    help="max timed replays per whole-pass measurement")
    ap.add_argument("--pass-budget-s", type=float, default=0.4,
                    help="target seconds per pass measurement")
    ap.add_argument("--weight-slots", type=int, default=2,
                    help="distinct weight copies the layers rotate over (each layer still streams "
                         "its bytes)")
    ap.add_argument("--nccl-protos", default="LL,LL128,Simple")
    ap.add_argument("--nccl-channels", default="2,8")
    ap.add_argument("--nccl-buffsizes", default="default,1048576")
    ap.add_argument("--flashinfer-site", default=None,
                    help="folder with FlashInfer 0.6.x (trtllm fusion)")
    ap.add_argument("--flashinfer-pcie-site", default=None,
                    help="folder with FlashInfer 0.7.x (PCIe IPC)")
    ap.add_argument("--job-timeout", type=float, default=120.0,
                    help="seconds before a backend's job is killed")
    ap.add_argument("--json", default=None, help="write all numbers + repro command here")
    ap.add_argument("--png", default=None, help="write the stacked-bar plot here")
    ap.add_argument("--write-nccl-profile", default=None,
                    help="write the sweep's best NCCL settings as a --nccl-tuning-profile JSON")
    ap.add_argument("--nccl-profile-from", default=None, metavar="RESULTS_JSON",
                    help="no GPU: rebuild the --write-nccl-profile file from the JSON of an "
                         "earlier run")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan and exit (no GPU needed)")
    return ap


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    args.widths = parse_int_list(args.widths, "--widths")
    args.batch_sizes = parse_int_list(args.batch_sizes, "--batch-sizes")
    args.backends = parse_backends(args.backends)
    args.nccl_protos = [p for p in args.nccl_protos.split(",") if p]
    bad = [p for p in args.nccl_protos if p not in ("LL", "LL128", "Simple")]
    if bad:
        ap.error(f"--nccl-protos: unknown {bad}; allowed: LL, LL128, Simple")
    args.nccl_channels = parse_int_list(args.nccl_channels, "--nccl-channels")
    args.nccl_buffsizes = [b for b in args.nccl_buffsizes.split(",") if b]
    for b in args.nccl_buffsizes:
        if b != "default" and not b.isdigit():
            ap.error(f"--nccl-buffsizes: {b!r} is neither 'default' nor a byte count")
    if args.world < 2 and not args.compute_only:
        ap.error("--world: an all-reduce needs at least 2 GPUs (or use --compute-only)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        plan = build_plan(args)
    except P.ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print_plan(plan)
        return 0
    if args.nccl_profile_from:
        if not args.write_nccl_profile:
            print("error: --nccl-profile-from needs --write-nccl-profile PATH", file=sys.stderr)
            return 2
        try:
            old = json.loads(Path(args.nccl_profile_from).read_text())
            summary = summarize(old["plan"], old["jobs"])
        except (OSError, ValueError, KeyError) as e:
            print(f"error: --nccl-profile-from {args.nccl_profile_from}: {e}", file=sys.stderr)
            return 2
        if not summary["nccl_best"]:
            print(f"error: --nccl-profile-from {args.nccl_profile_from}: no NCCL sweep results",
                  file=sys.stderr)
            return 2
        emit_nccl_profile(args.write_nccl_profile, old["plan"], summary, old.get("env", {}),
                          old.get("repro_command", ""))
        return 0
    try:
        common.require_gpus(args.world, "allreduce_vs_compute")
    except common.NoGpuError as e:
        return common.exit_no_gpu(e)
    common.enforce_no_multicast()
    import multiprocessing as mp

    mp_ctx = mp.get_context("forkserver")
    mp_ctx.set_forkserver_preload(["torch", "torch.distributed"])
    opts = {"replays": args.replays, "pass_replays": args.pass_replays,
            "pass_budget_s": args.pass_budget_s,
            "weight_slots": args.weight_slots, "passes": args.passes}
    results = []
    try:
        from tqdm import tqdm
        jobs_iter = tqdm(plan["jobs"], desc="backends", file=sys.stderr)
    except ImportError:
        jobs_iter = plan["jobs"]
    for job in jobs_iter:
        res = run_job(mp_ctx, plan, job, opts, args.job_timeout)
        print(f"# job {job['name']}: {res.get('error') or 'done'} in {res['wall_s']} s",
              file=sys.stderr)
        results.append(res)
        if args.json:  # partial results survive a run that is stopped from outside
            Path(args.json + ".partial").write_text(
                json.dumps({"plan": plan, "jobs": results}, default=str))
    versions = {}
    for r in results:
        for v in (r.get("variants") or {}).values():
            fv = (v.get("info") or {}).get("flashinfer")
            if fv:
                key = "flashinfer_pcie" if r["job"] == "flashinfer-pcie" else "flashinfer"
                versions[key] = fv
    sglang_custom = None
    if plan["sglang_custom"]:
        import importlib.util
        sglang_custom = ("present (not wired into this benchmark)"
                         if importlib.util.find_spec("sgl_kernel")
                         else "absent: sgl_kernel is not installed on this machine")
    summary = summarize(plan, results)
    info = common.collect_env(versions)
    notes = [f"profile {plan['profile']['name']}: {plan['profile']['source']}",
             f"per-rank GEMM shapes at TP {plan['shard_tp']}; all-reduce over {plan['world']} "
             f"GPUs; {plan['allreduces_per_pass']} all-reduces per pass; bf16; GEMMs only "
             "(attention core and activations not modeled); expert GEMMs as batched GEMMs over "
             "the expected distinct experts",
             "times: medians of CUDA-event-timed CUDA-graph replays (eager: same calls without a "
             "graph)",
             "AR us/call: one all-reduce; AR-only us: the pass's all-reduces back to back; AR+norm "
             "us: each followed by add+RMSNorm (fused backends: one kernel; others: one fused "
             "add+RMSNorm kernel)",
             EMULATION_NOTE]
    if sglang_custom:
        notes.append(f"sglang-custom: {sglang_custom}")
    print(common.format_preamble(info, {"argv": " ".join(argv)}, notes))
    print(common.format_table(TABLE_COLS, table_rows(summary)))
    print(f"# wrong results: {summary['wrong_results']}")
    for name, t in summary["targets"].items():
        print(f"# target {name}: {json.dumps(t, default=str)}")
    if args.write_nccl_profile and summary["nccl_best"]:
        emit_nccl_profile(args.write_nccl_profile, plan, summary, info,
                          common.repro_command(argv, SCRIPT))
    if args.png:
        print(f"# plot: {args.png}" if plot_png(args.png, plan, summary)
              else "# plot: matplotlib missing")
    if args.json:
        common.write_json(args.json,
                          {"env": info, "plan": plan, "summary": summary, "jobs": results,
                           "sglang_custom": sglang_custom, "notes": notes},
                          common.repro_command(argv, SCRIPT))
    return 0 if summary["wrong_results"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
