"""Which implementation carries the TP all-reduces of the verify and decode
passes (`--tp-allreduce`).

Choices and what they map to in each pinned SGLang:
    nccl              custom all-reduce off (disable_custom_all_reduce=True), FlashInfer fusion off
                      and, on 0.5.23, SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0: every TP all-reduce goes
                      to NCCL (pynccl inside CUDA graphs). Tune it with the --nccl-* flags.
    custom            SGLang's custom all-reduce (the default when usable). SGLang itself disables
                      it on more than two PCIe-only GPUs, so that combination is refused here.
    pcie-ipc          0.5.23 only: SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 (its pcie_ipc communicator, TP
                      2/4/8, bf16), custom all-reduce and FlashInfer fusion off so nothing is
                      checked before it. 0.5.16 has no such path: refused with what to use instead.
    flashinfer-fused  flashinfer_allreduce_fusion_backend=trtllm (fused all-reduce + residual +
                      RMSNorm). Opt-in only: SM90, SM10x, or SM12x with FlashInfer >= 0.7
                      (FlashInfer 0.6.14, the pin of SGLang 0.5.16, builds its trtllm comm kernels
                      for majors 9 and 10 only);
                      TP >= 2 on one node.
    auto              decided from a measured table (built-in below, or `--tp-allreduce-table FILE`
                      written by the all-reduce microbenchmark): the fastest measured path for this
                      SGLang, SM, fabric and TP size at the verify payload. Without at least two
                      measured candidates for that setup, SGLang's own choice is kept: never a
                      guess. FlashInfer fusion is never picked on PCIe without a measured row for it
                      (upstream closed an enable-by-default change after TP4 over PCIe regressed,
                      sglang#32330, 2026-08-12).

Measured-table format (`fastverify-allreduce-table/1`):
    {"format": "fastverify-allreduce-table/1",
     "rows": [{"sm": 120, "fabric": "pcie"|"nvlink", "tp": 8, "bytes": 12288, "path": "pcie-ipc",
               "us": 5.3, "gpu": "...", "source": "...", "date": "YYYY-MM-DD"}, ...]}
`us` is the median time of one all-reduce of `bytes` bytes (CUDA-graph replay where
the source says so).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple

TABLE_FORMAT = "fastverify-allreduce-table/1"
CHOICES = ("auto", "nccl", "custom", "pcie-ipc", "flashinfer-fused")
PATHS = CHOICES[1:]
PCIE_IPC_TP_SIZES = (2, 4, 8)          # SGLang 0.5.23 pcie_ipc_ar.py: world sizes 2, 4 and 8
FUSION_SM_MAJORS = (9, 10, 12)
# gen_trtllm_comm_module: majors [9, 10] in 0.6.14, [9, 10, 12] in 0.7.2
FLASHINFER_SM12X_COMM_MIN = (0, 7)

FLAG_HELP = {
    "tp_allreduce": "TP all-reduce path for verify/decode: auto (from a measured table), nccl, "
                    "custom, pcie-ipc (SGLang >= 0.5.23), flashinfer-fused (opt-in fused "
                    "all-reduce+RMSNorm). Unset: SGLang's own choice.",
    "tp_allreduce_table": f"Measured all-reduce table ({TABLE_FORMAT}) for --tp-allreduce auto; "
                          "default: the built-in table.",
}

# Built-in measured rows. Only numbers somebody measured, each with its source and date.
BUILTIN_ROWS: Tuple[dict, ...] = (
    # Project measurement on the 2x H200 machine (NVLink NV18), torch 2.11 + NCCL 2.28.9, [tokens,
    # 7168] bf16, medians of 20 timings of 122 back-to-back all-reduces replayed in a CUDA graph.
    *({"sm": 90, "fabric": "nvlink", "tp": 2, "bytes": tok * 7168 * 2, "path": "nccl", "us": us,
       "gpu": "2x H200", "source": "fastverify measurement, torch NCCL in a CUDA graph",
       "date": "2026-11-30"}
      for tok, us in ((1, 19.8), (8, 19.5), (64, 24.8))),
    # SGLang 0.5.23 pcie_ipc_ar.py module docstring: one 8x SM120 (RTX PRO 6000
    # class) PCIe host, 12 KiB.
    {"sm": 120, "fabric": "pcie", "tp": 8, "bytes": 12 << 10, "path": "pcie-ipc", "us": 5.3,
     "gpu": "8x SM120", "source": "SGLang 0.5.23 pcie_ipc_ar.py docstring", "date": "2026-09"},
    {"sm": 120, "fabric": "pcie", "tp": 8, "bytes": 12 << 10, "path": "nccl", "us": 205.0,
     "gpu": "8x SM120", "source": "SGLang 0.5.23 pcie_ipc_ar.py docstring", "date": "2026-09"},
)


class AllReduceConfigError(ValueError):
    """A bad --tp-allreduce choice for this SGLang/GPU, or a malformed --tp-allreduce-table."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """What the launcher knows about the GPUs (None: unknown)."""
    sm: Optional[int] = None              # 90, 100, 120, ... (major * 10 + minor)
    has_nvlink: Optional[bool] = None     # all TP GPUs joined by NVLink
    p2p: Optional[bool] = None            # peer access between the TP GPUs
    multicast: Optional[bool] = None      # CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED

    @property
    def fabric(self) -> Optional[str]:
        return None if self.has_nvlink is None else ("nvlink" if self.has_nvlink else "pcie")


@dataclasses.dataclass(frozen=True)
class AllReducePlan:
    """The chosen path, why, and what to set: server-arg fields (launcher) and
    environment (TP workers)."""
    path: Optional[str]                       # None: keep SGLang's own choice
    reason: str
    fields: Tuple[Tuple[str, object], ...] = ()
    env: Tuple[Tuple[str, str], ...] = ()

    def field_dict(self) -> dict:
        return dict(self.fields)

    def env_dict(self) -> dict:
        return dict(self.env)


def _version_tuple(v) -> Tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        out = []
        for part in v.split("."):
            digits = "".join(ch for ch in part if ch.isdigit())
            if not digits:
                break
            out.append(int(digits))
            if not part.isdigit():
                break
        return tuple(out)
    return tuple(int(x) for x in v)


def has_pcie_ipc(sglang_version) -> bool:
    return _version_tuple(sglang_version)[:3] >= (0, 5, 23)


# --------------------------------------------------------------------------------------------------
# FlashInfer fusion gates
# --------------------------------------------------------------------------------------------------

def fusion_blocker(sm: Optional[int], flashinfer_version) -> Optional[str]:
    """Why FlashInfer's fused all-reduce cannot run on this device, or None when it
    can (sm None: unknown)."""
    if sm is None:
        return None
    major = sm // 10
    if major not in FUSION_SM_MAJORS:
        return (f"FlashInfer all-reduce fusion needs SM90, SM10x or SM12x; this GPU is SM{sm}. "
                "Use --tp-allreduce nccl/custom/pcie-ipc instead.")
    fi = _version_tuple(flashinfer_version)
    if major == 12 and fi and fi[:2] < FLASHINFER_SM12X_COMM_MIN:
        return (f"FlashInfer {'.'.join(map(str, fi))} cannot build its trtllm comm kernels for "
                f"SM{sm} (gen_trtllm_comm_module supports SM majors 9 and 10 only). Remedy: use "
                "SGLang 0.5.23 with FlashInfer >= 0.7 (0.7.2 builds them for SM12x), or choose "
                "--tp-allreduce nccl (SGLang 0.5.16 has no PCIe IPC all-reduce).")
    return None


def fusion_sm_allowed(sm: Optional[int], backend: Optional[str], flashinfer_version) -> bool:
    """The SM gate at SGLang's fusion seams: upstream SM90/SM100, plus SM12x
    when fusion was requested.

    Raises AllReduceConfigError with the remedy when SM12x is requested on a FlashInfer that cannot
    build the kernels, instead of failing deep inside FlashInfer's JIT.
    """
    if sm is None or backend is None:
        return False
    major = sm // 10
    if major in (9, 10):
        return True
    if major == 12:
        blocker = fusion_blocker(sm, flashinfer_version)
        if blocker:
            raise AllReduceConfigError(blocker)
        return backend in ("auto", "trtllm")
    return False


def preflight_probes_multicast(multicast_supported: Optional[bool]) -> bool:
    """Whether the FlashInfer workspace preflight should ask for the multicast granularity.

    PCIe boxes have no multicast; asking fails the probe and fusion is silently skipped.
    Unknown: ask (upstream).
    """
    return multicast_supported is not False


# --------------------------------------------------------------------------------------------------
# measured tables
# --------------------------------------------------------------------------------------------------

def _check_rows(rows, origin: str) -> Tuple[dict, ...]:
    need = {"sm": int, "fabric": str, "tp": int, "bytes": int, "path": str, "us": (int, float)}
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise AllReduceConfigError(f"{origin}: row {i} is not an object")
        for key, typ in need.items():
            if not isinstance(row.get(key), typ) or isinstance(row.get(key), bool):
                raise AllReduceConfigError(f"{origin}: row {i} needs {key!r} "
                                           f"({getattr(typ, '__name__', 'number')})")
        if row["path"] not in PATHS:
            raise AllReduceConfigError(f"{origin}: row {i} path {row['path']!r}; allowed: "
                                       f"{', '.join(PATHS)}")
        if row["fabric"] not in ("nvlink", "pcie"):
            raise AllReduceConfigError(f"{origin}: row {i} fabric {row['fabric']!r}; allowed: "
                                       "nvlink, pcie")
        if row["us"] <= 0 or row["bytes"] <= 0:
            raise AllReduceConfigError(f"{origin}: row {i} needs positive 'us' and 'bytes'")
        out.append(dict(row))
    return tuple(out)


def load_table(path) -> Tuple[dict, ...]:
    origin = f"--tp-allreduce-table {path}"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise AllReduceConfigError(f"{origin}: file not found") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AllReduceConfigError(f"{origin}: not a readable JSON file ({e})") from None
    if (not isinstance(data, dict) or data.get("format") != TABLE_FORMAT
            or not isinstance(data.get("rows"), list)):
        raise AllReduceConfigError(f"{origin}: expected {{\"format\": \"{TABLE_FORMAT}\", "
                                   f"\"rows\": [...]}}")
    return _check_rows(data["rows"], origin)


def write_table(path, rows: Sequence[Mapping[str, object]]) -> None:
    rows = _check_rows(list(rows), f"table {path}")
    Path(path).write_text(json.dumps({"format": TABLE_FORMAT, "rows": list(rows)}, indent=2) + "\n")


def measured_best(rows, *, sm: int, fabric: str, tp: int, payload_bytes: int,
                  candidates: Sequence[str]):
    """Per candidate path, its row nearest to payload_bytes; return (best row, all
    compared rows) or None."""
    per_path = {}
    for row in rows:
        if (row["sm"] != sm or row["fabric"] != fabric or row["tp"] != tp
                or row["path"] not in candidates):
            continue
        cur = per_path.get(row["path"])
        if cur is None or abs(row["bytes"] - payload_bytes) < abs(cur["bytes"] - payload_bytes):
            per_path[row["path"]] = row
    if len(per_path) < 2:
        return None
    compared = sorted(per_path.values(), key=lambda r: r["us"])
    return compared[0], compared


# --------------------------------------------------------------------------------------------------
# the decision
# --------------------------------------------------------------------------------------------------

def plan_for_path(path: str, sglang_version, reason: str) -> AllReducePlan:
    pcie_ipc = has_pcie_ipc(sglang_version)
    if path == "nccl":
        fields = {"disable_custom_all_reduce": True, "flashinfer_allreduce_fusion_backend": None}
    elif path == "custom":
        fields = {"disable_custom_all_reduce": False, "flashinfer_allreduce_fusion_backend": None}
    elif path == "pcie-ipc":
        fields = {"disable_custom_all_reduce": True, "flashinfer_allreduce_fusion_backend": None}
    else:  # flashinfer-fused
        fields = {"flashinfer_allreduce_fusion_backend": "trtllm"}
    env = {}
    if pcie_ipc:
        env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] = "1" if path == "pcie-ipc" else "0"
    return AllReducePlan(path, reason, tuple(fields.items()), tuple(env.items()))


def _explicit(choice: str, sglang_version, topo: Topology, tp_size: int, nnodes: int,
              flashinfer_version) -> AllReducePlan:
    if choice == "nccl":
        return plan_for_path("nccl", sglang_version, "requested: every TP all-reduce through NCCL")
    if choice == "custom":
        if tp_size > 2 and topo.has_nvlink is False:
            raise AllReduceConfigError(
                "--tp-allreduce custom: SGLang disables its custom all-reduce on more than two "
                f"PCIe-only GPUs (TP {tp_size} without NVLink). Allowed here: "
                + ("pcie-ipc, nccl" if has_pcie_ipc(sglang_version)
                   else "nccl (SGLang 0.5.16 has no pcie-ipc)"))
        return plan_for_path("custom", sglang_version, "requested: SGLang custom all-reduce")
    if choice == "pcie-ipc":
        if not has_pcie_ipc(sglang_version):
            raise AllReduceConfigError(
                f"--tp-allreduce pcie-ipc: SGLang {sglang_version} has no PCIe IPC all-reduce (it "
                "arrived in SGLang 0.5.23 as SGLANG_ENABLE_PCIE_IPC_ALLREDUCE). Use SGLang 0.5.23, "
                "or here --tp-allreduce nccl tuned with --nccl-proto/--nccl-max-channels, or "
                "custom at TP 2.")
        if tp_size not in PCIE_IPC_TP_SIZES:
            raise AllReduceConfigError(f"--tp-allreduce pcie-ipc: TP size {tp_size} is not "
                                       "supported; allowed TP sizes: "
                                       f"{', '.join(map(str, PCIE_IPC_TP_SIZES))}")
        return plan_for_path("pcie-ipc", sglang_version,
                             "requested: SGLang PCIe IPC all-reduce (bf16; others use NCCL)")
    if choice == "flashinfer-fused":
        if tp_size < 2:
            raise AllReduceConfigError("--tp-allreduce flashinfer-fused: needs TP size >= 2 (no "
                                       "all-reduce at TP 1)")
        if nnodes > 1:
            raise AllReduceConfigError("--tp-allreduce flashinfer-fused: the trtllm backend is "
                                       "single-node only; allowed: nccl, custom"
                                       + (", pcie-ipc" if has_pcie_ipc(sglang_version) else ""))
        blocker = fusion_blocker(topo.sm, flashinfer_version)
        if blocker:
            raise AllReduceConfigError(f"--tp-allreduce flashinfer-fused: {blocker}")
        reason = "requested: FlashInfer fused all-reduce + residual + RMSNorm (trtllm backend)"
        if topo.has_nvlink is False:
            reason += ("; PCIe fabric: upstream measured a TP4 PCIe regression (sglang#32330), "
                       "compare against nccl/pcie-ipc with the all-reduce benchmark")
        if topo.multicast is False:
            reason += ("; no multicast on this device: the workspace preflight skips the multicast "
                       "probe")
        return plan_for_path("flashinfer-fused", sglang_version, reason)
    raise AllReduceConfigError(f"--tp-allreduce: {choice!r}; allowed: {', '.join(CHOICES)}")


def decide(choice: Optional[str], *, sglang_version, topology: Topology, tp_size: int,
           nnodes: int = 1,
           flashinfer_version=None, table: Optional[Sequence[dict]] = None,
           table_source: str = "built-in table",
           payload_bytes: int = 8 * 7168 * 2) -> AllReducePlan:
    """Decide the TP all-reduce path. `payload_bytes` is one verify all-reduce
    ([tokens, hidden] x 2 B)."""
    if choice is None:
        return AllReducePlan(None, "--tp-allreduce not given: SGLang's own choice")
    if choice != "auto":
        return _explicit(choice, sglang_version, topology, tp_size, nnodes, flashinfer_version)
    if tp_size < 2:
        return AllReducePlan(None, "auto: TP 1 has no all-reduce; nothing to choose")
    if topology.sm is None or topology.fabric is None:
        return AllReducePlan(None,
                             "auto: GPU SM or fabric unknown at launch; keeping SGLang's own "
                             "choice")
    candidates = ["nccl"]
    if tp_size <= 2 or topology.has_nvlink:
        candidates.append("custom")
    if has_pcie_ipc(sglang_version) and tp_size in PCIE_IPC_TP_SIZES:
        candidates.append("pcie-ipc")
    if nnodes == 1 and fusion_blocker(topology.sm, flashinfer_version) is None:
        candidates.append("flashinfer-fused")   # only ever chosen from a measured row of its own
    rows = BUILTIN_ROWS if table is None else table
    best = measured_best(rows, sm=topology.sm, fabric=topology.fabric, tp=tp_size,
                         payload_bytes=payload_bytes, candidates=candidates)
    where = f"SM{topology.sm}/{topology.fabric}/TP{tp_size}"
    if best is None:
        return AllReducePlan(None,
                             f"auto: {table_source} has fewer than two measured paths for {where} "
                                   f"among {', '.join(candidates)}; keeping SGLang's own choice "
                                   "(measure with the all-reduce benchmark and pass "
                                   "--tp-allreduce-table)")
    row, compared = best
    summary = ", ".join(f"{r['path']} {r['us']:g} us @ {r['bytes']} B ({r.get('source', '?')}, "
                        f"{r.get('date', '?')})"
                        for r in compared)
    return plan_for_path(row["path"], sglang_version,
                         f"auto: fastest measured for {where} in {table_source}: {summary}")
