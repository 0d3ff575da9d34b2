"""Do the --nccl-* flags reach NCCL in every TP rank, and does the all-reduce
work inside a CUDA graph?

Two processes (one per GPU) apply the NCCL tuning through the same glue function the patched SGLang
calls in each TP worker (fastverify.glue.nccl_hook.apply_in_worker), then:
  1. all-reduce [tokens, hidden] bf16 eagerly and check the sum (rank r contributes r + 1);
  2. warm the all-reduce up on a side stream, capture it in a CUDA graph (capture hangs without the
     warm-up), replay, check the sum;
  3. time both (median of --reps timings of --calls back-to-back all-reduces, CUDA events);
  4. read the NCCL_DEBUG=INFO log of every rank and keep the lines that show the settings NCCL took
     ("NCCL_PROTO set by environment to LL", channel counts, tuning decisions).
Prints a `#` preamble and a table; --json PATH writes the same with a repro_command.
Runs with plain torch (no SGLang): python3.12 + torch 2.11 + 2 GPUs.

    PYTHONPATH=python NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
      python3 benchmark/nccl_env_check.py --nccl-proto LL --nccl-max-channels 4 --json OUT.json
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import socket
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from fastverify.bench.common import time_gpu_us  # noqa: E402

# Lines of NCCL_DEBUG=INFO output that show what NCCL took from the environment and chose.
EVIDENCE = re.compile(r"(set by environment to|NCCL "
                      r"version|channels|[Pp]roto|Algo|NCCL_ALGO|NCCL_PROTO|BUFFSIZE)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # the SGLang flag names (patch 0002); dest = the ServerArgs field names the glue reads
    p.add_argument("--nccl-algo", dest="nccl_algo")
    p.add_argument("--nccl-proto", dest="nccl_proto")
    p.add_argument("--nccl-min-channels", dest="nccl_min_channels", type=int)
    p.add_argument("--nccl-max-channels", dest="nccl_max_channels", type=int)
    p.add_argument("--nccl-buffsize", dest="nccl_buffsize", type=int)
    p.add_argument("--nccl-env", dest="nccl_env", action="append")
    p.add_argument("--nccl-tuning-profile", dest="nccl_tuning_profile")
    p.add_argument("--tokens", type=int, default=8,
                   help="rows of the all-reduced tensor (verify tokens)")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--calls", type=int, default=122,
                   help="all-reduces per timing (2 per layer x 61 layers)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--log-dir", default=None,
                   help="where the per-rank NCCL debug logs go (default: a temp dir)")
    p.add_argument("--json", dest="json_path")
    return p.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time(fn, calls: int, reps: int) -> float:
    """us per all-reduce: median of `reps` CUDA-event timings of fn(calls) (`calls` all-reduces)."""
    return time_gpu_us(lambda: fn(calls), reps, warmup=0)["median_us"] / calls


def worker(rank: int, args, port: int, log_dir: str, result_path: str) -> None:
    import torch
    import torch.distributed as dist

    from fastverify.glue import nccl_hook

    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV,TUNING")
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(log_dir, f"nccl.rank{rank}.%p.log")
    tuning = nccl_hook.apply_in_worker(args, rank=rank)           # the TP-worker seam of patch 0002
    print(tuning.log_line(rank), flush=True)

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world, device_id=dev)
    expect = float(sum(range(1, args.world + 1)))
    # [tokens, hidden]
    x = torch.full((args.tokens, args.hidden), float(rank + 1), dtype=torch.bfloat16, device=dev)

    y = x.clone()
    dist.all_reduce(y)
    torch.cuda.synchronize()
    eager_ok = bool(torch.all(y == expect).item())

    def eager(n):
        for _ in range(n):
            dist.all_reduce(y)

    for _ in range(3):
        y.copy_(x)
        eager(1)
    eager_us = _time(eager, args.calls, args.reps)

    # CUDA graph: warm up on the capture's side stream first, then capture `calls` all-reduces.
    z = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(z)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    one = torch.cuda.CUDAGraph()
    with torch.cuda.graph(one):
        dist.all_reduce(z)
    z.copy_(x)
    one.replay()
    torch.cuda.synchronize()
    graph_ok = bool(torch.all(z == expect).item())
    many = torch.cuda.CUDAGraph()
    with torch.cuda.graph(many):
        for _ in range(args.calls):
            dist.all_reduce(z)
    # F821 is a false positive: the lambda runs inside _time, before the `del many` below
    graph_us = (_time(lambda n: many.replay(), args.calls, args.reps)  # noqa: F821
                if graph_ok else None)

    dist.barrier()
    res = {"rank": rank, "eager_ok": eager_ok, "graph_ok": graph_ok, "eager_us": eager_us,
           "graph_us": graph_us,
           "exports": tuning.exports(), "provenance": tuning.provenance_lines(),
           "env_seen": {k: os.environ.get(k) for k in tuning.exports()},
           "nccl_version": list(torch.cuda.nccl.version())}
    Path(f"{result_path}.{rank}").write_text(json.dumps(res))
    # Tearing down a process group while captured graphs still hold its NCCL communicator
    # blocked past the 90 s limit on the 2x H200 machine (2026-11-30), after both ranks had
    # written correct results. The result is on disk, so release the graphs and leave without
    # the collective teardown.
    del one, many
    torch.cuda.synchronize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def evidence(log_dir: str, rank: int):
    lines = []
    for f in sorted(glob.glob(os.path.join(log_dir, f"nccl.rank{rank}.*.log"))):
        for line in Path(f).read_text(errors="replace").splitlines():
            if EVIDENCE.search(line):
                lines.append(line.strip())
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < args.world:
        print(f"nccl_env_check needs {args.world} CUDA GPUs; this machine has "
              f"{torch.cuda.device_count()}",
              file=sys.stderr)
        return 2
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="nccl-env-check-")
    os.makedirs(log_dir, exist_ok=True)
    result_path = os.path.join(log_dir, "result")
    mp.spawn(worker, args=(args, _free_port(), log_dir, result_path), nprocs=args.world, join=True)
    ranks = [json.loads(Path(f"{result_path}.{r}").read_text()) for r in range(args.world)]
    for r in ranks:
        r["nccl_debug"] = evidence(log_dir, r["rank"])
        # NCCL itself reports every variable it read from the environment
        r["nccl_took"] = {
            k: any(f"{k} set by environment to {v}" in line for line in r["nccl_debug"])
            for k, v in r["exports"].items()}

    env_keys = sorted(k for k in os.environ
                      if k.startswith(("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_")))
    print(f"# gpu: {torch.cuda.get_device_name(0)} x{args.world}; torch {torch.__version__}; "
          f"NCCL {'.'.join(map(str, ranks[0]['nccl_version']))}")
    print("# env: " + " ".join(f"{k}={os.environ[k]}" for k in env_keys))
    print(f"# args: {' '.join(sys.argv[1:])}")
    print(f"# all-reduce [{args.tokens}, {args.hidden}] bf16; median of {args.reps} timings of "
          f"{args.calls} calls")
    print(f"{'rank':>4} {'eager sum':>9} {'graph sum':>9} {'eager us':>9} {'graph us':>9}  NCCL "
          "took flags")
    for r in ranks:
        took = ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in r["nccl_took"].items()) or "-"
        g = f"{r['graph_us']:9.1f}" if r["graph_us"] is not None else f"{'-':>9}"
        print(f"{r['rank']:>4} {('ok' if r['eager_ok'] else 'WRONG'):>9} "
              f"{('ok' if r['graph_ok'] else 'WRONG'):>9} {r['eager_us']:9.1f} {g}  {took}")
    for r in ranks:
        print(f"# rank {r['rank']} provenance: " + "; ".join(r["provenance"]))
        for line in r["nccl_debug"][:12]:
            print(f"#   {line}")
    ok = all(r["eager_ok"] and r["graph_ok"] and all(r["nccl_took"].values()) for r in ranks)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({
            "ok": ok, "ranks": ranks, "tokens": args.tokens, "hidden": args.hidden,
            "calls": args.calls, "reps": args.reps, "env": {k: os.environ[k] for k in env_keys},
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "repro_command": ("PYTHONPATH=python "
                              + " ".join(f"{k}={shlex.quote(os.environ[k])}" for k in env_keys)
                              + " python3 benchmark/nccl_env_check.py "
                              + " ".join(map(shlex.quote, sys.argv[1:])))},
            indent=2))
    print("RESULT:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
