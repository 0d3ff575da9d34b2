"""A lab launcher of the patched SGLang server whose layer ops run their torch forward instead of
their CUDA kernels: the route to a float32 server for the exact lossless check.

    python3 lab/gpu/native_ops.py [sglang.launch_server arguments]   (as SGLANG_LAUNCH)

With ``--dtype float32`` the stock server does not start: sgl_kernel's RMSNorm refuses the type
("rmsnorm ... failed to dispatch data type Float"). Under this launcher every SGLang layer op built
on ``MultiPlatformOp`` (RMSNorm, SiluAndMul, the rotary embedding, ...) whose class has a
``forward_native`` dispatches to it, so those ops run as plain torch in any dtype; an op without
one keeps its own dispatch (0.5.16). SGLang's own switch for its fused ops (``BaseFusedOp``: every
layer op in 0.5.23, where ``MultiPlatformOp`` is an alias of it; a few in 0.5.16),
``SGLANG_FORCE_FUSED_OP_BACKEND=torch``, is set as well, for the processes the launcher starts too.
Matmuls (cuBLAS; TF32 stays off unless the server is asked for it), attention (the backend chosen
by the flags), sampling and the speculative kernels are untouched, and CUDA graphs capture the
torch ops as they capture the kernels. A check of outputs, never a measurement of speed: the line
``native_ops: ...`` in each process's log says it is on.

Installed at import, so the scheduler processes, which the multiprocessing start method "spawn"
starts by importing this file again, run native ops as well.
"""
import os
import sys

MARK = "_fastverify_native_ops"
FORCE_ENV = "SGLANG_FORCE_FUSED_OP_BACKEND"  # sglang.kernels.fused_op's forced backend


def _say(msg: str) -> None:  # before SGLang configures logging: straight into the server's log
    print(msg, file=sys.stderr, flush=True)


def _force_fused_ops_to_torch() -> bool:
    """SGLang's own switch, where the pin has it (``sglang.kernels.fused_op``: 0.5.16 for a few
    ops, 0.5.23 for every layer op). True if it changed something."""
    try:
        from sglang.kernels import fused_op
    except ImportError:
        return False
    if os.environ.get(FORCE_ENV) == "torch" \
            and fused_op.get_fused_op_backend() == fused_op.KernelBackend.TORCH:
        return False
    os.environ[FORCE_ENV] = "torch"  # the processes this one starts inherit it
    fused_op.set_fused_op_backend(fused_op.KernelBackend.TORCH)
    _say(f"native_ops: {FORCE_ENV}=torch, every BaseFusedOp runs its forward_native "
         "(lab/gpu/native_ops.py; a lossless check, not a measurement)")
    return True


def _dispatch_to_native(cls) -> bool:
    """Make ``cls`` dispatch every op whose class defines its own ``forward_native`` to it. True
    if it changed something."""
    if getattr(cls.dispatch_forward, MARK, False):
        return False
    stock = cls.dispatch_forward
    base_native = cls.forward_native

    def dispatch_forward(self):
        if type(self).forward_native is not base_native:
            return self.forward_native
        return stock(self)

    setattr(dispatch_forward, MARK, True)
    cls.dispatch_forward = dispatch_forward
    _say(f"native_ops: every {cls.__name__} with a forward_native runs it "
         "(lab/gpu/native_ops.py; a lossless check, not a measurement)")
    return True


def install(cls=None) -> bool:
    """Make every SGLang layer op with a ``forward_native`` run it. ``cls`` given: only that class
    hierarchy's dispatch (``_dispatch_to_native``). Otherwise SGLang's forced fused-op backend
    ``torch`` where the pin has one, and the dispatch of ``MultiPlatformOp`` where that class still
    dispatches itself (0.5.16; in 0.5.23 it is an alias of ``BaseFusedOp``). False if nothing was
    left to change (idempotent)."""
    if cls is not None:
        return _dispatch_to_native(cls)
    changed = _force_fused_ops_to_torch()
    from sglang.srt.layers.utils import multi_platform
    mpo = multi_platform.MultiPlatformOp
    if "dispatch_forward" in vars(mpo):
        changed = _dispatch_to_native(mpo) or changed
    return changed


if __name__ in ("__main__", "__mp_main__"):
    install()

if __name__ == "__main__":
    from launcher import serve  # this folder's launcher.py

    serve()
