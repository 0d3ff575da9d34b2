"""fastverify/plain_step.py: a plain decode step's tensor work around its pass, two Triton kernels.

The torch reference is checked against a per-request statement of what the step needs; the
kernels against the reference, value and dtype, under Triton's interpreter (TRITON_INTERPRET=1,
CPU tensors, a subprocess: the interpreter is chosen when the kernels are defined) and, on a
GPU machine, compiled."""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fastverify import plain_step  # noqa: E402
from fastverify.glue import warmup  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _spec_inputs(accept_tokens, accept_lens, bs, roots_first, req_to_token, req_pool_indices,
                 seq_lens, orig):
    """Request by request, what the pass reads: the root (the first accept token after a
    plain step, else the last accepted one), the slot req_to_token holds for the new token,
    the lengths counting it."""
    flat = accept_tokens.reshape(-1).tolist()
    row = len(flat) // bs
    ids, locs = [], []
    for i in range(bs):
        col = 0 if roots_first else int(accept_lens[i]) - 1
        ids.append(flat[i * row + col])
        locs.append(int(req_to_token[int(req_pool_indices[i]), int(seq_lens[i])]))
    return (ids, locs, [int(s) + 1 for s in seq_lens], None if orig is None
            else [int(o) + 1 for o in orig])


def _case(gen, bs, row, seq_dtype=torch.int64, acc_dtype=torch.int32, offset=0, two_d=False,
          rows=12, cols=40, pool_step=1, device="cpu"):
    """Random step inputs in the server's dtypes (or the ones given) on ``device``. ``offset``: the
    accept tokens start one element into their buffer (a pointer not 16-byte aligned); ``two_d``:
    accept tokens as [bs, row] ("t": a transposed view, column-major); ``pool_step``: req_to_token a
    view of every pool_step-th column."""
    buf = torch.randint(0, 1 << 20, (offset + bs * row,), generator=gen)
    buf = buf.to(acc_dtype).to(device)[offset:]
    acc = buf.view(row, bs).t() if two_d == "t" else buf.view(bs, row) if two_d else buf
    lens = torch.randint(1, row + 1, (bs,), generator=gen, dtype=torch.int32)
    pool = torch.randint(0, 1 << 24, (rows, cols * pool_step), generator=gen, dtype=torch.int32)
    rpi = torch.randperm(rows, generator=gen)[:bs].to(torch.int64)
    seq = torch.randint(0, cols, (bs,), generator=gen).to(seq_dtype)
    orig = torch.randint(0, 1 << 16, (bs,), generator=gen, dtype=torch.int32)
    return (acc, lens.to(device), pool.to(device)[:, ::pool_step], rpi.to(device), seq.to(device),
            orig.to(device))


def _as_lists(out):
    return tuple(None if t is None else t.tolist() for t in out)


def _dtypes(out):
    return tuple(None if t is None else t.dtype for t in out)


def compare_all(device) -> dict:
    """Kernels against the reference on ``device``: batch sizes 1-9, rows (k) of 1, 4 and 8, roots
    first or gathered, orig_seq_lens present or None, sampled tokens int32 or int64, and a few
    layouts (2-D, column-major or unaligned accept tokens, a strided req_to_token, int32 lengths).
    Returns {"cases", "mismatches", "kernels"}."""
    gen = torch.Generator().manual_seed(1234)
    cases, bad = 0, []
    layouts = [{}, {"two_d": True}, {"two_d": "t"}, {"offset": 1}, {"pool_step": 2},
               {"seq_dtype": torch.int32}]
    for bs in range(1, 10):
        for k in (1, 4, 8):
            for li, layout in enumerate(layouts):
                acc, lens, pool, rpi, seq, orig = _case(gen, bs, k, device=device, **layout)
                for roots_first in (False, True):
                    for o in (orig, None):
                        if li and o is None:
                            continue
                        args = (acc, lens, bs, roots_first, pool, rpi, seq, o)
                        got, want = (plain_step.plain_inputs(*args),
                                     plain_step.plain_inputs_ref(*args))
                        cases += 1
                        if _dtypes(got) != _dtypes(want) or _as_lists(got) != _as_lists(want):
                            bad.append(["inputs", bs, k, li, roots_first, o is None])
            for dtype in (torch.int32, torch.int64):
                pred = torch.randint(0, 1 << 20, (bs,), generator=gen).to(dtype).to(device)
                got, want = plain_step.plain_outputs(pred, k), plain_step.plain_outputs_ref(pred, k)
                cases += 1
                if _dtypes(got) != _dtypes(want) or _as_lists(got) != _as_lists(want):
                    bad.append(["outputs", bs, k, str(dtype)])
    return {"cases": cases, "mismatches": bad,
            "kernels": plain_step.uses_kernels(torch.empty(0, device=device))}


# ---------------------------------------------------------------------------------------- reference


def test_reference_by_hand():
    """Two requests, rows of 3: accept lengths 1 and 2 gather 5 and 7; read first, 5 and 6."""
    acc = torch.tensor([5, 9, 9, 6, 7, 9], dtype=torch.int32)
    lens = torch.tensor([1, 2], dtype=torch.int32)
    pool = torch.arange(20, dtype=torch.int32).view(2, 10)
    rpi, seq, orig = (torch.tensor([1, 0]), torch.tensor([3, 4]),
                      torch.tensor([2, 3], dtype=torch.int32))
    ids, loc, new_seq, new_orig = plain_step.plain_inputs_ref(acc, lens, 2, False, pool, rpi, seq,
                                                              orig)
    assert ids.tolist() == [5, 7] and loc.tolist() == [13, 4] and new_seq.tolist() == [4, 5]
    assert new_orig.tolist() == [3, 4]
    assert ((ids.dtype, loc.dtype, new_seq.dtype, new_orig.dtype)
            == (torch.int64, torch.int64, torch.int64, torch.int32))
    ids_first = plain_step.plain_inputs_ref(acc, lens, 2, True, pool, rpi, seq, None)[0]
    assert ids_first.tolist() == [5, 6]
    assert plain_step.plain_inputs_ref(acc, lens, 2, True, pool, rpi, seq, None)[3] is None
    tokens, accept_lens = plain_step.plain_outputs_ref(torch.tensor([7, 8]), 3)
    assert tokens.tolist() == [7, 0, 0, 8, 0, 0] and accept_lens.tolist() == [1, 1]
    assert tokens.dtype == accept_lens.dtype == torch.int32


@pytest.mark.parametrize("acc_dtype", [torch.int32, torch.int64])
def test_reference_is_the_per_request_statement(acc_dtype):
    """The torch reference (the step's former inline ops) against the request-by-request statement,
    in the server's dtypes and the int64 accept tokens of the CPU tests' stand-ins."""
    gen = torch.Generator().manual_seed(7)
    for bs in range(1, 10):
        for row in (1, 4, 8):
            acc, lens, pool, rpi, seq, orig = _case(gen, bs, row, acc_dtype=acc_dtype,
                                                    two_d=(False, True, "t")[bs % 3])
            for roots_first in (False, True):
                for o in (orig, None):
                    args = (acc, lens, bs, roots_first, pool, rpi, seq, o)
                    assert _as_lists(plain_step.plain_inputs_ref(*args)) == _spec_inputs(*args)
            pred = torch.randint(0, 1 << 20, (bs,), generator=gen)
            tokens, accept_lens = plain_step.plain_outputs_ref(pred, row)
            assert tokens.view(bs, row)[:, 0].tolist() == pred.tolist()
            assert not tokens.view(bs, row)[:, 1:].any() and accept_lens.tolist() == [1] * bs


def test_cpu_tensors_take_the_reference_without_the_interpreter(monkeypatch):
    """The auto glue's CPU tests hand the step stand-in batches: without the interpreter the kernels
    (built for a GPU) are not launched on them."""
    if plain_step._INTERPRETED:
        pytest.skip("this process interprets the kernels")
    assert not plain_step.uses_kernels(torch.empty(0))
    acc, lens, pool, rpi, seq, orig = _case(torch.Generator().manual_seed(3), 3, 4)
    args = (acc, lens, 3, False, pool, rpi, seq, orig)
    assert (_as_lists(plain_step.plain_inputs(*args))
            == _as_lists(plain_step.plain_inputs_ref(*args)))


# ------------------------------------------------------------------------------------------ kernels

PROBE = """
import json, os, sys, types
sys.path.insert(0, {tests!r})
import torch
import test_plain_step as t
from fastverify import plain_step
from fastverify.glue import warmup
res = t.compare_all("cpu")
res["warm"] = plain_step.warm("cpu", 8)
pool = types.SimpleNamespace(req_to_token=torch.zeros(4, 96, dtype=torch.int32))
w = types.SimpleNamespace(model_runner=types.SimpleNamespace(req_to_token_pool=pool),
                          max_batch_size=5, draft_token_num=8)
res["warm_spec"] = warmup.warm_spec_kernels(w, kernels=(), accept=None, plain=True)
print("PROBE " + json.dumps(res))
"""


def _run_interpreted():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests" / "stubs"),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", PROBE.format(tests=str(ROOT / "tests"))], env=env,
                       capture_output=True, text=True, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("PROBE ")]
    assert r.returncode == 0 and line, r.stderr[-3000:]
    return json.loads(line[0][6:])


@pytest.fixture(scope="module")
def interpreted():
    return _run_interpreted()


def test_kernels_match_the_reference_under_the_interpreter(interpreted):
    """Every case, value and dtype, through the kernels (not the reference they fall back on)."""
    assert interpreted["kernels"] is True
    assert interpreted["cases"] == 9 * 3 * (4 + 5 * 2 + 2) and interpreted["mismatches"] == []


def test_warm_up_runs_each_variant_a_server_meets(interpreted):
    """Roots first and gathered, sampled tokens int32 and int64: four launches, outputs as the
    reference's; through warm_spec_kernels when asked for (auto mode)."""
    # (the interpreter's JIT entry returns no compiled kernel: every launch goes
    # through it, none directly)
    assert interpreted["warm"] == {"variants": 4, "mismatches": [], "direct_checked": 0,
                                   "direct_off": None}
    ws = interpreted["warm_spec"]
    assert ws["kernels"] == ["plain_step"] and ws["plain_variants"] == 4 and ws["mismatches"] == []


def _binder(kernel):
    """Triton's argument binder for a Hopper target, built without a GPU: it returns the
    specialisation that keys the compile cache (pointer dtypes and alignment, integer types
    and values, constexprs)."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.compiler import CUDABackend
        from triton.runtime.jit import create_function_from_signature

        return create_function_from_signature(kernel.signature, kernel.params,
                                              CUDABackend(GPUTarget("cuda", 90, 32)))
    except Exception as e:  # noqa: BLE001 - another Triton's internals
        pytest.skip(f"Triton's binder is not reachable here ({type(e).__name__}: {e})")


def test_one_compile_per_variant_whatever_the_batch_size():
    """The compile-cache key of each kernel over batch sizes 1-200 (1 and multiples of 16 included),
    rows of 1-16, any req_to_token shape, unaligned inputs: one key per (roots first, orig present)
    and per dtype of the sampled tokens."""
    if plain_step._plain_inputs_kernel is None or plain_step._INTERPRETED:
        pytest.skip("no compiled kernels in this process")
    bind_in, bind_out = (_binder(plain_step._plain_inputs_kernel),
                         _binder(plain_step._plain_outputs_kernel))
    gen = torch.Generator().manual_seed(5)
    keys_in, keys_out = {}, {}
    for bs in (1, 2, 3, 8, 15, 16, 17, 32, 64, 128, 200):
        for k in (1, 2, 4, 8, 16):
            acc, lens, pool, rpi, seq, orig = _case(gen, bs, k, offset=bs % 2, rows=bs + 3,
                                                    cols=16 * k + 1,
                                                    pool_step=1 + bs % 3,
                                                    two_d=(False, True, "t")[k % 3])
            acc2 = acc.reshape(bs, -1)
            for roots_first in (False, True):
                for o in (orig, None):
                    new_seq, new_orig = torch.empty_like(seq), torch.empty_like(orig)
                    _, spec, _ = bind_in(acc2, lens, pool, rpi, seq, o if o is not None else seq,
                                         seq, seq, new_seq, new_orig if o is not None else new_seq,
                                         bs, acc2.stride(0), acc2.stride(1), pool.stride(0),
                                         pool.stride(1),
                                         ROOTS_FIRST=roots_first, HAS_ORIG=o is not None,
                                         BLOCK=plain_step.BLOCK)
                    keys_in.setdefault((roots_first, o is not None), set()).add(str(spec))
            for dtype in (torch.int32, torch.int64):
                pred = torch.zeros(bs, dtype=dtype)
                out = torch.empty(bs * k, dtype=torch.int32)
                _, spec, _ = bind_out(pred, out, out[:bs], bs * k, k, BLOCK=plain_step.BLOCK)
                keys_out.setdefault(dtype, set()).add(str(spec))
    assert {v: len(s) for v, s in keys_in.items()} == {(False, True): 1, (True, True): 1,
                                                       (False, False): 1,
                                                        (True, False): 1}
    assert {v: len(s) for v, s in keys_out.items()} == {torch.int32: 1, torch.int64: 1}


# ---------------------------------------------------------------------------------- direct launches


class FakeCompiled:
    """A compiled variant: its launcher takes every parameter positionally (the constexprs last)."""

    def __init__(self, log, variant, wrong=False):
        self.log, self.variant, self.wrong = log, variant, wrong

    def __getitem__(self, grid):
        def run(*args):
            if self.wrong:
                raise TypeError("function takes 5 positional arguments")
            self.log.append(("direct", self.variant, grid, args))
        return run


class FakeKernel:
    """Triton's JIT entry: binds positional and constexpr keyword arguments, returns
    the compiled variant."""

    def __init__(self, returns=True, wrong=False):
        self.log, self.returns, self.wrong = [], returns, wrong

    def __getitem__(self, grid):
        def run(*args, **constexprs):
            self.log.append(("jit", grid, args, constexprs))
            return FakeCompiled(self.log, len(self.log), self.wrong) if self.returns else None
        return run


def test_direct_launch_after_the_first_launch_of_each_variant():
    k = FakeKernel()
    d = plain_step._Direct(k, ("A", "B"))
    g1, g2 = (1, 1, 1), (2, 1, 1)
    d.launch(g1, "v1", (10, 20, 30, True, 128))
    assert k.log == [("jit", g1, (10, 20, 30), {"A": True, "B": 128})]
    # the same variant: its compiled kernel, every argument
    d.launch(g1, "v1", (11, 21, 31, True, 128))
    d.launch(g2, "v1", (12, 22, 32, True, 128))  # another grid: the same compiled kernel
    assert k.log[1:] == [("direct", 1, g1, (11, 21, 31, True, 128)),
                         ("direct", 1, g2, (12, 22, 32, True, 128))]
    d.launch(g1, "v2", (13, 23, 33, False, 128))  # a new variant: the JIT entry first
    assert k.log[3][0] == "jit" and d.direct_launches == 2
    d.jit_only = True  # a measurement's baseline (lab/plain_step_launch.py)
    d.launch(g1, "v1", (14, 24, 34, True, 128))
    assert k.log[4][0] == "jit" and d.direct_launches == 2
    d.jit_only = False
    d.launch(g1, "v1", (15, 25, 35, True, 128))
    assert k.log[5][0] == "direct" and d.direct_launches == 3


def test_no_direct_launch_without_a_compiled_kernel_or_once_turned_off():
    k = FakeKernel(returns=False)  # (the interpreter, or a Triton that compiles asynchronously)
    d = plain_step._Direct(k, ("A",))
    for _ in range(3):
        d.launch((1,), "v", (1, 2, 64))
    assert [e[0] for e in k.log] == ["jit"] * 3
    k2 = FakeKernel()
    d2 = plain_step._Direct(k2, ("A",))
    d2.launch((1,), "v", (1, 2, 64))
    d2.launch((1,), "v", (1, 2, 64))
    d2.turn_off("test")
    d2.launch((1,), "v", (1, 2, 64))
    d2.launch((1,), "w", (1, 2, 64))
    d2.launch((1,), "w", (1, 2, 64))
    assert [e[0] for e in k2.log] == ["jit", "direct", "jit", "jit", "jit"] and d2.off == "test"


def test_warm_up_turns_direct_launches_off_when_they_fail(monkeypatch, caplog):
    """A launcher that refuses the arguments (another Triton's convention): the warm-up catches it
    on the variant's second launch, turns direct launches off for both kernels, and the outputs stay
    right (every later launch through the JIT entry, here the torch reference in its place)."""
    calls = []

    class RefKernel(FakeKernel):
        """The JIT entry computing the reference into the outputs, so that warm's checks pass."""

        def __getitem__(self, grid):
            def run(*args, **constexprs):
                calls.append("jit")
                if "ROOTS_FIRST" in constexprs:
                    acc, lens, pool, rpi, seq, orig, ids, loc, new_seq, new_orig, bs = args[:11]
                    want = plain_step.plain_inputs_ref(acc, lens, bs, constexprs["ROOTS_FIRST"],
                                                       pool, rpi, seq,
                                                       orig if constexprs["HAS_ORIG"] else None)
                    for out, w in zip((ids, loc, new_seq, new_orig), want):
                        if w is not None:
                            out.copy_(w)
                else:
                    pred, acc, lens, n, kk = args
                    want = plain_step.plain_outputs_ref(pred, kk)
                    acc.copy_(want[0])
                    lens.copy_(want[1])
                return FakeCompiled(calls, 0, wrong=True)
            return run

    monkeypatch.setattr(plain_step, "_inputs_launch",
                        plain_step._Direct(RefKernel(), ("ROOTS_FIRST", "HAS_ORIG",
                                                         "BLOCK")))
    monkeypatch.setattr(plain_step, "_outputs_launch", plain_step._Direct(RefKernel(), ("BLOCK",)))
    monkeypatch.setattr(plain_step, "uses_kernels", lambda t: True)
    res = plain_step.warm("cpu", 8)
    assert res["mismatches"] == [] and res["variants"] == 4
    assert res["direct_off"].startswith("plain_inputs(roots_first=False): TypeError")
    assert plain_step._inputs_launch.off and plain_step._outputs_launch.off
    # the first variant's second launch went to its compiled kernel (refused: no JIT call); after
    # that both of each variant's launches go through the JIT entry
    assert calls == ["jit"] * 7
    assert "launched through Triton's JIT entry from now on" in caplog.text


# ------------------------------------------------------------------------------------------ warm-up


def _worker():
    pool = types.SimpleNamespace(req_to_token=torch.zeros(2, 64, dtype=torch.int32))
    return types.SimpleNamespace(model_runner=types.SimpleNamespace(req_to_token_pool=pool),
                                 max_batch_size=4, draft_token_num=8)


def test_warm_up_of_the_plain_kernels_is_reported_and_never_stops_start_up(monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = []
    monkeypatch.setattr(plain_step, "warm",
                        lambda device, k, dtype: (calls.append((str(device), k, dtype))
                                                  or {"variants": 4, "mismatches": ["x"]}))
    res = warmup.warm_spec_kernels(_worker(), kernels=(), accept=None, plain=True)
    assert calls == [("cpu", 8, torch.int32)] and res["kernels"] == ["plain_step"]
    assert res["mismatches"] == [("plain_step", "x")] and res["plain_variants"] == 4
    assert (warmup.warm_spec_kernels(_worker(), kernels=(), accept=None)["skipped"]
            == "no kernel found")

    def boom(*a):
        raise RuntimeError("no GPU")
    monkeypatch.setattr(plain_step, "warm", boom)
    res = warmup.warm_spec_kernels(_worker(), kernels=(), accept=None, plain=True)
    assert (res["kernels"] == []
            and "plain step kernels failed (RuntimeError: no GPU)" in caplog.text)


@pytest.mark.parametrize("mode", ["auto", "chain", "tree"])
def test_only_auto_mode_warms_the_plain_kernels(monkeypatch, mode):
    from fastverify.glue import verify_runtime

    seen = []
    monkeypatch.setattr(warmup, "warm_spec_kernels", lambda worker, **kw: seen.append(kw["plain"]))
    built = lambda worker, width: verify_runtime.VerifyRuntime(width, None, None, {})  # noqa: E731
    monkeypatch.setattr(verify_runtime, "_capture", built)
    monkeypatch.setattr(verify_runtime, "_build_one", built)
    spec = types.SimpleNamespace(speculative_num_draft_tokens=8, speculative_ngram_verify_mode=mode,
                                 speculative_ngram_match_type="BFS",
                                 speculative_ngram_verify_widths=None if mode == "tree" else "1,8")
    verify_runtime.build_runtimes(_worker(), spec=spec)
    assert seen == [mode == "auto"]


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_kernels_match_the_reference_on_the_gpu():
    """Compiled, on CUDA tensors: the same cases; then the compile cache holds one
    entry per variant met."""
    if plain_step._INTERPRETED:
        pytest.skip("this process interprets the kernels")
    res = compare_all("cuda")
    assert res["kernels"] is True and res["mismatches"] == []
    # inputs: (roots first or gathered) x (orig present or not) with int64 lengths, and the
    # int32 lengths of the last layout (with orig) x roots first or gathered; outputs: int32
    # and int64 sampled tokens
    for kernel, variants in ((plain_step._plain_inputs_kernel, 6),
                             (plain_step._plain_outputs_kernel, 2)):
        caches = getattr(kernel, "device_caches", None)
        if caches is None:
            continue  # another Triton's layout
        assert sum(len(c[0]) for c in caches.values()) == variants


def test_launch_benchmark_refuses_bad_arguments_and_a_machine_without_gpu(capsys):
    import plain_step_launch  # lab/ is on sys.path (tests/conftest.py)

    with pytest.raises(SystemExit) as e:
        plain_step_launch.main(["--bs", "1,x"])
    assert e.value.code == 2 and "--bs: comma-separated integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plain_step_launch.main(["--calls", "0"])
    if not torch.cuda.is_available():
        assert plain_step_launch.main(["--bs", "1"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_variant_key_follows_what_types_an_integer_argument():
    """An integer argument outside int32 is typed i64 by Triton (another compiled
    variant): it must key apart."""
    assert plain_step._wide(1, 7, 1 << 20) is False
    assert plain_step._wide(1, 1 << 31) is True and plain_step._wide(-(1 << 31) - 1) is True
    assert plain_step._wide(-(1 << 31), (1 << 31) - 1) is False
