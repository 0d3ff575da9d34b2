"""glue/warmup.py: the start-up compilation of the n-gram step's Triton kernels. SGLang's
own kernels run under Triton's interpreter (TRITON_INTERPRET=1, CPU tensors) in a
subprocess; the rest on stand-ins."""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fastverify.glue import warmup

ROOT = Path(__file__).resolve().parents[1]


def test_buckets_are_the_powers_of_two_a_batch_size_rounds_up_to():
    assert warmup.buckets(1) == [1]
    assert warmup.buckets(5) == [1, 2, 4, 8]
    assert warmup.buckets(8) == [1, 2, 4, 8]
    assert warmup.buckets(9) == [1, 2, 4, 8, 16]


def _worker(pool_rows=2, pool_len=64, max_bs=4, k=8):
    import torch

    pool = types.SimpleNamespace(req_to_token=torch.zeros(pool_rows, pool_len, dtype=torch.int32))
    return types.SimpleNamespace(model_runner=types.SimpleNamespace(req_to_token_pool=pool),
                                 max_batch_size=max_bs, draft_token_num=k)


def test_nothing_to_warm_is_a_skip_not_an_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "no req_to_token pool" in warmup.warm_spec_kernels(types.SimpleNamespace())["skipped"]
    # CPU, no interpreter
    assert "runs no Triton kernels" in warmup.warm_spec_kernels(_worker())["skipped"]


class _Launch:
    """Stand-in of a Triton kernel: kernel[grid](*args) calls `body`."""

    def __init__(self, body):
        self.body, self.grids = body, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.body


def test_a_kernel_that_fails_or_misbehaves_is_reported_and_start_up_goes_on(monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    idle = _Launch(lambda *args: None)  # writes nothing: its outputs are wrong

    def boom(*args):
        raise RuntimeError("no GPU")
    failing = _Launch(boom)
    mods = {"fv_k1": types.SimpleNamespace(assign_extend_cache_locs=idle),
            "fv_k2": types.SimpleNamespace(assign_req_to_token_pool=failing)}
    monkeypatch.setattr(warmup.importlib, "import_module", lambda name: mods[name])
    res = warmup.warm_spec_kernels(_worker(max_bs=3),
                                   kernels=(("fv_k1", "assign_extend_cache_locs"),
                                            ("fv_k2", "assign_req_to_token_pool"),
                                            ("fv_k1", "missing")))
    assert res["kernels"] == ["assign_extend_cache_locs"] and res["buckets"] == [1, 2, 4]
    assert res["mismatches"] == [("assign_extend_cache_locs", 1), ("assign_extend_cache_locs", 2),
                                 ("assign_extend_cache_locs", 4)]
    assert idle.grids == [(1,), (2,), (4,)] and failing.grids == [(1,)]
    assert "assign_req_to_token_pool failed (RuntimeError: no GPU)" in caplog.text


PROBE = """
import json, sys, types
import torch
from fastverify.glue import warmup
pool = types.SimpleNamespace(req_to_token=torch.zeros(4, 96, dtype=torch.int32))
w = types.SimpleNamespace(model_runner=types.SimpleNamespace(req_to_token_pool=pool),
                          max_batch_size=5, draft_token_num=8)
print("PROBE " + json.dumps(warmup.warm_spec_kernels(w)))
"""


@pytest.mark.sglang
def test_sglangs_own_kernels_run_with_the_warm_up_arguments():
    """The pinned SGLang's two kernels, interpreted on the CPU: every bucket runs and gives what it
    must (a wrong argument order or dtype would fail or mismatch here before it reaches a GPU)."""
    pytest.importorskip("triton")
    pytest.importorskip("sglang")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests" / "stubs"),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                       text=True, timeout=300)
    line = [x for x in r.stdout.splitlines() if x.startswith("PROBE ")]
    assert r.returncode == 0 and line, r.stderr[-3000:]
    res = json.loads(line[0][6:])
    assert res["kernels"] == ["assign_req_to_token_pool", "assign_extend_cache_locs",
                              "fill_accept_out_cache_loc"]
    assert res["buckets"] == [1, 2, 4, 8] and res["mismatches"] == []


KEYS_PROBE = """
import json, os, sys, types
import torch
# compiled mode: no interpreter
from sglang.srt.mem_cache.allocation import assign_req_to_token_pool as kernel
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.jit import create_function_from_signature
from fastverify.glue import warmup

# Triton's own argument binder for a Hopper target: the specialisation that keys its compile
# cache (argument types, pointer alignment, constexprs), computed without a GPU
bind = create_function_from_signature(kernel.signature, kernel.params,
                                      CUDABackend(GPUTarget("cuda", 90, 32)))

def key(*args):
    return str(bind(*args)[1])

POOL_LEN = 32780
pool = torch.zeros(4, POOL_LEN, dtype=torch.int32)
# what the scheduler's spec-decode allocation passes: int32 lengths, the slots a slice of the
# allocator's free list at whatever offset earlier allocations left
free = torch.arange(4096, dtype=torch.int64)
serving = set()
for bs in range(1, 9):
    for taken in range(4):
        cur = torch.full((bs,), 16, dtype=torch.int32)
        serving.add(key(torch.arange(bs) % 4, pool, cur, cur + 8, free[taken:taken + 8 * bs],
                        POOL_LEN, warmup._next_power_of_2(bs)))

class Recorder:
    seen = set()
    def __getitem__(self, grid):
        return lambda *args: Recorder.seen.add(key(*args))

mods = {"fv_k": types.SimpleNamespace(assign_req_to_token_pool=Recorder())}
warmup.importlib = types.SimpleNamespace(import_module=lambda name: mods[name])
if sys.argv[1] == "aligned-only":
    warmup.FREE_LIST_OUT = frozenset()
# lets the warm-up run on CPU tensors; the kernel above stays compiled
os.environ["TRITON_INTERPRET"] = "1"
runner = types.SimpleNamespace(req_to_token_pool=types.SimpleNamespace(req_to_token=pool))
w = types.SimpleNamespace(model_runner=runner, max_batch_size=8, draft_token_num=8)
warmup.warm_spec_kernels(w, kernels=(("fv_k", "assign_req_to_token_pool", "int32"),), accept=None)
print("KEYS " + json.dumps({"serving": sorted(serving), "warmed": sorted(Recorder.seen)}))
"""


def _keys(mode):
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests" / "stubs"),
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-c", KEYS_PROBE, mode], env=env,
                       capture_output=True, text=True, timeout=300)
    line = [x for x in r.stdout.splitlines() if x.startswith("KEYS ")]
    if r.returncode != 0 and "triton.backends" in r.stderr:
        pytest.skip("Triton's binder is not reachable in this Triton")
    assert r.returncode == 0 and line, r.stderr[-3000:]
    res = json.loads(line[0][5:])
    return set(res["serving"]), set(res["warmed"])


@pytest.mark.sglang
def test_the_scheduler_slot_kernel_is_warmed_for_every_cache_key_serving_meets():
    """The pinned SGLang's assign_req_to_token_pool, keyed by Triton's own binder for a Hopper GPU:
    the calls the scheduler makes at batch sizes 1-8 (its slots a free-list slice at offsets 0-3)
    meet two keys per bucket, 16-byte aligned slots and not; the warm-up's calls meet all of them.
    Warmed with aligned slots only (as before run28), the unaligned keys are missed: the compiles
    run26 and run28 recorded mid-serving."""
    pytest.importorskip("triton")
    pytest.importorskip("sglang")
    serving, warmed = _keys("both")
    assert len(serving) == 2 * len(warmup.buckets(8))  # buckets 1, 2, 4, 8 x aligned or not
    assert serving <= warmed
    serving_again, aligned_only = _keys("aligned-only")
    assert serving_again == serving
    missed = serving - aligned_only
    assert len(missed) == len(warmup.buckets(8)) and all("'*i64', '')" in k for k in missed)


def test_each_kernel_meets_its_callers_argument_types_and_every_accepted_slot_count_is_moved(
        monkeypatch):
    """The scheduler passes assign_req_to_token_pool int32 lengths, the worker passes
    assign_extend_cache_locs int64 ones (a warm-up with other types compiles a kernel the server
    never calls), and the scheduler's slots are a free-list slice, aligned or not; the accepted
    tokens' fill runs once per power-of-two bucket of batch size x verify width, and the KV pool
    moves slot 0 onto itself for every such count, as the verify step's move would."""
    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    seen, aligned = {}, {}

    def kernel_of(name):
        def body(*args):
            seen.setdefault(name, []).append(tuple(a.dtype if hasattr(a, "dtype") else a
                                                   for a in args))
            if len(args) > 4:  # the slot kernels' out_cache_loc
                aligned.setdefault(name, []).append(args[4].data_ptr() % 16 == 0)
        return _Launch(body)

    mods = {"fv_k": types.SimpleNamespace(assign_req_to_token_pool=kernel_of("req"),
                                          assign_extend_cache_locs=kernel_of("ext"),
                                          fill_accept_out_cache_loc=kernel_of("fill"))}
    monkeypatch.setattr(warmup.importlib, "import_module", lambda name: mods[name])
    moved = []

    class Pool:
        def move_kv_cache(self, tgt, src):
            # slot 0 only
            assert tgt.dtype == src.dtype == torch.int64 and not tgt.any() and not src.any()
            moved.append(tgt.numel())

    w = _worker(max_bs=3)
    w.token_to_kv_pool_allocator = types.SimpleNamespace(get_kvcache=lambda: Pool())
    res = warmup.warm_spec_kernels(w, widths=(1, 2, 8),
                                   kernels=(("fv_k", "assign_req_to_token_pool", "int32"),
                                            ("fv_k", "assign_extend_cache_locs", "int64")),
                                   accept=("fv_k", "fill_accept_out_cache_loc"))
    assert res["kernels"] == ["assign_req_to_token_pool", "assign_extend_cache_locs",
                              "fill_accept_out_cache_loc", "move_kv_cache"]
    # the scheduler's slots come from the allocator's free list at any offset: each bucket
    # with an aligned and an unaligned list (16 bytes: Triton's specialisation); the
    # worker's own call only aligned
    assert [a[2:4] for a in seen["req"]] == [(torch.int32, torch.int32)] * 6
    assert aligned["req"] == [True, False] * 3 and [a[6] for a in seen["req"]] == [1, 1, 2, 2, 4, 4]
    assert ([a[2:4] for a in seen["ext"]] == [(torch.int64, torch.int64)] * 3
            and aligned["ext"] == [True] * 3)
    assert warmup.accept_sizes(3, (1, 2, 8)) == [1, 2, 3, 4, 6, 8, 16, 24]
    assert [a[3] for a in seen["fill"]] == [1, 2, 4, 8, 16, 32]  # size_upper of each count's bucket
    assert [a[:3] for a in seen["fill"]] == [(torch.int32, torch.int64, torch.int64)] * 6
    assert moved == [1, 2, 3, 4, 6, 8, 16, 24] and res["moves"] == 8
    # the stand-ins write nothing: every run is reported as a mismatch, and start-up goes on
    assert ("fill_accept_out_cache_loc", 2) in res["mismatches"]
