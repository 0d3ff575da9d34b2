"""Residual add + RMSNorm: the work that follows every all-reduce of a decoder layer.

- ``add_rmsnorm_torch``: separate torch ops (add, square-mean, rsqrt, scale): the unfused form.
- ``add_rmsnorm_fused``: one Triton kernel per call, one program per token row, fp32 math in
  registers: the single-kernel form that serving engines run after an unfused all-reduce.
- ``add_rmsnorm_ref``: the fp32 reference the benchmarks check both against.

All three compute ``residual_out = x + residual`` and ``out = rmsnorm(residual_out) * weight``.
"""

from __future__ import annotations

from typing import Tuple

try:  # Triton is only needed on the GPU machine
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU machines
    triton = None
    tl = None


def add_rmsnorm_ref(x, residual, weight, eps: float):
    """fp32 reference: returns ``(out, residual_out)`` in fp32. x, residual: [T, H];
    weight: [H]."""
    r = x.float() + residual.float()  # [T, H]
    inv = (r.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt()  # [T, 1]
    return r * inv * weight.float(), r


def add_rmsnorm_torch(x, residual, weight, eps: float) -> Tuple:
    """Unfused: separate kernels for the add and the norm. Returns ``(out,
    residual_out)`` in x.dtype."""
    r = x + residual  # [T, H]
    rf = r.float()
    out = (rf * (rf.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt()).to(x.dtype) * weight
    return out, r


if triton is not None:

    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, H, eps,
                            BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < H
        base = row.to(tl.int64) * H
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        s = x + r
        # the residual is stored in the activation dtype, and the norm reads that
        # rounded value, as engines do
        s_lo = s.to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + base + cols, s_lo, mask=mask)
        sf = s_lo.to(tl.float32)
        var = tl.sum(sf * sf, axis=0) / H
        inv = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + base + cols, (sf * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


def add_rmsnorm_fused(x, residual, weight, eps: float, out=None, residual_out=None):
    """One Triton kernel. x, residual: [T, H] contiguous; weight: [H]. Returns
    ``(out, residual_out)``."""
    if triton is None:
        raise RuntimeError("add_rmsnorm_fused needs Triton (GPU machine)")
    import torch

    T, H = x.shape
    out = torch.empty_like(x) if out is None else out
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    block = triton.next_power_of_2(H)
    _add_rmsnorm_kernel[(T,)](x, residual, weight, out, residual_out, H, eps, BLOCK=block,
                              num_warps=min(16, max(1, block // 512)))
    return out, residual_out
