#!/usr/bin/env python3
"""Is speculative decoding lossless on real weights? Plain SGLang server against speculative ones.

  greedy   every prompt (the evaluation prompts, lab/gpu/eval_prompts.py) at temperature 0 on the
           plain server and on each speculative server, at each concurrency; output ids compared
           token for token with plain's at the same concurrency. For every departure, plain is
           asked for its own top logprobs at the first differing position (the prompt plus the
           common prefix, max_new_tokens=1, return_logprob, top_logprobs_num=TOP_N). The
           departure is a rounding tie when plain's token and the server's are both among those
           and neither is more than --tie-bound below plain's top-1 there (three near-equal
           logits are as much a tie as two); anything else FAILS the check.
  sampled  at temperature > 0, N samples of the first k tokens per prompt from each server; per
           prompt and position (and for the whole k-token sequence) a chi-square test of
           homogeneity of the speculative server's tokens against plain's (categories with fewer
           than 10 samples in all pooled), Bonferroni-corrected over the server's tests.

Both write OUT/summary.json and OUT/summary.txt (all servers, the verdict) and
OUT/<server>/summary.{json,txt} (one server: prompts identical, departures, tie or FAIL with the
gap; or its tests). Exit status: 0 every server passes, 1 some server fails, 2 bad input or a
server that does not answer.

  python3 lab/gpu/lossless.py greedy --plain http://127.0.0.1:30000 \\
      --server chain_w=http://127.0.0.1:30010 --server auto=http://127.0.0.1:30020 --out OUT
  python3 lab/gpu/lossless.py sampled --plain URL --server NAME=URL --samples 300 --out OUT

The tie bound. The gap is a difference of logprobs, so the softmax normalizer cancels and it is
the difference of the two logits, and the logits come out of the bf16 LM head: bf16 keeps 8
significant bits, so a logit in [8, 16) is a multiple of 2^-4 = 0.0625, in [16, 32) of 0.125.
Two logits one or two such steps apart swap on the rounding of the hidden state alone: a batch of
another shape or a verify pass of k tokens sums in another order than a one-token decode step, and
30 layers of such differences move the logits by a few units of their last bit. The first
measurement on SmolLM2-135M (bf16, TP=1) saw gaps of 0 to 0.125 at all 10 departures of
chain + widths from plain. The default bound, 0.25, is two steps at logits in [16, 32) (four in
[8, 16)); a verify bug picks tokens whose logit is far below the top (gaps of whole nats), which
it does not excuse. The gap is measured by a prefill of prompt + prefix, not in plain's own decode
step: a small further rounding difference, inside the same bound.

The sampled test's power: with n samples per side, the statistic of a shift is about
n * sum_j (p_j - q_j)^2 / (p_j + q_j); at n = 300, 0.2 of the mass moved between two tokens of
0.5 and 0.3 gives ~30 (p ~ 1e-6 at 3 degrees of freedom: found), 0.1 gives ~8 (p ~ 0.05: not
found after the correction). It catches a verify rule that is wrong (a greedy acceptance under
sampling pulls the mass towards the argmax), not a bias of a few percent. Position 0 comes from the
prefill, the later ones from verify steps where drafts were accepted (accept length > 1 shows
they were). p-values come from the chi-square law (`chi2_sf`, standard library only: no scipy on
the GPU machine), valid at the expected counts >= 5 that the pooling keeps.

Requests follow SGLang 0.5.16's /generate (GenerateReqInput: input_ids, sampling_params,
return_logprob, logprob_start_len, top_logprobs_num; meta_info.output_top_logprobs holds
[logprob, token_id, text] per position) and /tokenize ({"prompt"} -> {"tokens"}); every server
is flushed (POST /flush_cache) before each pass. Prompts are tokenized once by plain's /tokenize,
or with ``--tokenizer DIR`` by the model folder's tokenizer here (transformers; the bundle's
0.5.16 server answers /tokenize with HTTP 500), in the chat template of evaluate.py, and every
server gets the same input_ids. Standard library only, but for ``--tokenizer``.
"""
import argparse
import http.client
import json
import math
import os
import queue
import shlex
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the serving client's chat template (the one the evaluation command sends too)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmark"))
import eval_prompts  # noqa: E402
from serving import chatml  # noqa: E402

DEFAULT_TIE_BOUND = 0.25
# plain's logprobs asked at a departure: three or more near-equal logits occur (SmolLM2 bf16:
# the server's token third, 0.125 below plain's top-1, where plain's top two were 0.125 apart)
TOP_N = 5
TIE_BOUND_WHY = ("two bf16 steps of a logit in [16, 32) (0.125 each); 0 to 0.125 seen at all 10 "
                 "first departures measured on SmolLM2-135M bf16")
MIN_CATEGORY = 10      # pooled below: expected count >= 5 per row with equal sample counts


class LosslessError(RuntimeError):
    """A server that does not answer as SGLang does, or bad input."""


# ------------------------------------------------------------------------------------------------
# transport and client
# ------------------------------------------------------------------------------------------------
def http_transport(url, path, body, timeout=120.0):
    """POST body (JSON) to url + path; (status, parsed JSON or text)."""
    u = urllib.parse.urlparse(url if "://" in url else "http://" + url)
    if u.scheme != "http" or not u.port:
        raise LosslessError(f"url must be http://host:port, got {url!r}")
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body or {}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
    finally:
        c.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


class Client:
    """One server; ``transport(url, path, body) -> (status, payload)`` (injected by the tests)."""

    def __init__(self, name, url, transport=http_transport):
        self.name, self.url, self.transport = name, url, transport

    def post(self, path, body):
        try:
            st, out = self.transport(self.url, path, body)
        except OSError as e:
            raise LosslessError(f"{self.name} ({self.url}{path}): {e}") from None
        if st != 200:
            raise LosslessError(f"{self.name} ({self.url}{path}): HTTP {st}: {str(out)[:300]}")
        return out

    def flush(self, tries=20):
        """POST /flush_cache until it answers 200 (it refuses while requests are pending)."""
        msg = ""
        for _ in range(tries):
            try:
                st, msg = self.transport(self.url, "/flush_cache", None)
                if st == 200:
                    return
            except OSError as e:
                msg = str(e)
            time.sleep(0.1)
        raise LosslessError(f"{self.name}: flush_cache failed: {str(msg)[:200]}")

    def tokenize(self, text):
        out = self.post("/tokenize", {"prompt": text})
        ids = out.get("tokens") if isinstance(out, dict) else None
        if not isinstance(ids, list) or not ids:
            raise LosslessError(f"{self.name}: /tokenize gave no tokens: {str(out)[:200]}")
        return ids

    def generate(self, ids, max_new_tokens, temperature=0.0, ignore_eos=False, tops=False):
        body = {"input_ids": ids, "stream": False,
                "sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens,
                                    "ignore_eos": ignore_eos}}
        if temperature > 0:
            body["sampling_params"].update(top_p=1.0, top_k=-1)
        if tops:
            body.update(return_logprob=True, top_logprobs_num=TOP_N)
        out = self.post("/generate", body)
        if not isinstance(out, dict) or not isinstance(out.get("output_ids"), list):
            raise LosslessError(f"{self.name}: /generate gave no output_ids: {str(out)[:200]}")
        return out


def accept_length(meta):
    """Mean tokens per verify step from meta_info (None when the server did not speculate)."""
    ct = meta.get("spec_verify_ct")
    if not ct:
        return None
    return meta.get("spec_accept_length") or meta.get("completion_tokens", 0) / ct


def run_pass(client, work, c, call):
    """``call(client, item)`` for every item, at most c in flight; results in order (an error is
    recorded as {"error": ...})."""
    q = queue.Queue()
    for i, item in enumerate(work):
        q.put((i, item))
    out = [None] * len(work)

    def worker():
        while True:
            try:
                i, item = q.get_nowait()
            except queue.Empty:
                return
            try:
                out[i] = call(client, item)
            except LosslessError as e:
                out[i] = {"error": str(e)}

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(c, len(work)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def local_tokenizer(path):
    """text -> token ids with the tokenizer of the model folder ``path`` (as a server encodes a text
    prompt: special tokens as the tokenizer adds them)."""
    if not os.path.isdir(path):
        raise LosslessError(f"--tokenizer {path}: not a folder")
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise LosslessError(f"--tokenizer {path}: transformers is not importable ({e})") from e
    tok = AutoTokenizer.from_pretrained(path)
    return lambda text: list(tok.encode(text))


def load_prompts(plain, sets, per_set, only=None, tokenize=None):
    """[{'id', 'text', 'ids'}]: the evaluation prompts, tokenized by ``tokenize`` (text -> ids) or
    else plain's /tokenize."""
    prompts = eval_prompts.build(sets, per_set)
    if only:
        known = {p["id"] for p in prompts}
        bad = [x for x in only if x not in known]
        if bad:
            raise LosslessError(f"--prompts: unknown id(s) {', '.join(bad)}; "
                                f"allowed: {', '.join(sorted(known))}")
        prompts = [p for p in prompts if p["id"] in only]
    for p in prompts:
        p["ids"] = (tokenize or plain.tokenize)(chatml(p["text"]))
    return prompts


# ------------------------------------------------------------------------------------------------
# greedy: departures and their gaps
# ------------------------------------------------------------------------------------------------
def first_difference(a, b):
    """Index of the first position where a and b differ (the shorter one's length when one is a
    prefix of the other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def judge_departure(top, plain_tok, server_tok, bound):
    """``top``: plain's [[logprob, id, ...], ...] at the position, best first (up to TOP_N).
    (gap, verdict, reason), the gap being plain's top-1 minus top-2 logprob there: a tie when
    plain's own token and the server's are both among ``top`` and neither lies more than ``bound``
    below the top-1."""
    if not top or len(top) < 2 or top[0] is None or top[1] is None:
        return None, "FAIL", "plain returned no top-2 logprobs at the position"
    ranked = [(float(t[0]), t[1]) for t in top if t is not None]
    lp1, id1 = ranked[0]
    gap = lp1 - ranked[1][0]
    lps = {}
    for lp, tid in ranked:
        lps.setdefault(tid, lp)
    behind = []
    for who, tok in (("the server's", server_tok), ("plain's own", plain_tok)):
        if tok is None:
            continue
        if tok not in lps:
            return gap, "FAIL", (f"{who} token {tok} is not among plain's top {len(ranked)} "
                                 f"{', '.join(str(t) for _, t in ranked)}")
        behind.append(lp1 - lps[tok])
        if behind[-1] > bound:
            return gap, "FAIL", (f"{who} token {tok} lies {behind[-1]:.4f} below plain's top-1 "
                                 f"{id1}: gap above the tie bound {bound}")
    return gap, "tie", f"gap {max(behind + [0.0]):.4f} <= {bound}"


def measure_gap(plain, prompt_ids, prefix):
    """Plain's top TOP_N logprobs for the token after prompt + prefix (a fresh prefill)."""
    plain.flush()
    out = plain.generate(list(prompt_ids) + list(prefix), 1, tops=True)
    tops = (out.get("meta_info") or {}).get("output_top_logprobs") or []
    return tops[0] if tops else None


def greedy_pass(client, prompts, c, max_new_tokens, memorise=False):
    """One flushed pass of every prompt at concurrency c. ``memorise``: the flushed pass is run
    once unrecorded and then again with no flush between, so that the recorded one's drafts come
    from the server's own earlier outputs of the same prompts (long accepted runs: the verify
    passes that a cold corpus rarely reaches)."""
    client.flush()

    def call(cl, p):
        out = cl.generate(p["ids"], max_new_tokens)
        return {"ids": out["output_ids"], "accept": accept_length(out.get("meta_info") or {})}
    if memorise:
        run_pass(client, prompts, c, call)
    return run_pass(client, prompts, c, call)


def analyze_greedy(plain, outputs, prompts, bound):
    """outputs: {server: {c: [record per prompt]}}, plain's under plain.name. Departures asked of
    plain; per server its summary, compared with plain at the same concurrency; and, under the
    key "<plain>-self" (not part of the verdict), plain at every other concurrency
    against plain at the first: the batch-shape noise of plain itself."""
    first_c = next(iter(outputs[plain.name]))
    judged = {n: (v, None) for n, v in outputs.items() if n != plain.name}
    if len(outputs[plain.name]) > 1:
        judged[f"{plain.name}-self"] = (
            {c: v for c, v in outputs[plain.name].items() if c != first_c}, first_c)
    servers = {}
    for name, (by_c, against) in judged.items():
        rows, deps, errors = [], [], []
        for c, recs in by_c.items():
            base = outputs[plain.name][c if against is None else against]
            same = 0
            for p, b, r in zip(prompts, base, recs):
                if "error" in b or "error" in r:
                    errors.append({"c": c, "prompt": p["id"],
                                   "error": b.get("error") or r.get("error")})
                    continue
                j = first_difference(b["ids"], r["ids"])
                if j is None:
                    same += 1
                    continue
                plain_tok = b["ids"][j] if j < len(b["ids"]) else None
                server_tok = r["ids"][j] if j < len(r["ids"]) else None
                try:
                    top = measure_gap(plain, p["ids"], b["ids"][:j])
                except LosslessError as e:
                    top, err = None, str(e)
                else:
                    err = None
                gap, verdict, why = judge_departure(top, plain_tok, server_tok, bound)
                deps.append({"c": c, "prompt": p["id"], "position": j, "plain_token": plain_tok,
                             "server_token": server_tok, "gap": gap, "verdict": verdict,
                             "reason": err or why,
                             "top": [t[:2] for t in top] if top else None})
            accepts = [r["accept"] for r in recs if r.get("accept")]
            rows.append({"c": c, "prompts": len(recs), "identical": same,
                         "departures": sum(d["c"] == c for d in deps),
                         "ties": sum(d["c"] == c and d["verdict"] == "tie" for d in deps),
                         "fails": sum(d["c"] == c and d["verdict"] != "tie" for d in deps),
                         "accept_length": sum(accepts) / len(accepts) if accepts else None})
        ok = not errors and all(d["verdict"] == "tie" for d in deps)
        gaps = [d["gap"] for d in deps if d["gap"] is not None]
        if against is not None:  # plain against itself: information, not a verdict
            ok = True
        servers[name] = {"verdict": "PASS" if ok else "FAIL", "by_concurrency": rows,
                         "reference": f"{plain.name} at c={against}" if against is not None
                         else f"{plain.name} at the same concurrency",
                         "noise": against is not None,
                         "departures": deps, "errors": errors,
                         "max_gap": max(gaps) if gaps else None}
    return servers


def greedy_text(name, s, bound):
    verdict = "noise floor, no verdict" if s["noise"] else s["verdict"]
    lines = [f"## {name}: {verdict} (against {s['reference']}; tie bound {bound})",
             "   c  prompts  identical  departures  ties  fails  accept"]
    for r in s["by_concurrency"]:
        acc = "-" if r["accept_length"] is None else f"{r['accept_length']:.2f}"
        lines.append(f"{r['c']:>4}  {r['prompts']:>7}  {r['identical']:>9}  {r['departures']:>10}"
                     f"  {r['ties']:>4}  {r['fails']:>5}  {acc:>6}")
    for d in s["departures"]:
        gap = "-" if d["gap"] is None else f"{d['gap']:.4f}"
        lines.append(f"  c={d['c']} {d['prompt']} @ token {d['position']}: plain "
                     f"{d['plain_token']} vs {d['server_token']}, gap {gap} -> {d['verdict']}"
                     f" ({d['reason']})")
    for e in s["errors"]:
        lines.append(f"  c={e['c']} {e['prompt']}: ERROR {e['error'][:200]}")
    return "\n".join(lines)


def _clients_and_prompts(a, transport):
    """(plain, the other servers, the prompts encoded once) of either check's flags."""
    plain = Client(a.plain_name, a.plain, transport)
    others = [Client(n, u, transport) for n, u in a.server]
    prompts = load_prompts(plain, a.sets.split(","), a.per_set, a.prompts,
                           local_tokenizer(a.tokenizer) if a.tokenizer else None)
    return plain, others, prompts


def cmd_greedy(a, transport=http_transport):
    plain, others, prompts = _clients_and_prompts(a, transport)
    conc = a.concurrency
    outputs = {cl.name: {} for cl in [plain] + others}
    for c in conc:
        for cl in [plain] + others:
            outputs[cl.name][c] = greedy_pass(cl, prompts, c, a.max_new_tokens, a.memorise)
    servers = analyze_greedy(plain, outputs, prompts, a.tie_bound)
    texts = {n: greedy_text(n, s, a.tie_bound) for n, s in servers.items()}
    why = TIE_BOUND_WHY if a.tie_bound == DEFAULT_TIE_BOUND else "given by --tie-bound"
    doc = {"mode": "greedy", "plain": {"name": plain.name, "url": plain.url},
           "tie_bound": a.tie_bound, "tie_bound_why": why,
           "config": {"sets": a.sets, "per_set": a.per_set, "concurrency": conc,
                      "max_new_tokens": a.max_new_tokens, "memorise": a.memorise,
                      "prompts": [p["id"] for p in prompts]},
           "servers": servers}
    head = (f"# greedy lossless check: plain {plain.name} ({plain.url}); {len(prompts)} prompts, "
            f"c={','.join(map(str, conc))}, max_new_tokens {a.max_new_tokens}; tie: gap <= "
            f"{a.tie_bound} ({why}) for both tokens below plain's top-1 (top "
            f"{TOP_N} asked)")
    if a.memorise:
        head += ("\n# MEMORISED: every recorded pass follows an unrecorded one of the same "
                 "prompts, no flush between (drafts from the server's own earlier outputs)")
    return write_summaries(a.out, doc, head, texts)


# ------------------------------------------------------------------------------------------------
# sampled: chi-square homogeneity
# ------------------------------------------------------------------------------------------------
def chi2_sf(x, df):
    """P(X >= x) for X chi-square with df degrees of freedom: the regularized upper incomplete
    gamma Q(df/2, x/2), by its power series below a + 1 and a continued fraction above (both
    converge fast there; relative error ~1e-12)."""
    if df <= 0:
        raise ValueError(f"chi2_sf: df must be positive, got {df}")
    if x <= 0:
        return 1.0
    a, z = df / 2.0, x / 2.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:   # P(a, z) = front / a * sum z^n / ((a+1)...(a+n))
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= z / n
            total += term
        return max(0.0, 1.0 - math.exp(log_front) * total)
    # Q(a, z) = front * 1 / (z + 1 - a - 1 (1 - a) / (z + 3 - a - ...)), modified Lentz
    tiny = 1e-300
    b = z + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        step = d * c
        h *= step
        if abs(step - 1) < 1e-15:
            break
    return min(1.0, math.exp(log_front) * h)


def pooled_counts(xs, ys, min_total=MIN_CATEGORY):
    """Two samples of category labels -> (labels, counts of xs, counts of ys), the categories with
    fewer than ``min_total`` in both samples together pooled into "other" (merged into the
    smallest kept one when it is itself too small)."""
    tot = {}
    for v in list(xs) + list(ys):
        tot[v] = tot.get(v, 0) + 1
    keep = sorted((v for v in tot if tot[v] >= min_total), key=lambda v: (-tot[v], str(v)))
    rest = sum(n for v, n in tot.items() if v not in keep)
    labels = [str(v) for v in keep]
    cx = [sum(1 for x in xs if x == v) for v in keep]
    cy = [sum(1 for y in ys if y == v) for v in keep]
    if rest:
        ox = sum(1 for x in xs if x not in keep)
        oy = len(ys) - sum(cy)
        if rest >= min_total or not keep:
            labels.append("other")
            cx.append(ox)
            cy.append(oy)
        else:
            labels[-1] += "+other"
            cx[-1] += ox
            cy[-1] += oy
    return labels, cx, cy


def chi2_homogeneity(cx, cy):
    """(statistic, df) of the 2 x C test that both rows come from one distribution."""
    nx, ny = sum(cx), sum(cy)
    n = nx + ny
    stat = 0.0
    for ox, oy in zip(cx, cy):
        col = ox + oy
        for o, row in ((ox, nx), (oy, ny)):
            e = row * col / n
            if e > 0:
                stat += (o - e) ** 2 / e
    return stat, len(cx) - 1


def sample_tests(plain_samples, server_samples, k):
    """Per position (token j of the k) and for the whole k-token sequence: the test's record."""
    tests = []
    for j in list(range(k)) + ["seq"]:
        def key(s):
            return tuple(s) if j == "seq" else (s[j] if j < len(s) else None)
        labels, cx, cy = pooled_counts([key(s) for s in plain_samples],
                                       [key(s) for s in server_samples])
        if len(labels) < 2:
            tests.append({"what": f"token {j}" if j != "seq" else "sequence",
                          "categories": len(labels), "stat": 0.0, "df": 0, "p": 1.0,
                          "note": "one category in both samples"})
            continue
        stat, df = chi2_homogeneity(cx, cy)
        tests.append({"what": f"token {j}" if j != "seq" else "sequence",
                      "categories": len(labels), "stat": stat, "df": df, "p": chi2_sf(stat, df),
                      "top": [[lb, x, y] for lb, x, y in list(zip(labels, cx, cy))[:5]]})
    return tests


def sampled_pass(client, prompts, a):
    client.flush()
    work = [(p, i) for p in prompts for i in range(a.samples)]

    def call(cl, item):
        out = cl.generate(item[0]["ids"], a.tokens, temperature=a.temperature, ignore_eos=True)
        return {"prompt": item[0]["id"], "ids": out["output_ids"][:a.tokens],
                "accept": accept_length(out.get("meta_info") or {})}
    return run_pass(client, work, a.concurrency, call)


def analyze_sampled(outputs, plain_name, prompts, k, alpha):
    servers = {}
    for name, recs in outputs.items():
        if name == plain_name:
            continue
        tests, errors = [], [r["error"] for r in recs + outputs[plain_name] if "error" in r]
        for p in prompts:
            ps = [r["ids"] for r in outputs[plain_name] if r.get("prompt") == p["id"]]
            ss = [r["ids"] for r in recs if r.get("prompt") == p["id"]]
            for t in sample_tests(ps, ss, k):
                t["prompt"] = p["id"]
                tests.append(t)
        m = sum(1 for t in tests if t["df"] > 0) or 1
        level = alpha / m
        for t in tests:
            t["verdict"] = "FAIL" if t["df"] > 0 and t["p"] < level else "ok"
        accepts = [r["accept"] for r in recs if r.get("accept")]
        ok = not errors and all(t["verdict"] == "ok" for t in tests)
        servers[name] = {"verdict": "PASS" if ok else "FAIL", "alpha": alpha, "tests_counted": m,
                         "level": level, "min_p": min((t["p"] for t in tests), default=1.0),
                         "accept_length": sum(accepts) / len(accepts) if accepts else None,
                         "tests": tests, "errors": errors[:20]}
    return servers


def sampled_text(name, s):
    acc = "-" if s["accept_length"] is None else f"{s['accept_length']:.2f}"
    lines = [f"## {name}: {s['verdict']} (min p {s['min_p']:.3g}; fails below "
             f"{s['level']:.3g} = {s['alpha']} / {s['tests_counted']} tests; accept {acc})",
             "prompt         test        cats     stat  df         p  verdict"]
    for t in s["tests"]:
        lines.append(f"{t['prompt']:<14} {t['what']:<10} {t['categories']:>5} {t['stat']:>8.2f}"
                     f" {t['df']:>3} {t['p']:>9.3g}  {t['verdict']}")
    for e in s["errors"]:
        lines.append(f"  ERROR {e[:200]}")
    return "\n".join(lines)


def cmd_sampled(a, transport=http_transport):
    plain, others, prompts = _clients_and_prompts(a, transport)
    outputs = {cl.name: sampled_pass(cl, prompts, a) for cl in [plain] + others}
    servers = analyze_sampled(outputs, plain.name, prompts, a.tokens, a.alpha)
    texts = {n: sampled_text(n, s) for n, s in servers.items()}
    doc = {"mode": "sampled", "plain": {"name": plain.name, "url": plain.url},
           "test": "chi-square homogeneity per prompt and token position and for the k-token "
                   f"sequence, categories under {MIN_CATEGORY} samples pooled, p from the "
                   "chi-square law (chi2_sf), Bonferroni over each server's tests",
           "config": {"samples": a.samples, "tokens": a.tokens, "temperature": a.temperature,
                      "alpha": a.alpha, "prompts": [p["id"] for p in prompts],
                      "concurrency": a.concurrency},
           "servers": servers}
    head = (f"# sampled lossless check: plain {plain.name}; {len(prompts)} prompts x {a.samples} "
            f"samples of {a.tokens} tokens at temperature {a.temperature}; chi-square homogeneity"
            f", alpha {a.alpha} Bonferroni-corrected per server")
    return write_summaries(a.out, doc, head, texts)


# ------------------------------------------------------------------------------------------------
# output and command line
# ------------------------------------------------------------------------------------------------
def write_summaries(out_dir, doc, head, texts):
    doc["repro_command"] = " ".join(shlex.quote(x) for x in sys.argv)
    doc["verdict"] = "PASS" if all(s["verdict"] == "PASS" for s in doc["servers"].values()) \
        else "FAIL"
    os.makedirs(out_dir, exist_ok=True)
    verdicts = ", ".join(f"{n} {s['verdict']}" for n, s in doc["servers"].items())
    text = "\n\n".join([head] + list(texts.values()) + [f"# result: {doc['verdict']} ({verdicts})"])
    for name, s in doc["servers"].items():
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        one = {k: v for k, v in doc.items() if k != "servers"}
        one.update(server=name, verdict=s["verdict"], result=s)
        with open(os.path.join(d, "summary.json"), "w") as f:
            json.dump(one, f, indent=1)
        with open(os.path.join(d, "summary.txt"), "w") as f:
            f.write(head + "\n\n" + texts[name] + "\n")
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(out_dir, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if doc["verdict"] == "PASS" else 1


def name_url(spec):
    name, sep, url = spec.partition("=")
    if not sep or not name or not url:
        raise argparse.ArgumentTypeError(f"--server takes NAME=URL, got {spec!r}")
    return name, url


def positive_ints(text):
    try:
        out = [int(v) for v in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"takes comma-separated positive integers, got {text!r}")
    return out


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sp = ap.add_subparsers(dest="cmd", required=True)
    for name in ("greedy", "sampled"):
        q = sp.add_parser(name)
        q.add_argument("--plain", required=True, help="base URL of the plain server")
        q.add_argument("--plain-name", default="plain")
        q.add_argument("--server", action="append", type=name_url, required=True,
                       metavar="NAME=URL", help="a speculative server (repeat)")
        q.add_argument("--sets", default="grounded,open", help="prompt sets (eval_prompts.py)")
        q.add_argument("--per-set", type=int, default=6)
        q.add_argument("--prompts", type=lambda s: s.split(","), default=None,
                       help="only these prompt ids (e.g. grounded-0,open-2)")
        q.add_argument("--out", required=True, help="output folder")
        q.add_argument("--tokenizer", default=None,
                       help="model folder whose tokenizer encodes the prompts here "
                            "(default: plain's /tokenize)")
    g = sp.choices["greedy"]
    g.add_argument("--concurrency", type=positive_ints, default=[1, 4])
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--memorise", action="store_true",
                   help="run each flushed pass once unrecorded first, no flush between: the "
                        "recorded drafts come from the server's own outputs (long accepts)")
    g.add_argument("--tie-bound", type=float, default=DEFAULT_TIE_BOUND,
                   help=f"largest top-1 minus top-2 logprob gap of a rounding tie "
                        f"(default {DEFAULT_TIE_BOUND}: {TIE_BOUND_WHY})")
    s = sp.choices["sampled"]
    s.add_argument("--samples", type=int, default=300, help="samples per prompt and server")
    s.add_argument("--tokens", type=int, default=4, help="k: tokens per sample")
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--alpha", type=float, default=0.01, help="family-wise level per server")
    s.add_argument("--concurrency", type=int, default=8)
    return ap


def main(argv=None, transport=http_transport):
    ap = build_parser()
    a = ap.parse_args(argv)
    names = [a.plain_name] + [n for n, _ in a.server]
    if len(set(names)) != len(names):
        ap.error(f"server names must be distinct (plain included), got {names}")
    if a.cmd == "greedy" and (a.tie_bound < 0 or a.max_new_tokens < 1):
        ap.error("--tie-bound must be >= 0 and --max-new-tokens >= 1")
    if a.cmd == "sampled" and (a.temperature <= 0 or a.samples < 2 or a.tokens < 1
                               or not 0 < a.alpha < 1 or a.concurrency < 1):
        ap.error("sampled: --temperature > 0, --samples >= 2, --tokens >= 1, 0 < --alpha < 1, "
                 "--concurrency >= 1")
    try:
        return (cmd_greedy if a.cmd == "greedy" else cmd_sampled)(a, transport)
    except (LosslessError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
