"""lab/gpu/native_ops.py: the launcher's dispatch sends every op with a forward_native to it and
leaves the others alone; on the pinned SGLang a float32 RMSNorm that would dispatch to its CUDA
kernel runs torch's RMSNorm instead, equal to the formula."""
import pytest

import native_ops


def make_ops():
    class Base:
        def __init__(self):
            self.fwd = self.dispatch_forward()

        def dispatch_forward(self):
            return self.forward_cuda

        def forward_native(self, x):
            raise NotImplementedError

        def forward_cuda(self, x):
            return ("cuda", x)

    class WithNative(Base):
        def forward_native(self, x):
            return ("native", x)

    class KernelOnly(Base):
        pass

    return Base, WithNative, KernelOnly


def test_an_op_with_a_torch_forward_takes_it_and_one_without_keeps_its_dispatch():
    base, with_native, kernel_only = make_ops()
    assert with_native().fwd(1) == ("cuda", 1)  # before
    assert native_ops.install(base) is True
    assert with_native().fwd(2) == ("native", 2)
    assert kernel_only().fwd(3) == ("cuda", 3)
    assert native_ops.install(base) is False  # once
    assert with_native().fwd(4) == ("native", 4)


def _fused_op():
    try:
        from sglang.kernels import fused_op
    except ImportError:
        return None
    return fused_op


def _check_float32_rmsnorm(norm, torch):
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(16, generator=g) + 0.5)
    x = torch.randn(4, 16, generator=g, dtype=torch.float32)

    def ref(s):
        return s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight

    got = norm(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref(x), rtol=1e-6, atol=1e-6)
    # with a residual: the sum is normed and returned as the new residual
    r = torch.randn(4, 16, generator=g)
    out, res = norm(x.clone(), r.clone())
    torch.testing.assert_close(res, x + r)
    torch.testing.assert_close(out, ref(x + r), rtol=1e-6, atol=1e-6)


def _refusing_kernel(*args, **kwargs):
    raise RuntimeError("rmsnorm: failed to dispatch data type Float")  # what sgl_kernel says


def test_a_float32_rmsnorm_that_would_take_the_cuda_kernel_runs_torch_0516(monkeypatch):
    torch = pytest.importorskip("torch")
    mp = pytest.importorskip("sglang.srt.layers.utils.multi_platform")
    if "dispatch_forward" not in vars(mp.MultiPlatformOp):
        pytest.skip("this SGLang's layer ops are fused ops (the 0.5.23 route)")
    from sglang.srt.layers.layernorm import RMSNorm

    fused_op = _fused_op()
    if fused_op is not None:  # 0.5.16 has a few fused ops too: forced to torch as well
        monkeypatch.setattr(fused_op, "_forced_backend", fused_op._forced_backend)
        monkeypatch.delenv(native_ops.FORCE_ENV, raising=False)

    # as on a GPU machine: the stock dispatch picks the CUDA kernel
    monkeypatch.setattr(mp, "_is_cuda", True)
    monkeypatch.setattr(mp, "_is_cpu", False)
    cls = mp.MultiPlatformOp
    monkeypatch.setattr(cls, "dispatch_forward", cls.dispatch_forward)  # undone after the test
    monkeypatch.setattr(RMSNorm, "forward_cuda", _refusing_kernel)
    norm = RMSNorm(16, eps=1e-6)
    assert norm._forward_method == norm.forward_cuda
    assert native_ops.install() is True
    norm = RMSNorm(16, eps=1e-6).float()
    assert norm._forward_method == norm.forward_native
    _check_float32_rmsnorm(norm, torch)


def test_a_float32_rmsnorm_that_would_take_the_cuda_kernel_runs_torch_0523(monkeypatch):
    torch = pytest.importorskip("torch")
    fused_op = _fused_op()
    from sglang.srt.layers.layernorm import RMSNorm

    if fused_op is None or not issubclass(RMSNorm, fused_op.BaseFusedOp):
        pytest.skip("this SGLang's RMSNorm dispatches itself (the 0.5.16 route)")

    monkeypatch.setattr(fused_op, "_forced_backend", fused_op._forced_backend)  # undone after
    monkeypatch.delenv(native_ops.FORCE_ENV, raising=False)
    norm = RMSNorm(16, eps=1e-6).float()
    norm._forward_method = _refusing_kernel  # as the GPU machine's dispatch resolves it
    with pytest.raises(RuntimeError, match="Float"):
        norm(torch.ones(2, 16))
    assert native_ops.install() is True
    assert native_ops.install() is False
    import os
    assert os.environ[native_ops.FORCE_ENV] == "torch"  # the processes it starts inherit it
    norm._forward_method = _refusing_kernel
    _check_float32_rmsnorm(norm, torch)
