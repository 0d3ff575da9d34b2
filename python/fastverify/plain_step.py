"""The small tensor work around auto's plain decode pass (``glue.auto.run_plain_decode``), fused.

Around its DECODE forward a plain step needs, per request: the root (the last accepted token of the
previous step) as int64 input id, the KV slot of the new token (``req_to_token[req_pool_indices,
seq_lens]``) as int64, the lengths counting the new token (``seq_lens + 1``, ``orig_seq_lens + 1``);
and after the pass the result in the shape of a verify step that accepted no draft (accept length 1,
the sampled token first in a zeroed row of k). In torch that is about ten launches of a few
microseconds of GPU time each at batch sizes 1-8, on a step whose GPU time is what the controller
weighs against speculation; here it is two Triton launches.

Compile variants: the batch size, the strides and k are runtime integers exempt from Triton's value
specialisation (``do_not_specialize``: no variant for 1 or for multiples of 16), the input pointers
from its alignment specialisation where this Triton allows (a view's offset makes none), and the
block is fixed, so the kernels compile once per (roots read first or gathered) x (orig_seq_lens
present or not) x input dtypes, and once per dtype of the sampled tokens (int32 from the sampling
kernels, int64 from greedy argmax). A server's decode batch always carries orig_seq_lens, in the
dtypes ``warm`` uses: it meets four variants.

Unlike torch indexing, the kernels do not bounds-check: an accept length of 0 or a length
past the req_to_token row reads out of range instead of failing a device assert (neither
occurs in a decode batch).

Launches: the first call of each variant goes through Triton's JIT entry (``kernel[grid](...)``: it
binds the arguments, builds the specialisation key, compiles or finds the variant), which returns
the compiled kernel; later calls of that variant launch the compiled kernel directly (``_Direct``),
keyed by what decides the variant here (the constexprs, the tensors' dtypes, whether an integer
argument needs 64 bits and, on a Triton without alignment exemptions, the inputs' 16-byte
alignment), so the step's host time no longer pays the JIT's binding and key per launch. ``warm``
launches each variant both ways and checks both against the reference, and turns the direct launch
off (logged) if it raises or disagrees; a launcher's ``jit_only`` keeps its launches on the JIT
entry (the baseline of lab/plain_step_launch.py).

``plain_inputs_ref`` / ``plain_outputs_ref`` are the torch statements the step ran before, kept as
the reference the kernels are tested against and as the path for tensors that are not on a GPU (the
CPU tests' stand-in batches) unless Triton's interpreter is on. Triton is imported with this module,
which ``glue.auto`` imports only inside the plain step.
"""
from __future__ import annotations

import inspect
import logging

logger = logging.getLogger("fastverify.plain_step")

# requests (inputs) or accept-token slots (outputs) per program: one program up to bs 128 / 16 x 8
BLOCK = 128

try:
    import triton
    import triton.language as tl
except ImportError:  # a machine without Triton runs the torch reference
    triton = tl = None

_INPUT_PTRS = ("acc_ptr", "lens_ptr", "pool_ptr", "rpi_ptr", "seq_ptr", "orig_ptr")
_OUTPUT_PTRS = ("pred_ptr",)


_ALIGN_EXEMPT = (triton is not None
                 and "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters)


def _jit_options(ints, ptrs) -> dict:
    opts = {"do_not_specialize": list(ints)}
    if _ALIGN_EXEMPT:
        opts["do_not_specialize_on_alignment"] = list(ptrs)
    return opts


class _Direct:
    """One kernel's launches: the first of each variant key through the JIT entry, which returns
    the compiled kernel; the next ones through that compiled kernel's own launcher (every
    parameter positionally, the constexprs last, as the JIT entry passes them). ``off``: why
    direct launches are not used (None: used); ``jit_only``: every launch through the JIT entry (a
    measurement's baseline)."""

    def __init__(self, kernel, constexprs):
        self.kernel = kernel
        self.constexprs = tuple(constexprs)  # names of the kernel's trailing constexpr parameters
        # (variant key, grid) -> the compiled kernel's launcher for that grid
        self.runners: dict = {}
        self.compiled: dict = {}  # variant key -> compiled kernel
        self.off = None
        self.jit_only = False
        self.direct_launches = 0

    def launch(self, grid, key, args) -> None:
        """``grid``: three dimensions (a compiled kernel's launcher reads all three); ``args``:
        every parameter of the kernel in order, the constexprs' values last."""
        if self.off is None and not self.jit_only:
            run = self.runners.get((key, grid))
            if run is None and key in self.compiled:
                run = self.runners[(key, grid)] = self.compiled[key][grid]
            if run is not None:
                run(*args)
                self.direct_launches += 1
                return
        n = len(self.constexprs)
        compiled = self.kernel[grid](*args[:-n], **dict(zip(self.constexprs, args[-n:])))
        if self.off is None and compiled is not None and hasattr(compiled, "__getitem__"):
            self.compiled[key] = compiled

    def turn_off(self, reason: str) -> None:
        self.off = reason
        self.runners.clear()
        self.compiled.clear()


def _aligned(*tensors) -> tuple:
    """The 16-byte alignment of each tensor's data, where Triton keys a variant by it (else ())."""
    return () if _ALIGN_EXEMPT else tuple(t.data_ptr() % 16 == 0 for t in tensors)


def _wide(*ints) -> bool:
    """Whether an integer argument falls outside int32 (Triton then types it
    i64: another variant)."""
    return any(not -(1 << 31) <= v < (1 << 31) for v in ints)


_plain_inputs_kernel = _plain_outputs_kernel = None
if triton is not None:
    try:
        @triton.jit(**_jit_options(("bs", "acc_s0", "acc_s1", "pool_s0", "pool_s1"), _INPUT_PTRS))
        def _plain_inputs_kernel(acc_ptr, lens_ptr, pool_ptr, rpi_ptr, seq_ptr, orig_ptr,
                                 ids_ptr, loc_ptr, new_seq_ptr, new_orig_ptr,
                                 bs, acc_s0, acc_s1, pool_s0, pool_s1,
                                 ROOTS_FIRST: tl.constexpr, HAS_ORIG: tl.constexpr,
                                 BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < bs
            row = i.to(tl.int64) * acc_s0
            if ROOTS_FIRST:
                root = tl.load(acc_ptr + row, mask=m, other=0)
            else:  # an accept length counts the root: the last accepted token is at length - 1
                last = tl.load(lens_ptr + i, mask=m, other=1).to(tl.int64) - 1
                root = tl.load(acc_ptr + row + last * acc_s1, mask=m, other=0)
            tl.store(ids_ptr + i, root.to(tl.int64), mask=m)
            seq = tl.load(seq_ptr + i, mask=m, other=0)
            rpi = tl.load(rpi_ptr + i, mask=m, other=0).to(tl.int64)
            loc = tl.load(pool_ptr + rpi * pool_s0 + seq.to(tl.int64) * pool_s1, mask=m, other=0)
            tl.store(loc_ptr + i, loc.to(tl.int64), mask=m)
            tl.store(new_seq_ptr + i, seq + 1, mask=m)
            if HAS_ORIG:
                orig = tl.load(orig_ptr + i, mask=m, other=0)
                tl.store(new_orig_ptr + i, orig + 1, mask=m)

        @triton.jit(**_jit_options(("n", "k"), _OUTPUT_PTRS))
        def _plain_outputs_kernel(pred_ptr, acc_ptr, lens_ptr, n, k, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = o < n
            row = o // k
            first = m & (o - row * k == 0)
            tok = tl.load(pred_ptr + row, mask=first, other=0)  # 0 in every other slot of the row
            tl.store(acc_ptr + o, tok.to(tl.int32), mask=m)
            tl.store(lens_ptr + row, tl.full([BLOCK], 1, tl.int32), mask=first)
    except Exception as e:  # noqa: BLE001 - an unusable Triton leaves the torch path, never a broken import
        logger.warning("plain step kernels unavailable (%s: %s); the step runs its torch ops",
                       type(e).__name__, e)
        _plain_inputs_kernel = _plain_outputs_kernel = None

# a kernel built while TRITON_INTERPRET=1 runs on CPU tensors too
_INTERPRETED = type(_plain_inputs_kernel).__name__ == "InterpretedFunction"
_inputs_launch = _Direct(_plain_inputs_kernel, ("ROOTS_FIRST", "HAS_ORIG", "BLOCK"))
_outputs_launch = _Direct(_plain_outputs_kernel, ("BLOCK",))


def uses_kernels(t) -> bool:
    """Whether tensors on ``t``'s device take the Triton kernels (else the torch reference)."""
    return _plain_inputs_kernel is not None and (t.is_cuda or _INTERPRETED)


def plain_inputs_ref(accept_tokens, accept_lens, bs: int, roots_first: bool, req_to_token,
                     req_pool_indices, seq_lens, orig_seq_lens):
    """The pass's inputs in torch: (input_ids int64, out_cache_loc int64, seq_lens + 1,
    orig_seq_lens + 1 or None). A root is read from each request's row of ``accept_tokens``
    ([bs * row] or [bs, row]): first when ``roots_first`` (every accept length is 1), else at
    its accept length - 1."""
    import torch

    acc = accept_tokens.reshape(bs, -1)  # [bs, row]
    if roots_first:
        roots = acc[:, 0]
    else:
        roots = acc.gather(1, (accept_lens.view(bs, 1) - 1).to(torch.long)).view(bs)
    out_cache_loc = req_to_token[req_pool_indices, seq_lens.to(torch.int64)].to(torch.int64)
    new_orig = orig_seq_lens + 1 if orig_seq_lens is not None else None
    return roots.to(torch.int64), out_cache_loc, seq_lens + 1, new_orig


def plain_outputs_ref(predict, k: int):
    """The pass's result in a verify step's shape, in torch: (accept_tokens int32 [bs * k], the
    sampled token first in each row of k and 0 after it; accept_lens int32 [bs], all 1)."""
    import torch

    bs = predict.shape[0]
    accept_lens = torch.ones(bs, dtype=torch.int32, device=predict.device)
    accept_tokens = torch.zeros(bs, k, dtype=torch.int32, device=predict.device)
    accept_tokens[:, 0] = predict
    return accept_tokens.flatten(), accept_lens


def plain_inputs(accept_tokens, accept_lens, bs: int, roots_first: bool, req_to_token,
                 req_pool_indices, seq_lens, orig_seq_lens):
    """``plain_inputs_ref``'s outputs (same values, same dtypes, new tensors) from one launch. The
    row length of ``accept_tokens`` is its size over ``bs``, as in the reference: the carried
    tokens' stride, whatever width the last step ran at."""
    import torch

    one_d = ((accept_lens, req_pool_indices, seq_lens)
             + ((orig_seq_lens,) if orig_seq_lens is not None else ()))
    dev = seq_lens.device
    if (bs < 1 or not uses_kernels(seq_lens) or req_to_token.dim() != 2
            or req_to_token.device != dev
            or accept_tokens.device != dev
            or not all(t.is_contiguous() and t.device == dev for t in one_d)):
        return plain_inputs_ref(accept_tokens, accept_lens, bs, roots_first, req_to_token,
                                req_pool_indices, seq_lens, orig_seq_lens)
    acc = accept_tokens.reshape(bs, -1)
    input_ids = torch.empty(bs, dtype=torch.int64, device=dev)
    out_cache_loc = torch.empty(bs, dtype=torch.int64, device=dev)
    new_seq_lens = torch.empty_like(seq_lens)
    has_orig = orig_seq_lens is not None
    new_orig = torch.empty_like(orig_seq_lens) if has_orig else None
    orig = orig_seq_lens if has_orig else seq_lens
    ints = (bs, acc.stride(0), acc.stride(1), req_to_token.stride(0), req_to_token.stride(1))
    key = (bool(roots_first), has_orig, acc.dtype, accept_lens.dtype, req_to_token.dtype,
           req_pool_indices.dtype,
           seq_lens.dtype, orig.dtype, _wide(*ints)) + _aligned(acc, accept_lens, req_to_token,
                                                                req_pool_indices,
                                                               seq_lens, orig)
    _inputs_launch.launch(
        ((bs + BLOCK - 1) // BLOCK, 1, 1), key,
        (acc, accept_lens, req_to_token, req_pool_indices, seq_lens, orig,
         input_ids, out_cache_loc, new_seq_lens, new_orig if has_orig else new_seq_lens,
         *ints, bool(roots_first), has_orig, BLOCK))
    return input_ids, out_cache_loc, new_seq_lens, new_orig


def plain_outputs(predict, k: int):
    """``plain_outputs_ref``'s outputs from one launch."""
    import torch

    if (k < 1 or not uses_kernels(predict) or predict.dim() != 1 or predict.shape[0] < 1
            or not predict.is_contiguous()):
        return plain_outputs_ref(predict, k)
    bs = predict.shape[0]
    accept_tokens = torch.empty(bs * k, dtype=torch.int32, device=predict.device)
    accept_lens = torch.empty(bs, dtype=torch.int32, device=predict.device)
    n = bs * k
    _outputs_launch.launch(((n + BLOCK - 1) // BLOCK, 1, 1),
                           (predict.dtype, _wide(n, k)) + _aligned(predict),
                           (predict, accept_tokens, accept_lens, n, k, BLOCK))
    return accept_tokens, accept_lens


def warm(device, k: int, pool_dtype=None, bs: int = 3) -> dict:
    """Launch both kernels once per variant a server meets, so that Triton compiles them before
    serving: the inputs with the scheduler batch's dtypes (accept tokens and lengths int32,
    req_to_token ``pool_dtype`` (int32), req_pool_indices and seq_lens int64, orig_seq_lens int32: a
    decode batch always carries them), roots read first and gathered; the outputs for sampled tokens
    int32 and int64. One batch size covers them all (it is no compile-time constant). Each variant
    is launched twice, through the JIT entry and then directly (``_Direct``), and each output is
    checked against the reference. Returns {"variants": variants, "mismatches": [names],
    "direct_checked": variants launched directly, "direct_off": why direct launches are off or
    None}, or {"skipped": reason}."""
    import torch

    probe = torch.empty(0, device=device)
    if not uses_kernels(probe):
        return {"skipped": f"no plain step kernels for device {device}"}
    pool_dtype = pool_dtype if pool_dtype is not None else torch.int32
    gen = torch.Generator(device="cpu").manual_seed(0)
    width = max(int(k), 1)
    pool = torch.randint(0, 1 << 20, (bs + 1, 32), generator=gen).to(pool_dtype).to(device)
    acc = torch.randint(0, 1 << 16, (bs * width,), generator=gen, dtype=torch.int32).to(device)
    lens = torch.randint(1, width + 1, (bs,), generator=gen, dtype=torch.int32).to(device)
    rpi = torch.randperm(bs + 1, generator=gen)[:bs].to(torch.int64).to(device)
    seq = torch.randint(0, 31, (bs,), generator=gen, dtype=torch.int64).to(device)
    orig = seq.to(torch.int32)
    mismatches, variants, direct = [], 0, 0

    def check(name, run, want) -> None:
        """``run`` twice: the JIT entry (the variant's first launch), then the direct
        launch, each against the reference; a direct launch that raises or disagrees
        turns direct launches off."""
        nonlocal variants, direct
        variants += 1
        if not _same(run(), want):
            mismatches.append(name)
            return
        before = _inputs_launch.direct_launches + _outputs_launch.direct_launches
        try:
            again = run()
        except Exception as e:  # noqa: BLE001 - another Triton's launcher: the JIT entry stays
            _turn_off_direct(f"{name}: {type(e).__name__}: {e}")
            return
        if _inputs_launch.direct_launches + _outputs_launch.direct_launches > before:
            direct += 1
            if not _same(again, want):
                _turn_off_direct(f"{name}: the direct launch's output differs from the reference")

    for roots_first in (False, True):
        args = (acc, lens, bs, roots_first, pool, rpi, seq, orig)
        check(f"plain_inputs(roots_first={roots_first})", lambda: plain_inputs(*args),
              plain_inputs_ref(*args))
    for dtype in (torch.int32, torch.int64):
        pred = torch.randint(0, 1 << 16, (bs,), generator=gen).to(dtype).to(device)
        check(f"plain_outputs({str(dtype).replace('torch.', '')})",
              lambda: plain_outputs(pred, width), plain_outputs_ref(pred, width))
    return {"variants": variants, "mismatches": mismatches, "direct_checked": direct,
            "direct_off": _inputs_launch.off or _outputs_launch.off}


def _turn_off_direct(reason: str) -> None:
    logger.warning("plain step kernels: launched through Triton's JIT entry from now on "
                   "(%s)", reason)
    _inputs_launch.turn_off(reason)
    _outputs_launch.turn_off(reason)


def _same(got, want) -> bool:
    """Tuples of tensors (or None) equal in value, dtype and shape."""
    import torch

    return len(got) == len(want) and all(
        (a is None and b is None) or (a is not None and b is not None and a.dtype == b.dtype
                                      and a.shape == b.shape and torch.equal(a.cpu(), b.cpu()))
        for a, b in zip(got, want))
