"""Glue for `--tp-allreduce` (patch 0003) and the FlashInfer fusion SM/multicast gates (patch 0004).

Reads SGLang's platform detection, the FlashInfer version and the device attributes once, and calls
fastverify.allreduce for every decision:
  * `tp_allreduce_pass(view)`: a SGLang post-process pass (launcher, during argument
    resolution, right after the upstream fusion auto-enable/enforce-disable passes)
    returning the server-arg fields;
  * `apply_in_worker(server_args)`: in each TP worker before `_init_parallel_groups`, the
    environment half of the plan (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE on 0.5.23);
  * `fusion_sm_supported(backend)`, `sm12x_fusion_gate()`, `preflight_wants_multicast(cuda_driver)`:
    the SM and multicast gates at SGLang's fusion seams.
"""
from __future__ import annotations

import logging
import os
from typing import MutableMapping, Optional

from fastverify import allreduce as ar

logger = logging.getLogger("fastverify.allreduce")


# --------------------------------------------------------------------------------------------------
# what this process runs on
# --------------------------------------------------------------------------------------------------

def sglang_version() -> str:
    from sglang.version import __version__

    return str(__version__)


def flashinfer_version() -> Optional[str]:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    for dist in ("flashinfer-python", "flashinfer"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def device_sm() -> Optional[int]:
    """SM family as SGLang's own platform detection sees it (so tests can
    override it the SGLang way)."""
    try:
        from sglang.srt.runtime_context import get_platform

        p = get_platform()
        facts = (p.is_sm120, p.is_sm100, p.is_sm90)
    except ImportError:  # 0.5.16: probes in utils.common, looked up at call time
        from sglang.srt.utils import common

        facts = (common.is_sm120_supported(), common.is_sm100_supported(),
                 common.is_sm90_supported())
    for is_it, sm in zip(facts, (120, 100, 90)):
        if is_it:
            return sm
    return None


def multicast_supported(cuda_driver=None, device: Optional[int] = None) -> Optional[bool]:
    """CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED of the current device; None if it cannot be asked."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        if cuda_driver is None:
            from sglang.srt.utils.common import get_cuda_driver_bindings

            cuda_driver = get_cuda_driver_bindings()
        dev_index = torch.cuda.current_device() if device is None else device
        cuda_driver.cuInit(0)
        err, dev = cuda_driver.cuDeviceGet(dev_index)
        if err != cuda_driver.CUresult.CUDA_SUCCESS:
            return None
        attr = cuda_driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
        err, value = cuda_driver.cuDeviceGetAttribute(attr, dev)
        if err != cuda_driver.CUresult.CUDA_SUCCESS:
            return None
        return bool(value)
    except Exception:
        return None


def _nvlink_and_p2p(tp_size: int):
    try:
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < tp_size:
            return None, None
        p2p = all(torch.cuda.can_device_access_peer(i, j)
                  for i in range(tp_size) for j in range(tp_size) if i != j)
        from sglang.srt.distributed.device_communicators.custom_all_reduce_utils import (
            is_full_nvlink)
        from sglang.srt.utils.common import get_physical_device_id

        return bool(is_full_nvlink([get_physical_device_id(i) for i in range(tp_size)],
                                   tp_size)), p2p
    except Exception:
        return None, None


def topology(tp_size: int) -> ar.Topology:
    nvlink, p2p = _nvlink_and_p2p(tp_size)
    return ar.Topology(sm=device_sm(), has_nvlink=nvlink, p2p=p2p, multicast=multicast_supported())


# --------------------------------------------------------------------------------------------------
# launcher: the --tp-allreduce decision as a post-process pass
# --------------------------------------------------------------------------------------------------

def _payload_bytes(view) -> int:
    """One verify all-reduce: [draft tokens, hidden] in 2-byte dtype (hidden 7168 if the
    config is unreadable)."""
    try:
        cfg = view.get_model_config().hf_config
        cfg = getattr(cfg, "text_config", None) or cfg
        hidden = int(cfg.hidden_size)
    except Exception:
        hidden = 7168
    tokens = getattr(view, "speculative_num_draft_tokens", None) or 1
    return int(tokens) * hidden * 2


def plan_for(view) -> ar.AllReducePlan:
    choice = getattr(view, "tp_allreduce", None)
    if choice is None:
        return ar.decide(None, sglang_version=sglang_version(), topology=ar.Topology(),
                         tp_size=view.tp_size)
    table_path = getattr(view, "tp_allreduce_table", None)
    table = ar.load_table(table_path) if table_path else None
    return ar.decide(choice, sglang_version=sglang_version(), topology=topology(view.tp_size),
                     tp_size=view.tp_size, nnodes=getattr(view, "nnodes", 1) or 1,
                     flashinfer_version=flashinfer_version(), table=table,
                     table_source=f"--tp-allreduce-table {table_path}" if table_path
                     else "built-in table", payload_bytes=_payload_bytes(view))


def tp_allreduce_pass(view) -> dict:
    """SGLang post-process pass: {field: value} for the chosen path (nothing
    when unset/undecided)."""
    if getattr(view, "tp_allreduce", None) is None:
        return {}
    plan = plan_for(view)
    logger.info("--tp-allreduce %s -> %s: %s", view.tp_allreduce, plan.path
                or "SGLang's choice", plan.reason)
    if plan.path is None:
        return {}
    return {**plan.field_dict(), "tp_allreduce": plan.path}


# --------------------------------------------------------------------------------------------------
# TP worker: the environment half
# --------------------------------------------------------------------------------------------------

def apply_in_worker(server_args, environ: Optional[MutableMapping[str, str]] = None) -> dict:
    """Export the plan's environment (resolved path in server_args.tp_allreduce)
    before the groups exist."""
    path = getattr(server_args, "tp_allreduce", None)
    if path not in ar.PATHS:
        return {}
    env = ar.plan_for_path(path, sglang_version(), "").env_dict()
    (os.environ if environ is None else environ).update(env)
    return env


# --------------------------------------------------------------------------------------------------
# fusion gates (patch 0004)
# --------------------------------------------------------------------------------------------------

def fusion_sm_supported(backend: Optional[str]) -> bool:
    """Replaces the SM90/SM100-only check in flashinfer_comm_fusion._resolve_backend; raises with
    the remedy when SM12x is asked for on a FlashInfer that cannot build the kernels."""
    return ar.fusion_sm_allowed(device_sm(), backend or "auto", flashinfer_version())


def sm12x_fusion_gate() -> bool:
    """Per-call gate term (module constant): SM12x with a FlashInfer that builds the
    trtllm comm kernels. Fusion still only runs where a backend was requested (the
    per-call gate checks that too)."""
    sm = device_sm()
    return sm is not None and sm // 10 == 12 and ar.fusion_blocker(sm, flashinfer_version()) is None


def preflight_wants_multicast(cuda_driver) -> bool:
    """Whether the workspace preflight should probe the multicast granularity on this device."""
    return ar.preflight_probes_multicast(multicast_supported(cuda_driver))
