"""Shared pieces of the microbenchmarks (`fastverify bench`, benchmark/, lab/): the `#` preamble,
fixed-width tables, JSON with a repro command, the clean refusal on a machine without GPUs, and the
two timers every benchmark uses: `time_gpu_us` (CUDA events, eager or around CUDA-graph replays) and
`time_host_us` (the host clock, for host-side costs).

Nothing here imports torch at module level, so the CPU tests and `--dry-run` work without CUDA.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

# Variables that change what a collective does; shown in every preamble.
ENV_PREFIXES = ("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_", "CUDA_", "FLASHINFER_", "TORCH_NCCL",
                "PYTORCH_CUDA")
# Multicast must stay off on the shared H200 hosts; the benchmarks refuse to run without these.
REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


class NoGpuError(RuntimeError):
    """Raised when the benchmark needs more CUDA devices than the machine has."""


def require_gpus(n: int, what: str) -> int:
    """Return the CUDA device count, or raise NoGpuError with a message that
    says what is missing."""
    try:
        import torch
    except ImportError:
        raise NoGpuError(f"{what} needs PyTorch with CUDA and {n} GPU(s); torch is not "
                         "installed") from None
    if not torch.cuda.is_available():
        raise NoGpuError(
            f"{what} needs {n} CUDA GPU(s); this machine has none (torch {torch.__version__}, "
            "torch.cuda.is_available() is False). Run it on a GPU machine, or use --dry-run to "
            "print the plan."
        )
    count = torch.cuda.device_count()
    if count < n:
        raise NoGpuError(f"{what} needs {n} CUDA GPU(s); this machine has {count}")
    return count


def enforce_no_multicast(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Set the variables that keep NVLink multicast off (NCCL NVLS, torch
    symmetric memory, NVSHMEM).

    A value that asks for multicast is an error rather than something silently overridden.
    """
    env = os.environ if env is None else env
    for key, val in REQUIRED_ENV.items():
        cur = env.get(key)
        if cur is not None and cur != val:
            raise ValueError(f"{key}={cur}: multicast must stay off on these machines; set "
                             f"{key}={val}")
        env[key] = val
    return {k: env[k] for k in REQUIRED_ENV}


def _run(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001 - informational only
        return ""


def collect_env(extra_versions: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """GPU, driver, CUDA, torch, NCCL and FlashInfer versions plus the
    collective-related environment."""
    info: Dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            cap = torch.cuda.get_device_capability(0)
            info["compute_capability"] = f"{cap[0]}.{cap[1]}"
        try:
            v = torch.cuda.nccl.version()
            info["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001
            info["nccl"] = "unknown"
    except ImportError:
        info["torch"] = "not installed"
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if smi:
        info["driver"] = smi.splitlines()[0]
    if extra_versions:
        info.update(extra_versions)
    info["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    return info


def format_preamble(info: Mapping[str, Any], args: Optional[Mapping[str, Any]] = None,
                    notes: Iterable[str] = ()) -> str:
    lines = []
    for key in ("date_utc", "host", "gpus", "compute_capability", "driver", "cuda_runtime",
                "torch", "nccl", "flashinfer", "flashinfer_pcie", "python"):
        if key in info:
            val = info[key]
            if isinstance(val, list):
                val = f"{len(val)} x {val[0]}" if val and len(set(val)) == 1 else ", ".join(val)
            lines.append(f"# {key}: {val}")
    env = info.get("env") or {}
    lines.append("# env: " + (" ".join(f"{k}={v}" for k, v in env.items()) or "(none)"))
    if args:
        lines.append("# args: " + " ".join(f"{k}={v}" for k, v in args.items()))
    for n in notes:
        lines.append(f"# {n}")
    return "\n".join(lines)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]],
                 floatfmt: str = "{:.1f}") -> str:
    """Fixed-width table: right-aligned numbers, left-aligned text, a dashed
    rule under the header."""
    cells = [[c for c in columns]]
    for r in rows:
        out = []
        for v in r:
            if v is None:
                out.append("-")
            elif isinstance(v, float):
                out.append(floatfmt.format(v))
            else:
                out.append(str(v))
        cells.append(out)
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    numeric = [all(_is_num(r[i]) for r in rows) if rows else False for i in range(len(columns))]

    def fmt(row: List[str]) -> str:
        return "  ".join(s.rjust(w) if numeric[i] else s.ljust(w)
                         for i, (s, w) in enumerate(zip(row, widths))).rstrip()

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def _is_num(v: Any) -> bool:
    return v is None or isinstance(v, (int, float)) and not isinstance(v, bool)


def split_label(spec: str, default: Callable[[str], str]) -> tuple:
    """``LABEL=PATH`` -> (LABEL, PATH); a bare PATH -> (default(PATH), PATH). The label ends at the
    first ``=`` (a path may hold one)."""
    if "=" in spec:
        label, _, path = spec.partition("=")
        return label, path
    return default(spec), spec


def repro_command(argv: Sequence[str], script: str) -> str:
    """The command line that reproduces a run, relative to the repository root."""
    return " ".join(["python", script] + [shlex.quote(a) for a in argv])


def write_json(path: str | os.PathLike, payload: Mapping[str, Any], repro: str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = dict(payload)
    data["repro_command"] = repro
    p.write_text(json.dumps(data, indent=1, sort_keys=False, default=_json_default) + "\n")
    return p


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of no samples")
    return float(statistics.median(xs))


# ------------------------------------------------------------ the timers (torch imported lazily)
def time_gpu_us(fn: Callable[[], Any], reps: int, *, calls: int = 1, graph: bool = False,
                warmup: int = 3, stream=None, pre_capture_warmup: int = 3,
                sync: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """Device time of ``calls`` back-to-back calls of ``fn``, timed ``reps`` times (CUDA events).

    Eager (``graph=False``): ``warmup`` untimed rounds, then each timing records an event pair
    around the calls. ``graph=True``: the calls are captured into one CUDA graph and each timing is
    one replay; they first run ``pre_capture_warmup`` times on the capture's own side stream
    (``stream``, or a new one): collectives (NCCL) hang in capture unless they were first used on
    that stream; then ``warmup`` untimed replays. ``sync`` (e.g. a barrier) runs before each timing
    so that ranks start together. Returns the samples and their median in microseconds per call
    (and the graph under "graph", which the caller drops to release its memory).
    """
    import torch

    def many():
        for _ in range(calls):
            fn()

    run, out = many, {}
    if graph:
        s = stream if stream is not None else torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(pre_capture_warmup):
                many()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
            many()
        torch.cuda.synchronize()
        run, out["graph"] = g.replay, g
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    samples = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        if sync is not None:
            sync()
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    out.update(samples_us=samples, median_us=median(samples))
    return out


def time_host_us(run: Callable[[int], Any], calls: int, repeats: int,
                 sync: Optional[Callable[[], None]] = None) -> float:
    """Host time per call: the median over ``repeats`` runs of ``run(calls)`` on the host clock, in
    microseconds per call. ``run`` makes the ``calls`` back-to-back calls itself (`calls_of`), so
    the timer adds no call of its own per call. ``sync`` (e.g. torch.cuda.synchronize) runs before
    and after each run, outside the timed part."""
    runs = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        run(calls)
        runs.append((time.perf_counter() - t0) / calls * 1e6)
        if sync is not None:
            sync()
    return median(runs)


def calls_of(fn: Callable[[], Any]) -> Callable[[int], None]:
    """``run(n)`` for `time_host_us`: ``n`` calls of ``fn``."""
    def run(n: int) -> None:
        for _ in range(n):
            fn()
    return run


def exit_no_gpu(err: NoGpuError) -> int:
    print(f"error: {err}", file=sys.stderr)
    return 2
