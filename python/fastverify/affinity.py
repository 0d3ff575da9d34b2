"""Pin each SGLang scheduler thread to a CPU of your choosing.

On a virtual machine the CPUs the guest sees are not equal. On the 2x H200 machine the same piece of Python
work took 6-8 ms on some CPUs and 13-17 ms on others, and a CPU could change from one to the other within
seconds (``lab/gpu/cpu_probe.py``). A TP rank's scheduler thread runs wherever the kernel put it, so the
host side of a step (all of an eager prefill's launch, the part of a decode step not hidden behind the GPU)
runs up to twice as long in one server process as in another. SGLang's ``SGLANG_SET_CPU_AFFINITY`` binds
each rank to a block of CPUs; that does not say which CPU of the block.

``FASTVERIFY_SCHED_CPUS=a,b,...`` pins the scheduler thread of the rank on GPU ``i`` (the process's current
CUDA device) to CPU ``cpus[i % len(cpus)]``, as its event loop starts. Only that thread: the threads the
process started before (NCCL's, the n-gram corpus' worker, torch's) keep the process's CPUs, so they do not
queue behind it. Threads the scheduler thread starts later inherit its CPU.

Turned on like the step trace: ``lab/steptrace/sitecustomize.py`` installs the import hook when the
variable is set and its folder is on ``PYTHONPATH``. Linux only (``sched_setaffinity`` of the calling thread).
"""

from __future__ import annotations

import logging
import os
from typing import Callable, List, Optional

ENV = "FASTVERIFY_SCHED_CPUS"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"

logger = logging.getLogger(__name__)


def parse_cpus(text: str) -> List[int]:
    """'3,17' -> [3, 17]; ranges as the kernel writes them ('0-2,8') are accepted. Raises ValueError on
    anything else or an empty list."""
    cpus: List[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            if hi < lo:
                raise ValueError(f"{ENV}: empty range {part!r}")
            cpus.extend(range(lo, hi + 1))
        else:
            cpus.append(int(part))
    if not cpus:
        raise ValueError(f"{ENV}: no CPU in {text!r}")
    if any(c < 0 for c in cpus):
        raise ValueError(f"{ENV}: negative CPU in {text!r}")
    return cpus


def cpu_for(cpus: List[int], device_index: int) -> int:
    return cpus[device_index % len(cpus)]


def pin_current_thread(cpu: int, setaffinity: Callable = os.sched_setaffinity,
                       allowed: Optional[set] = None) -> bool:
    """Pin the calling thread to ``cpu``. False (and the thread left as it was) when the CPU is not one the
    process may use."""
    allowed = allowed if allowed is not None else os.sched_getaffinity(0)
    if cpu not in allowed:
        logger.warning("%s: CPU %d is not among this process's CPUs %s; scheduler thread not pinned", ENV, cpu,
                       sorted(allowed))
        return False
    setaffinity(0, {cpu})  # pid 0: on Linux the calling thread only
    return True


def wrap_event_loop(fn, cpus: List[int], device_index: Callable[[], int]):
    """``Scheduler.run_event_loop`` that first pins the calling thread."""

    def run_event_loop(scheduler, *args, **kwargs):
        index = device_index()
        cpu = cpu_for(cpus, index)
        if pin_current_thread(cpu):
            logger.info("%s: scheduler thread of the rank on GPU %d pinned to CPU %d", ENV, index, cpu)
        return fn(scheduler, *args, **kwargs)

    run_event_loop.__wrapped__ = fn
    return run_event_loop


def _current_device() -> int:
    import torch

    return int(torch.cuda.current_device()) if torch.cuda.is_available() else 0


def install_import_hook(env=None) -> bool:
    """With FASTVERIFY_SCHED_CPUS set: wrap the scheduler's event loop when SGLang's scheduler is imported.
    True if installed. A malformed value raises at once (before SGLang starts)."""
    import sys

    from steptrace import _AfterImport  # lab/steptrace/, on PYTHONPATH with sitecustomize.py

    env = os.environ if env is None else env
    text = env.get(ENV)
    if not text:
        return False
    cpus = parse_cpus(text)

    def action(module) -> None:
        module.Scheduler.run_event_loop = wrap_event_loop(module.Scheduler.run_event_loop, cpus, _current_device)

    sys.meta_path.insert(0, _AfterImport(SCHEDULER_MODULE, action))
    return True
