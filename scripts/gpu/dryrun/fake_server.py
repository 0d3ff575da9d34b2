#!/usr/bin/env python3
"""Stand-in for `python3 -m sglang.launch_server` in the CPU rehearsal of run_e2e.sh (dryrun.sh).

Takes the same command line, serves /health, /get_server_info, /metrics and a streamed /generate
whose greedy output depends only on the prompt (so the identity check has something to compare), and
exits on SIGTERM. It says so in every answer: its numbers are not measurements of anything.
"""
import argparse
import json
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--speculative-algorithm", default=None)
ap.add_argument("--speculative-num-draft-tokens", type=int, default=8)
ap.add_argument("--incremental-streaming-output", action="store_true")
a, rest = ap.parse_known_args()
print("fake server (rehearsal only), args:", " ".join(sys.argv[1:]), flush=True)
mode = rest[rest.index("--speculative-ngram-verify-mode") + 1:][:1] \
    if "--speculative-ngram-verify-mode" in rest else []
if mode == ["auto"]:
    # the shape of auto's log line on its plain-path stretches (evaluate.sh collects the last one)
    print("auto verify: 0 stretches on the plain decode path, 0 steps (0.0 each, 0 % of the decode "
          "steps, 0 probes on it); no stretch from a worker's step: {'a stand-in server': 1}; "
          "begun: -; ended: -; probes held: 0; a probe on it, ms by batch size: -",
          flush=True)
time.sleep(1.0)   # a start-up delay, so the health wait loop runs more than once
served = [0]


class H(BaseHTTPRequestHandler):
    def log_message(self, *x):
        pass

    def _json(self, obj, code=200, ctype="application/json"):
        data = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._json("")
        if self.path == "/get_server_info":
            return self._json({"version": "rehearsal", "tp_size": 2,
                               "speculative_algorithm": a.speculative_algorithm})
        if self.path == "/metrics":
            return self._json(f"sglang:num_requests_total {served[0]}\n", ctype="text/plain")
        self._json({}, 404)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        if self.path == "/flush_cache":
            return self._json("Cache flushed (rehearsal).\n", ctype="text/plain")
        served[0] += 1
        n = body["sampling_params"]["max_new_tokens"]
        seed = sum(body.get("input_ids") or [ord(c) for c in body.get("text", "")])
        if not body["sampling_params"].get("ignore_eos", False):   # a stand-in for an early EOS
            n = max(1, n - seed % (n // 2 + 1))
        ids = [(seed + 7 * i) % 997 for i in range(n)]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        step = 4 if a.speculative_algorithm else 1
        prev = 0
        for k in range(step, n + step, step):
            k = min(k, n)
            out_ids = ids[prev:k] if a.incremental_streaming_output else ids[:k]
            prev = k
            mi = {"completion_tokens": k, "prompt_tokens": 3}
            if a.speculative_algorithm:
                mi.update(spec_verify_ct=-(-k // step), spec_accept_length=k / -(-k // step))
            self.wfile.write(b"data: " + json.dumps({"text": None, "output_ids": out_ids,
                                                     "meta_info": mi}).encode() + b"\n\n")
            time.sleep(0.0005)
        self.wfile.write(b"data: [DONE]\n\n")


srv = ThreadingHTTPServer(("127.0.0.1", a.port), H)
signal.signal(signal.SIGTERM, lambda *x: sys.exit(0))
srv.serve_forever()
