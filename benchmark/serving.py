#!/usr/bin/env python3
"""Serving benchmark client for an SGLang (native /generate) or OpenAI-compatible
server. Standard library only.

  run      one server: single stream and concurrency levels (TTFT, TPOT, output tokens/s, accept
           length), optionally one long generation, /metrics scraped around each level, a table,
           --json, --plot
  compare  greedy identity: output token ids per prompt across result files (the lossless check)
  table    a markdown table of the headline numbers of result files
  plot     one PNG comparing result files (needs matplotlib)

Examples
  python benchmark/serving.py run --base-url http://127.0.0.1:30000 --tag tree --concurrency 1,8 \\
      --kinds code,reasoning,chat,repetitive,story --max-new-tokens 256 --long-gen 8192 \\
      --json tree.json
  # a server without a tokenizer:
  python benchmark/serving.py run --base-url ... --input-ids --vocab-size 32000 ...
  python benchmark/serving.py run --backend openai --base-url http://host:8000 --model NAME ...
  python benchmark/serving.py compare plain.json tree.json chain.json --level 1
  python benchmark/serving.py plot plain.json tree.json chain.json --out serving.png

Definitions (per request; a level aggregates its requests)
  TTFT     first streamed chunk that carries at least one output token, from the moment the
           request was sent
  TPOT     (latency - TTFT) / (output_tokens - 1)
  output tokens   the server's completion token count (meta_info.completion_tokens;
           usage.completion_tokens): reasoning tokens are output tokens. OpenAI streams that report
           no usage are counted from their chunks, content and reasoning_content alike
  accept length   meta_info.spec_accept_length, else completion_tokens / spec_verify_ct; a level's
           mean is token-weighted: sum(output tokens) / sum(verify steps)
  tokens/s        sum(output tokens) / wall time of the level
"""
import argparse
import http.client
import json
import math
import os
import platform
import queue
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

# --------------------------------------------------------------------------------------------------
# Prompts. Several kinds, some that invite repetition (n-gram drafts can match
# earlier text), some that don't.
# --------------------------------------------------------------------------------------------------
PROMPTS = {
    "code": [
        "Write a Python class LRUCache with get and put methods, with docstrings and type hints, "
        "then write ten unit tests for it using unittest.",
        "Write a C function that parses a CSV line into fields, handling quoted fields, and a "
        "main() that tests it on five example lines.",
        "Implement binary search, merge sort and quicksort in Python, each with a docstring and a "
        "doctest.",
    ],
    "reasoning": [
        "A train leaves at 9:40 and travels 210 km at 84 km/h. A second train leaves the same "
        "station at 10:05 at 105 km/h on the same track. When and where does the second train "
        "catch up? Think step by step.",
        "Alice has twice as many apples as Bob. After Bob buys 7 apples and Alice gives away 5, "
        "they have the same number. How many apples did each have? Explain your reasoning step by "
        "step.",
        "Is 1001 a prime number? Check every candidate divisor step by step and explain.",
    ],
    "chat": [
        "What are three good habits for staying focused when working from home?",
        "Can you recommend a simple dinner I can cook in twenty minutes with rice, eggs and "
        "vegetables?",
        "Explain to a ten year old why the sky is blue.",
    ],
    "repetitive": [
        "List the numbers from 1 to 60, one per line, each followed by its square, in the format "
        "'n squared is m'.",
        "Write a JSON array of 20 objects describing users, each with the fields id, name, email, "
        "is_active and created_at.",
        "Write an HTML table with 25 rows listing the months and the number of days in each, with "
        "the same row structure for every row.",
    ],
    "story": [
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Describe a walk through a busy market in a city you invent, with its sounds and smells.",
        "Write a letter from a sailor to their family, describing a storm at sea.",
    ],
}
REPETITIVE_KINDS = {"code", "repetitive"}
LONG_PROMPT = ("Write a complete, well documented Python module implementing a small relational "
               "database: a tokenizer and parser for a subset of SQL (CREATE TABLE, INSERT, SELECT "
               "with WHERE, ORDER BY, JOIN), an in-memory storage engine, indexes, a query planner "
               "and an interactive shell. Include unit tests for every part.")


def chatml(text):
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def text_to_ids(text, vocab_size, offset=100, bos=1):
    """Token ids for a server without a tokenizer: one id per UTF-8 byte, so repeated text
    gives repeated ids (what an n-gram drafter reacts to). ids stay inside [offset,
    min(offset+256, vocab_size))."""
    if vocab_size < offset + 2:
        raise ValueError(f"--vocab-size must be > {offset + 1}, got {vocab_size}")
    span = min(256, vocab_size - offset)
    return [bos] + [offset + (b % span) for b in text.encode("utf-8")]


def build_prompts(kinds, per_kind):
    out = []
    for kind in kinds:
        if kind not in PROMPTS:
            raise ValueError(f"unknown prompt kind {kind!r}; allowed: {','.join(PROMPTS)}")
        for i, text in enumerate(PROMPTS[kind][:per_kind]):
            out.append({"id": f"{kind}-{i}", "kind": kind, "repetitive": kind in REPETITIVE_KINDS,
                        "text": text})
    return out


# --------------------------------------------------------------------------------------------------
# HTTP (stdlib): JSON GET/POST and server-sent events
# --------------------------------------------------------------------------------------------------
class Endpoint:
    def __init__(self, base_url, timeout=600.0, api_key=None):
        u = urllib.parse.urlparse(base_url if "://" in base_url else "http://" + base_url)
        if u.scheme not in ("http", "https"):
            raise ValueError(f"--base-url must be http(s)://host:port, got {base_url!r}")
        self.scheme, self.host, self.port = (u.scheme, u.hostname, u.port
                                             or (443 if u.scheme == "https" else 80))
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def _conn(self, timeout=None):
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout or self.timeout)

    def get(self, path, timeout=10.0):
        c = self._conn(timeout)
        try:
            c.request("GET", self.prefix + path, headers=self.headers)
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            c.close()

    def post_json(self, path, body, timeout=None):
        c = self._conn(timeout)
        try:
            c.request("POST", self.prefix + path, body=json.dumps(body), headers=self.headers)
            r = c.getresponse()
            data = r.read().decode("utf-8", "replace")
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status} from {path}: {data[:500]}")
            return json.loads(data)
        finally:
            c.close()

    def stream(self, path, body):
        """Yield (t_received, parsed JSON) for each `data:` event until [DONE] or
        the end of the stream."""
        c = self._conn()
        try:
            c.request("POST", self.prefix + path, body=json.dumps(body), headers=self.headers)
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status} from {path}: "
                                   f"{r.read().decode('utf-8', 'replace')[:500]}")
            while True:
                line = r.readline()
                if not line:
                    return
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                yield time.perf_counter(), json.loads(payload)
        finally:
            c.close()


# --------------------------------------------------------------------------------------------------
# One request
# --------------------------------------------------------------------------------------------------
def request_body(args, prompt, max_new_tokens):
    sp = {"temperature": args.temperature, "max_new_tokens": max_new_tokens,
          "ignore_eos": args.ignore_eos}
    if args.backend == "sglang":
        body = {"sampling_params": sp, "stream": True}
        if args.input_ids:
            body["input_ids"] = text_to_ids(prompt["text"], args.vocab_size)
        else:
            body["text"] = (chatml(prompt["text"]) if args.chat_format == "chatml"
                            else prompt["text"])
        return "/generate", body
    body = {"model": args.model, "max_tokens": max_new_tokens, "temperature": args.temperature,
            "stream": True, "stream_options": {"include_usage": True}}
    if args.ignore_eos:
        # SGLang and vLLM accept it; other servers ignore unknown fields or refuse
        body["ignore_eos"] = True
    if args.openai_api == "chat":
        body["messages"] = [{"role": "user", "content": prompt["text"]}]
        return "/v1/chat/completions", body
    body["prompt"] = (text_to_ids(prompt["text"], args.vocab_size) if args.input_ids
                      else prompt["text"])
    return "/v1/completions", body


def run_request(ep, args, prompt, max_new_tokens):
    """Send one streamed request; return its record (never raises: errors are recorded)."""
    path, body = request_body(args, prompt, max_new_tokens)
    rec = {"prompt_id": prompt["id"], "kind": prompt["kind"], "repetitive": prompt["repetitive"]}
    t0 = time.perf_counter()
    ttft = None
    chunk_tokens = 0
    last = None
    text_parts, reasoning_parts = [], []
    usage = None
    try:
        ids_acc = []
        for t, ev in ep.stream(path, body):
            if args.backend == "sglang":
                last = ev
                ids = ev.get("output_ids") or []
                n = (ev.get("meta_info") or {}).get("completion_tokens", len(ids))
                # cumulative chunks (SGLang's default) carry all ids so far; incremental ones
                # (--incremental-streaming-output) only the new ones
                piece = ev.get("text")
                if len(ids) == n and len(ids) >= len(ids_acc):
                    ids_acc = list(ids)
                    if piece is not None:
                        text_parts = [piece]
                else:
                    ids_acc.extend(ids)
                    if piece is not None:
                        text_parts.append(piece)
                if ttft is None and n:
                    ttft = t - t0
                continue
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                delta = ch.get("delta") or {}
                piece = ch.get("text") or delta.get("content") or ""
                reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
                if piece or reasoning:
                    chunk_tokens += 1
                    if ttft is None:
                        ttft = t - t0
                text_parts.append(piece)
                reasoning_parts.append(reasoning)
        latency = time.perf_counter() - t0
    except Exception as e:
        rec.update(error=f"{type(e).__name__}: {e}", latency_s=time.perf_counter() - t0)
        return rec
    rec["latency_s"] = latency
    rec["ttft_s"] = ttft if ttft is not None else latency
    if args.backend == "sglang":
        mi = (last or {}).get("meta_info") or {}
        n_out = mi.get("completion_tokens", len(ids_acc))
        rec.update(output_tokens=n_out, prompt_tokens=mi.get("prompt_tokens"),
                   finish=str(mi.get("finish_reason")),
                   output_ids=ids_acc if (last or {}).get("output_ids") is not None else None,
                   text="".join(text_parts) if text_parts else None)
        if rec["output_ids"] is not None and len(ids_acc) != n_out:
            rec["warning"] = f"{len(ids_acc)} output ids for {n_out} completion tokens"
        rec.update(accept_fields(mi, n_out))
    else:
        n_out = (usage or {}).get("completion_tokens") or chunk_tokens
        details = (usage or {}).get("completion_tokens_details") or {}
        rec.update(output_tokens=n_out, prompt_tokens=(usage or {}).get("prompt_tokens"),
                   reasoning_tokens=details.get("reasoning_tokens"), text="".join(text_parts),
                   reasoning_text="".join(reasoning_parts) or None, output_ids=None)
    rec["tpot_s"] = (latency - rec["ttft_s"]) / (n_out - 1) if n_out and n_out > 1 else None
    return rec


def accept_fields(meta_info, n_out):
    out = {}
    vc = meta_info.get("spec_verify_ct")
    al = meta_info.get("spec_accept_length")
    if vc:
        out["spec_verify_ct"] = vc
        out["accept_length"] = al if al is not None else n_out / vc
    elif al is not None:
        out["accept_length"] = al
    for k in ("spec_accept_rate", "spec_num_correct_drafts", "spec_num_proposed_drafts"):
        if k in meta_info:
            out[k] = meta_info[k]
    return out


# --------------------------------------------------------------------------------------------------
# Levels: N requests with at most C in flight
# --------------------------------------------------------------------------------------------------
class Progress:
    def __init__(self, total, label, enabled=True, stream=sys.stderr):
        self.total, self.label, self.enabled, self.stream = total, label, enabled, stream
        self.done, self.t0, self.lock = 0, time.perf_counter(), threading.Lock()

    def tick(self, tokens=0):
        with self.lock:
            self.done += 1
            if self.enabled:
                w = 30
                fill = int(w * self.done / max(1, self.total))
                el = time.perf_counter() - self.t0
                self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (w - fill)}] "
                                  f"{self.done}/{self.total} {el:6.1f}s")
                if self.done == self.total:
                    self.stream.write("\n")
                self.stream.flush()


def run_level(ep, args, prompts, concurrency, n_requests, max_new_tokens, label):
    work = queue.Queue()
    for i in range(n_requests):
        work.put((i, prompts[i % len(prompts)]))
    results = [None] * n_requests
    bar = Progress(n_requests, label, enabled=not args.no_progress)

    def worker():
        while True:
            try:
                i, p = work.get_nowait()
            except queue.Empty:
                return
            r = run_request(ep, args, p, max_new_tokens)
            r["index"] = i
            results[i] = r
            bar.tick()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(min(concurrency, n_requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(results, duration):
    ok = [r for r in results if "error" not in r]
    out_tok = sum(r.get("output_tokens") or 0 for r in ok)
    ttft = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
    tpot = [r["tpot_s"] for r in ok if r.get("tpot_s") is not None]
    vsteps = sum(r.get("spec_verify_ct") or 0 for r in ok)
    spec_tok = sum(r.get("output_tokens") or 0 for r in ok if r.get("spec_verify_ct"))
    s = {
        "requests": len(results), "errors": len(results) - len(ok), "duration_s": duration,
        "output_tokens": out_tok, "output_tok_per_s": out_tok / duration if duration > 0 else None,
        "req_per_s": len(ok) / duration if duration > 0 else None,
        "ttft_ms_mean": 1e3 * statistics.fmean(ttft) if ttft else None,
        "ttft_ms_median": 1e3 * pct(ttft, 0.5) if ttft else None,
        "ttft_ms_p99": 1e3 * pct(ttft, 0.99) if ttft else None,
        "tpot_ms_mean": 1e3 * statistics.fmean(tpot) if tpot else None,
        "tpot_ms_median": 1e3 * pct(tpot, 0.5) if tpot else None,
        "tpot_ms_p99": 1e3 * pct(tpot, 0.99) if tpot else None,
        "verify_steps": vsteps or None,
        "accept_length_mean": spec_tok / vsteps if vsteps else None,
        "reasoning_tokens": sum(r.get("reasoning_tokens") or 0 for r in ok) or None,
    }
    per_kind = {}
    for r in ok:
        k = per_kind.setdefault(r["kind"], {"tokens": 0, "steps": 0, "tpot": []})
        k["tokens"] += r.get("output_tokens") or 0
        k["steps"] += r.get("spec_verify_ct") or 0
        if r.get("tpot_s") is not None:
            k["tpot"].append(r["tpot_s"])
    s["per_kind"] = {kind: {"accept_length": v["tokens"] / v["steps"] if v["steps"] else None,
                            "tpot_ms_median": 1e3 * pct(v["tpot"], 0.5) if v["tpot"] else None}
                     for kind, v in per_kind.items()}
    if len(ok) < len(results):
        s["first_error"] = next(r["error"] for r in results if "error" in r)
    return s


# --------------------------------------------------------------------------------------------------
# /metrics (Prometheus text) and server facts
# --------------------------------------------------------------------------------------------------
_METRIC = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)')


def parse_metrics(text):
    """{'name{labels}': float} for every sample line (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC.match(line)
        if m:
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def scrape(ep):
    try:
        st, txt = ep.get("/metrics", timeout=10)
        return parse_metrics(txt) if st == 200 else {}
    except Exception:
        return {}


def metric_deltas(before, after, prefix="sglang:verify_"):
    """Histogram means over an interval: for each `<name>_sum{labels}` with a matching
    `_count`, the mean of the samples added between the two scrapes. Also the spec counters
    SGLang exports, as deltas."""
    out = {}
    for key, v in after.items():
        if not key.startswith(prefix) or "_sum" not in key:
            continue
        ckey = key.replace("_sum", "_count", 1)
        dn = after.get(ckey, 0) - before.get(ckey, 0)
        if dn > 0:
            out[key.replace("_sum", "_mean", 1)] = (v - before.get(key, 0)) / dn
            out[ckey] = dn
    return out


def server_facts(ep):
    facts = {}
    for path in ("/get_server_info", "/server_info"):
        try:
            st, txt = ep.get(path, timeout=10)
            if st == 200:
                info = json.loads(txt)
                keys = ("version", "tp_size", "speculative_algorithm",
                        "speculative_num_draft_tokens",
                        "speculative_ngram_verify_mode", "speculative_eagle_topk",
                        "speculative_num_steps",
                        "attention_backend", "model_path", "load_format", "cuda_graph_max_bs",
                        "disable_cuda_graph",
                        "tp_allreduce", "nccl_proto", "nccl_algo", "nccl_max_channels",
                        "nccl_min_channels",
                        "enable_verify_timing", "flashinfer_allreduce_fusion_backend",
                        "max_running_requests")
                facts["server_args"] = {k: info[k] for k in keys if k in info}
                st2 = info.get("internal_states") or []
                if st2 and isinstance(st2, list) and isinstance(st2[0], dict):
                    facts["avg_spec_accept_length"] = st2[0].get("avg_spec_accept_length")
                break
        except Exception:
            continue
    return facts


def gpu_facts():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10).stdout
        return [line.strip() for line in out.splitlines() if line.strip()] or None
    except Exception:
        return None


def preamble(args, facts):
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM_", "CUDA_VISIBLE"))}
    return {
        "tag": args.tag, "base_url": args.base_url, "backend": args.backend,
        "client_host": platform.node(), "python": platform.python_version(),
        "gpus_visible_to_client": gpu_facts(), "env": env, **facts,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def print_preamble(pre, out=sys.stdout):
    out.write(f"# serving benchmark  tag={pre['tag']}  {pre['time_utc']}\n")
    out.write(f"# server {pre['base_url']} ({pre['backend']})\n")
    if pre.get("gpus_visible_to_client"):
        out.write(f"# gpus {'; '.join(pre['gpus_visible_to_client'])}\n")
    for k, v in (pre.get("server_args") or {}).items():
        out.write(f"# server_args.{k} = {v}\n")
    if pre.get("env"):
        out.write("# env " + " ".join(f"{k}={v}" for k, v in pre["env"].items()) + "\n")
    out.write(f"# client python {pre['python']} on {pre['client_host']}\n")


def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def print_table(levels, out=sys.stdout):
    hdr = (f"{'level':>10} {'reqs':>5} {'err':>4} {'out tok':>8} {'tok/s':>9} {'TTFT ms':>9} "
           f"{'p99':>8} {'TPOT ms':>8} {'p99':>7} {'accept':>7} {'steps':>7}")
    out.write(hdr + "\n" + "-" * len(hdr) + "\n")
    for lv in levels:
        s = lv["summary"]
        out.write(f"{lv['name']:>10} {s['requests']:>5} {s['errors']:>4} {s['output_tokens']:>8} "
                  f"{fmt(s['output_tok_per_s']):>9} {fmt(s['ttft_ms_median']):>9} "
                  f"{fmt(s['ttft_ms_p99']):>8} {fmt(s['tpot_ms_median'], '.2f'):>8} "
                  f"{fmt(s['tpot_ms_p99'], '.2f'):>7} {fmt(s['accept_length_mean'], '.2f'):>7} "
                  f"{fmt(s['verify_steps'], '.0f'):>7}\n")


# --------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------
def parse_levels(text):
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit("error: --concurrency takes comma-separated positive integers, got "
                         f"{text!r}")
    if not levels or any(c < 1 for c in levels):
        raise SystemExit("error: --concurrency takes comma-separated positive integers, got "
                         f"{text!r}")
    return levels


def wait_healthy(ep, timeout_s):
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        try:
            st, _ = ep.get("/health", timeout=5)
            if st == 200:
                return True
        except Exception:
            pass
        time.sleep(1)
    return False


def cmd_run(args):
    ep = Endpoint(args.base_url, timeout=args.request_timeout, api_key=args.api_key)
    if args.wait_s and not wait_healthy(ep, args.wait_s):
        raise SystemExit(f"error: {args.base_url}/health did not answer 200 within {args.wait_s}s")
    kinds = [k for k in args.kinds.split(",") if k]
    try:
        prompts = build_prompts(kinds, args.per_kind)
    except ValueError as e:
        raise SystemExit(f"error: --kinds: {e}")
    levels = parse_levels(args.concurrency)
    pre = preamble(args, server_facts(ep))
    print_preamble(pre)
    if args.warmup:
        # at every measured concurrency: a server's first batch of a new size can pay one-time costs
        # (a JIT compile of a kernel for that shape took ~0.5 s in the first speculative server to
        # see 4 requests on a fresh machine) that do not belong to the level's numbers; the same
        # short request, c at a time
        for c in levels:
            run_level(ep, args, prompts[:1], c, c * args.warmup, min(32, args.max_new_tokens),
                      f"warmup c={c}")
    result = {"repro_command": " ".join(shlex.quote(a)
                                        for a in ["python3", args._script] + args._argv),
              "preamble": pre,
              "config": {k: v for k, v in vars(args).items() if k not in ("func", "api_key")
                         and not k.startswith("_")},
              "prompts": prompts, "levels": []}
    for c in levels:
        n = max(len(prompts), c * args.requests_per_slot)
        m0 = scrape(ep) if args.metrics else {}
        res, dur = run_level(ep, args, prompts, c, n, args.max_new_tokens, f"c={c:<4}")
        m1 = scrape(ep) if args.metrics else {}
        lv = {"name": f"c={c}", "concurrency": c, "summary": summarize(res, dur), "requests": res}
        if args.metrics:
            lv["metrics"] = metric_deltas(m0, m1)
        result["levels"].append(lv)
    if args.long_gen:
        p = {"id": "long-0", "kind": "long", "repetitive": True, "text": LONG_PROMPT}
        m0 = scrape(ep) if args.metrics else {}
        res, dur = run_level(ep, args, [p], 1, 1, args.long_gen, "long    ")
        m1 = scrape(ep) if args.metrics else {}
        lv = {"name": f"long{args.long_gen}", "concurrency": 1, "summary": summarize(res, dur),
              "requests": res}
        if args.metrics:
            lv["metrics"] = metric_deltas(m0, m1)
        result["levels"].append(lv)
    result["preamble"].update({k: v for k, v in server_facts(ep).items()
                               if k == "avg_spec_accept_length"})
    print_table(result["levels"])
    for lv in result["levels"]:
        if lv["summary"].get("first_error"):
            print(f"# {lv['name']}: first error: {lv['summary']['first_error']}")
        for k, v in sorted((lv.get("metrics") or {}).items()):
            if k.endswith("_mean") or "_mean{" in k:
                print(f"# {lv['name']} {k} = {v:.6g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"# wrote {args.json}")
    if args.plot:
        plot([result], args.plot)
    errors = sum(lv["summary"]["errors"] for lv in result["levels"])
    return 1 if errors and args.fail_on_error else 0


def load(path):
    with open(path) as f:
        return json.load(f)


def outputs_by_prompt(result, level_name):
    """{prompt_id: output_ids} of every request in the named level, in request order: a
    prompt's first request under its id, its repeats (a level sends more requests than
    prompts) as id#2, id#3, ..."""
    out, seen = {}, {}
    for lv in result["levels"]:
        if lv["name"] != level_name:
            continue
        for r in sorted(lv["requests"], key=lambda r: r.get("index", 0)):
            if r.get("output_ids") is None:
                continue
            pid = r["prompt_id"]
            seen[pid] = seen.get(pid, 0) + 1
            out[pid if seen[pid] == 1 else f"{pid}#{seen[pid]}"] = r["output_ids"]
    return out


def compare(results, names, level_name):
    """Compare every result with the first. Returns (report lines, all_identical)."""
    ref = outputs_by_prompt(results[0], level_name)
    lines, same_all = [], True
    if not ref:
        return [f"no output ids for level {level_name} in {names[0]}"], False
    for res, name in zip(results[1:], names[1:]):
        other = outputs_by_prompt(res, level_name)
        n_same, diffs = 0, []
        for pid, a in ref.items():
            b = other.get(pid)
            if b is None:
                diffs.append(f"{pid}: missing")
                continue
            if a == b:
                n_same += 1
                continue
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diffs.append(f"{pid}: first difference at token {first} of {len(a)}/{len(b)}")
        same_all &= n_same == len(ref)
        lines.append(f"{name} vs {names[0]} [{level_name}]: {n_same}/{len(ref)} prompts identical")
        lines += ["    " + d for d in diffs]
    return lines, same_all


def cmd_compare(args):
    results = [load(p) for p in args.files]
    lines, same = compare(results, [os.path.basename(p) for p in args.files], args.level)
    print("\n".join(lines))
    print("greedy identity:", "IDENTICAL" if same else "DIFFERENT")
    return 0 if same or not args.strict else 1


def model_label(server_args) -> str:
    """The model of a run for a plot title: the last part of its served name or model path (a folder
    on the GPU host says nothing to a reader, and a repository id keeps its model name)."""
    sa = server_args or {}
    name = str(sa.get("served_model_name") or sa.get("model_path") or "").rstrip("/")
    return os.path.basename(name) or name


def plot_title(preamble) -> str:
    gpus = "; ".join(preamble.get("gpus_visible_to_client") or [])
    return "  ".join(x for x in (model_label(preamble.get("server_args")), gpus) if x)


def plot(results, out_png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"# matplotlib is not installed: no plot written to {out_png}")
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    tags = [r["preamble"].get("tag") or f"run{i}" for i, r in enumerate(results)]
    names = []
    for r in results:
        for lv in r["levels"]:
            if lv["name"] not in names:
                names.append(lv["name"])
    width = 0.8 / max(1, len(results))
    for j, (r, tag) in enumerate(zip(results, tags)):
        by = {lv["name"]: lv["summary"] for lv in r["levels"]}
        xs = [i + j * width for i in range(len(names))]
        for ax, key in zip(axes, ("output_tok_per_s", "tpot_ms_median", "accept_length_mean")):
            ax.bar(xs, [(by.get(n) or {}).get(key) or 0 for n in names], width, label=tag)
    for ax, title in zip(axes,
                         ("output tokens/s (higher is better)", "median TPOT ms (lower is better)",
                          "mean accept length (tokens per verify step)")):
        ax.set_title(title, fontsize=10)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
        ax.set_xticklabels(names, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    pre = results[0]["preamble"]
    fig.suptitle(plot_title(pre), fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    print(f"# wrote {out_png}")
    return True


def markdown_table(results, names, keys=None):
    """One markdown table: a row per (result file, level) with the headline numbers."""
    keys = keys or [("output_tok_per_s", "tok/s", ".0f"), ("tpot_ms_median", "TPOT p50 ms", ".2f"),
                    ("tpot_ms_p99", "TPOT p99 ms", ".2f"), ("ttft_ms_median", "TTFT p50 ms", ".1f"),
                    ("accept_length_mean", "accept len", ".2f"),
                    ("verify_steps", "verify steps", ".0f")]
    out = ["| run | level | " + " | ".join(k[1] for k in keys) + " |",
           "|---|---|" + "---:|" * len(keys)]
    for res, name in zip(results, names):
        for lv in res["levels"]:
            s = lv["summary"]
            cells = " | ".join(fmt(s.get(k), f) for k, _, f in keys)
            out.append(f"| {name} | {lv['name']} | {cells} |")
    return "\n".join(out)


def cmd_table(args):
    results = [load(p) for p in args.files]
    names = [r["preamble"].get("tag") or os.path.basename(p) for r, p in zip(results, args.files)]
    print(markdown_table(results, names))
    return 0


def cmd_plot(args):
    return 0 if plot([load(p) for p in args.files], args.out) else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="benchmark one server")
    r.add_argument("--base-url", default="http://127.0.0.1:30000")
    r.add_argument("--backend", choices=("sglang", "openai"), default="sglang",
                   help="sglang: native /generate (token ids, accept length); openai: "
                        "/v1/completions or chat")
    r.add_argument("--openai-api", choices=("completions", "chat"), default="completions")
    r.add_argument("--model", default="default", help="model name for the OpenAI API")
    r.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    r.add_argument("--tag", default="run",
                   help="label of this run in tables, plots and comparisons")
    r.add_argument("--kinds", default="code,reasoning,chat,repetitive,story",
                   help=f"comma-separated prompt kinds: {','.join(PROMPTS)}")
    r.add_argument("--per-kind", type=int, default=2, help="prompts per kind (at most 3)")
    r.add_argument("--concurrency", default="1,8",
                   help="comma-separated concurrency levels (1 = single stream)")
    r.add_argument("--requests-per-slot", type=int, default=2,
                   help="a level sends max(#prompts, concurrency * this) requests")
    r.add_argument("--max-new-tokens", type=int, default=256)
    r.add_argument("--long-gen", type=int, default=0,
                   help="also one single-stream request of this many tokens")
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly --max-new-tokens (default on: equal work across servers)")
    r.add_argument("--chat-format", choices=("chatml", "none"), default="chatml",
                   help="wrap text prompts in a ChatML turn (native backend)")
    r.add_argument("--input-ids", action="store_true",
                   help="send token ids (server without a tokenizer)")
    r.add_argument("--vocab-size", type=int, default=32000, help="for --input-ids")
    r.add_argument("--metrics", action="store_true", help="scrape /metrics around each level")
    r.add_argument("--warmup", type=int, default=1,
                   help="short requests per concurrency slot before measuring, run at each level's "
                        "concurrency")
    r.add_argument("--wait-s", type=float, default=0, help="wait up to this long for /health first")
    r.add_argument("--request-timeout", type=float, default=900)
    r.add_argument("--json", help="write the full result (with repro_command) here")
    r.add_argument("--plot", help="write a PNG here (needs matplotlib)")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--fail-on-error", action="store_true", help="exit 1 when any request failed")
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("compare",
                       help="greedy identity of output ids across result files (first = reference)")
    c.add_argument("files", nargs="+")
    c.add_argument("--level", default="c=1", help="level name to compare (c=1, long8192, ...)")
    c.add_argument("--strict", action="store_true", help="exit 1 unless every prompt is identical")
    c.set_defaults(func=cmd_compare)
    t = sub.add_parser("table", help="markdown table of the headline numbers of result files")
    t.add_argument("files", nargs="+")
    t.set_defaults(func=cmd_table)
    p = sub.add_parser("plot", help="one PNG comparing result files")
    p.add_argument("files", nargs="+")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_plot)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    args._argv = argv
    args._script = os.path.relpath(os.path.abspath(__file__))
    if getattr(args, "per_kind", 1) < 1:
        ap.error("--per-kind must be >= 1")
    if getattr(args, "max_new_tokens", 1) < 1:
        ap.error("--max-new-tokens must be >= 1")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
