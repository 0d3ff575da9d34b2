"""Offline replay of n-gram speculation over recorded greedy outputs.

Answers "would n-gram speculation pay off on my traffic, and with which verify shape?" before a long
model load. It drives SGLang's own C++ n-gram corpus (the installed, patched one) over recorded
requests exactly as the NGRAM worker does during greedy decoding:

    for each decode step of each running request:
        context  = prompt + tokens generated so far          (the first token comes from prefill)
        query    = last max_trie_depth tokens of the context  (ngram_worker._prepare_draft_tokens)
        draft    = corpus.batch_get(rids, queries, total_lens)  # tokens [bs*d], mask [bs*d*d]
        verify   = walk the draft against the recorded continuation
                                                      (greedy: the recording IS the target)
        append   = accepted draft tokens + one bonus token
        corpus.batch_put(queries)                     (ngram_worker._update_ngram_corpus)
    requests that left the batch: corpus.erase_match_state(rids)

Greedy verification of a tree (what verify_tree_greedy computes): start at the root (the last
context token); while some child of the current node carries the target's next token, accept
it and descend; the target's prediction after the last accepted node is the bonus token.
Accept length = accepted drafts + 1. Because the recording is the greedy target output, the
replayed token stream equals the recording by construction, and only the accept lengths and
the verify shapes are measured.

Server facts this mirrors (SGLang 0.5.16 and 0.5.23, ngram_worker.py, identical in both):
- the corpus is only fed the query window after each verify (prompts are not inserted at prefill),
  so a request's last accepted tokens are never inserted;
- inserts are asynchronous; the next draft preparation waits for them (`synchronize()`);
- padding nodes are token 0 hung under the root; they are real tree nodes for the verify kernel.

Verify shapes per step (tokens in the target forward pass of one request):
- tree (today's SGLang): always d = --speculative-num-draft-tokens, root included, match or not;
- chain: the root plus a path of at most k draft tokens (k = chain length); a request whose lookup
  finds no real candidate is gated to a plain 1-token decode step (no-match gating).

The end of a recording cuts the last step: a draft that matches past the last recorded token cannot
earn a bonus token the recording does not have, so a step accepts at most (remaining - 1) drafts.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from fastverify import costs as _costs
from fastverify.argtypes import int_list
from fastverify.costs import CostTable, CostTableError

MODES = ("tree", "chain")
MATCH_TYPES = ("BFS", "PROB")
DEFAULT_TRACE = Path(__file__).resolve().parent / "data" / "smollm2_135m_greedy.jsonl"

# SGLang's server defaults for the n-gram corpus (server_args.py, 0.5.16 and 0.5.23).
SERVER_MAX_TRIE_DEPTH = 18
SERVER_MIN_BFS_BREADTH = 1
SERVER_MAX_BFS_BREADTH = 10


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""



# -------------------------------------------------------------------------------------------- trace
@dataclass(frozen=True)
class TraceRequest:
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    line: int  # 1-based line in the trace file


@dataclass(frozen=True)
class Trace:
    path: str
    requests: tuple[TraceRequest, ...]
    meta: dict = field(default_factory=dict)  # optional header line {"meta": {...}}

    @property
    def decode_tokens(self) -> int:
        """Tokens produced by decode steps (the first output token of each
        request comes from prefill)."""
        return sum(max(0, len(r.output_ids) - 1) for r in self.requests)

    @property
    def short_requests(self) -> tuple:
        """Requests with an empty or one-token output: no decode step to replay (the first output
        token comes from prefill), so the replay skips them; `run_cli` reports them."""
        return tuple(r for r in self.requests if len(r.output_ids) < 2)


TOKEN_ID_MAX = 2**31 - 1  # SGLang's corpus takes token ids as int32 (ngram_corpus._to_csr)


def _token_list(value, key: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TraceError(f"{where}: '{key}' must be a list of token ids, got "
                         f"{type(value).__name__}")
    for i, tok in enumerate(value):
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise TraceError(f"{where}: '{key}'[{i}] must be a non-negative integer token id, got "
                             f"{tok!r}")
        if tok > TOKEN_ID_MAX:
            raise TraceError(f"{where}: '{key}'[{i}] = {tok} is outside the int32 token ids "
                             f"SGLang's corpus takes (0..{TOKEN_ID_MAX})")
    return tuple(value)


def parse_trace(lines: Iterable[str], path: str = "<trace>") -> Trace:
    """Validate and parse JSON Lines: {"prompt_ids": [...], "output_ids": [...]} per line.

    An optional first line {"meta": {...}} describes the trace (model, versions).
    Blank lines are skipped.
    """
    requests: list[TraceRequest] = []
    meta: dict = {}
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
        if "meta" in obj and "prompt_ids" not in obj:
            if requests or meta:
                raise TraceError(f"{where}: a {{\"meta\": ...}} header is only allowed as the "
                                 "first line")
            if not isinstance(obj["meta"], dict):
                raise TraceError(f"{where}: 'meta' must be a JSON object")
            meta = obj["meta"]
            continue
        for key in ("prompt_ids", "output_ids"):
            if key not in obj:
                raise TraceError(f"{where}: missing key '{key}' (each line needs 'prompt_ids' and "
                                 "'output_ids')")
        prompt = _token_list(obj["prompt_ids"], "prompt_ids", where)
        output = _token_list(obj["output_ids"], "output_ids", where)
        if not prompt:
            raise TraceError(f"{where}: 'prompt_ids' is empty (the corpus needs a non-empty "
                             "context)")
        requests.append(TraceRequest(prompt, output, lineno))
    if not requests:
        raise TraceError(f"{path}: no requests (expected one JSON object per line with "
                         "'prompt_ids' and 'output_ids')")
    if all(len(r.output_ids) < 2 for r in requests):
        raise TraceError(f"{path}: all {len(requests)} requests have an empty or one-token "
                         f"output; the first output token comes from prefill, so there is no "
                         f"decode step to replay")
    return Trace(path=str(path), requests=tuple(requests), meta=meta)


def load_trace(path) -> Trace:
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{path}: trace file not found" + (" (a folder)" if p.is_dir() else ""))
    try:
        with p.open(encoding="utf-8-sig") as f:  # a UTF-8 byte order mark is accepted
            return parse_trace(f, str(path))
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text (byte {e.start})") from None


# ------------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class ReplayConfig:
    """One replayed verify shape. `size` is the tree width d (tokens per verify pass, root included)
    for mode='tree', and the chain length L (draft tokens after the root) for mode='chain', which
    the server runs as --speculative-ngram-verify-mode chain --speculative-num-draft-tokens L+1."""

    mode: str
    size: int
    match_type: str = "BFS"
    max_trie_depth: int = SERVER_MAX_TRIE_DEPTH
    min_bfs_breadth: int = SERVER_MIN_BFS_BREADTH
    max_bfs_breadth: int = SERVER_MAX_BFS_BREADTH
    # server default 10M; only matters once the trie is full (10M costs ~20 s to build)
    capacity: int = 1_000_000
    concurrency: int = 1  # requests decoded together; they share the corpus like one server batch

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.match_type not in MATCH_TYPES:
            raise ValueError(f"--match-type must be one of {', '.join(MATCH_TYPES)}, got "
                             f"{self.match_type!r}")
        if self.mode == "tree" and self.size < 2:
            raise ValueError("--draft-tokens (tree width) must be >= 2 (root + 1 draft), got "
                             f"{self.size}")
        if self.mode == "chain" and self.size < 1:
            raise ValueError(f"--chain-lengths must be >= 1, got {self.size}")
        for name in ("max_trie_depth", "min_bfs_breadth", "max_bfs_breadth", "capacity",
                     "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got "
                                 f"{getattr(self, name)}")
        if self.min_bfs_breadth > self.max_bfs_breadth:
            raise ValueError(f"--min-bfs-breadth ({self.min_bfs_breadth}) must be <= "
                             f"--max-bfs-breadth ({self.max_bfs_breadth})")

    @property
    def corpus_draft_tokens(self) -> int:
        """draft_token_num the corpus is built with (root included)."""
        return self.size if self.mode == "tree" else chain_corpus_width(self.size)

    @property
    def label(self) -> str:
        return f"tree d={self.size}" if self.mode == "tree" else f"chain L={self.size}"


# ------------------------------------------------------------------------------------ tree helpers
def tree_parents(mask_rows: Sequence[Sequence[int]]) -> list[int]:
    """Parent of each node from the corpus' ancestor mask ([d, d], row i = ancestors-or-self of i).

    Node 0 is the root (parent -1). The parent is the ancestor one level up (depth =
    ancestors-or-self count).
    """
    depth = [int(sum(row)) for row in mask_rows]
    parents = [-1]
    for i in range(1, len(mask_rows)):
        up = [j for j in range(i) if mask_rows[i][j] and depth[j] == depth[i] - 1]
        if len(up) != 1:
            raise ValueError(f"draft mask row {i} does not name exactly one parent (got {up})")
        parents.append(up[0])
    return parents


def greedy_accept_tree(tokens: Sequence[int], parents: Sequence[int],
                       target: Sequence[int]) -> list[int]:
    """Indices of the accepted draft nodes (root excluded) when verifying greedily against `target`
    (target[0] is the model's next token after the root, target[1] after that, ...).

    At each node, children are tried in index order, as the verify kernel walks
    next_token/next_sibling.
    """
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            children.setdefault(p, []).append(i)
    accepted: list[int] = []
    node = 0
    while len(accepted) < len(target):
        want = target[len(accepted)]
        nxt = next((c for c in children.get(node, ()) if tokens[c] == want), None)
        if nxt is None:
            break
        accepted.append(nxt)
        node = nxt
    return accepted


def has_real_candidate(tokens: Sequence[int], parents: Sequence[int]) -> bool:
    """False when the corpus found nothing: every non-root node is a token-0 pad under the root."""
    return any(not (t == 0 and p == 0) for t, p in zip(tokens[1:], parents[1:]))


# --- chain reduction: fastverify.chain (the same code the patched server
# runs) ---------------------
def chain_corpus_width(length: int) -> int:
    """Chain of `length` draft tokens = --speculative-num-draft-tokens
    length + 1 (root included)."""
    return length + 1


def _mask_from_parents(parents: Sequence[int]) -> list[list[int]]:
    d = len(parents)
    rows = []
    for i in range(d):
        row = [0] * d
        j = i
        while j >= 0:
            row[j] = 1
            j = parents[j]
        rows.append(row)
    return rows


def chain_path(tokens: Sequence[int], parents: Sequence[int], k: int,
               match_type: str = "BFS") -> list[int]:
    """Real draft tokens of the corpus' best path
    (fastverify.chain.extract_chains), cut to k tokens."""
    from fastverify.chain import extract_chains

    chain_tokens, chain_len = extract_chains([list(tokens)],
                                             [_mask_from_parents(parents)], match_type)
    n = int(chain_len[0])
    return [int(t) for t in chain_tokens[0, 1:1 + n]][:k]


_adapter_chain_from_tree = chain_path  # earlier name, still used by fastverify.sim


# ------------------------------------------------------------------------------------------ replay
@dataclass
class ReplayResult:
    config: ReplayConfig
    buckets: tuple = ()  # captured verify widths assumed for no-match gating (() = only d)
    # per request-step: accepted drafts + bonus
    accept_lens: list[int] = field(default_factory=list)
    # per request-step: the corpus offered a real candidate
    matched: list[bool] = field(default_factory=list)
    # per request-step: real draft tokens verified
    draft_lens: list[int] = field(default_factory=list)
    # per batch step: tokens verified at width d (bs*d)
    step_static: list[int] = field(default_factory=list)
    # per batch step: tokens with no-match gating
    step_planned: list[int] = field(default_factory=list)
    step_bs: list[int] = field(default_factory=list)  # per batch step: requests in the batch

    @property
    def steps(self) -> int:
        return len(self.accept_lens)

    @property
    def tokens(self) -> int:
        return sum(self.accept_lens)

    def summary(self) -> dict:
        steps = max(1, self.steps)
        hist = Counter(self.accept_lens)
        return {
            "mode": self.config.mode,
            "size": self.config.size,
            "label": self.config.label,
            "num_draft_tokens": self.config.corpus_draft_tokens,
            "steps": self.steps,
            "batch_steps": len(self.step_bs),
            "tokens": self.tokens,
            "mean_accept_length": self.tokens / steps,
            "verified_tokens_per_step": sum(self.step_static) / steps,
            "gated_tokens_per_step": sum(self.step_planned) / steps,
            "drafted_tokens_per_step": sum(self.draft_lens) / steps,
            "match_rate": sum(self.matched) / steps,
            "accept_length_hist": {str(k): hist[k] for k in sorted(hist)},
        }


CorpusFactory = Callable[[ReplayConfig], object]

# loggers of SGLang's JIT loader that warn "Cannot detect CUDA architecture." on a machine without
# a GPU (0.5.16: sglang.jit_kernel, 0.5.23: sglang.kernels.jit); the corpus is host C++, needs none
_ARCH_LOGGERS = ("sglang.jit_kernel.utils.arch", "sglang.kernels.jit.utils.arch")


class _DropNoArch:
    def filter(self, record) -> bool:
        return "Cannot detect CUDA architecture" not in record.getMessage()


def warm_up(corpus_factory: CorpusFactory, cfg: ReplayConfig,
            say: Optional[Callable[[str], None]] = None):
    """Build one corpus before any progress bar starts, so that a bar times the replay only: the
    first corpus loads SGLang's JIT module (~15 s; compiled on a machine's first use, 1-2 min). The
    JIT loader's "Cannot detect CUDA architecture." (no GPU here, none needed) is kept out of the
    output. Returns the corpus it built (configured by `cfg`)."""
    import logging
    import time

    if say is not None and corpus_factory is sglang_corpus_factory:
        say("starting SGLang's n-gram corpus (its JIT module: ~15 s; compiled on first use: "
            "1-2 min)")
    t0 = time.monotonic()
    drop = _DropNoArch()
    for name in _ARCH_LOGGERS:
        logging.getLogger(name).addFilter(drop)
    try:
        corpus = corpus_factory(cfg)
    finally:
        for name in _ARCH_LOGGERS:
            logging.getLogger(name).removeFilter(drop)
    took = time.monotonic() - t0
    if say is not None and corpus_factory is sglang_corpus_factory:
        say(f"corpus ready in {took:.0f} s")
    return corpus


def sglang_corpus_factory(cfg: ReplayConfig):
    """SGLang's installed n-gram corpus (C++, JIT-built on first use),
    configured like the server."""
    try:
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus
    except ImportError as e:
        raise RuntimeError(
            "replay needs SGLang's n-gram corpus (sglang.srt.speculative.cpp_ngram.ngram_corpus): "
            f"{e}"
        ) from e
    return NgramCorpus(
        max_trie_depth=cfg.max_trie_depth,
        min_bfs_breadth=cfg.min_bfs_breadth,
        max_bfs_breadth=cfg.max_bfs_breadth,
        draft_token_num=cfg.corpus_draft_tokens,
        match_type=cfg.match_type,
        capacity=cfg.capacity,
    )


def _query_window(prompt: Sequence[int], out: Sequence[int], g: int, depth: int) -> list[int]:
    """Last `depth` tokens of prompt + out[:g] (the worker's _efficient_concat_last_n)."""
    tail = list(out[max(0, g - depth):g])
    if len(tail) >= depth:
        return tail[-depth:]
    return list(prompt[-(depth - len(tail)):]) + tail


def _step_drafts(cfg: ReplayConfig, flat_tokens, flat_mask, bs: int):
    """Corpus output of one batch step -> per request (tokens [d], parents [d], real draft
    length), in the shape the server verifies: the tree as is, or the chain
    fastverify.chain reduces it to."""
    from fastverify import chain as fc

    d = cfg.corpus_draft_tokens
    if cfg.mode == "chain":
        flat_tokens, flat_mask, lens = fc.reduce_to_chain(flat_tokens, flat_mask, d, cfg.match_type)
    else:
        lens = fc.real_draft_lengths(flat_tokens, flat_mask, d)
    tokens = [[int(t) for t in row] for row in flat_tokens.reshape(bs, d)]  # [bs, d]
    parents = fc.tree_parents(flat_mask.reshape(bs, d, d)).tolist()  # [bs, d]
    return tokens, parents, [int(x) for x in lens]


def replay(trace: Trace, cfg: ReplayConfig, corpus_factory: CorpusFactory = sglang_corpus_factory,
           progress: Optional[Callable[[int], None]] = None,
           buckets: Sequence[int] = ()) -> ReplayResult:
    """Replay every request of `trace` through a fresh corpus under `cfg`
    (see the module docstring).

    `buckets`: verify widths assumed captured for no-match gating (fastverify.chain.plan_verify);
    widths above the config's d are ignored. The static count (every step verifies d tokens per
    request) is always reported.
    """
    import numpy as np
    from fastverify.chain import plan_verify

    corpus = corpus_factory(cfg)
    d = cfg.corpus_draft_tokens
    buckets = tuple(sorted({int(w) for w in buckets if 1 <= int(w) <= d}))
    result = ReplayResult(cfg, buckets)
    pending = [(f"r{i}", r) for i, r in enumerate(trace.requests) if len(r.output_ids) >= 2]
    pending.reverse()
    running: dict[str, list] = {}  # rid -> [request, generated count g]
    prev_rids: set[str] = set()
    while pending or running:
        while pending and len(running) < cfg.concurrency:
            rid, req = pending.pop()
            running[rid] = [req, 1]  # output_ids[0] came from prefill
        rids = list(running)
        queries, total_lens = [], []
        for rid in rids:
            req, g = running[rid]
            queries.append(_query_window(req.prompt_ids, req.output_ids, g, cfg.max_trie_depth))
            total_lens.append(len(req.prompt_ids) + g)
        corpus.synchronize()
        flat_tokens, flat_mask = corpus.batch_get(rids, queries, total_lens)  # [bs*d], [bs*d*d]
        tokens, parents, lens = _step_drafts(cfg, np.asarray(flat_tokens),
                                             np.asarray(flat_mask), len(rids))
        plan = plan_verify(lens, d, buckets)
        result.step_bs.append(len(rids))
        result.step_static.append(plan.tokens_static)
        result.step_planned.append(plan.tokens_planned)
        for b, rid in enumerate(rids):
            req, g = running[rid]
            target = req.output_ids[g:len(req.output_ids) - 1]  # a bonus token must remain
            # The server as it runs today verifies all d nodes, pads included; a pad is accepted
            # only where the target itself emits token 0, so gated steps would differ only there.
            accepted = len(greedy_accept_tree(tokens[b], parents[b], target))
            result.accept_lens.append(accepted + 1)
            result.matched.append(lens[b] > 0)
            result.draft_lens.append(lens[b])
            running[rid][1] = g + accepted + 1
            if progress is not None:
                progress(accepted + 1)
        corpus.batch_put(queries)
        for rid in rids:
            req, g = running[rid]
            if g >= len(req.output_ids):
                del running[rid]
        departed = prev_rids - set(running)
        if departed:
            corpus.erase_match_state(sorted(departed))
        prev_rids = set(running)
    corpus.synchronize()
    return result


# -------------------------------------------------------------------------------------- cost model
COST_FLAG = "--cost-table"
PICK_BACKEND = "--cost-backend"


def parse_cost_table(obj, source: str = "<cost table>", backend: Optional[str] = None) -> CostTable:
    """A verify-cost table in any form `fastverify.costs.parse_cost_table` reads (the same JSON
    forms as `--speculative-ngram-auto-cost-table`, e.g. {"decode_ms": 30.0, "verify_ms": {"1":
    30.0, "8": 33.0}}, or the microbenchmark's --json with `backend` picking its rows) that can
    model one stream. Unlike the controller, which must decide for any batch and extrapolates, a
    prediction never leaves the measured range (`CostTable.measured_pass_ms`)."""
    return _costs.parse_cost_table(obj, source, backend, PICK_BACKEND).single_stream()


def load_cost_table(path, backend: Optional[str] = None) -> CostTable:
    return _costs.load_cost_table(path, COST_FLAG, backend, PICK_BACKEND).single_stream()


def predict(result: ReplayResult, cost: CostTable) -> dict:
    """Predicted single-stream decode throughput (needs a replay with concurrency 1).

    tokens/s = sum over steps of (accepted + 1) / sum over steps of t(tokens in that pass); with a
    fixed pass size this is mean(accept length) / t(pass). "static": every step verifies d tokens
    (stock SGLang, and the chain patch as it runs today); "gated": a step with no real candidate is
    a plain decode (t_decode) and a step with one verifies the smallest captured width that fits it.
    No speculation: 1 / t_decode.
    """
    if any(bs != 1 for bs in result.step_bs):
        raise CostTableError(f"{cost.source}: throughput predictions model one stream; replay with "
                             "--concurrency 1")
    static_ms = sum(cost.measured_pass_ms(n) for n in result.step_static)
    gated_ms = sum(cost.measured_pass_ms(n) for n in result.step_planned)
    base = 1000.0 / cost.decode_ms(1)
    spec = result.tokens / static_ms * 1000.0
    gated = result.tokens / gated_ms * 1000.0
    return {"tokens_per_s": spec, "gated_tokens_per_s": gated, "no_spec_tokens_per_s": base,
            "speedup": spec / base, "gated_speedup": gated / base}


# ------------------------------------------------------------------------------------------- report
def _progress_bar(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        # first drawn after 1 s: an ETA from the first step alone (it waits on the corpus) is noise
        bar = tqdm(total=total, desc=desc, unit="tok", file=sys.stderr, leave=False,
                   mininterval=1.0)
        return bar.update, bar.close
    state = {"done": 0, "next": 0}

    def update(n):
        state["done"] += n
        if state["done"] >= state["next"]:
            print(f"[replay] {desc}: {state['done']}/{total} tokens", file=sys.stderr)
            state["next"] += max(1, total // 10)

    return update, lambda: None


def format_table(rows: list[dict]) -> str:
    has_cost = any("tokens_per_s" in r for r in rows)
    head = (f"{'config':<12} {'flag d':>6} {'steps':>7} {'accept len':>10} {'verified/step':>13} "
            f"{'gated/step':>10} {'match rate':>10}")
    if has_cost:
        head += f" {'tok/s':>8} {'x no-spec':>9} {'gated tok/s':>11} {'x no-spec':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (f"{r['label']:<12} {r['num_draft_tokens']:>6} {r['steps']:>7} "
                f"{r['mean_accept_length']:>10.3f} {r['verified_tokens_per_step']:>13.2f} "
                f"{r['gated_tokens_per_step']:>10.2f} {r['match_rate']:>10.3f}")
        if has_cost:
            line += (f" {r['tokens_per_s']:>8.1f} {r['speedup']:>8.2f}x"
                     f" {r['gated_tokens_per_s']:>11.1f} {r['gated_speedup']:>8.2f}x")
        lines.append(line)
    return "\n".join(lines)


def plot(rows: list[dict], out: str, title: str,
         no_spec_tokens_per_s: Optional[float] = None) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(f"--plot {out}: matplotlib is not installed (pip install "
                           "matplotlib)") from None
    has_cost = any("tokens_per_s" in r for r in rows)
    fig, axes = plt.subplots(1, 3 if has_cost else 2, figsize=(15 if has_cost else 10, 4.2))
    ax = axes[0]
    maxlen = max(int(k) for r in rows for k in r["accept_length_hist"])
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        xs = list(range(1, maxlen + 1))
        ys = [r["accept_length_hist"].get(str(x), 0) / max(1, r["steps"]) for x in xs]
        ax.bar([x - 0.4 + (i + 0.5) * width for x in xs], ys, width=width, label=r["label"])
    ax.set_xlabel("accept length (accepted drafts + bonus)")
    ax.set_ylabel("fraction of steps")
    ax.set_title("accept-length distribution")
    ax.legend(fontsize=8)
    ax = axes[1]
    for mode, marker in (("tree", "o"), ("chain", "s")):
        pts = [r for r in rows if r["mode"] == mode]
        if pts:
            ax.plot([r["verified_tokens_per_step"] for r in pts],
                    [r["mean_accept_length"] for r in pts],
                    marker=marker, label=f"{mode} (every step verifies d)")
            ax.plot([r["gated_tokens_per_step"] for r in pts],
                    [r["mean_accept_length"] for r in pts],
                    marker=marker, ls="--", mfc="none", label=f"{mode}, no-match gating")
            for r in pts:
                ax.annotate(r["label"].split()[1],
                            (r["verified_tokens_per_step"], r["mean_accept_length"]),
                            fontsize=8, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("tokens verified per step")
    ax.set_ylabel("mean accept length")
    ax.set_title("acceptance vs verify cost in tokens")
    ax.legend(fontsize=8)
    if has_cost:
        ax = axes[2]
        xs = list(range(len(rows)))
        ax.bar([x - 0.2 for x in xs], [r["tokens_per_s"] for r in rows], width=0.4,
               label="every step verifies d")
        ax.bar([x + 0.2 for x in xs], [r["gated_tokens_per_s"] for r in rows], width=0.4,
               label="no-match gating")
        ax.set_xticks(xs, [r["label"] for r in rows])
        if no_spec_tokens_per_s:
            ax.axhline(no_spec_tokens_per_s, color="k", ls="--", label="no speculation")
        ax.legend(fontsize=8)
        ax.set_ylabel("predicted tokens/s (1 stream)")
        ax.set_title("predicted throughput")
        ax.tick_params(axis="x", rotation=45, labelsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- CLI
def _buckets(text: str):
    if text.strip() == "all":
        return tuple(range(1, 1025))
    return tuple(int_list("--buckets", minimum=1)(text))


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `replay` on a CLI's subparsers (fastverify/cli.py)."""
    p = subparsers.add_parser(
        "replay",
        help="replay recorded greedy outputs through SGLang's n-gram corpus (tree vs chain)",
        description=__doc__.split("\n\n")[0])
    _fill_parser(p)
    return p


def _fill_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", nargs="?", default=None,
                   help="JSON Lines trace, one {\"prompt_ids\": [...], \"output_ids\": [...]} per "
                        f"line (default: the embedded trace {DEFAULT_TRACE.name})")
    p.add_argument("--mode", choices=("tree", "chain", "both"), default="both")
    p.add_argument("--draft-tokens", "--widths", dest="widths", type=int_list("--draft-tokens"),
                   default=[4, 8, 12],
                   help="tree widths d (tokens per verify pass, root included), comma-separated "
                        "(default 4,8,12)")
    p.add_argument("--chain-lengths", type=int_list("--chain-lengths"), default=[1, 2, 4, 8],
                   help="chain lengths k (draft tokens after the root), comma-separated (default "
                        "1,2,4,8)")
    p.add_argument("--match-type", choices=MATCH_TYPES, default="BFS")
    p.add_argument("--max-trie-depth", type=int, default=SERVER_MAX_TRIE_DEPTH)
    p.add_argument("--min-bfs-breadth", type=int, default=SERVER_MIN_BFS_BREADTH)
    p.add_argument("--max-bfs-breadth", type=int, default=SERVER_MAX_BFS_BREADTH)
    p.add_argument("--buckets", type=_buckets, default=(),
                   help="verify widths assumed captured for no-match gating: comma-separated, or "
                        "'all' (1..d); default: only d (a step with no real candidate becomes a "
                        "plain decode, others verify d)")
    p.add_argument("--capacity", type=int, default=1_000_000,
                   help="trie node capacity (server default 10,000,000; equal results until the "
                        "trie fills up)")
    p.add_argument("--concurrency", type=int, default=1,
                   help="requests decoded together, sharing the corpus like one server batch "
                        "(default 1)")
    p.add_argument("--cost-table", default=None,
                   help="JSON {\"decode_ms\": x, \"verify_ms\": {\"1\": ms, \"8\": ms, ...}}, or "
                        "the --json of benchmark/allreduce_vs_compute.py: predict tokens/s")
    p.add_argument("--profile", default=None,
                   help="a pass-cost profile instead of --cost-table: a built-in name "
                        "(fastverify/data/profiles), a profile file, or a `fastverify bench "
                        "allreduce --json` result[#backend]")
    p.add_argument("--cost-backend", default=None,
                   help="with a microbenchmark --json as --cost-table: which all-reduce backend's "
                        "pass times to use")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG plot here (needs matplotlib)")
    p.add_argument("--from-json", default=None, metavar="RESULT.json",
                   help="print and plot a saved --json result instead of replaying (no SGLang "
                        "needed)")
    p.set_defaults(func=run_cli)


def configs_from_args(args) -> list[ReplayConfig]:
    common = dict(match_type=args.match_type, max_trie_depth=args.max_trie_depth,
                  min_bfs_breadth=args.min_bfs_breadth, max_bfs_breadth=args.max_bfs_breadth,
                  concurrency=args.concurrency, capacity=args.capacity)
    cfgs = []
    if args.mode in ("tree", "both"):
        cfgs += [ReplayConfig("tree", w, **common) for w in args.widths]
    if args.mode in ("chain", "both"):
        cfgs += [ReplayConfig("chain", k, **common) for k in args.chain_lengths]
    return cfgs


def _replot(args) -> int:
    try:
        saved = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        rows = saved["results"]
    except (OSError, ValueError, KeyError) as e:
        print(f"error: --from-json {args.from_json}: not a replay result ({e})", file=sys.stderr)
        return 2
    print(f"# {args.from_json}: {saved.get('repro_command', '')}")
    print(format_table(rows))
    if args.plot:
        cost = saved.get("cost_table")
        try:
            plot(rows, args.plot, f"n-gram replay: {Path(saved['trace']['path']).name}",
                 1000.0 / cost["decode_ms"] if cost else None)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"# wrote {args.plot}")
    return 0


def run_cli(args, corpus_factory: CorpusFactory = sglang_corpus_factory, argv=None) -> int:
    if args.from_json:
        return _replot(args)
    try:
        trace = load_trace(args.trace or DEFAULT_TRACE)
        if args.trace is None:  # name the embedded trace the same way on every machine
            trace = Trace(f"fastverify/data/{DEFAULT_TRACE.name}", trace.requests, trace.meta)
        cfgs = configs_from_args(args)
        cost = _cost_from_args(args, cfgs)
    except (TraceError, CostTableError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    short = trace.short_requests
    if short:
        lines = ", ".join(str(r.line) for r in short[:10]) + (", ..." if len(short) > 10 else "")
        print(f"# {len(short)} of {len(trace.requests)} requests have an empty or one-token "
              f"output (no decode step) and are not replayed: lines {lines}", file=sys.stderr)
    if cfgs:
        warm_up(corpus_factory, cfgs[0],
                lambda line: print(f"[replay] {line}", file=sys.stderr, flush=True))
    rows = []
    for cfg in cfgs:
        update, close = _progress_bar(trace.decode_tokens, cfg.label)
        try:
            res = replay(trace, cfg, corpus_factory, progress=update, buckets=args.buckets)
        finally:
            close()
        row = res.summary()
        if cost is not None:
            try:
                row.update(predict(res, cost))
            except CostTableError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        rows.append(row)
    print(f"# trace {trace.path}: {len(trace.requests)} requests, {trace.decode_tokens} decode "
          "tokens"
          + (f"; {trace.meta.get('model')}" if trace.meta.get("model") else "")
          + (f"; {len(short)} with an empty or one-token output not replayed" if short else ""))
    print(f"# corpus: match_type={args.match_type} max_trie_depth={args.max_trie_depth} "
          f"bfs_breadth={args.min_bfs_breadth}..{args.max_bfs_breadth} "
          f"concurrency={args.concurrency}; gating buckets: "
          f"{'all widths' if len(args.buckets) > 64 else (args.buckets or 'd only')}")
    if cost is not None:
        print(f"# cost table {cost.source}: no speculation {1000.0 / cost.decode_ms(1):.1f} tok/s")
    print(format_table(rows))
    if args.json_out:
        out = {
            "repro_command": _repro_command(argv),
            "trace": {"path": str(trace.path), "requests": len(trace.requests),
                      "decode_tokens": trace.decode_tokens, "meta": trace.meta},
            "corpus": {k: v for k, v in asdict(cfgs[0]).items() if k not in ("mode", "size")}
            if cfgs else {},
            "gating_buckets": "all" if len(args.buckets) > 64 else list(args.buckets),
            "sglang_version": _sglang_version(),
            "cost_table": ({"source": cost.source, "decode_ms": cost.decode_ms(1),
                            "verify_ms": {str(k): v for k, v in cost.verify}} if cost else None),
            "results": rows,
        }
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"# wrote {args.json_out}")
    if args.plot:
        try:
            Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
            plot(rows, args.plot, f"n-gram replay: {Path(trace.path).name}",
                 1000.0 / cost.decode_ms(1) if cost else None)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"# wrote {args.plot}")
    return 0


def _cost_from_args(args, cfgs) -> Optional[CostTable]:
    """The cost table of --cost-table or --profile, checked before any replay runs: a prediction
    models one stream, and the table must cover every pass the configurations can verify."""
    if args.cost_table and args.profile:
        raise ValueError("--cost-table and --profile both give costs; give one")
    if not (args.cost_table or args.profile):
        return None
    flag = "--cost-table" if args.cost_table else "--profile"
    if args.concurrency != 1:
        raise ValueError(f"{flag} predicts the tokens/s of one stream; it needs --concurrency 1 "
                         f"(got {args.concurrency}); replay at higher concurrency without {flag} "
                         f"for acceptance only")
    if args.cost_table:
        return load_cost_table(args.cost_table, args.cost_backend)
    from fastverify import passcost
    try:
        prof = passcost.load_profile(args.profile, "--profile")
    except passcost.PassCostError as e:
        raise ValueError(str(e)) from None
    top = max([c.corpus_draft_tokens for c in cfgs], default=1)
    table = prof.cost_table(sorted(set(passcost.CURVE_TOKENS) | set(range(1, top + 1))))
    return table.single_stream()


def _repro_command(argv) -> str:
    cmd = list(argv if argv is not None else sys.argv[1:])
    if cmd and cmd[0] == "replay":
        cmd = cmd[1:]
    return " ".join(["fastverify", "replay"] + cmd)


def _sglang_version() -> Optional[str]:
    try:
        from importlib.metadata import version
        return version("sglang")
    except Exception:
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastverify.replay",
                                description=__doc__.split("\n\n")[0])
    _fill_parser(p)
    args = p.parse_args(argv)
    return args.func(args, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
