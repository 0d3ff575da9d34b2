"""The host's CPUs as a scheduler thread sees them: topology, speed per CPU, speed right after an
idle sleep, and which CPUs slow each other down when both are busy.

    python3 lab/gpu/cpu_probe.py [--json FILE] [--reps 5] [--bases 0,16]

An eager prefill of a 24-layer model is launched by one Python thread per TP rank, and the step
lasts as long as the slower rank's launch; on the 2x H200 machine that launch took 20-25 ms in
some server processes and 40-60 ms in others, for the same request. This separates the usual
suspects, each with a fixed piece of Python work (attribute and dict traffic, like a launch
path; ~5 ms on a fast core):

- per CPU: the work's median time with the process pinned to that CPU alone (a
  slow CPU, or a busy one);
- after sleeping: the work's time right after sleeping 0, 1, 5, 20 ms on one CPU (a core that clocks
  down when its thread sleeps, as a scheduler does between requests with ``--sleep-on-idle``);
- pairs: the work on a base CPU while a spinning process holds each other CPU in turn (CPUs
  that share a core or its caches, also where the hypervisor does so behind CPUs the guest
  sees as separate cores).

Plus the topology the guest reports (package, core, hyperthread siblings, NUMA node per CPU) and
what ``psutil.cpu_count(logical=False)`` says (SGLang's ``SGLANG_SET_CPU_AFFINITY`` binds each TP
rank to a block of that many cores divided by the ranks). Linux only.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from thread_cpu import parse_list  # noqa: E402  (the kernel's CPU list format)

SLEEPS_MS = (0, 1, 5, 20)
SLOW = 1.15  # a pair whose work takes this much longer than alone shares something


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def topology(root: str = "/sys/devices/system") -> Dict[int, dict]:
    """{cpu: {package, core, siblings, node}} from sysfs; fields the guest
    does not expose are None."""
    cpus = parse_list(_read(f"{root}/cpu/online") or "")
    nodes: Dict[int, int] = {}
    node_dir = f"{root}/node"
    if os.path.isdir(node_dir):
        for name in sorted(os.listdir(node_dir)):
            if name.startswith("node") and name[4:].isdigit():
                for c in parse_list(_read(f"{node_dir}/{name}/cpulist") or ""):
                    nodes[c] = int(name[4:])
    out = {}
    for c in cpus:
        base = f"{root}/cpu/cpu{c}/topology"
        pkg, core, sib = (_read(f"{base}/{f}") for f in
                          ("physical_package_id", "core_id", "thread_siblings_list"))
        out[c] = {"package": int(pkg) if pkg is not None else None,
                  "core": int(core) if core is not None else None,
                  "siblings": parse_list(sib) if sib else None,
                  "node": nodes.get(c)}
    return out


def work(n: int = 20000) -> float:
    """A fixed piece of Python work; returns its seconds."""
    class Obj:
        __slots__ = ("a", "b")

        def __init__(self, a, b):
            self.a, self.b = a, b

    t0 = time.perf_counter()
    d: Dict[int, Obj] = {}
    acc = 0
    for i in range(n):
        o = Obj(i, i & 7)
        d[i & 1023] = o
        acc += d[(i * 7) & 1023].b if (i * 7) & 1023 in d else o.a
    return time.perf_counter() - t0


def _median_ms(reps: int, sleep_s: float = 0.0) -> float:
    times = []
    for _ in range(reps):
        if sleep_s:
            time.sleep(sleep_s)
        times.append(work())
    return statistics.median(times) * 1e3


def _spin(cpu: int, stop) -> None:
    os.sched_setaffinity(0, {cpu})
    x = 0
    while not stop.is_set():
        for _ in range(10000):
            x += 1


def per_cpu(cpus: List[int], reps: int) -> Dict[int, float]:
    for _ in range(3):  # the interpreter's first runs of the work are slower wherever they run
        work()
    out = {}
    for c in cpus:
        os.sched_setaffinity(0, {c})
        work()  # settle on the CPU
        out[c] = _median_ms(reps)
    return out


def after_sleep(cpu: int, reps: int) -> Dict[int, float]:
    os.sched_setaffinity(0, {cpu})
    work()
    return {ms: _median_ms(reps, ms / 1e3) for ms in SLEEPS_MS}


def pairs(base: int, cpus: List[int], reps: int) -> Dict[int, float]:
    """{other cpu: the work's median ms on base while a spinner holds other}; key
    base: the work alone."""
    os.sched_setaffinity(0, {base})
    ctx = mp.get_context("fork")
    work()
    out = {base: _median_ms(reps)}
    for c in cpus:
        if c == base:
            continue
        stop = ctx.Event()
        p = ctx.Process(target=_spin, args=(c, stop), daemon=True)
        p.start()
        time.sleep(0.02)
        out[c] = _median_ms(reps)
        stop.set()
        p.join(1.0)
    return out


def sharing(alone_ms: float, with_ms: Dict[int, float], slow: float = SLOW) -> List[int]:
    """The CPUs whose spinner made the base's work slower than ``slow`` x its time alone."""
    return sorted(c for c, t in with_ms.items() if t > slow * alone_ms)


def pick(passes: List[Dict[int, float]], n: int) -> List[int]:
    """The ``n`` CPUs whose slowest pass was fastest (a CPU fast in one pass and slow in another
    ranks by its slow pass), in order of that time."""
    worst = {c: max(p[c] for p in passes) for c in passes[0]}
    return sorted(worst, key=lambda c: (worst[c], c))[:n]


def render(result: dict) -> str:
    lines = [f"# python {sys.version.split()[0]}, {result['logical']} logical CPUs, psutil "
             f"physical: {result['physical']}"]
    topo = result["topology"]
    lines.append("cpu  package core node siblings   work ms (alone)")
    for c in sorted(result["per_cpu"], key=int):
        t = topo.get(c) or topo.get(str(c)) or {}
        sib = ",".join(map(str, t.get("siblings") or [])) or "-"
        lines.append(f"{int(c):3d}  {str(t.get('package')):>7} {str(t.get('core')):>4} "
                     f"{str(t.get('node')):>4} {sib:<10} {result['per_cpu'][c]:.2f}")
    vals = list(result["per_cpu"].values())
    lines.append(f"work alone: median {statistics.median(vals):.2f} ms, min {min(vals):.2f}, max "
                 f"{max(vals):.2f}")
    lines.append(f"after sleeping (cpu {result['sleep_cpu']}): " + ", ".join(
        f"{ms} ms -> {t:.2f}" for ms, t in result["after_sleep"].items()))
    for base, row in result["pairs"].items():
        row = dict(row)
        alone = row.pop(base)
        shared = sharing(alone, row)
        worst = max(row.items(), key=lambda kv: kv[1]) if row else (None, 0.0)
        lines.append(f"pairs on cpu {base} (alone {alone:.2f} ms): slower than {SLOW}x with "
                     f"{shared or 'none'}; worst cpu {worst[0]} {worst[1]:.2f} ms")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--reps", type=int, default=5, help="work repetitions per median")
    ap.add_argument("--bases", default="0", help="CPUs to run the pair test on, comma separated")
    ap.add_argument("--pick", type=int, default=0,
                    help="also time every CPU twice more and end with a line 'CPUS a,b,...': the N "
                         "fastest")
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    try:
        import psutil
        physical = psutil.cpu_count(logical=False)
    except ImportError:
        physical = None
    bases = [b for b in parse_list(args.bases) if b in cpus]
    result = {"logical": len(cpus), "physical": physical, "topology": topology(),
              "per_cpu": per_cpu(cpus, args.reps), "sleep_cpu": cpus[0],
              "after_sleep": after_sleep(cpus[0], args.reps),
              "pairs": {b: pairs(b, cpus, args.reps) for b in bases}}
    if args.pick:
        passes = [result["per_cpu"]] + [per_cpu(cpus, args.reps) for _ in range(2)]
        result["pick_passes"] = passes[1:]
        result["picked"] = pick(passes, args.pick)
    os.sched_setaffinity(0, set(cpus))
    print(render(result))
    if args.pick:
        print("picked over three passes (each CPU's slowest): " + ", ".join(
            f"{c} {max(p[c] for p in passes):.2f} ms" for c in result["picked"]))
        print("CPUS " + ",".join(map(str, result["picked"])))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
