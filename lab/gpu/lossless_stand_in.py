#!/usr/bin/env python3
"""Stand-in for `python3 -m sglang.launch_server` in the CPU rehearsal of lossless.sh
(lossless_dryrun.sh): /health, /flush_cache, /tokenize and a non-streamed /generate with greedy
output, top-2 logprobs and sampling, shaped as SGLang 0.5.16 answers. Its numbers mean nothing.

Greedy output depends only on the input ids. The server started with
`--speculative-ngram-verify-widths` departs from it at output token 6 of every prompt whose ids sum
to an odd number, taking plain's second choice there (gap 0.0625: a tie); every other position has
a gap of 2.0. Sampling draws each token from one fixed distribution.

STAND_IN_DIE_ONCE=PORT:FILE: the stand-in on that port exits with an error at its first start
(while FILE does not exist; it creates FILE), as a server whose start-up check failed."""
import argparse
import json
import os
import random
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--speculative-ngram-verify-widths", default=None)
a, _ = ap.parse_known_args()
DEPART = a.speculative_ngram_verify_widths is not None
rng = random.Random(a.port)


def greedy(ids, n, depart):
    s = sum(ids)
    out = [(s + 31 * t) % 500 + 10 for t in range(n)]  # a function of the ids only
    return out if not (depart and s % 2 and n > 6) else out[:6] + [out[6] + 1] + out[7:]


class H(BaseHTTPRequestHandler):
    def log_message(self, *x):
        pass

    def reply(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply("ok")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/tokenize":
            return self.reply({"tokens": [len(body["prompt"]), sum(map(ord, body["prompt"]))],
                               "count": 2, "max_model_len": 8192})
        if self.path != "/generate":
            return self.reply("ok")
        sp = body["sampling_params"]
        n, ids = sp["max_new_tokens"], body["input_ids"]
        meta = {"completion_tokens": n, "stand_in": True}
        if sp.get("temperature", 0) > 0:
            out = rng.choices([1, 2, 3, 4], [0.5, 0.3, 0.15, 0.05], k=n)
        elif body.get("top_logprobs_num"):
            # the token after prompt + prefix: continue plain's sequence of the prompt (2 ids)
            prompt, j = ids[:2], len(ids) - 2
            tok = greedy(prompt, j + 1, False)[j]
            gap = 0.0625 if j == 6 else 2.0
            meta["output_top_logprobs"] = [[[-0.1, tok, None], [-0.1 - gap, tok + 1, None]]]
            out = [tok]
        else:
            out = greedy(ids, n, DEPART)
            if DEPART or "--speculative-algorithm" in sys.argv:
                meta.update(spec_verify_ct=max(1, n // 3), spec_accept_length=3.0)
        self.reply({"output_ids": out, "meta_info": meta})


die = os.environ.get("STAND_IN_DIE_ONCE", "")
if die and int(die.split(":", 1)[0]) == a.port and not os.path.exists(die.split(":", 1)[1]):
    open(die.split(":", 1)[1], "w").close()
    sys.exit("RuntimeError: stand-in start-up check failed (STAND_IN_DIE_ONCE)")
signal.signal(signal.SIGTERM, lambda *x: sys.exit(0))
print("lossless stand-in (rehearsal only):", " ".join(sys.argv[1:]), flush=True)
ThreadingHTTPServer(("127.0.0.1", a.port), H).serve_forever()
