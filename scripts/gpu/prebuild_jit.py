#!/usr/bin/env python3
"""Pre-build, on a CPU host, the JIT modules an H200 SGLang 0.5.16 (or 0.5.23) server
compiles at its first request.

Run by build_bundle.sh with FAKE_CUDA=1 (scripts/gpu/fakecuda: reports one sm90 GPU), CUDA_HOME
pointing at nvcc 13.0.88 (the GPU machine's exact version) and TVM_FFI_CACHE_DIR at the cache that
travels. SGLang keys each module on its name, template arguments, a hash of its sources, the arch
(9.0a) and the tvm-ffi version, so a module built here is loaded there as-is; a shape not built here
compiles there (~15-25 s each).

Shapes (--attn HEAD_DIM:KV_HEADS_PER_RANK, repeatable) decide the rotary and KV-store modules:
  SmolLM2-135M padded for TP=2: 64:2   SmolLM2-135M at TP=1: 64:3
  dummy 7168-hidden model at TP=2: 128:4, at TP=1: 128:8
--qk-norm HEAD_DIM: the per-head q/k RMSNorm of Qwen3-style models (the dummy
model is a dense Qwen3).
--flashinfer-aot DIR builds FlashInfer's RMSNorm module (sgl_kernel's rmsnorm calls into it)
and the TRT-LLM all-reduce(+RMSNorm) fusion module into DIR/<name>/<name>.so, where FlashInfer
loads ahead-of-time builds.
--skip-sglang builds the FlashInfer modules only. SGLang 0.5.23 keys its JIT cache
(SGLANG_JIT_CACHE_DIR) also on `nvcc --version`, `c++ --version` and the installed torch,
flashinfer and tvm-ffi versions, so a module built on a host whose C++ compiler or torch differs
from the GPU machine's is never found there; its server compiles each one at first use.
Exit status 1 when any module failed.
"""
import argparse
import os
import shutil
import sys
import time

FAILED = []


def step(name, fn):
    t = time.time()
    try:
        fn()
        print(f"  built/cached {name} ({time.time() - t:.1f}s)", flush=True)
    except Exception as e:  # report every failure, then fail the build at the end
        FAILED.append(name)
        print(f"  FAILED {name}: {type(e).__name__}: {str(e)[:2000]}", flush=True)


def sglang_modules(attn_shapes, world_sizes, qk_norm_dims):
    try:
        import sglang.jit_kernel  # noqa: F401  (0.5.16; 0.5.23 moved it to sglang.kernels)
    except ModuleNotFoundError:
        return sglang_kernels_modules(attn_shapes, world_sizes, qk_norm_dims)
    import torch
    from sglang.jit_kernel import activation, clamp_position, kvcache, norm, rope
    from sglang.jit_kernel.all_reduce import get_all_reduce_module
    from sglang.jit_kernel.ngram_corpus import get_ngram_corpus_cls
    from sglang.jit_kernel.utils import load_jit

    bf16 = torch.bfloat16
    step("activation bf16", lambda: activation._jit_activation_module(bf16))
    step("rotary_embedding", lambda: rope._jit_rotary_embedding_module())
    for dt in (torch.int64, torch.int32):
        step(f"clamp_position {dt}", lambda dt=dt: clamp_position._jit_clamp_position_module(dt))
    for head_dim, kv in sorted(set(attn_shapes)):
        step(f"fused_rope neox {head_dim} bf16",
             lambda h=head_dim: rope._jit_fused_rope_module(True, h, bf16))
        row_bytes = kv * head_dim * 2                               # one token's K (or V) row, bf16
        step(f"kvcache row_bytes {row_bytes}", lambda rb=row_bytes: kvcache._jit_kvcache_module(rb))
    # Qwen3-style per-head q/k RMSNorm
    for head_dim in sorted(set(qk_norm_dims)):
        step(f"qknorm {head_dim} bf16", lambda h=head_dim: norm._jit_qknorm_module(h, bf16))
    step("ngram_corpus (C++)", lambda: get_ngram_corpus_cls())
    if world_sizes:
        step("communicator",
             lambda: load_jit("communicator", cuda_files=["distributed/communicator.cuh"],
                              cuda_wrappers=[("register_once", "register_communicator")]))
        step("cuda_ipc",
             lambda: load_jit("cuda_ipc", extra_ldflags=["-lcuda"],
                              cuda_files=["distributed/ipc.cuh"],
                              cuda_wrappers=[("register_once", "register_ipc_manager")]))
        for ws in world_sizes:
            step(f"custom_all_reduce bf16 ws{ws}", lambda ws=ws: get_all_reduce_module(bf16, ws))


def sglang_kernels_modules(attn_shapes, world_sizes, qk_norm_dims):
    """The same modules in SGLang 0.5.23's layout (sglang.kernels.ops), each built through the
    function the server calls, with the arguments it passes for these shapes."""
    import torch
    from sglang.kernels.ops.activation.activation import activation_module
    from sglang.kernels.ops.attention import clamp_position, rope
    from sglang.kernels.ops.communication import all_reduce
    from sglang.kernels.ops.kvcache.kvcache import _jit_kvcache_module
    from sglang.kernels.ops.layernorm.norm import _jit_qknorm_module
    from sglang.kernels.ops.speculative.ngram_corpus import get_ngram_corpus_cls

    bf16 = torch.bfloat16
    step("activation bf16", lambda: activation_module(bf16))
    step("rotary_embedding", lambda: rope._jit_rotary_embedding_module())
    for dt in (torch.int64, torch.int32):
        step(f"clamp_position {dt}", lambda dt=dt: clamp_position._jit_clamp_position_module(dt))
    for head_dim, kv in sorted(set(attn_shapes)):
        step(f"fused_rope neox {head_dim} bf16",
             lambda h=head_dim: rope._jit_fused_rope_module(True, h, bf16, bf16))
        row_bytes = kv * head_dim * 2
        # num_threads 0: the server's own choice of threads for the row width
        step(f"kvcache row_bytes {row_bytes}",
             lambda rb=row_bytes: _jit_kvcache_module(rb, rb, 0))
    for head_dim in sorted(set(qk_norm_dims)):
        step(f"qknorm {head_dim} bf16", lambda h=head_dim: _jit_qknorm_module(h, bf16))
    step("ngram_corpus (C++)", lambda: get_ngram_corpus_cls())
    if world_sizes:
        step("communicator", lambda: all_reduce._init_communicator())
        step("cuda_ipc", lambda: all_reduce._init_ipc_manager())
        for ws in world_sizes:
            step(f"custom_all_reduce bf16 ws{ws}",
                 lambda ws=ws: all_reduce.get_all_reduce_module(bf16, ws))


def flashinfer_modules(aot_dir, with_trtllm):
    from flashinfer.jit.norm import gen_norm_module

    specs = [("norm", gen_norm_module)]
    if with_trtllm:
        from flashinfer.jit.comm import gen_trtllm_comm_module

        specs.append(("trtllm_comm", gen_trtllm_comm_module))
    for name, gen in specs:
        def build(name=name, gen=gen):
            dst = os.path.join(aot_dir, name, f"{name}.so")
            if os.path.isfile(dst):
                return
            spec = gen()
            spec.build_and_load()
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(str(spec.jit_library_path), dst)
        step(f"flashinfer {name} -> aot", build)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attn", action="append", default=None, metavar="HEAD_DIM:KV_PER_RANK",
                    help="attention shape to build rotary + KV-store modules for (default: 64:2 "
                         "64:3 128:4 128:8)")
    ap.add_argument("--world-size", type=int, action="append", default=None,
                    help="TP sizes for the custom all-reduce module (default: 2)")
    ap.add_argument("--qk-norm", type=int, action="append", default=None, metavar="HEAD_DIM",
                    help="head dims of per-head q/k RMSNorm modules (Qwen3-style models; default: "
                         "128)")
    ap.add_argument("--flashinfer-aot", default=None, help="FlashInfer ahead-of-time module folder")
    ap.add_argument("--no-trtllm", action="store_true",
                    help="skip the TRT-LLM all-reduce fusion module")
    ap.add_argument("--skip-sglang", action="store_true",
                    help="build no SGLang module (only the FlashInfer ones)")
    a = ap.parse_args(argv)
    shapes = []
    for s in a.attn or ["64:2", "64:3", "128:4", "128:8"]:
        try:
            h, k = (int(x) for x in s.split(":"))
        except ValueError:
            ap.error(f"--attn expects HEAD_DIM:KV_HEADS_PER_RANK (e.g. 64:2), got {s!r}")
        shapes.append((h, k))
    if os.environ.get("FAKE_CUDA") != "1":
        print("note: FAKE_CUDA is not 1; this needs a GPU (or scripts/gpu/fakecuda) to pick the "
              "target arch")
    t0 = time.time()
    print(f"TVM_FFI_CACHE_DIR={os.environ.get('TVM_FFI_CACHE_DIR')}", flush=True)
    if not a.skip_sglang:
        sglang_modules(shapes, a.world_size or [2], a.qk_norm or [128])
    if a.flashinfer_aot:
        flashinfer_modules(a.flashinfer_aot, not a.no_trtllm)
    cache = os.environ.get("TVM_FFI_CACHE_DIR")
    if cache and os.path.isdir(cache):
        for d in sorted(os.listdir(cache)):
            print(f"  cache: {d}")
    print(f"prebuild: {len(FAILED)} failed {FAILED} in {time.time() - t0:.0f}s", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
