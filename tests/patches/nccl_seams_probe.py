"""Run inside a patched SGLang (PYTHONPATH): exercise the 0002-0004 seams, print one JSON object.

Used by tests/patches/test_nccl_seams.py; each case records the outcome or the error message.
"""
import contextlib
import json
import os
import sys

MODEL = sys.argv[1]
out = {}


def case(name, fn):
    try:
        out[name] = {"ok": fn()}
    except Exception as e:  # the message is what the test checks
        out[name] = {"error": f"{type(e).__name__}: {e}"}


from sglang.srt.server_args import prepare_server_args  # noqa: E402
from sglang.version import __version__ as VERSION  # noqa: E402

V23 = VERSION.startswith("0.5.23")
out["version"] = VERSION


def args(*extra):
    sa = prepare_server_args(["--model-path", MODEL, "--device", "cuda", "--tp", "4", *extra])
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
    return sa


def resolved(sa):
    return sa.resolved_dict() if hasattr(sa, "resolved_dict") else vars(sa)


@contextlib.contextmanager
def platform(sm):
    """Override SGLang's own platform detection: override_platform (0.5.23) or
    module attrs (0.5.16)."""
    if V23:
        from sglang.srt.runtime_context import override_platform

        with override_platform(is_sm90=sm == 90, is_sm100=sm == 100, is_sm120=sm == 120):
            yield
    else:
        from sglang.srt.utils import common

        saved = {k: getattr(common, k)
                 for k in ("is_sm90_supported", "is_sm100_supported", "is_sm120_supported")}
        common.is_sm90_supported = lambda: sm == 90
        common.is_sm100_supported = lambda: sm == 100
        common.is_sm120_supported = lambda: sm == 120
        try:
            yield
        finally:
            for k, v in saved.items():
                setattr(common, k, v)


def flags_parsed():
    sa = args("--nccl-algo", "ring", "--nccl-proto", "LL", "--nccl-min-channels", "2",
              "--nccl-max-channels", "4",
              "--nccl-buffsize", "1048576", "--nccl-env", "NCCL_P2P_LEVEL=SYS", "--nccl-env",
              "NCCL_DEBUG=INFO")
    r = resolved(sa)
    sa.check_server_args()
    return {k: r[k] for k in ("nccl_algo", "nccl_proto", "nccl_min_channels", "nccl_max_channels",
                              "nccl_buffsize", "nccl_env", "nccl_tuning_profile", "tp_size")}


case("flags_parsed", flags_parsed)
for name, extra in {
    "bad_algo": ["--nccl-algo", "fastest"],
    "bad_proto": ["--nccl-proto", "LL64"],
    "min_gt_max": ["--nccl-min-channels", "8", "--nccl-max-channels", "2"],
    "bad_channels": ["--nccl-max-channels", "0"],
    "bad_buffsize": ["--nccl-buffsize", "-1"],
    "non_nccl_env": ["--nccl-env", "LD_PRELOAD=x.so"],
    "global_tree": ["--nccl-algo", "Tree"],
    "bad_profile": ["--nccl-tuning-profile", os.path.join(os.path.dirname(MODEL), "missing.json")],
}.items():
    case(name, lambda extra=extra: args(*extra).check_server_args())

# --tp-allreduce mapping (fields resolved in the launcher pass)
for choice in ("nccl", "custom", "pcie-ipc"):
    case(f"tp_{choice}", lambda c=choice: {k: resolved(args("--tp-allreduce", c))[k] for k in
                                            ("tp_allreduce", "disable_custom_all_reduce",
                                             "flashinfer_allreduce_fusion_backend")})
case("tp_unset",
     lambda: {k: resolved(args())[k] for k in ("tp_allreduce", "disable_custom_all_reduce",
                                               "flashinfer_allreduce_fusion_backend")})

import fastverify.glue.allreduce_hook as hook  # noqa: E402

for sm in (90, 100, 120):
    for fi in ("0.6.14", "0.7.2"):
        def fused(sm=sm, fi=fi):
            hook.flashinfer_version = lambda: fi
            with platform(sm):
                r = resolved(args("--tp-allreduce", "flashinfer-fused"))
                from sglang.srt.layers import flashinfer_comm_fusion as fc

                backend = fc._resolve_backend("trtllm", False)
            return {"backend_field": r["flashinfer_allreduce_fusion_backend"], "resolved": backend,
                    "sm12x_gate": None}
        case(f"fused_sm{sm}_fi{fi}", fused)

        def gate(sm=sm, fi=fi):
            hook.flashinfer_version = lambda: fi
            with platform(sm):
                return hook.sm12x_fusion_gate()
        case(f"gate_sm{sm}_fi{fi}", gate)


class FakeDriver:
    """Stands in for cuda.bindings.driver: records whether the multicast granularity is asked."""
    class CUresult:
        CUDA_SUCCESS = 0

    class CUmemAllocationGranularity_flags:
        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1

    class CUmulticastGranularity_flags:
        CU_MULTICAST_GRANULARITY_RECOMMENDED = 1

    class CUmulticastObjectProp:
        pass

    def __init__(self):
        self.asked = 0

    def cuMemGetAllocationGranularity(self, prop, flag):
        return 0, 2 << 20

    def cuMulticastGetGranularity(self, prop, flag):
        self.asked += 1
        return 1, None  # fails like a device without multicast


for mc in (True, False):
    def preflight(mc=mc):
        import torch
        from sglang.srt.layers import flashinfer_comm_fusion as fc

        hook.multicast_supported = lambda cuda_driver=None, device=None: mc
        drv = FakeDriver()
        props = type("P", (), {"requestedHandleTypes": 0})()
        sizes = fc._flashinfer_trtllm_workspace_allocation_sizes(drv, props, 4, 2048, 7168,
                                                                torch.bfloat16)
        return {"sizes": sizes, "asked": drv.asked}
    case(f"preflight_multicast_{mc}", preflight)

print("FVJSON" + json.dumps(out, default=str))
