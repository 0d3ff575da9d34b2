"""Per-thread CPU use of running processes, sampled from /proc: which threads of a
server's scheduler are busy, and on which CPUs, while a load runs (a host step that runs
twice as long as usual for seconds at a time is either other work on its core or a slower
core; this tells them apart).

    python3 lab/gpu/thread_cpu.py PID [PID ...] --interval 1 --samples 20 > threads.txt

Every interval, for each process: the threads that used more than --min-pct of one CPU in it (thread
id, name, share of one CPU, the CPU it last ran on, and that CPU's hyperthread siblings' busy
share), then each CPU of the process's affinity list with its busy share. At the start, each
process's affinity list and thread count. Linux only; a process that exits is dropped.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def read_threads(pid: int) -> dict:
    """{tid: (name, utime + stime ticks, last cpu)} of one process; {} when it is gone."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                raw = fh.read()
        except OSError:
            continue
        # the name is in parentheses and may hold spaces; the fields after it are space separated
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        rest = raw[raw.rindex(")") + 2:].split()
        # rest[0] is field 3 (state): utime field 14, stime 15, processor 39
        out[int(tid)] = (name, int(rest[11]) + int(rest[12]), int(rest[36]))
    return out


def read_cpus() -> dict:
    """{cpu: (busy ticks, total ticks)} from /proc/stat."""
    out = {}
    with open("/proc/stat") as fh:
        for line in fh:
            if line.startswith("cpu") and line[3].isdigit():
                f = line.split()
                vals = [int(x) for x in f[1:]]
                idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
                out[int(f[0][3:])] = (sum(vals) - idle, sum(vals))
    return out


def siblings(cpu: int) -> list:
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as fh:
            return parse_list(fh.read().strip())
    except OSError:
        return [cpu]


def parse_list(text: str) -> list:
    """'0-3,8' -> [0, 1, 2, 3, 8]"""
    cpus = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        else:
            cpus.append(int(part))
    return cpus


def affinity(pid: int) -> list:
    try:
        return sorted(os.sched_getaffinity(pid))
    except OSError:
        return []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pids", nargs="+", type=int)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--min-pct", type=float, default=5.0,
                    help="threads under this share of one CPU are left out")
    args = ap.parse_args(argv)
    hz = os.sysconf("SC_CLK_TCK")
    pids = [p for p in args.pids if os.path.isdir(f"/proc/{p}")]
    for pid in pids:
        cpus = affinity(pid)
        print(f"# pid {pid}: {len(read_threads(pid))} threads, affinity {len(cpus)} CPUs {cpus}")
    prev = {pid: read_threads(pid) for pid in pids}
    prev_cpu, t_prev = read_cpus(), time.monotonic()
    for n in range(args.samples):
        time.sleep(args.interval)
        now, t_now = read_cpus(), time.monotonic()
        dt = t_now - t_prev
        busy = {c: (now[c][0] - prev_cpu[c][0]) / max(now[c][1] - prev_cpu[c][1], 1) for c in now
                if c in prev_cpu}
        print(f"== sample {n + 1} ({dt:.2f} s)")
        for pid in list(pids):
            cur = read_threads(pid)
            if not cur:
                print(f"  pid {pid}: gone")
                pids.remove(pid)
                continue
            rows = []
            for tid, (name, ticks, cpu) in cur.items():
                old = prev[pid].get(tid)
                pct = 100.0 * (ticks - old[1]) / hz / dt if old else 0.0
                if pct >= args.min_pct:
                    sib = [s for s in siblings(cpu) if s != cpu]
                    sib_busy = " ".join(f"cpu{s} {100 * busy.get(s, 0):.0f}%" for s in sib)
                    rows.append((pct,
                                 f"  pid {pid} tid {tid:<8} {name[:16]:<16} {pct:6.1f}% on "
                                      f"cpu{cpu:<4} (sibling {sib_busy or '-'})"))
            for _, line in sorted(rows, reverse=True):
                print(line)
            allowed = affinity(pid)
            if allowed:
                print(f"  pid {pid} CPUs busy: " + " ".join(f"{c}:{100 * busy.get(c, 0):.0f}"
                                                            for c in allowed))
            prev[pid] = cur
        prev_cpu, t_prev = now, t_now
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
