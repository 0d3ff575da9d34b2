"""The evaluation command's client and analysis: interleaved rounds, paired per request.

  run      one group of servers (one plain server A, a second plain server P for the noise floor,
           the modes to judge): rounds in alternating server order (A B C D, then D C B A, ...),
           every server flushed (POST /flush_cache) before each pass, each prompt sent once per
           pass; starts no round that would end past --time-budget-s. Writes the raw record
           (--out raw.json). --flush never: the memorised case instead (each server's radix
           cache and n-gram corpus keep every earlier pass: after the warm-up's flush, one
           unrecorded pass of every cell teaches each server the outputs, and its drafts of the
           recorded passes come from its own earlier outputs of the same prompts).
           --interleave wave: the servers take turns every c prompts of a cell (a wave, each
           flushed before it), the order reversed every wave, instead of every prompt set.
           After the rounds, each distinct first departure of a server's greedy output from
           A's (same round, prompt and cell) is judged by A's top logprobs there, as
           lossless.py judges one: a rounding tie or a FAIL (--judge-departures, --judge-s).
  analyze  raw records (one per group) -> summary.json, summary.txt (the printed table), one PNG
           per group; --logs DIR (the servers' logs, <group>.<server>.log): auto's own
           per-request verify records summed into the pooled section
  env      the machine: GPU, driver, versions, NCCL/TORCH env (env.json, merged into the summary)
  prompts  print the prompt sets (eval_prompts.py)

A pass: one server, one cell (prompt set, concurrency, ignore_eos), every prompt of the set once.
Per request: TTFT (first streamed chunk with an output token), decode tok/s = (tokens - 1) /
(latency - TTFT), end-to-end tok/s = tokens / latency, accept length (meta_info spec_accept_length,
else tokens / spec_verify_ct), output ids. Pairs: the same prompt, cell and round on server X and
on A; ratios X / A (TTFT: lower is better). A cell's figure is the geometric mean of its pair
ratios with a 95 % percentile bootstrap interval (pairs resampled). Verdict per cell: "tie" when
the ratio lies inside the noise band (P's own interval against A, made symmetric in log space), or
when its interval includes 1; else "faster" or "slower". Goal lines (auto): where a fixed mode is
"faster" (the cell pays), auto / best fixed mode >= 0.95 (paired) and auto above plain (interval
above 1); elsewhere auto >= 0.99x plain with its interval including or above 1. Greedy identity:
output ids of X against A's of the same round, prompt by prompt. Pooled (per group): every cell's
pairs together, each request once; P against A with the spread of its log ratio per request, and
each other server against A and against the plain pair (its rate over the geometric mean of A's and
P's for the same request), judged against the pooled noise band; a speculative server's requests
split by whether they kept any drafted token (tokens - 1 > its steps). On one H200 the log ratio of
two identical servers spread 0.15-0.27 per request, so a cell of 60 pairs resolves about 5 % and
the pooled section about 2 %. Standard library only (matplotlib for the PNG when present).
"""
import argparse
import ast
import http.client
import json
import math
import os
import platform
import queue
import random
import shlex
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the serving client's HTTP endpoint (its server-sent-event reader) and chat template
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmark"))
import eval_prompts  # noqa: E402
from lossless import DEFAULT_TIE_BOUND, TOP_N, first_difference, judge_departure  # noqa: E402
from serving import Endpoint, chatml  # noqa: E402

ROLES = ("plain", "noise", "fixed", "auto")
MIN_DECODE_TOKENS = 4      # a decode rate needs this many output tokens (both sides of a pair)
BOOT_REPS = 2000
BOOT_SEED = 20261201
PAY_SHARE = 0.95           # goal: auto >= this x the best fixed mode where one pays
FLOOR_SHARE = 0.99         # goal: auto >= this x plain where none pays
ASK_TIMEOUT_S = 30.0       # one ask of a departure's logprobs (<= 129 tokens alone on the server)


# ------------------------------------------------------------------------------------------------
# HTTP (standard library)
# ------------------------------------------------------------------------------------------------
class Server:
    def __init__(self, name, role, url, timeout=120.0):
        if role not in ROLES:
            raise ValueError(f"server {name!r}: role {role!r} not allowed; "
                             f"allowed: {', '.join(ROLES)}")
        u = urllib.parse.urlparse(url if "://" in url else "http://" + url)
        if u.scheme != "http" or not u.port:
            raise ValueError(f"server {name!r}: url must be http://host:port, got {url!r}")
        self.name, self.role, self.url = name, role, url
        self.host, self.port, self.timeout = u.hostname, u.port, timeout
        self.endpoint = Endpoint(url, timeout=timeout)

    def _conn(self, timeout=None):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def call(self, method, path, body=None, timeout=10.0):
        c = self._conn(timeout)
        try:
            c.request(method, path, body=None if body is None else json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            c.close()

    def flush(self, tries=20):
        """POST /flush_cache until it answers 200 (it refuses while requests are pending)."""
        msg = ""
        for _ in range(tries):
            try:
                st, msg = self.call("POST", "/flush_cache")
                if st == 200:
                    return True
            except OSError as e:
                msg = str(e)
            time.sleep(0.1)
        print(f"# {self.name}: flush failed: {msg[:200]}", file=sys.stderr)
        return False

    def facts(self):
        out = {}
        try:
            st, txt = self.call("GET", "/get_server_info")
            if st == 200:
                info = json.loads(txt)
                keep = ("version", "tp_size", "model_path", "speculative_algorithm",
                        "speculative_num_draft_tokens", "speculative_ngram_verify_mode",
                        "speculative_ngram_verify_widths", "attention_backend", "cuda_graph_max_bs",
                        "max_running_requests", "disable_overlap_schedule", "mem_fraction_static")
                out["server_args"] = {k: info[k] for k in keep if k in info}
                out["server_args"].update({k: v for k, v in info.items()
                                           if "emulat" in k or "pass_cost" in k})
        except (OSError, ValueError) as e:
            out["error"] = str(e)
        try:
            st, txt = self.call("GET", "/metrics")
            if st == 200:   # the emulator announces itself on /metrics while active
                out["emulator_metrics"] = [ln for ln in txt.splitlines()
                                           if "emulat" in ln and not ln.startswith("#")][:20]
        except OSError:
            pass
        return out

    def generate(self, text, max_new_tokens, ignore_eos):
        """One streamed greedy request; its record (never raises: errors are recorded)."""
        body = {"text": chatml(text), "stream": True,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens,
                                    "ignore_eos": ignore_eos}}
        rec = {}
        t0 = time.perf_counter()
        ttft, ids, last = None, [], {}
        try:
            for _, ev in self.endpoint.stream("/generate", body):
                last = ev.get("meta_info") or {}
                chunk = ev.get("output_ids") or []
                n = last.get("completion_tokens", len(chunk))
                # cumulative chunks carry every id so far, incremental ones only the new ids
                if len(chunk) == n and len(chunk) >= len(ids):
                    ids = list(chunk)
                else:
                    ids.extend(chunk)
                if ttft is None and n:
                    ttft = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - recorded, the pass goes on
            rec["error"] = f"{type(e).__name__}: {e}"
        latency = time.perf_counter() - t0
        n_out = last.get("completion_tokens", len(ids))
        fin = last.get("finish_reason")
        rec.update(latency_s=latency, ttft_s=ttft if ttft is not None else latency,
                   output_tokens=n_out, output_ids=ids,
                   finish=str(fin.get("type") if isinstance(fin, dict) else fin))
        if last.get("spec_verify_ct"):
            rec["spec_verify_ct"] = last["spec_verify_ct"]
            rec["accept_length"] = last.get("spec_accept_length") or n_out / last["spec_verify_ct"]
        return rec


# ------------------------------------------------------------------------------------------------
# run: interleaved rounds
# ------------------------------------------------------------------------------------------------
def parse_server(spec):
    """NAME,ROLE,URL -> Server."""
    parts = spec.split(",", 2)
    if len(parts) != 3:
        raise ValueError(f"--server takes NAME,ROLE,URL (roles: {', '.join(ROLES)}), got {spec!r}")
    return Server(*parts)


def parse_bools(text, flag):
    vals = {"off": False, "on": True}
    out = []
    for v in text.split(","):
        if v not in vals:
            raise ValueError(f"{flag} takes a comma-separated list of off/on, got {text!r}")
        out.append(vals[v])
    return out


def parse_ints(text, flag):
    try:
        out = [int(v) for v in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise ValueError(f"{flag} takes comma-separated positive integers, got {text!r}")
    return out


def check_servers(servers):
    roles = [s.role for s in servers]
    if roles.count("plain") != 1:
        raise ValueError("exactly one server with role plain is needed (the baseline A), "
                         f"got {roles}")
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise ValueError(f"server names must be distinct, got {names}")


def round_order(servers, r):
    """Round 0 in the given order, round 1 reversed, round 2 in order again, ..."""
    return list(servers) if r % 2 == 0 else list(reversed(servers))


def cells_of(sets, concurrency, ignore_eos):
    return [{"set": s, "c": c, "ignore_eos": e}
            for e in ignore_eos for c in concurrency for s in sets]


def units_of(prompts, c, interleave):
    """The groups of a cell's prompts that every server runs in turn: all of them at once
    ("pass"), or waves of ``c`` ("wave": each server gets the same few prompts within a second or
    so of the others, where a pass of a server's whole set runs seconds apart from the others')."""
    if interleave == "pass":
        return [list(prompts)]
    return [list(prompts[i:i + c]) for i in range(0, len(prompts), c)]


def run_pass(server, prompts, c, max_new_tokens, ignore_eos):
    """Every prompt once, at most c in flight; records in prompt order."""
    work = queue.Queue()
    for i, p in enumerate(prompts):
        work.put((i, p))
    recs = [None] * len(prompts)

    def worker():
        while True:
            try:
                i, p = work.get_nowait()
            except queue.Empty:
                return
            rec = server.generate(p["text"], max_new_tokens, ignore_eos)
            rec["prompt_id"] = p["id"]
            recs[i] = rec

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(c, len(prompts)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return recs


def departures(raw):
    """The distinct first departures of every server's greedy output from the plain server's
    (same round, prompt and cell), most frequent first: [{'prompt_id', 'position', 'prefix' (the
    plain output before it), 'plain_token', 'server_token' (None where that output ended there),
    'seen': {server: pairs}, 'cells': ['c=4 ignore_eos=off', ...]}]."""
    idx = index_requests(raw)
    base = next(s["name"] for s in raw["servers"] if s["role"] == "plain")
    found = {}
    for (srv, set_, c, eos, r, pid), rec in idx.items():   # in the order the passes ran
        if srv == base:
            continue
        b = idx.get((base, set_, c, eos, r, pid))
        if b is None:
            continue
        a, x = b["output_ids"], rec["output_ids"]
        j = first_difference(a, x)
        if j is None:
            continue
        key = (pid, tuple(a[:j]), a[j] if j < len(a) else None, x[j] if j < len(x) else None)
        d = found.setdefault(key, {"prompt_id": pid, "position": j, "prefix": list(a[:j]),
                                   "plain_token": key[2], "server_token": key[3], "seen": {},
                                   "cells": []})
        d["seen"][srv] = d["seen"].get(srv, 0) + 1
        name = f"c={c} ignore_eos={'on' if eos else 'off'}"
        if name not in d["cells"]:
            d["cells"].append(name)
    return sorted(found.values(), key=lambda d: (-sum(d["seen"].values()), d["prompt_id"],
                                                 d["position"]))


def plain_tops(server, text, prefix):
    """The plain server's top TOP_N logprobs for the token after chatml(text) + prefix, and how
    they were had: 'decode' (its own greedy output of len(prefix) + 1 tokens, alone in the batch,
    reproduced the prefix: the logprobs of its own decode step there) or 'prefill' (it did not:
    the prompt's ids, read back from the same answer's input logprobs, plus the prefix as a fresh
    prefill of one token). Raises OSError/ValueError when the server does not answer so."""
    def ask(body):
        st, txt = server.call("POST", "/generate", body, timeout=ASK_TIMEOUT_S)
        if st != 200:
            raise ValueError(f"HTTP {st}: {txt[:200]}")
        return json.loads(txt)

    server.flush()   # a fresh prefill of the prompt, as in the flushed passes
    sp = {"temperature": 0.0, "max_new_tokens": len(prefix) + 1, "ignore_eos": True}
    out = ask({"text": chatml(text), "sampling_params": sp, "return_logprob": True,
               "logprob_start_len": 0, "top_logprobs_num": TOP_N})
    meta = out.get("meta_info") or {}
    tops = meta.get("output_top_logprobs") or []
    if list(out.get("output_ids") or [])[:len(prefix)] == list(prefix) and len(tops) > len(prefix):
        return tops[len(prefix)], "decode"
    ids = [t[1] for t in meta.get("input_token_logprobs") or []]
    if not ids:
        raise ValueError("no input_token_logprobs to read the prompt's ids from")
    server.flush()
    out = ask({"input_ids": ids + list(prefix), "sampling_params": {**sp, "max_new_tokens": 1},
               "return_logprob": True, "top_logprobs_num": TOP_N})
    tops = (out.get("meta_info") or {}).get("output_top_logprobs") or []
    if not tops:
        raise ValueError("no output_top_logprobs")
    return tops[0], "prefill"


def judge_departures(raw, server, time_s, most, bound=DEFAULT_TIE_BOUND):
    """Each distinct departure (`departures`, at most ``most``, for at most ``time_s`` seconds)
    asked of the plain ``server`` and judged as lossless.py judges one: a rounding tie when plain's
    token and the other server's are both among plain's top logprobs there and neither lies more
    than ``bound`` below its top-1. Unasked ones keep verdict None."""
    deps = departures(raw)
    t_end = time.time() + time_s
    asked = 0
    for i, d in enumerate(deps):
        d.update(gap=None, verdict=None, reason="not asked", how=None, top=None)
        if i >= most or time.time() > t_end:
            continue
        asked += 1
        text = next(p["text"] for p in raw["prompts"] if p["id"] == d["prompt_id"])
        try:
            top, d["how"] = plain_tops(server, text, d["prefix"])
        except (OSError, ValueError) as e:
            d["reason"] = f"plain did not answer: {e}"
            continue
        d["gap"], d["verdict"], d["reason"] = judge_departure(top, d["plain_token"],
                                                              d["server_token"], bound)
        d["top"] = [t[:2] for t in top if t is not None]
    return {"tie_bound": bound, "distinct": len(deps), "asked": asked, "list": deps}


def cmd_run(a):
    servers = [parse_server(s) for s in a.server]
    check_servers(servers)
    sets = a.sets.split(",")
    prompts = eval_prompts.build(sets, a.per_set)
    conc = parse_ints(a.concurrency, "--concurrency")
    eos = parse_bools(a.ignore_eos, "--ignore-eos")
    cells = cells_of(sets, conc, eos)
    deadline = time.time() + a.time_budget_s
    raw = {"repro_command": a.repro or " ".join(shlex.quote(x) for x in sys.argv),
           "group": a.group, "group_flags": a.group_flags,
           "config": {"sets": sets, "per_set": a.per_set, "concurrency": conc, "ignore_eos": eos,
                      "max_new_tokens": a.max_new_tokens, "min_rounds": a.min_rounds,
                      "max_rounds": a.max_rounds, "time_budget_s": a.time_budget_s,
                      "flush": a.flush, "interleave": a.interleave},
           "prompts": prompts,
           "servers": [{"name": s.name, "role": s.role, "url": s.url, **s.facts()}
                       for s in servers],
           "passes": [], "rounds_done": 0, "stopped": None}
    by_set = {s: [p for p in prompts if p["set"] == s] for s in sets}
    # warm-up, unrecorded: each server's first batches of each size, then a flush
    t_w = time.time()
    for s in servers:
        for c in conc:
            run_pass(s, prompts[:c], c, min(16, a.max_new_tokens), True)
        s.flush()
        if a.flush == "never":  # the memorised case: every cell once, unrecorded
            for cell in cells:
                run_pass(s, by_set[cell["set"]], cell["c"], a.max_new_tokens, cell["ignore_eos"])
    raw["warmup_s"] = time.time() - t_w
    round_s = []
    for r in range(a.max_rounds):
        est = max(round_s) if round_s else None
        if est is not None and time.time() + est > deadline:
            raw["stopped"] = f"time: round {r} would end {time.time() + est - deadline:.0f} s late"
            break
        t_r = time.time()
        for cell in cells:
            for u, unit in enumerate(units_of(by_set[cell["set"]], cell["c"], a.interleave)):
                for s in round_order(servers, r + u):
                    if time.time() > deadline + a.grace_s:
                        raw["stopped"] = f"time: deadline passed in round {r}"
                        break
                    ok = s.flush() if a.flush == "each" else None
                    t_p = time.time()
                    recs = run_pass(s, unit, cell["c"], a.max_new_tokens, cell["ignore_eos"])
                    raw["passes"].append({"round": r, "server": s.name, **cell, "flushed": ok,
                                          "t_start": t_p, "duration_s": time.time() - t_p,
                                          "requests": recs,
                                          **({"wave": u} if a.interleave == "wave" else {})})
                if raw["stopped"]:
                    break
            if raw["stopped"]:
                break
        if raw["stopped"]:
            break
        round_s.append(time.time() - t_r)
        raw["rounds_done"] = r + 1
        print(f"# {a.group}: round {r} {round_s[-1]:.1f} s "
              f"({deadline - time.time():.0f} s of the budget left)", flush=True)
    raw["round_s"] = round_s
    if raw["rounds_done"] < a.min_rounds:
        raw["stopped"] = ((raw["stopped"] or "")
                          + f"; only {raw['rounds_done']} of {a.min_rounds} rounds")
    raw["servers_after"] = {s.name: s.facts().get("server_args") for s in servers}
    if a.judge_departures > 0:   # after the rounds: outside every timed pass
        with open(a.out, "w") as f:   # the rounds' record kept should the judging be cut off
            json.dump(raw, f)
        t_j = time.time()
        base = next(s for s in servers if s.role == "plain")
        raw["departures"] = judge_departures(raw, base, a.judge_s, a.judge_departures)
        dl = raw["departures"]["list"]
        print(f"# departures from {base.name}'s greedy output: {len(dl)} distinct, "
              f"{sum(d['verdict'] is not None for d in dl)} judged in {time.time() - t_j:.1f} s: "
              f"{sum(d['verdict'] == 'tie' for d in dl)} ties, "
              f"{sum(d['verdict'] == 'FAIL' for d in dl)} FAIL", flush=True)
    with open(a.out, "w") as f:
        json.dump(raw, f)
    print(f"# wrote {a.out}: {raw['rounds_done']} rounds, {len(raw['passes'])} passes; "
          f"stopped: {raw['stopped']}")
    return 0


# ------------------------------------------------------------------------------------------------
# analysis (pure functions on the raw record)
# ------------------------------------------------------------------------------------------------
def decode_tps(rec):
    n, span = rec.get("output_tokens") or 0, rec["latency_s"] - rec["ttft_s"]
    return (n - 1) / span if n >= MIN_DECODE_TOKENS and span > 0 else None


def e2e_tps(rec):
    n = rec.get("output_tokens") or 0
    return n / rec["latency_s"] if n and rec["latency_s"] > 0 else None


METRICS = {"decode": decode_tps, "e2e": e2e_tps, "ttft": lambda r: r["ttft_s"]}


def index_requests(raw):
    """{(server, set, c, ignore_eos, round, prompt_id): record} of the requests that succeeded."""
    out = {}
    for p in raw["passes"]:
        for rec in p["requests"]:
            if rec is None or "error" in rec:
                continue
            key = (p["server"], p["set"], p["c"], p["ignore_eos"], p["round"], rec["prompt_id"])
            out[key] = rec
    return out


def cell_keys(idx, server, cell):
    """(round, prompt_id) of the server's requests in a cell; cell['set'] 'all' takes every set."""
    return {(k[4], k[5]): k for k in idx if k[0] == server and k[2] == cell["c"]
            and k[3] == cell["ignore_eos"] and (cell["set"] == "all" or k[1] == cell["set"])}


def pair_ratios(idx, x, base, cell, metric):
    """Per-request ratios metric(x) / metric(base) over the pairs both servers completed."""
    f = METRICS[metric]
    kx, kb = cell_keys(idx, x, cell), cell_keys(idx, base, cell)
    out = []
    for pk in sorted(set(kx) & set(kb)):
        vx, vb = f(idx[kx[pk]]), f(idx[kb[pk]])
        if vx and vb:
            out.append(vx / vb)
    return out


def bootstrap_geomean(ratios, reps=BOOT_REPS, seed=BOOT_SEED):
    """(geometric mean, 2.5 % and 97.5 % percentiles of the resampled geometric mean) or None."""
    if not ratios:
        return None
    logs = [math.log(v) for v in ratios]
    n = len(logs)
    point = math.exp(sum(logs) / n)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(logs, k=n)) / n for _ in range(reps))
    lo, hi = means[int(0.025 * (reps - 1))], means[int(math.ceil(0.975 * (reps - 1)))]
    return point, math.exp(lo), math.exp(hi)


def noise_band(noise_ci):
    """The A-vs-P interval made symmetric around 1 in log space: (low, high)."""
    if noise_ci is None:
        return (1.0, 1.0)
    h = max(abs(math.log(noise_ci[1])), abs(math.log(noise_ci[2])))
    return (math.exp(-h), math.exp(h))


def verdict(ci, band, higher_is_better=True):
    """'faster', 'slower' or 'tie' (inside the noise band, or the interval includes 1)."""
    if ci is None:
        return "n/a"
    point, lo, hi = ci
    if band[0] <= point <= band[1] or lo <= 1.0 <= hi:
        return "tie"
    better = point > 1.0 if higher_is_better else point < 1.0
    return "faster" if better else "slower"


def identity(idx, x, base, cell):
    """(identical pairs, pairs, first differing token positions of the others)."""
    kx, kb = cell_keys(idx, x, cell), cell_keys(idx, base, cell)
    same, n, firsts = 0, 0, []
    for pk in sorted(set(kx) & set(kb)):
        a, b = idx[kb[pk]]["output_ids"], idx[kx[pk]]["output_ids"]
        n += 1
        j = first_difference(a, b)
        if j is None:
            same += 1
        else:
            firsts.append(j)
    return same, n, firsts


def self_identity(idx, server, cell):
    """The server's outputs in later rounds against its own first round: (identical, pairs)."""
    keys = cell_keys(idx, server, cell)
    first = {}
    for (r, pid) in sorted(keys):
        first.setdefault(pid, r)
    same = n = 0
    for (r, pid), k in keys.items():
        if r == first[pid]:
            continue
        n += 1
        same += idx[k]["output_ids"] == idx[keys[(first[pid], pid)]]["output_ids"]
    return same, n


def accept_length(idx, server, cell):
    recs = [idx[k] for k in cell_keys(idx, server, cell).values()]
    steps = sum(r.get("spec_verify_ct") or 0 for r in recs)
    toks = sum(r.get("output_tokens") or 0 for r in recs if r.get("spec_verify_ct"))
    return toks / steps if steps else None


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def analyze_group(raw, logs_dir=None):
    """One group's summary: per cell, per server, the paired figures, verdicts and goal lines;
    pooled over the cells (`pooled`), with each speculative server's requests split by whether
    drafts were accepted, and where ``logs_dir`` holds the servers' logs
    (``<group>.<server>.log``) what auto's own per-request records say (`verify_records`)."""
    idx = index_requests(raw)
    servers = raw["servers"]
    base = next(s["name"] for s in servers if s["role"] == "plain")
    noise = next((s["name"] for s in servers if s["role"] == "noise"), None)
    cfg = raw["config"]
    sets = list(cfg["sets"]) + (["all"] if len(cfg["sets"]) > 1 else [])
    cells = cells_of(sets, cfg["concurrency"], cfg["ignore_eos"])
    out = {"group": raw["group"], "group_flags": raw.get("group_flags"), "baseline": base,
           "noise": noise, "rounds_done": raw["rounds_done"], "stopped": raw.get("stopped"),
           "round_s": raw.get("round_s"), "config": cfg, "repro_command": raw["repro_command"],
           "servers": servers, "cells": []}
    for cell in cells:
        c_out = {**cell, "servers": {}, "noise_band": {}, "goals": []}
        noise_ci = {m: bootstrap_geomean(pair_ratios(idx, noise, base, cell, m)) if noise else None
                    for m in METRICS}
        c_out["noise_band"] = {m: noise_band(noise_ci[m]) for m in METRICS}
        for s in servers:
            name = s["name"]
            keys = cell_keys(idx, name, cell)
            recs = [idx[k] for k in keys.values()]
            row = {"role": s["role"], "requests": len(recs),
                   "decode_tps_median": median([decode_tps(r) for r in recs]),
                   "e2e_tps_median": median([e2e_tps(r) for r in recs]),
                   "ttft_ms_median": (median([r["ttft_s"] for r in recs]) or 0) * 1e3 or None,
                   "output_tokens_mean": (sum(r["output_tokens"] for r in recs) / len(recs)
                                          if recs else None),
                   "accept_length": accept_length(idx, name, cell),
                   "self_identity": self_identity(idx, name, cell)}
            if name != base:
                for m in METRICS:
                    rs = pair_ratios(idx, name, base, cell, m)
                    ci = bootstrap_geomean(rs)
                    row[m] = {"pairs": len(rs), "ratio": ci[0] if ci else None,
                              "ci95": [ci[1], ci[2]] if ci else None,
                              "verdict": verdict(ci, c_out["noise_band"][m], m != "ttft")}
                same, n, firsts = identity(idx, name, base, cell)
                row["identity"] = {"identical": same, "pairs": n, "first_diffs": firsts[:12]}
            c_out["servers"][name] = row
        if cell["set"] != "all":
            c_out["goals"] = goal_lines(idx, servers, base, cell, c_out)
        out["cells"].append(c_out)
    out["pooled"] = pooled(idx, servers, base, noise,
                           [c for c in out["cells"] if c["set"] != "all"])
    if logs_dir:
        for name, row in out["pooled"]["servers"].items():
            rec = verify_records(os.path.join(logs_dir, f"{raw['group']}.{name}.log"))
            if rec:
                row["verify_log"] = rec
    if raw.get("departures"):
        out["departures"] = departure_summary(raw["departures"])
    return out


def departure_summary(judged):
    """Per server, from `judge_departures`' record: the pairs whose greedy output departed from
    plain's, the distinct departures among them and how they were judged (tie, FAIL, not asked),
    the largest gap of a tie, and the list itself."""
    per = {}
    for d in judged["list"]:
        for srv, n in d["seen"].items():
            row = per.setdefault(srv, {"pairs": 0, "distinct": 0, "ties": 0, "fails": 0,
                                       "not_asked": 0, "max_tie_gap": None})
            row["pairs"] += n
            row["distinct"] += 1
            if d["verdict"] == "tie":
                row["ties"] += 1
                if d["gap"] is not None:
                    row["max_tie_gap"] = max(row["max_tie_gap"] or 0.0, d["gap"])
            elif d["verdict"] is None:
                row["not_asked"] += 1
            else:
                row["fails"] += 1
    return {"tie_bound": judged["tie_bound"], "servers": per, "list": judged["list"]}


def departure_lines(dep, baseline):
    """The report's lines on the judged departures (`departure_summary`)."""
    if not dep:
        return []
    out = ["", f"### greedy departures from {baseline}'s output, judged by {baseline}'s top "
               f"logprobs there (tie: both tokens within {dep['tie_bound']} of its top-1)"]
    if not dep["servers"]:
        out.append("# none: every server's output was identical to the plain server's")
    for srv, r in sorted(dep["servers"].items()):
        gap = f", largest gap {r['max_tie_gap']:.4f}" if r["max_tie_gap"] is not None else ""
        out.append(f"# {srv}: {r['pairs']} pairs departed, {r['distinct']} distinct: "
                   f"{r['ties']} ties{gap}, {r['fails']} FAIL, {r['not_asked']} not asked")
    for d in dep["list"]:
        if d["verdict"] == "FAIL":
            out.append(f"#   FAIL {d['prompt_id']} at token {d['position']} "
                       f"({', '.join(d['cells'])}; {d['seen']}): {d['reason']}")
    return out


def accepted_drafts(rec):
    """Whether a speculative server's request kept any drafted token: its output holds more tokens
    than its steps gave one each (the first comes from the prefill; SGLang counts a step that
    verified nothing, on auto's plain path too, as one). None where the record has no step count
    (a plain server). A verify that accepted nothing leaves no trace here (`verify_records`)."""
    steps = rec.get("spec_verify_ct")
    if not steps:
        return None
    return (rec.get("output_tokens") or 0) - steps > 1


VERIFY_RECORD = "auto verify request "


def verify_records(path):
    """Auto's own per-request records in a server log (the controller logs one line per request
    whose drafts were verified, as it finishes: verified drafts, tokens expected, tokens accepted),
    summed: {"requests", "verified_drafts", "expected_tokens", "accepted_tokens"}, or None where
    the log is missing or has none."""
    if not os.path.exists(path):
        return None
    tot = {"requests": 0, "verified_drafts": 0, "expected_tokens": 0.0, "accepted_tokens": 0.0}
    with open(path, errors="replace") as fh:
        for line in fh:
            at = line.find(VERIFY_RECORD)
            if at < 0:
                continue
            try:
                d = ast.literal_eval(line[at + len(VERIFY_RECORD):].strip())
            except (ValueError, SyntaxError):
                continue
            if not isinstance(d, dict):
                continue
            tot["requests"] += 1
            for k in ("verified_drafts", "expected_tokens", "accepted_tokens"):
                tot[k] += d.get(k) or 0
    return tot if tot["requests"] else None


def pooled(idx, servers, base, noise, cells):
    """Every cell's pairs together (each request once), decode tok/s: how far apart the two plain
    servers are over the whole run (their ratio, and the spread of its log per request), and each
    other server against plain and against the plain pair (per request, its rate over the geometric
    mean of both plain servers' rates for that request), with the verdict against the pooled noise
    band. Where a gap of a few per cent is inside what two identical servers differ by, only this
    many pairs can tell it from a tie, and only if the two plain servers agree."""
    cells = [c for c in cells if cell_keys(idx, base, c)]

    def ratios(x, y):
        return [v for c in cells for v in pair_ratios(idx, x, y, c, "decode")]

    out = {"cells": len(cells), "servers": {}}
    band = (1.0, 1.0)
    if noise:
        rs = ratios(noise, base)
        ci = bootstrap_geomean(rs)
        logs = [math.log(v) for v in rs]
        mean = sum(logs) / len(logs) if logs else 0.0
        sd = (math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))
              if len(logs) > 1 else None)
        band = noise_band(ci)
        out["noise"] = {"server": noise, "pairs": len(rs), "ratio": ci[0] if ci else None,
                        "ci95": [ci[1], ci[2]] if ci else None, "sd_log_ratio": sd,
                        "band": list(band)}
    for s in servers:
        name = s["name"]
        if name in (base, noise):
            continue
        ci = bootstrap_geomean(ratios(name, base))
        row = {"role": s["role"], "vs_plain": ci[0] if ci else None,
               "vs_plain_ci95": [ci[1], ci[2]] if ci else None}
        if noise:
            xs, ns, kept = _aligned(idx, name, base, noise, cells)
            rs = [v / math.sqrt(b) for v, b in zip(xs, ns)]
            ci = bootstrap_geomean(rs)
            row.update(pairs=len(rs), vs_plain_pair=ci[0] if ci else None,
                       vs_plain_pair_ci95=[ci[1], ci[2]] if ci else None,
                       verdict=verdict(ci, band))
            if any(k is not None for k in kept):
                for label, want in (("accepted_drafts", True), ("no_accepted_draft", False)):
                    part = [r for r, k in zip(rs, kept) if k is want]
                    ci = bootstrap_geomean(part)
                    row[label] = {"pairs": len(part), "vs_plain_pair": ci[0] if ci else None,
                                  "ci95": [ci[1], ci[2]] if ci else None}
        out["servers"][name] = row
    # the goal where speculation pays is auto against the best fixed mode: each auto server against
    # each fixed one, paired per request, pooled
    for s in servers:
        if s["role"] != "auto":
            continue
        vs = {}
        for fixed in (t["name"] for t in servers if t["role"] == "fixed"):
            ci = bootstrap_geomean(ratios(s["name"], fixed))
            if ci:
                vs[fixed] = {"ratio": ci[0], "ci95": [ci[1], ci[2]]}
        if vs:
            out["servers"][s["name"]]["vs_fixed"] = vs
    names = [s["name"] for s in servers]
    out["ab"] = {name: ab_pair(idx, name, name + "_b", cells, band)
                 for name in names if name + "_b" in names}
    return out


def ab_pair(idx, x, y, cells, band):
    """An in-launch A/B: x's decode rate over its twin y's (the same server with an A/B switch
    set), paired per request, over all cells and by concurrency, each with its verdict against the
    pooled noise band of the two plain servers."""
    out = {}
    for label, want in [("all", None)] + [(f"c={c}", c) for c in sorted({c["c"] for c in cells})]:
        rs = [v for c in cells if want is None or c["c"] == want
              for v in pair_ratios(idx, x, y, c, "decode")]
        ci = bootstrap_geomean(rs)
        out[label] = {"pairs": len(rs), "ratio": ci[0] if ci else None,
                      "ci95": [ci[1], ci[2]] if ci else None, "verdict": verdict(ci, band)}
    return out


def _aligned(idx, x, base, noise, cells):
    """For the requests all three servers completed in the cells: x's decode rate over base's,
    noise's over base's (the product of base and noise, in units of base squared), and whether x's
    request kept any drafted token (`accepted_drafts`)."""
    xs, ns, kept = [], [], []
    for c in cells:
        kx, kb, kn = (cell_keys(idx, s, c) for s in (x, base, noise))
        for pk in sorted(set(kx) & set(kb) & set(kn)):
            vx, vb, vn = (decode_tps(idx[k[pk]]) for k in (kx, kb, kn))
            if vx and vb and vn:
                xs.append(vx / vb)
                ns.append(vn / vb)
                kept.append(accepted_drafts(idx[kx[pk]]))
    return xs, ns, kept


def goal_lines(idx, servers, base, cell, c_out):
    """Auto's goal in this cell, per metric (decode, e2e)."""
    fixed = [s["name"] for s in servers if s["role"] == "fixed"]
    lines = []
    for auto in (s["name"] for s in servers if s["role"] == "auto"):
        for m in ("decode", "e2e"):
            a_row = c_out["servers"][auto].get(m) or {}
            if a_row.get("ratio") is None:
                continue
            paying = [f for f in fixed
                      if (c_out["servers"][f].get(m) or {}).get("verdict") == "faster"]
            best = max(fixed, key=lambda f: (c_out["servers"][f].get(m) or {}).get("ratio") or 0,
                       default=None)
            g = {"auto": auto, "metric": m, "auto_vs_plain": a_row["ratio"],
                 "auto_vs_plain_ci95": a_row["ci95"], "best_fixed": best,
                 "best_fixed_vs_plain": (c_out["servers"][best].get(m) or {}).get("ratio")
                 if best else None}
            if paying:
                ci = bootstrap_geomean(pair_ratios(idx, auto, best, cell, m))
                g.update(case="pays", auto_vs_best=ci[0] if ci else None,
                         auto_vs_best_ci95=[ci[1], ci[2]] if ci else None,
                         goal=f"auto >= {PAY_SHARE}x {best} and above plain")
                g["passed"] = bool(ci and ci[0] >= PAY_SHARE and a_row["ci95"][0] > 1.0)
            else:
                g.update(case="does not pay", goal=f"auto >= {FLOOR_SHARE}x plain, interval "
                                                   "including or above 1")
                g["passed"] = a_row["ratio"] >= FLOOR_SHARE and a_row["ci95"][1] >= 1.0
            lines.append(g)
    return lines


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------
def f(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def fr(row, m):
    d = row.get(m)
    if not d or d.get("ratio") is None:
        return "-"
    return f"{d['ratio']:.3f} [{d['ci95'][0]:.3f},{d['ci95'][1]:.3f}] {d['verdict']}"


def cell_name(c):
    return f"{c['set']} c={c['c']} ignore_eos={'on' if c['ignore_eos'] else 'off'}"


def overview(g):
    """One line per server: its decode tok/s ratio in every cell, with the verdict as + (faster),
    - (slower) or = (tie)."""
    mark = {"faster": "+", "slower": "-", "tie": "=", "n/a": "?"}
    cells = [c for c in g["cells"] if c["set"] != "all"]
    heads = [f"{c['set'][:4]} c{c['c']} {'eos' if c['ignore_eos'] else 'stop'}" for c in cells]
    out = ["# decode tok/s vs plain per cell (+ faster, - slower, = tie; eos: ignore_eos on)",
           f"{'server':<10} " + " ".join(f"{h:>15}" for h in heads)]
    for name in cells[0]["servers"] if cells else []:
        if name == g["baseline"]:
            continue
        vals = []
        for c in cells:
            d = c["servers"][name].get("decode") or {}
            vals.append(f"{f(d.get('ratio'))} {mark.get(d.get('verdict'), '?')}"
                        if d.get("ratio") is not None else "-")
        out.append(f"{name:<10} " + " ".join(f"{v:>15}" for v in vals))
    return out


def report(summary):
    lines = []
    env = summary.get("environment") or {}
    lines.append(f"# evaluation  {env.get('time_utc', '')}")
    for k in ("gpus", "driver", "torch", "cuda", "nccl", "sglang", "fastverify_commit", "host",
              "cpus"):
        if env.get(k) is not None:
            lines.append(f"# {k}: {env[k]}")
    if env.get("env"):
        lines.append("# env " + " ".join(f"{k}={v}" for k, v in env["env"].items()))
    lines.append(f"# repro: {summary.get('repro_command')}")
    for g in summary["groups"]:
        cfg = g["config"]
        lines.append("")
        lines.append(f"## profile {g['group']}  server flags: {g.get('group_flags') or '(none)'}")
        lines.append(f"# rounds {g['rounds_done']} (stopped: {g.get('stopped')}); round s "
                     f"{', '.join(f'{x:.0f}' for x in g.get('round_s') or [])}; max_new_tokens "
                     f"{cfg['max_new_tokens']}; prompts per set {cfg['per_set']}; greedy"
                     + ("; servers take turns every c prompts (--interleave wave)"
                        if cfg.get("interleave") == "wave" else ""))
        if cfg.get("flush") == "never":
            lines.append("# MEMORISED: no flush between passes; each server's drafts come from its "
                         "own earlier outputs of the same prompts (speculation's best case)")
        lines.append(f"# ratios vs {g['baseline']} (geomean of per-request pairs, 95 % bootstrap); "
                     "TTFT ratio: lower is better")
        if g.get("group_flags"):
            lines.append(f"# EMULATED: every pass of these servers waits what profile "
                         f"{g['group']} says it costs (pass-cost emulator on this GPU); not a "
                         "measurement of that deployment")
        lines += overview(g)
        for s in g["servers"]:
            emu = s.get("emulator_metrics")
            if emu:
                lines.append(f"# {s['name']}: emulated ({'; '.join(emu[:2])})")
        hdr = (f"{'server':<10} {'role':<6} {'pairs':>5} {'decode tok/s ratio [95%] verdict':<38} "
               f"{'e2e tok/s ratio [95%] verdict':<38} {'TTFT ratio':>10} {'dec tok/s':>9} "
               f"{'TTFT ms':>8} {'accept':>6} {'identical':>9}")
        for c in g["cells"]:
            lines.append("")
            nb = c["noise_band"]["decode"]
            lines.append(f"### {cell_name(c)}  (noise band, decode: [{nb[0]:.3f}, {nb[1]:.3f}])")
            lines.append(hdr)
            for name, row in c["servers"].items():
                ident = row.get("identity")
                lines.append(
                    f"{name:<10} {row['role']:<6} {(row.get('decode') or {}).get('pairs', '-'):>5} "
                    f"{fr(row, 'decode'):<38} {fr(row, 'e2e'):<38} "
                    f"{f((row.get('ttft') or {}).get('ratio')):>10} "
                    f"{f(row['decode_tps_median'], '.1f'):>9} "
                    f"{f(row['ttft_ms_median'], '.1f'):>8} {f(row['accept_length'], '.2f'):>6} "
                    f"{(str(ident['identical']) + '/' + str(ident['pairs'])) if ident else '-':>9}")
            for gl in c["goals"]:
                extra = (f"auto/{gl['best_fixed']} {f(gl.get('auto_vs_best'))}"
                         if gl["case"] == "pays" else f"best fixed {gl['best_fixed']} "
                                                      f"{f(gl['best_fixed_vs_plain'])}")
                lines.append(f"GOAL {gl['auto']} {gl['metric']:<6} {gl['case']:<12} "
                             f"auto/plain {f(gl['auto_vs_plain'])} {extra}: "
                             f"{'PASS' if gl['passed'] else 'FAIL'} ({gl['goal']})")
        lines += pooled_lines(g.get("pooled"))
        lines += departure_lines(g.get("departures"), g["baseline"])
        lines.append("")
        lines.append("# plain reproducibility (later rounds vs its own first round): " + "; ".join(
            f"{cell_name(c)} {c['servers'][g['baseline']]['self_identity'][0]}/"
            f"{c['servers'][g['baseline']]['self_identity'][1]}"
            for c in g["cells"] if c["set"] != "all"))
    return "\n".join(lines) + "\n"


def pooled_lines(p):
    """The pooled section of a profile's report (`pooled`)."""
    if not p or not p.get("servers"):
        return []
    out = ["", f"### pooled: every cell's pairs together ({p['cells']} cells), decode tok/s"]
    nz = p.get("noise")
    if nz and nz.get("ratio") is not None:
        out.append(f"# {nz['server']} vs plain {nz['ratio']:.3f} [{nz['ci95'][0]:.3f}, "
                   f"{nz['ci95'][1]:.3f}] over {nz['pairs']} pairs; sd of log ratio per request "
                   f"{f(nz['sd_log_ratio'])}; noise band [{nz['band'][0]:.3f}, "
                   f"{nz['band'][1]:.3f}]")
    out.append(f"{'server':<10} {'role':<6} {'vs plain [95%]':<24} "
               f"{'vs the plain pair [95%] verdict':<34}")
    for name, row in p["servers"].items():
        vp = (f"{row['vs_plain']:.3f} [{row['vs_plain_ci95'][0]:.3f},"
              f"{row['vs_plain_ci95'][1]:.3f}]" if row.get("vs_plain") is not None else "-")
        pp = (f"{row['vs_plain_pair']:.3f} [{row['vs_plain_pair_ci95'][0]:.3f},"
              f"{row['vs_plain_pair_ci95'][1]:.3f}] {row['verdict']}"
              if row.get("vs_plain_pair") is not None else "-")
        out.append(f"{name:<10} {row['role']:<6} {vp:<24} {pp:<34}")
    for name, row in p["servers"].items():
        parts = []
        for label, what in (("accepted_drafts", "with accepted drafts"),
                            ("no_accepted_draft", "without")):
            d = row.get(label)
            if d and d.get("vs_plain_pair") is not None:
                parts.append(f"{d['pairs']} {what} {d['vs_plain_pair']:.3f} "
                             f"[{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]")
        if parts:
            out.append(f"# {name} vs the plain pair, its requests: " + "; ".join(parts))
        if row.get("vs_fixed"):
            out.append(f"# {name} vs each fixed mode, paired per request: " + "; ".join(
                f"{fixed} {d['ratio']:.3f} [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]"
                for fixed, d in row["vs_fixed"].items()))
        v = row.get("verify_log")
        if v:
            share = (f" ({v['accepted_tokens'] / v['expected_tokens']:.0%})"
                     if v["expected_tokens"] else "")
            out.append(f"# {name} log: {v['requests']} requests with verified drafts, "
                       f"{v['verified_drafts']} verify steps, expected to accept "
                       f"{v['expected_tokens']:.0f} tokens, accepted {v['accepted_tokens']:.0f}"
                       + share)
    for name, by in p.get("ab", {}).items():
        out.append(f"# A/B {name} vs {name}_b, paired per request: " + "; ".join(
            f"{label} {d['ratio']:.3f} [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}] {d['verdict']} "
            f"({d['pairs']} pairs)" for label, d in by.items() if d["ratio"] is not None))
    return out


def plot_group(g, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cells = g["cells"]
    names = [n for n in cells[0]["servers"] if n != g["baseline"]]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(cells)), 7.5), sharex=True)
    w = 0.8 / max(1, len(names))
    for ax, m in zip(axes, ("decode", "e2e")):
        for j, n in enumerate(names):
            xs, ys, errs = [], [], [[], []]
            for i, c in enumerate(cells):
                d = c["servers"][n].get(m) or {}
                if d.get("ratio") is None:
                    continue
                xs.append(i + (j - (len(names) - 1) / 2) * w)
                ys.append(d["ratio"])
                errs[0].append(d["ratio"] - d["ci95"][0])
                errs[1].append(d["ci95"][1] - d["ratio"])
            ax.bar(xs, [y - 1.0 for y in ys], w, bottom=1.0, yerr=errs, capsize=2, label=n)
        for i, c in enumerate(cells):
            lo, hi = c["noise_band"][m]
            ax.fill_between([i - 0.45, i + 0.45], lo, hi, color="grey", alpha=0.2, lw=0, zorder=0)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel(f"{m} tok/s / plain {g['baseline']}")
        ax.grid(axis="y", alpha=0.3)
        lo_all = min([c["servers"][n][m]["ci95"][0] for c in cells for n in names
                      if (c["servers"][n].get(m) or {}).get("ci95")] + [0.9])
        ax.set_ylim(max(0.0, lo_all - 0.05), None)
    axes[0].legend(fontsize=8, ncol=len(names))
    axes[1].set_xticks(range(len(cells)))
    axes[1].set_xticklabels([cell_name(c).replace(" ignore_eos=", "\neos ") for c in cells],
                            fontsize=7)
    fig.suptitle(f"profile {g['group']} ({g.get('group_flags') or 'no extra flags'})\n"
                 "ratios vs plain, 95 % bootstrap; grey: A-vs-P noise band", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def cmd_analyze(a):
    groups = []
    for path in a.raw:
        with open(path) as fh:
            groups.append(analyze_group(json.load(fh), a.logs))
    env = {}
    if a.env and os.path.exists(a.env):
        with open(a.env) as fh:
            env = json.load(fh)
    summary = {"environment": env, "repro_command": a.repro or env.get("repro_command"),
               "method": __doc__.split("\n\n", 2)[2].strip(), "groups": groups}
    os.makedirs(a.out_dir, exist_ok=True)
    text = report(summary)
    with open(os.path.join(a.out_dir, "summary.txt"), "w") as fh:
        fh.write(text)
    with open(os.path.join(a.out_dir, "summary.json"), "w") as fh:
        json.dump(summary, fh, separators=(",", ":"))  # compact: results travel with every GPU call
    for g in groups:
        plot_group(g, os.path.join(a.out_dir, f"eval_{g['group']}.png"))
    sys.stdout.write(text)
    return 0


def sh(cmd):
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return res.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def cmd_env(a):
    gpus = sh(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    ver = sh([sys.executable, "-c", "import torch, sglang; print(torch.__version__, "
              "torch.version.cuda, '.'.join(map(str, torch.cuda.nccl.version())), "
              "sglang.__version__)"])
    parts = (ver or "").split()
    env = {"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
           "cpus": os.cpu_count(), "python": platform.python_version(),
           "gpus": gpus.splitlines() if gpus else None,
           "driver": sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
           "torch": parts[0] if parts else None, "cuda": parts[1] if len(parts) > 1 else None,
           "nccl": parts[2] if len(parts) > 2 else None,
           "sglang": parts[3] if len(parts) > 3 else None,
           "fastverify_commit": a.commit,
           "env": {k: v for k, v in sorted(os.environ.items())
                   if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM_", "CUDA_VISIBLE",
                                    "FASTVERIFY_", "FV_WEIGHTS"))},
           "repro_command": a.repro}
    with open(a.out, "w") as fh:
        json.dump(env, fh, indent=1)
    print(json.dumps(env, indent=1))
    return 0


def cmd_prompts(a):
    for p in eval_prompts.build(a.sets.split(","), a.per_set):
        print(f"--- {p['id']}\n{p['text']}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure one group of servers in interleaved rounds")
    r.add_argument("--server", action="append", required=True,
                   help="NAME,ROLE,URL (repeat; roles: plain (one: the baseline A), noise, fixed, "
                        "auto)")
    r.add_argument("--group", default="none",
                   help="label of this server set (e.g. an emulated profile)")
    r.add_argument("--group-flags", default="",
                   help="the extra server flags of this group (recorded)")
    r.add_argument("--sets", default="grounded,open")
    r.add_argument("--per-set", type=int, default=8)
    r.add_argument("--concurrency", default="1,4")
    r.add_argument("--ignore-eos", default="off,on", help="off, on or off,on")
    r.add_argument("--max-new-tokens", type=int, default=128)
    r.add_argument("--flush", choices=("each", "never"), default="each",
                   help="each: every server flushed before each pass (default; with "
                        "--interleave wave, before each wave); never: the memorised case (drafts "
                        "from the server's earlier outputs)")
    r.add_argument("--interleave", choices=("pass", "wave"), default="pass",
                   help="pass: each server runs a cell's whole prompt set in turn (default); "
                        "wave: each runs the next c prompts in turn, the order reversed every "
                        "wave, so that the requests paired across servers run seconds closer")
    r.add_argument("--min-rounds", type=int, default=4)
    r.add_argument("--max-rounds", type=int, default=8)
    r.add_argument("--time-budget-s", type=float, default=400,
                   help="no round starts that the longest round so far says would end past this")
    r.add_argument("--grace-s", type=float, default=20, help="hard stop this long past the budget")
    r.add_argument("--judge-departures", type=int, default=48,
                   help="after the rounds, ask the plain server for its top logprobs at (at most) "
                        "this many distinct first departures of the others' greedy output from "
                        "its own and judge each a rounding tie or a FAIL as lossless.py does "
                        "(0: off)")
    r.add_argument("--judge-s", type=float, default=20,
                   help="time the departures' judging may take (s)")
    r.add_argument("--repro", default="")
    r.add_argument("--out", required=True)
    r.set_defaults(func=cmd_run)
    z = sub.add_parser("analyze", help="raw records -> summary.json, summary.txt, PNGs")
    z.add_argument("raw", nargs="+")
    z.add_argument("--env", help="env.json of the `env` command")
    z.add_argument("--repro", default="")
    z.add_argument("--out-dir", required=True)
    z.add_argument("--logs", help="the servers' logs (<profile>.<server>.log): auto's own "
                                  "per-request verify records are summed into the report")
    z.set_defaults(func=cmd_analyze)
    e = sub.add_parser("env", help="the machine's GPU, driver, versions and NCCL env -> JSON")
    e.add_argument("--out", required=True)
    e.add_argument("--commit", default=None)
    e.add_argument("--repro", default="")
    e.set_defaults(func=cmd_env)
    p = sub.add_parser("prompts", help="print the prompt sets")
    p.add_argument("--sets", default="grounded,open")
    p.add_argument("--per-set", type=int, default=8)
    p.set_defaults(func=cmd_prompts)
    a = ap.parse_args(argv)
    if getattr(a, "per_set", 1) < 1 or getattr(a, "max_new_tokens", 1) < 1:
        ap.error("--per-set and --max-new-tokens must be >= 1")
    if getattr(a, "min_rounds", 1) < 1 or getattr(a, "max_rounds", 1) < getattr(a, "min_rounds", 1):
        ap.error("--min-rounds must be >= 1 and --max-rounds >= --min-rounds")
    if getattr(a, "judge_departures", 0) < 0 or getattr(a, "judge_s", 0) < 0:
        ap.error("--judge-departures and --judge-s must be >= 0")
    try:
        return a.func(a)
    except ValueError as err:
        ap.error(str(err))


if __name__ == "__main__":
    sys.exit(main())
