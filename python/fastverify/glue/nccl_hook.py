"""Glue for the NCCL tuning flags (patch 0002-nccl-tuning-flags): the only place that reads
os.environ and the NCCL version for this concern; everything else lives in fastverify.nccl.

Two seams, same code in SGLang 0.5.16 and 0.5.23:
  * launcher, during the server-args checks: `validate_server_args(server_args)` builds the tuning
    once so every bad flag/profile fails before any process starts;
  * every TP worker, in distributed/bootstrap.py right after `_set_all_reduce_flags` and before
    `_init_parallel_groups` (the first NCCL communicator): `apply_in_worker(server_args, rank)`
    exports the variables and logs the effective settings with their provenance once per rank.
"""
from __future__ import annotations

import logging
import os
from typing import MutableMapping, Optional

from fastverify.nccl import NcclTuning, tuning_from_args

logger = logging.getLogger("fastverify.nccl")

_APPLIED: Optional[NcclTuning] = None


def nccl_version() -> Optional[tuple]:
    """NCCL version of the torch in this process, e.g. (2, 28, 9); None where torch has
    no NCCL (CPU builds)."""
    try:
        import torch

        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return tuple(v) if isinstance(v, (tuple, list)) else None


def build_tuning(args, environ=None, version=None) -> NcclTuning:
    environ = os.environ if environ is None else environ
    version = nccl_version() if version is None else version
    return tuning_from_args(args, environ, version)


def validate_server_args(server_args) -> Optional[NcclTuning]:
    """Launcher side: raise NcclConfigError (a ValueError naming the flag) on any bad value."""
    tuning = build_tuning(server_args)
    if tuning.requested:
        logger.info("NCCL settings each TP worker will export: %s",
                    "; ".join(tuning.provenance_lines()))
    return tuning


def apply_in_worker(server_args, rank: int,
                    environ: Optional[MutableMapping[str, str]] = None) -> NcclTuning:
    """TP-worker side, before the first NCCL communicator: export and log once per process."""
    global _APPLIED
    # a draft worker in the same process reuses the target's groups
    if _APPLIED is not None:
        return _APPLIED
    environ = os.environ if environ is None else environ
    tuning = build_tuning(server_args, environ)
    environ.update(tuning.exports())
    _APPLIED = tuning
    if tuning.requested:
        logger.info(tuning.log_line(rank))
    return tuning


def _reset_for_tests() -> None:
    global _APPLIED
    _APPLIED = None
