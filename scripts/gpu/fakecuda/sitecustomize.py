"""Pretend one sm90 (H200) GPU on a host without one, so JIT builders pick the sm_90a target.

Active only with FAKE_CUDA=1 and this folder first on PYTHONPATH. It changes what torch.cuda
*reports* (availability, device count, capability, properties, torch.version.cuda); it cannot run
anything on a GPU. Used by scripts/gpu/prebuild_jit.py to compile the modules the H200 server would
otherwise compile at its first request.
"""
import os

if os.environ.get("FAKE_CUDA") == "1":
    import types

    import torch

    _PROPS = types.SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, total_memory=143771 * 2**20,
        multi_processor_count=132,
        L2_cache_size=60 * 2**20, is_integrated=False, is_multi_gpu_board=False, uuid="fake",
        warp_size=32,
        max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536, gcnArchName="",
    )
    torch.version.cuda = os.environ.get("FAKE_CUDA_VERSION", "13.0")
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.set_device = lambda *a, **k: None
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_name = lambda *a, **k: _PROPS.name
    torch.cuda.get_device_properties = lambda *a, **k: _PROPS
    torch.cuda.get_arch_list = lambda: ["sm_90a"]
    torch.cuda.is_initialized = lambda: True
