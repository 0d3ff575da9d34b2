"""How long a probe on the plain path waits for the n-gram corpus, against how many steps before it
the stretch's output was put: SGLang's own corpus (`NgramCorpus`, its C++ trie inserting on a
thread of its own), driven as the plain path drives it.

    python lab/probe_put_lead.py [--capacity 10000000] [--bs 1,4,16] [--step-ms 1.9]
                                 [--json out.json]

Each of ``--bs`` requests writes one token a step (novel tokens: every n-gram is new, the insert's
dearest case); the host's scheduler is a busy wait of ``--step-ms`` a step. Every ``--interval``
steps a probe looks drafts up (`synchronize`, then `batch_get` on each request's last
``--depth`` tokens, as `glue.auto._corpus_behind` does) and its wait is timed. The stretch's
output since the last put (each request's last depth + n - 1 tokens, as `plain_path._put_stretch`
gives it) is put ``lead`` steps before the probe: 1, where the plain path put it before, and
`plain_path.put_lead(bs)`, where it puts it now, in alternating cycles (A B B A ...) on the same
corpus. Before the cycles, one put's insert alone is timed (`synchronize` right after the put).
Then cycles that end in a real lookup (the stretch leaves the path for it): the output since the
early put put before the lookup, as `leave` did, or after it (`plain_path.put_pending`).
Absolute times are this host's: the trie's insert is memory-bound and its speed differs between
hosts; run it on the GPU machine's host for that host's numbers.
"""
import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python")]

from path_host_time import cpu_name  # noqa: E402  (the lab's other host-time benchmark)


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Requests:
    """``bs`` requests writing novel tokens into SGLang's corpus as a stretch on the plain path
    does: their prompts put first (a prefill's put), then steps of one token each, a busy wait of
    ``a.step_ms`` a step, the output since the last put put as `plain_path._put_stretch` gives it
    (each request's last depth + n - 1 tokens)."""

    def __init__(self, corpus, bs, a, rng, tag):
        self.corpus, self.a, self.rng = corpus, a, rng
        self.outs = [[rng.randrange(a.vocab) for _ in range(a.prompt)] for _ in range(bs)]
        corpus.batch_put([list(o) for o in self.outs])
        corpus.synchronize()
        self.rids = [f"{tag}-{i}" for i in range(bs)]
        self.unput = 0  # steps written since the last put

    def put(self, n=None):
        n = self.unput if n is None else n
        self.corpus.batch_put([list(o[-(self.a.depth + n - 1):]) for o in self.outs])
        self.unput = 0

    def stretch(self, lead):
        """``a.interval`` steps, the output since the last put put at the step ``lead`` steps
        before the interval's end (where its lookup is due)."""
        for s in range(self.a.interval):
            for o in self.outs:
                o.append(self.rng.randrange(self.a.vocab))
            self.unput += 1
            if s == self.a.interval - lead:
                self.put()
            spin(self.a.step_ms)

    def lookup_us(self):
        """A lookup on each request's last depth tokens, timed with its wait for the inserts."""
        ctx = [list(o[-self.a.depth:]) for o in self.outs]
        totals = [len(o) for o in self.outs]
        t = time.perf_counter()
        self.corpus.synchronize()
        self.corpus.batch_get(self.rids, ctx, totals)
        return (time.perf_counter() - t) * 1e6


def abba(a_value, b_value, n):
    """n values alternating A B B A A B B A ..."""
    return [a_value if c % 4 in (0, 3) else b_value for c in range(n)]


def run_bs(corpus, bs, a, leads, rng, tag):
    """Cycles of ``a.interval`` steps at batch size ``bs``, the put ``lead`` steps before each
    probe (leads alternating A B B A ...). Returns {lead: [wait us per probe]} and the insert
    alone (us per put of one interval's output, median of ``a.cycles // 4 + 1``)."""
    r = Requests(corpus, bs, a, rng, tag)
    alone = []
    for _ in range(a.cycles // 4 + 1):
        for o in r.outs:
            o.extend(rng.randrange(a.vocab) for _ in range(a.interval))
        t = time.perf_counter()
        r.put(a.interval)
        corpus.synchronize()
        alone.append((time.perf_counter() - t) * 1e6)
    waits = {lead: [] for lead in leads}
    for lead in abba(leads[0], leads[1], a.cycles):
        r.stretch(lead)
        waits[lead].append(r.lookup_us())
    corpus.erase_match_state(r.rids)
    return waits, statistics.median(alone)


def run_leave(corpus, bs, a, rng, tag):
    """Cycles of ``a.interval`` steps at batch size ``bs`` ending in a real lookup: the stretch
    leaves the path, its output since the early put (made `put_lead` steps before) still to be
    put. Alternating (A B B A ...): the put first and then the lookup (how `leave` did it), or the
    lookup first and then the put (`plain_path.put_pending`). Returns {order: [wait us]}."""
    from fastverify.glue.plain_path import put_lead

    r = Requests(corpus, bs, a, rng, tag)
    waits = {"put first": [], "look up first": []}
    for first in abba("put first", "look up first", a.cycles):
        r.stretch(put_lead(bs))
        if first == "put first":
            r.put()
        waits[first].append(r.lookup_us())
        if first == "look up first":
            r.put()
        corpus.erase_match_state(r.rids)  # (the worker's lookups start from a fresh state)
    return waits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=int, default=10_000_000,
                    help="trie nodes (SGLang's --speculative-ngram-capacity; default its default)")
    ap.add_argument("--bs", default="1,4,16", help="batch sizes (default 1,4,16)")
    ap.add_argument("--step-ms", type=float, default=1.9, help="host time a step (default 1.9)")
    ap.add_argument("--interval", type=int, default=32, help="steps between probes (default 32)")
    ap.add_argument("--cycles", type=int, default=24, help="probes per batch size (default 24)")
    ap.add_argument("--depth", type=int, default=18, help="trie depth (default 18, SGLang's)")
    ap.add_argument("--prompt", type=int, default=300, help="prompt tokens a request (default 300)")
    ap.add_argument("--warm", type=int, default=200,
                    help="600-token texts put before the first cycle (default 200)")
    ap.add_argument("--vocab", type=int, default=49152,
                    help="token ids drawn below (default 49152)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in a.bs.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--bs takes batch sizes separated by commas, got {a.bs!r}")
    if not sizes or min(sizes) < 1:
        ap.error("--bs needs batch sizes >= 1")
    if a.interval < 2 or a.cycles < 2 or a.depth < 2 or a.capacity < 1000:
        ap.error("--interval, --cycles and --depth must be >= 2, --capacity >= 1000")

    from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

    from fastverify.glue.plain_path import put_lead

    rng = random.Random(a.seed)
    t = time.perf_counter()
    corpus = NgramCorpus(max_trie_depth=a.depth, min_bfs_breadth=1, max_bfs_breadth=8,
                         draft_token_num=8, match_type="BFS", capacity=a.capacity)
    built_s = time.perf_counter() - t
    for _ in range(a.warm):
        corpus.batch_put([[rng.randrange(a.vocab) for _ in range(600)]])
    corpus.synchronize()
    import sglang

    env = {"cpu": cpu_name(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "sglang": getattr(sglang, "__version__", "?"), "capacity": a.capacity,
           "corpus_built_s": round(built_s, 2), "step_ms": a.step_ms, "interval": a.interval,
           "depth": a.depth, "cycles": a.cycles}
    print(f"# a probe's wait for the n-gram corpus, {env['cpu']} ({env['cpus']} CPUs), SGLang "
          f"{env['sglang']}, capacity {a.capacity:,} nodes (built in {built_s:.1f} s), "
          f"{a.step_ms} ms steps, a probe every {a.interval} steps, depth {a.depth}")
    print(f"{'bs':>3} {'insert alone':>13} {'lead':>5} {'wait median':>12} {'p90':>9} "
          f"{'probes':>7}")
    rows, leaves = [], []
    for bs in sizes:
        leads = [1, put_lead(bs)]
        if leads[1] == 1:
            leads = [1, 1]
        waits, alone = run_bs(corpus, bs, a, leads, rng, f"bs{bs}")
        for lead in dict.fromkeys(leads):
            w = waits[lead]
            row = {"bs": bs, "lead": lead, "baseline": lead == 1,
                   "insert_alone_us": round(alone, 1),
                   "wait_median_us": round(statistics.median(w), 1),
                   "wait_p90_us": round(pct(w, 0.9), 1), "probes": len(w)}
            rows.append(row)
            print(f"{bs:>3} {alone:>10.0f} us {lead:>5} {row['wait_median_us']:>9.0f} us "
                  f"{row['wait_p90_us']:>6.0f} us {len(w):>7}"
                  + ("  (baseline: the put one step before)" if lead == 1 else "  (put_lead)"))
        for first, w in run_leave(corpus, bs, a, rng, f"leave{bs}").items():
            leaves.append({"bs": bs, "order": first, "baseline": first == "put first",
                           "wait_median_us": round(statistics.median(w), 1),
                           "wait_p90_us": round(pct(w, 0.9), 1), "lookups": len(w)})
    print("# a real lookup after the stretch leaves the path (the early put made put_lead steps "
          "before): its wait")
    print(f"{'bs':>3} {'order':>14} {'wait median':>12} {'p90':>9} {'lookups':>8}")
    for r in leaves:
        print(f"{r['bs']:>3} {r['order']:>14} {r['wait_median_us']:>9.0f} us "
              f"{r['wait_p90_us']:>6.0f} us {r['lookups']:>8}"
              + ("  (baseline)" if r["baseline"] else "  (put_pending)"))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"environment": env, "rows": rows, "real_lookups": leaves,
                       "repro_command": "python lab/probe_put_lead.py " + " ".join(
                           sys.argv[1:] if argv is None else argv)}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
