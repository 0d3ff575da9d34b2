"""benchmark/serving.py against a small fake HTTP server on 127.0.0.1 started inside the test.

The fake server speaks the two protocols the client supports: SGLang's native /generate
(server-sent events with cumulative output_ids and meta_info) and OpenAI's streaming
/v1/completions and /v1/chat/completions (with reasoning_content deltas). It records every request
body so the tests can check what was sent, and it sleeps a known time before the first token so
TTFT can be checked against a lower bound.
"""
import importlib.util
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("serving_bench", ROOT / "benchmark" / "serving.py")
serving = importlib.util.module_from_spec(_spec)
sys.modules["serving_bench"] = serving
_spec.loader.exec_module(serving)

FIRST_TOKEN_DELAY = 0.15   # s before the first streamed token
STEP_DELAY = 0.01          # s between later chunks
N_TOKENS = 6


class FakeServer:
    """SGLang-native and OpenAI-compatible streaming endpoints with scripted
    timing and spec meta_info."""

    def __init__(self, spec=None, openai_usage=True, reasoning=False, incremental=False):
        self.bodies = []
        self.incremental = incremental
        self.spec = spec                    # None or (verify_ct, accept_length or None)
        self.openai_usage = openai_usage
        self.reasoning = reasoning
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body, ctype="application/json"):
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    return self._send(200, "")
                if self.path == "/get_server_info":
                    states = [{"avg_spec_accept_length": 3.0}]
                    return self._send(200, json.dumps({"version": "fake-1", "tp_size": 2,
                                                       "speculative_algorithm": "NGRAM",
                                                       "internal_states": states}))
                if self.path == "/metrics":
                    n = len(outer.bodies)
                    return self._send(200, "\n".join([
                        "# HELP sglang:verify_pass_seconds GPU time",
                        f'sglang:verify_pass_seconds_sum{{mode="verify",tp_rank="0"}} {0.002 * n}',
                        f'sglang:verify_pass_seconds_count{{mode="verify",tp_rank="0"}} {n}',
                        f"sglang:num_requests_total {n}",
                    ]) + "\n", "text/plain")
                self._send(404, "")

            def _stream(self, events):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                time.sleep(FIRST_TOKEN_DELAY)
                for i, ev in enumerate(events):
                    if i:
                        time.sleep(STEP_DELAY)
                    self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append((self.path, body))
                n = (body.get("sampling_params", {}).get("max_new_tokens")
                     or body.get("max_tokens") or N_TOKENS)
                # output depends on the prompt only (deterministic, like greedy decoding)
                seed = len(body.get("input_ids") or body.get("text") or body.get("prompt") or "x")
                ids = [(seed * 31 + i) % 1000 for i in range(n)]
                if self.path == "/generate":
                    evs = []
                    for k in range(1, n + 1):
                        mi = {"completion_tokens": k, "prompt_tokens": 5, "finish_reason": None}
                        if k == n:
                            mi["finish_reason"] = {"type": "length"}
                            if outer.spec:
                                vc, al = outer.spec
                                mi["spec_verify_ct"] = vc
                                if al is not None:
                                    mi["spec_accept_length"] = al
                        out_ids = ids[k - 1:k] if outer.incremental else ids[:k]
                        text = (f"w{k} " if outer.incremental
                                else "".join(f"w{j} " for j in range(1, k + 1)))
                        evs.append({"text": text, "output_ids": out_ids, "meta_info": mi})
                    return self._stream(evs)
                if self.path == "/v1/chat/completions":
                    evs = []
                    for k in range(n):
                        key = "reasoning_content" if (outer.reasoning and k < n // 2) else "content"
                        evs.append({"choices": [{"index": 0, "delta": {key: f"t{k} "}}]})
                    if outer.openai_usage:
                        details = {"reasoning_tokens": n // 2}
                        evs.append({"choices": [],
                                    "usage": {"prompt_tokens": 5, "completion_tokens": n,
                                              "completion_tokens_details": details}})
                    return self._stream(evs)
                if self.path == "/v1/completions":
                    evs = [{"choices": [{"index": 0, "text": f"t{k} "}]} for k in range(n)]
                    if outer.openai_usage:
                        evs.append({"choices": [],
                                    "usage": {"prompt_tokens": 5, "completion_tokens": n}})
                    return self._stream(evs)
                self._send(404, "{}")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_cli(tmp_path, url, *extra):
    out = tmp_path / "r.json"
    rc = serving.main(["run", "--base-url", url, "--tag", "t", "--kinds", "code,chat",
                       "--per-kind", "1",
                       "--concurrency", "1", "--max-new-tokens", str(N_TOKENS), "--warmup", "0",
                       "--no-progress", "--json", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text())


def test_ttft_tpot_and_throughput_from_a_streamed_request(tmp_path):
    with FakeServer() as srv:
        res = run_cli(tmp_path, srv.url)
    lv = res["levels"][0]
    for r in lv["requests"]:
        assert r["output_tokens"] == N_TOKENS
        # the first token cannot arrive before the server's scripted delay, and
        # arrives well before the end
        assert FIRST_TOKEN_DELAY <= r["ttft_s"] < r["latency_s"]
        assert r["tpot_s"] == pytest.approx((r["latency_s"] - r["ttft_s"]) / (N_TOKENS - 1))
        assert r["tpot_s"] >= STEP_DELAY * 0.9
    s = lv["summary"]
    assert s["requests"] == 2 and s["errors"] == 0 and s["output_tokens"] == 2 * N_TOKENS
    assert s["output_tok_per_s"] == pytest.approx(2 * N_TOKENS / s["duration_s"])
    # single stream: the level's wall time covers both requests back to back
    assert s["duration_s"] >= sum(r["latency_s"] for r in lv["requests"]) * 0.99
    assert s["accept_length_mean"] is None      # no speculation reported


def test_summary_math_on_known_records():
    recs = [
        {"kind": "code", "ttft_s": 0.1, "latency_s": 1.1, "tpot_s": 0.01, "output_tokens": 101,
         "spec_verify_ct": 25},
        {"kind": "chat", "ttft_s": 0.3, "latency_s": 2.3, "tpot_s": 0.02, "output_tokens": 101,
         "spec_verify_ct": 75},
        {"kind": "chat", "error": "boom", "latency_s": 0.5},
    ]
    s = serving.summarize(recs, duration=4.0)
    assert s["requests"] == 3 and s["errors"] == 1 and s["first_error"] == "boom"
    assert s["output_tokens"] == 202
    assert s["output_tok_per_s"] == pytest.approx(50.5)
    assert s["req_per_s"] == pytest.approx(0.5)
    assert s["ttft_ms_mean"] == pytest.approx(200.0)
    assert s["ttft_ms_median"] == pytest.approx(200.0)
    assert s["tpot_ms_median"] == pytest.approx(15.0)
    # token-weighted accept length: 202 tokens / 100 verify steps, not the mean of 4.04 and 1.35
    assert s["accept_length_mean"] == pytest.approx(2.02)
    assert s["per_kind"]["code"]["accept_length"] == pytest.approx(101 / 25)
    assert s["per_kind"]["chat"]["accept_length"] == pytest.approx(101 / 75)


@pytest.mark.parametrize("spec,expected", [((2, 3.0), 3.0), ((4, None), N_TOKENS / 4)])
def test_accept_length_from_meta_info(tmp_path, spec, expected):
    with FakeServer(spec=spec) as srv:
        res = run_cli(tmp_path, srv.url)
    for r in res["levels"][0]["requests"]:
        assert r["spec_verify_ct"] == spec[0]
        assert r["accept_length"] == pytest.approx(expected)
    # level mean is token-weighted over verify steps
    assert res["levels"][0]["summary"]["accept_length_mean"] == pytest.approx(N_TOKENS / spec[0])
    assert res["levels"][0]["summary"]["verify_steps"] == 2 * spec[0]


@pytest.mark.parametrize("usage", [True, False])
def test_reasoning_tokens_count_as_output(tmp_path, usage):
    with FakeServer(openai_usage=usage, reasoning=True) as srv:
        res = run_cli(tmp_path, srv.url, "--backend", "openai", "--openai-api", "chat")
        paths = {p for p, _ in srv.bodies}
    assert paths == {"/v1/chat/completions"}
    for r in res["levels"][0]["requests"]:
        # half of the streamed tokens were reasoning_content: all of them are output tokens
        assert r["output_tokens"] == N_TOKENS
        assert r["reasoning_text"].startswith("t0 ")
        if usage:
            assert r["reasoning_tokens"] == N_TOKENS // 2
        assert r["ttft_s"] >= FIRST_TOKEN_DELAY


def test_token_id_input_for_a_server_without_tokenizer(tmp_path):
    with FakeServer() as srv:
        res = run_cli(tmp_path, srv.url, "--input-ids", "--vocab-size", "32000")
        bodies = [b for p, b in srv.bodies if p == "/generate"]
    prompts = {p["id"]: p["text"] for p in res["prompts"]}
    assert len(bodies) == 2
    for b in bodies:
        assert "text" not in b and isinstance(b["input_ids"], list)
        assert all(isinstance(t, int) and 0 <= t < 32000 for t in b["input_ids"])
        assert b["sampling_params"] == {"temperature": 0.0, "max_new_tokens": N_TOKENS,
                                        "ignore_eos": True}
    sent = sorted(tuple(b["input_ids"]) for b in bodies)
    assert sent == sorted(tuple(serving.text_to_ids(t, 32000)) for t in prompts.values())
    # repeated text gives repeated ids (what an n-gram drafter needs)
    ids = serving.text_to_ids("abcabc", 32000)
    assert ids[1:4] == ids[4:7]
    with pytest.raises(ValueError, match="--vocab-size"):
        serving.text_to_ids("x", 50)


def test_incremental_and_cumulative_streams_give_the_same_output_ids(tmp_path):
    outs = []
    for incremental in (False, True):
        with FakeServer(incremental=incremental) as srv:
            res = run_cli(tmp_path, srv.url)
        reqs = res["levels"][0]["requests"]
        assert all(len(r["output_ids"]) == r["output_tokens"] == N_TOKENS and "warning" not in r
                   for r in reqs)
        outs.append({r["prompt_id"]: (r["output_ids"], r["text"]) for r in reqs})
    assert outs[0] == outs[1]
    assert next(iter(outs[0].values()))[1] == "".join(f"w{j} " for j in range(1, N_TOKENS + 1))


def test_markdown_table_lists_every_level(tmp_path):
    with FakeServer(spec=(3, None)) as srv:
        res = run_cli(tmp_path, srv.url, "--long-gen", "9")
    md = serving.markdown_table([res], ["t"]).splitlines()
    assert md[0].startswith("| run | level | tok/s |") and len(md) == 4
    assert md[2].startswith("| t | c=1 | ") and md[3].startswith("| t | long9 | ")
    assert md[2].split("|")[7].strip() == f"{N_TOKENS / 3:.2f}"     # accept length column


def test_text_prompts_use_chatml_by_default(tmp_path):
    with FakeServer() as srv:
        run_cli(tmp_path, srv.url)
        texts = [b["text"] for p, b in srv.bodies if p == "/generate"]
    assert all(t.startswith("<|im_start|>user\n") and t.endswith("<|im_start|>assistant\n")
               for t in texts)


def test_json_has_repro_command_preamble_and_metrics(tmp_path):
    with FakeServer(spec=(3, None)) as srv:
        res = run_cli(tmp_path, srv.url, "--metrics", "--long-gen", "9")
    assert "serving.py" in res["repro_command"] and " run " in res["repro_command"]
    assert "--long-gen 9" in res["repro_command"]
    pre = res["preamble"]
    assert pre["tag"] == "t" and pre["server_args"]["speculative_algorithm"] == "NGRAM"
    assert pre["avg_spec_accept_length"] == 3.0
    names = [lv["name"] for lv in res["levels"]]
    assert names == ["c=1", "long9"]
    long = res["levels"][1]["requests"][0]
    assert long["output_tokens"] == 9
    m = res["levels"][0]["metrics"]
    # two requests in the level: the scraped histogram mean is (0.002 * 2 + ... ) / 2 samples
    assert m['sglang:verify_pass_seconds_count{mode="verify",tp_rank="0"}'] == 2
    assert m['sglang:verify_pass_seconds_mean{mode="verify",tp_rank="0"}'] == pytest.approx(0.002)


def test_concurrency_level_keeps_requests_in_flight(tmp_path):
    out = tmp_path / "c.json"
    with FakeServer() as srv:
        serving.main(["run", "--base-url", srv.url, "--kinds", "chat", "--per-kind", "1",
                      "--concurrency", "4",
                      "--max-new-tokens", "3", "--warmup", "0", "--no-progress",
                      "--json", str(out)])
    res = json.loads(out.read_text())
    s = res["levels"][0]["summary"]
    assert s["requests"] == 8                   # max(#prompts, 4 * requests-per-slot)
    # 8 requests of >= FIRST_TOKEN_DELAY each, 4 at a time: about 2 rounds, far
    # less than 8 back to back
    assert s["duration_s"] < 8 * FIRST_TOKEN_DELAY * 0.75


def test_compare_reports_first_difference(tmp_path):
    def result(ids_by_prompt):
        return {"levels": [{"name": "c=1", "requests": [
            {"prompt_id": p, "output_ids": ids} for p, ids in ids_by_prompt.items()]}]}
    ref = result({"a": [1, 2, 3, 4], "b": [5, 6]})
    same = result({"a": [1, 2, 3, 4], "b": [5, 6]})
    diff = result({"a": [1, 2, 9, 4], "b": [5, 6]})
    lines, ok = serving.compare([ref, same], ["ref", "same"], "c=1")
    assert ok and lines[0].endswith("2/2 prompts identical")
    lines, ok = serving.compare([ref, diff], ["ref", "diff"], "c=1")
    assert not ok
    assert "1/2 prompts identical" in lines[0]
    assert "a: first difference at token 2" in lines[1]
    for i, r in enumerate((ref, diff)):
        (tmp_path / f"{i}.json").write_text(json.dumps(r))
    assert serving.main(["compare", str(tmp_path / "0.json"), str(tmp_path / "1.json"),
                         "--strict"]) == 1
    assert serving.main(["compare", str(tmp_path / "0.json"), str(tmp_path / "0.json"),
                         "--strict"]) == 0


def test_compare_checks_every_repeat_of_a_prompt():
    """A level with more requests than prompts: every request is compared, in request order."""
    def result(outputs):
        return {"levels": [{"name": "c=4", "requests": [
            {"prompt_id": p, "index": i, "output_ids": ids}
            for i, (p, ids) in enumerate(outputs)]}]}
    ref = result([("a", [1, 2]), ("b", [3]), ("a", [1, 2]), ("b", [3])])
    lines, ok = serving.compare([ref, ref], ["ref", "same"], "c=4")
    assert ok and lines[0].endswith("4/4 prompts identical")
    late = result([("a", [1, 2]), ("b", [3]), ("a", [1, 7]), ("b", [3])])  # only the repeat differs
    lines, ok = serving.compare([ref, late], ["ref", "late"], "c=4")
    assert (not ok and "3/4 prompts identical" in lines[0]
            and "a#2: first difference at token 1" in lines[1])


def test_bad_arguments_are_named():
    with pytest.raises(SystemExit, match="--concurrency"):
        serving.parse_levels("1,x")
    with pytest.raises(SystemExit, match="--concurrency"):
        serving.parse_levels("0")
    with pytest.raises(ValueError, match="unknown prompt kind 'poetry'"):
        serving.build_prompts(["poetry"], 1)
    with pytest.raises(ValueError, match="--base-url"):
        serving.Endpoint("ftp://x")


def test_errors_are_recorded_not_raised(tmp_path):
    out = tmp_path / "e.json"
    # nothing listens on this port: every request fails, the level still completes and reports it
    rc = serving.main(["run", "--base-url", "http://127.0.0.1:9", "--kinds", "chat",
                       "--per-kind", "1",
                       "--concurrency", "1", "--warmup", "0", "--no-progress", "--json", str(out),
                       "--fail-on-error"])
    assert rc == 1
    s = json.loads(out.read_text())["levels"][0]["summary"]
    # max(1 prompt, 1 * 2 per slot)
    assert s["errors"] == s["requests"] == 2 and "first_error" in s


def test_warmup_runs_at_every_measured_concurrency(tmp_path):
    """Warm-up requests (short, one prompt) go out at each level's concurrency before
    anything is measured, so a server's first batch of that size is not in the numbers; they
    are not in the results."""
    out = tmp_path / "w.json"
    with FakeServer() as srv:
        serving.main(["run", "--base-url", srv.url, "--kinds", "chat", "--per-kind", "1",
                      "--concurrency", "1,3",
                      "--max-new-tokens", "40", "--warmup", "1", "--no-progress",
                      "--json", str(out)])
        bodies = [b for path, b in srv.bodies if path == "/generate"]
    res = json.loads(out.read_text())
    warm, measured = bodies[:4], bodies[4:]
    # 1 at c=1, then 3 at c=3
    assert [b["sampling_params"]["max_new_tokens"] for b in warm] == [32] * 4
    assert all(b["sampling_params"]["max_new_tokens"] == 40 for b in measured)
    # 2 per slot
    assert len(measured) == sum(lv["summary"]["requests"] for lv in res["levels"]) == 2 + 6


def test_plot_title_names_the_model_not_a_path_of_the_gpu_host():
    pre = {"server_args": {"model_path": "/root/.cache/huggingface/hub/models--x/snapshots/ab12/"},
           "gpus_visible_to_client": ["NVIDIA H200", "NVIDIA H200"]}
    assert serving.plot_title(pre) == "ab12  NVIDIA H200; NVIDIA H200"
    pre["server_args"]["served_model_name"] = "/data/models/SmolLM2-135M-Instruct"
    assert serving.plot_title(pre) == "SmolLM2-135M-Instruct  NVIDIA H200; NVIDIA H200"
    assert serving.model_label({"model_path": "HuggingFaceTB/SmolLM2-135M"}) == "SmolLM2-135M"
    assert serving.plot_title({}) == ""
