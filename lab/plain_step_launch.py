"""Host time of the auto mode's plain-step tensor work per call: the torch ops, Triton's JIT entry,
and the compiled kernel launched directly (python/fastverify/plain_step.py).

    python lab/plain_step_launch.py [--bs 1,4] [--k 8] [--calls 400] [--repeats 7] [--json OUT]

At a GPU-bound decode step the host's time per step is the margin that keeps the GPU fed; in auto
mode each plain step calls ``plain_inputs`` before its forward and ``plain_outputs`` after it. This
times each on the host clock per call (mean of ``--calls`` back-to-back calls, the median of
``--repeats`` such runs; the GPU keeps up, nothing waits on it), for the three ways of launching
them, with the server's dtypes (accept tokens and lengths int32, req_to_token int32,
req_pool_indices and seq_lens int64, orig_seq_lens int32, sampled tokens int32). The baseline,
Triton's JIT entry (the launchers' ``jit_only``), runs in the same invocation; every path's output
is checked against the torch reference first. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from fastverify.bench.common import (NoGpuError, calls_of, collect_env, exit_no_gpu,  # noqa: E402
                                     format_preamble, format_table, repro_command, time_host_us,
                                     write_json)

SCRIPT = "lab/plain_step_launch.py"
# the reference's torch ops; Triton's JIT entry; the compiled kernel
PATHS = ("torch", "jit", "direct")


def make_inputs(bs: int, k: int, device):
    """One decode batch's tensors in the server's dtypes (a pool of 4 * bs rows of 4096 slots)."""
    import torch

    gen = torch.Generator().manual_seed(bs * 100 + k)
    acc = torch.randint(0, 1 << 16, (bs * k,), generator=gen, dtype=torch.int32).to(device)
    lens = torch.ones(bs, dtype=torch.int32).to(device)
    pool = torch.randint(0, 1 << 20, (4 * bs, 4096), generator=gen, dtype=torch.int32).to(device)
    rpi = torch.randperm(4 * bs, generator=gen)[:bs].to(torch.int64).to(device)
    seq = torch.randint(100, 4000, (bs,), generator=gen, dtype=torch.int64).to(device)
    orig = seq.to(torch.int32)
    pred = torch.randint(0, 1 << 16, (bs,), generator=gen, dtype=torch.int32).to(device)
    return (acc, lens, bs, True, pool, rpi, seq, orig), pred


def _calls(path: str, args, pred, k: int):
    """The two calls of one plain step on `path` (a callable)."""
    from fastverify import plain_step

    if path == "torch":
        return ((lambda: plain_step.plain_inputs_ref(*args)),
                (lambda: plain_step.plain_outputs_ref(pred, k)))
    return (lambda: plain_step.plain_inputs(*args)), (lambda: plain_step.plain_outputs(pred, k))


def _set_path(path: str) -> None:
    from fastverify import plain_step

    plain_step._inputs_launch.jit_only = plain_step._outputs_launch.jit_only = path == "jit"


def time_call(fn, calls: int, repeats: int) -> float:
    """Median over `repeats` of the mean host microseconds per call of
    `calls` back-to-back calls."""
    import torch

    return time_host_us(calls_of(fn), calls, repeats, sync=torch.cuda.synchronize)


def run(bs_list, k: int, calls: int, repeats: int) -> dict:
    import torch

    from fastverify import plain_step

    if not plain_step.uses_kernels(torch.empty(0, device="cuda")):
        raise NoGpuError("the plain step kernels are unavailable here (no Triton)")
    rows, checks = [], {}
    for bs in bs_list:
        args, pred = make_inputs(bs, k, "cuda")
        want_in, want_out = (plain_step.plain_inputs_ref(*args),
                             plain_step.plain_outputs_ref(pred, k))
        row = {"bs": bs, "k": k}
        for path in PATHS:
            _set_path(path)
            fin, fout = _calls(path, args, pred, k)
            before = (plain_step._inputs_launch.direct_launches
                      + plain_step._outputs_launch.direct_launches)
            ok = all(plain_step._same(fin(), want_in) and plain_step._same(fout(), want_out)
                     for _ in range(3))
            direct = (plain_step._inputs_launch.direct_launches
                      + plain_step._outputs_launch.direct_launches - before)
            checks[f"bs{bs}/{path}"] = {"matches_reference": ok, "direct_launches": direct}
            row[f"{path}_inputs_us"] = time_call(fin, calls, repeats)
            row[f"{path}_outputs_us"] = time_call(fout, calls, repeats)
        for path in PATHS:
            row[f"{path}_step_us"] = row[f"{path}_inputs_us"] + row[f"{path}_outputs_us"]
        row["direct_vs_jit"] = row["direct_step_us"] / row["jit_step_us"]
        rows.append(row)
    _set_path("direct")
    return {"rows": rows, "checks": checks, "direct_off": plain_step._inputs_launch.off}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bs", default="1,4", help="batch sizes, comma-separated (default 1,4)")
    ap.add_argument("--k", type=int, default=8,
                    help="accept-token row length: the widest verify width (8)")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    try:
        bs_list = [int(x) for x in a.bs.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--bs: comma-separated integers, got {a.bs!r}")
    if not bs_list or min(bs_list) < 1 or a.k < 1 or a.calls < 1 or a.repeats < 1:
        ap.error("--bs, --k, --calls and --repeats must be positive")
    try:
        import torch

        if not torch.cuda.is_available():
            raise NoGpuError("plain_step_launch times CUDA launches: it needs a CUDA GPU (torch "
                             f"{torch.__version__}, none available here)")
        import triton

        info = collect_env({"triton": triton.__version__})
        res = run(bs_list, a.k, a.calls, a.repeats)
    except NoGpuError as e:
        return exit_no_gpu(e)
    print(format_preamble(info, {"k": a.k, "calls": a.calls, "repeats": a.repeats}, notes=[
        f"triton: {info['triton']}; host us per call, median of {a.repeats} runs of {a.calls} "
        "calls; baseline: jit (Triton's JIT entry)"]))
    cols = ["bs"] + [f"{p} {part}" for p in PATHS
                     for part in ("in", "out", "step")] + ["direct/jit"]
    table = [[r["bs"]] + [r[f"{p}_{part}_us"] for p in PATHS
                          for part in ("inputs", "outputs", "step")]
             + [f"{r['direct_vs_jit']:.2f}x"] for r in res["rows"]]
    print(format_table(cols, table))
    bad = [name for name, c in res["checks"].items() if not c["matches_reference"]]
    print("# outputs against the torch reference: "
          f"{'all match' if not bad else 'MISMATCH in ' + ', '.join(bad)}; direct launches: "
          f"{'off (' + res['direct_off'] + ')' if res['direct_off'] else 'on'}")
    if a.json:
        write_json(a.json, {"info": info, "args": vars(a), **res},
                   repro_command(argv or sys.argv[1:], SCRIPT))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
