"""The evaluation command's analysis (lab/gpu/evaluate.py) on made-up records with known answers."""
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import evaluate as ev

SETS = ("grounded", "open")


def rec(pid, tokens, ttft, decode_s, ids=None, verify_ct=None):
    """A request record: `tokens` output tokens, the first after ttft, the rest over decode_s."""
    r = {"prompt_id": pid, "output_tokens": tokens, "ttft_s": ttft, "latency_s": ttft + decode_s,
         "output_ids": ids if ids is not None else list(range(tokens)), "finish": "length"}
    if verify_ct:
        r["spec_verify_ct"] = verify_ct
        r["accept_length"] = tokens / verify_ct
    return r


def make_raw(speed, rounds=4, prompts=6, cells=((1, True),), noise=None, jitter=0.0, ids=None,
             accept=None):
    """Servers A (plain), P (noise) and those in `speed` (name -> (role, decode speed vs A or a
    function (set, prompt index, round) -> speed)). A decodes 101 tokens in 1.0 s with TTFT 0.05 s,
    times a deterministic per-request jitter factor shared by every server of a pair."""
    servers = [{"name": "A", "role": "plain"}, {"name": "P", "role": "noise"}]
    servers += [{"name": n, "role": role} for n, (role, _) in speed.items()]
    raw = {"group": "none", "repro_command": "test", "servers": servers, "passes": [],
           "rounds_done": rounds, "stopped": None, "round_s": [1.0] * rounds,
           "config": {"sets": list(SETS), "per_set": prompts,
                      "concurrency": sorted({c for c, _ in cells}),
                      "ignore_eos": sorted({e for _, e in cells}), "max_new_tokens": 101}}
    for r in range(rounds):
        for c, eos in cells:
            for s in SETS:
                for srv in servers:
                    recs = []
                    for i in range(prompts):
                        base = 1.0 + jitter * math.sin(7 * i + 3 * r + (s == "open"))
                        if srv["name"] == "A":
                            k = 1.0
                        elif srv["name"] == "P":
                            k = noise(s, i, r) if noise else 1.0
                        else:
                            k = speed[srv["name"]][1]
                            k = k(s, i, r) if callable(k) else k
                        out = ids(srv["name"], s, i, r) if ids else None
                        vc = accept.get(srv["name"]) if accept else None
                        recs.append(rec(f"{s}-{i}", 101, 0.05, base / k, out,
                                        verify_ct=int(101 / vc) if vc else None))
                    raw["passes"].append({"round": r, "server": srv["name"], "set": s, "c": c,
                                          "ignore_eos": eos, "requests": recs})
    return raw


def cell(summary, set_, c=1, eos=True):
    return next(x for x in summary["cells"]
                if x["set"] == set_ and x["c"] == c and x["ignore_eos"] == eos)


def test_bootstrap_constant_ratios_give_a_zero_width_interval():
    assert ev.bootstrap_geomean([1.2] * 30) == pytest.approx((1.2, 1.2, 1.2))


def test_bootstrap_geomean_point_and_interval():
    point, lo, hi = ev.bootstrap_geomean([2.0, 0.5] * 20)
    assert point == pytest.approx(1.0)
    assert lo < 1.0 < hi
    assert ev.bootstrap_geomean([]) is None
    # the interval narrows with more pairs of the same spread
    few = ev.bootstrap_geomean([1.1, 0.9, 1.3, 0.8] * 3)
    many = ev.bootstrap_geomean([1.1, 0.9, 1.3, 0.8] * 48)
    assert many[2] - many[1] < (few[2] - few[1]) / 2


def test_bootstrap_is_reproducible_and_covers_a_known_mean():
    import random
    rng = random.Random(5)
    ratios = [math.exp(rng.gauss(math.log(1.1), 0.1)) for _ in range(64)]
    a, b = ev.bootstrap_geomean(ratios), ev.bootstrap_geomean(ratios)
    assert a == b
    assert a[1] < 1.1 < a[2] and a[1] > 1.0


def test_noise_band_is_symmetric_in_log_space():
    lo, hi = ev.noise_band((0.99, 0.95, 1.02))
    assert lo == pytest.approx(0.95) and hi == pytest.approx(1 / 0.95)
    assert ev.noise_band(None) == (1.0, 1.0)


@pytest.mark.parametrize("ci, band, expect", [
    ((1.20, 1.15, 1.25), (0.95, 1.05), "faster"),
    ((0.80, 0.75, 0.85), (0.95, 1.05), "slower"),
    ((1.03, 1.01, 1.05), (0.95, 1.05), "tie"),      # inside the A-vs-P spread
    ((1.10, 0.98, 1.22), (0.97, 1.03), "tie"),      # outside it, but its own interval includes 1
])
def test_verdicts(ci, band, expect):
    assert ev.verdict(ci, band) == expect


def test_verdict_for_lower_is_better():
    assert ev.verdict((0.8, 0.75, 0.85), (0.95, 1.05), higher_is_better=False) == "faster"


def test_pairing_ratios_and_missing_or_failed_requests():
    raw = make_raw({"X": ("fixed", 1.25)}, rounds=2, prompts=3)
    # one request of X fails, one of A is missing: those pairs drop out
    px = next(p for p in raw["passes"] if p["server"] == "X" and p["set"] == "grounded")
    px["requests"][0] = {"prompt_id": "grounded-0", "error": "boom", "latency_s": 1.0,
                         "ttft_s": 1.0}
    pa = next(p for p in raw["passes"]
              if p["server"] == "A" and p["set"] == "grounded" and p["round"] == 1)
    del pa["requests"][2]
    idx = ev.index_requests(raw)
    rs = ev.pair_ratios(idx, "X", "A", {"set": "grounded", "c": 1, "ignore_eos": True}, "decode")
    assert len(rs) == 2 * 3 - 2
    assert rs == pytest.approx([1.25] * 4)
    e2e = ev.pair_ratios(idx, "X", "A", {"set": "all", "c": 1, "ignore_eos": True}, "e2e")
    assert len(e2e) == 2 * 6 - 2
    # end to end: 101 tokens in 0.05 + 1/1.25 s against 1.05 s
    assert e2e[0] == pytest.approx(1.05 / (0.05 + 0.8))


def test_decode_rate_needs_enough_tokens():
    assert ev.decode_tps(rec("p", 3, 0.1, 1.0)) is None
    assert ev.decode_tps(rec("p", 11, 0.1, 1.0)) == pytest.approx(10.0)


def test_cell_verdicts_and_goals_where_a_fixed_mode_pays():
    # grounded: chain_w 1.30x (pays), auto 1.26x (0.97 of it: passes); open: chain_w 0.8x (does not
    # pay), auto 0.97x: fails the 0.99 floor
    def chain(s, i, r):
        return 1.30 if s == "grounded" else 0.80

    def auto(s, i, r):
        return 1.26 if s == "grounded" else 0.97

    raw = make_raw({"chain_w": ("fixed", chain), "auto_w": ("auto", auto)}, jitter=0.2,
                   noise=lambda s, i, r: 1.0 + 0.01 * ((i + r) % 3 - 1))
    summ = ev.analyze_group(raw)
    g, o = cell(summ, "grounded"), cell(summ, "open")
    assert g["servers"]["chain_w"]["decode"]["ratio"] == pytest.approx(1.30)
    assert g["servers"]["chain_w"]["decode"]["verdict"] == "faster"
    assert o["servers"]["chain_w"]["decode"]["verdict"] == "slower"
    assert g["servers"]["P"]["decode"]["verdict"] == "tie"
    gd = next(x for x in g["goals"] if x["metric"] == "decode")
    assert gd["case"] == "pays" and gd["best_fixed"] == "chain_w"
    assert gd["auto_vs_best"] == pytest.approx(1.26 / 1.30)
    assert gd["passed"] is True
    od = next(x for x in o["goals"] if x["metric"] == "decode")
    assert od["case"] == "does not pay" and od["passed"] is False
    assert g["servers"]["chain_w"]["decode"]["pairs"] == 4 * 6
    assert cell(summ, "all")["servers"]["chain_w"]["decode"]["pairs"] == 2 * 4 * 6
    assert cell(summ, "all")["goals"] == []


def test_goal_fails_when_auto_trails_the_best_fixed_mode_and_passes_at_the_floor():
    raw = make_raw({"tree": ("fixed", 1.4), "auto_w": ("auto", 1.2)}, jitter=0.1)
    gd = next(x for x in cell(ev.analyze_group(raw), "grounded")["goals"]
              if x["metric"] == "decode")
    assert gd["case"] == "pays" and gd["passed"] is False
    assert gd["auto_vs_best"] == pytest.approx(1.2 / 1.4)
    raw = make_raw({"tree": ("fixed", 0.8),
                    "auto_w": ("auto", lambda s, i, r: 1.0 + 0.02 * (i % 2 - 0.5))}, jitter=0.1)
    gd = next(x for x in cell(ev.analyze_group(raw), "open")["goals"] if x["metric"] == "e2e")
    assert gd["case"] == "does not pay" and gd["passed"] is True


def test_pooled_section_compares_with_the_plain_pair_over_every_cell():
    # P runs 3 % faster than A, 2 % more or less by request (log sd known): the noise band is
    # [1/1.03, 1.03]. Against the plain pair, X (0.9x of A) is 0.9/sqrt(1.03): slower; Y (0.99x of
    # A) is 0.99/sqrt(1.03) = 0.975: inside the band, a tie
    def noise(s, i, r):
        return 1.03 * (1.02 if (i + r) % 2 else 1 / 1.02)

    raw = make_raw({"X": ("auto", 0.9), "Y": ("auto", 0.99)}, rounds=4, prompts=6,
                   cells=((1, False), (4, True)), noise=noise, jitter=0.2)
    p = ev.analyze_group(raw)["pooled"]
    assert p["cells"] == 4  # the "all" cells are not counted twice
    nz = p["noise"]
    assert nz["pairs"] == 4 * 4 * 6 and nz["ratio"] == pytest.approx(1.03)
    assert nz["sd_log_ratio"] == pytest.approx(math.log(1.02), rel=0.02)
    assert nz["band"][0] == pytest.approx(1 / 1.03, rel=0.005)
    x, y = p["servers"]["X"], p["servers"]["Y"]
    assert x["vs_plain"] == pytest.approx(0.9) and y["vs_plain"] == pytest.approx(0.99)
    # against the plain pair: each request's rate over sqrt(A * P)
    assert x["vs_plain_pair"] == pytest.approx(0.9 / math.sqrt(1.03), rel=1e-6)
    assert y["vs_plain_pair"] == pytest.approx(0.99 / math.sqrt(1.03), rel=1e-6)
    assert x["verdict"] == "slower" and y["verdict"] == "tie"
    assert x["pairs"] == 4 * 4 * 6
    text = ev.report({"environment": {}, "repro_command": "t",
                      "groups": [ev.analyze_group(raw)]})
    assert "### pooled: every cell's pairs together (4 cells)" in text
    assert "sd of log ratio per request 0.020" in text
    section = text.split("### pooled")[1]
    x_line = next(ln for ln in section.splitlines() if ln.startswith("X "))
    assert x_line.split()[2:5] == ["0.900", "[0.900,0.900]", "0.887"]
    assert x_line.split()[-1] == "slower"


def test_pooled_section_pairs_each_auto_server_with_each_fixed_mode():
    # F1 (fixed) runs 3x A, F2 (fixed) 2x; X (auto) 2.85x: 0.95 of F1, 1.425 of F2; per-request
    # jitter is shared by every server of a pair, so the ratios are exact
    raw = make_raw({"F1": ("fixed", 3.0), "F2": ("fixed", 2.0), "X": ("auto", 2.85)}, rounds=4,
                   prompts=6, cells=((1, False), (4, False)), jitter=0.2)
    p = ev.analyze_group(raw)["pooled"]
    vs = p["servers"]["X"]["vs_fixed"]
    assert list(vs) == ["F1", "F2"]
    assert vs["F1"]["ratio"] == pytest.approx(0.95) and vs["F2"]["ratio"] == pytest.approx(1.425)
    assert "vs_fixed" not in p["servers"]["F1"]  # only auto servers are set against them
    text = ev.report({"environment": {}, "repro_command": "t",
                      "groups": [ev.analyze_group(raw)]})
    assert ("# X vs each fixed mode, paired per request: F1 0.950 [0.950, 0.950]; "
            "F2 1.425 [1.425, 1.425]") in text


def test_an_ab_twin_is_paired_with_its_server_over_all_cells_and_by_concurrency():
    # X_b is X with an A/B switch set: X runs 4 % faster than X_b at c=4, level at c=1; P 3 % off A
    raw = make_raw({"X": ("auto", 0.95), "X_b": ("auto", 0.95), "Y": ("auto", 1.0)}, rounds=4,
                   prompts=6, cells=((1, False), (4, True)), noise=lambda s, i, r: 1.03,
                   jitter=0.2)
    for p in raw["passes"]:  # X's c=4 requests 4 % faster
        if p["server"] == "X" and p["c"] == 4:
            for r in p["requests"]:
                r["latency_s"] = r["ttft_s"] + (r["latency_s"] - r["ttft_s"]) / 1.04
    g = ev.analyze_group(raw)
    ab = g["pooled"]["ab"]
    assert list(ab) == ["X"]  # Y has no twin
    assert ab["X"]["c=1"]["ratio"] == pytest.approx(1.0) and ab["X"]["c=1"]["pairs"] == 4 * 2 * 6
    assert ab["X"]["c=4"]["ratio"] == pytest.approx(1.04)
    assert ab["X"]["all"]["ratio"] == pytest.approx(math.sqrt(1.04))
    # the band of two plain servers 3 % apart: 4 % is outside it, 2 % inside
    assert ab["X"]["c=4"]["verdict"] == "faster" and ab["X"]["all"]["verdict"] == "tie"
    assert ab["X"]["c=1"]["verdict"] == "tie"
    text = ev.report({"environment": {}, "repro_command": "t", "groups": [g]})
    line = next(ln for ln in text.splitlines() if ln.startswith("# A/B X vs X_b"))
    assert "c=4 1.040 [1.040, 1.040] faster (48 pairs)" in line


def test_accepted_drafts_reads_the_tokens_over_the_steps():
    # 128 tokens: the prefill's first, then one a step; a request that kept drafted tokens has
    # more tokens than that
    assert ev.accepted_drafts({"output_tokens": 128, "spec_verify_ct": 127}) is False
    assert ev.accepted_drafts({"output_tokens": 128, "spec_verify_ct": 125}) is True
    assert ev.accepted_drafts({"output_tokens": 128}) is None  # a plain server's record


def test_verify_records_are_summed_from_the_log(tmp_path):
    log = tmp_path / "none.auto_w.log"
    log.write_text(
        "[t] auto verify request {'request': 'a', 'verified_drafts': 4, 'expected_tokens': 2.5,"
        " 'accepted_tokens': 2.0}\n"
        "[t] INFO something else\n"
        "[t] auto verify request {'request': 'b', 'verified_drafts': 1, 'expected_tokens': 1.5,"
        " 'accepted_tokens': 0.0}\n"
        "[t] auto verify request {cut off\n"
        "[t] auto verify request [1, 2]\n")
    assert ev.verify_records(str(log)) == {"requests": 2, "verified_drafts": 5,
                                           "expected_tokens": 4.0, "accepted_tokens": 2.0}
    assert ev.verify_records(str(tmp_path / "missing.log")) is None
    (tmp_path / "none.A.log").write_text("no records\n")
    assert ev.verify_records(str(tmp_path / "none.A.log")) is None


def test_verify_records_read_the_lines_the_auto_glue_writes(tmp_path, caplog):
    """The parser meets the glue's own log format, not a copy of it written here."""
    from fastverify.glue import auto

    rec = {"request": "r1", "verified_drafts": 2, "expected_tokens": 3.5, "accepted_tokens": 1.0}
    with caplog.at_level("INFO", logger=auto.logger.name):
        auto.log_record(rec)
        auto.log_record({"step": 1, "option": "none"})  # a decision record: not counted
    log = tmp_path / "none.auto_w.log"
    log.write_text("".join(f"[2026-12-04 20:18:55] {r.getMessage()}\n" for r in caplog.records))
    assert ev.verify_records(str(log)) == {"requests": 1, "verified_drafts": 2,
                                           "expected_tokens": 3.5, "accepted_tokens": 1.0}


def test_pooled_split_by_accepted_drafts_and_the_log_in_the_report(tmp_path):
    # X keeps drafts in prompts 0-1 (1.2x A there) and none elsewhere (0.9x)
    def speed(s, i, r):
        return 1.2 if i < 2 else 0.9

    raw = make_raw({"X": ("auto", speed)}, rounds=2, prompts=6)
    for p in raw["passes"]:
        if p["server"] == "X":
            for i, r in enumerate(p["requests"]):
                r["spec_verify_ct"] = 60 if i < 2 else 100  # 101 tokens
    (tmp_path / "none.X.log").write_text(
        "auto verify request {'request': 'q', 'verified_drafts': 3, 'expected_tokens': 9.0,"
        " 'accepted_tokens': 6.0}\n")
    g = ev.analyze_group(raw, str(tmp_path))
    x = g["pooled"]["servers"]["X"]
    assert x["accepted_drafts"]["pairs"] == 2 * 2 * 2  # prompts 0-1, two sets, two rounds
    assert x["accepted_drafts"]["vs_plain_pair"] == pytest.approx(1.2)
    assert x["no_accepted_draft"]["vs_plain_pair"] == pytest.approx(0.9)
    assert x["verify_log"]["accepted_tokens"] == 6.0
    text = "\n".join(ev.pooled_lines(g["pooled"]))
    assert "# X vs the plain pair, its requests: 8 with accepted drafts 1.200" in text
    assert "16 without 0.900" in text
    assert ("# X log: 1 requests with verified drafts, 3 verify steps, expected to accept 9 "
            "tokens, accepted 6 (67%)") in text
    assert "verify_log" not in ev.analyze_group(raw)["pooled"]["servers"]["X"]


def test_identity_per_prompt_and_first_difference():
    def ids(name, s, i, r):
        out = list(range(101))
        if name == "X" and i == 1:
            out[17] = -1
        return out

    raw = make_raw({"X": ("fixed", 1.0)}, rounds=2, prompts=3, ids=ids)
    summ = ev.analyze_group(raw)
    x = cell(summ, "grounded")["servers"]["X"]["identity"]
    assert (x["identical"], x["pairs"]) == (4, 6)
    assert x["first_diffs"] == [17, 17]
    assert cell(summ, "grounded")["servers"]["A"]["self_identity"] == (3, 3)


def test_accept_length_is_token_weighted():
    raw = make_raw({"X": ("fixed", 1.0)}, rounds=1, prompts=2, accept={"X": 2.0})
    assert cell(ev.analyze_group(raw), "grounded")["servers"]["X"]["accept_length"] == \
        pytest.approx(202 / (2 * 50))


def test_report_and_summary_files(tmp_path):
    raw = make_raw({"tree": ("fixed", 0.8), "auto_w": ("auto", 1.0)}, cells=((1, False), (4, True)))
    p = tmp_path / "none.json"
    p.write_text(json.dumps(raw))
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"gpus": ["NVIDIA H200, 143771 MiB"], "driver": "580",
                               "torch": "2.11"}))
    assert ev.main(["analyze", str(p), "--env", str(env), "--out-dir", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert "### grounded c=1 ignore_eos=off" in text and "### open c=4 ignore_eos=on" in text
    assert "GOAL auto_w decode" in text and "# gpus: ['NVIDIA H200, 143771 MiB']" in text
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["groups"][0]["cells"][0]["servers"]["tree"]["decode"]["verdict"] == "slower"
    assert s["environment"]["driver"] == "580"


@pytest.mark.parametrize("argv, msg", [
    (["run", "--server", "A,plain", "--out", "x"], "NAME,ROLE,URL"),
    (["run", "--server", "A,boss,http://127.0.0.1:1", "--out", "x"], "role 'boss' not allowed"),
    (["run", "--server", "A,noise,http://127.0.0.1:1", "--out", "x"],
     "exactly one server with role"),
    (["run", "--server", "A,plain,http://127.0.0.1:1", "--ignore-eos", "yes", "--out", "x"],
     "off/on"),
    (["run", "--server", "A,plain,http://127.0.0.1:1", "--concurrency", "0", "--out", "x"],
     "positive integers"),
    (["run", "--server", "A,plain,http://127.0.0.1:1", "--sets", "poems", "--out", "x"],
     "unknown prompt set 'poems'"),
    (["run", "--server", "A,plain,http://127.0.0.1:1", "--judge-departures", "-1", "--out", "x"],
     "--judge-departures and --judge-s must be >= 0"),
])
def test_bad_arguments_are_refused_with_the_allowed_values(argv, msg, capsys):
    with pytest.raises(SystemExit):
        ev.main(argv)
    assert msg in capsys.readouterr().err


class _Stub(BaseHTTPRequestHandler):
    """A server that answers /flush_cache, /get_server_info, /metrics and a streamed /generate."""
    flushes = []
    generates = []

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
        if self.path == "/get_server_info":
            return self._send(200, json.dumps({"version": "stub", "tp_size": 1}))
        return self._send(200, "sglang:pass_cost_emulated 1\n", "text/plain")

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else {}
        if self.path == "/flush_cache":
            type(self).flushes.append(self.server.server_port)
            return self._send(200, "ok", "text/plain")
        k = body["sampling_params"]["max_new_tokens"]
        type(self).generates.append((self.server.server_port, k))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for j in range(0, k, 2):   # incremental chunks of two ids
            ev_ = {"output_ids": [j, j + 1][: k - j],
                   "meta_info": {"completion_tokens": min(j + 2, k), "spec_verify_ct": j // 2 + 1}}
            self.wfile.write(b"data: " + json.dumps(ev_).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")


def _run_against_stubs(tmp_path, *args):
    """`evaluate.py run` against two stub servers A (plain) and X (fixed), with ``args`` after the
    servers; the stubs' records cleared first. Returns (the raw record, the two stub ports)."""
    srvs = [ThreadingHTTPServer(("127.0.0.1", 0), _Stub) for _ in range(2)]
    for s in srvs:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    _Stub.flushes.clear()
    _Stub.generates.clear()
    out = tmp_path / "raw.json"
    try:
        argv = ["run", "--server", f"A,plain,http://127.0.0.1:{srvs[0].server_port}",
                "--server", f"X,fixed,http://127.0.0.1:{srvs[1].server_port}", *args,
                "--out", str(out)]
        assert ev.main(argv) == 0
    finally:
        for s in srvs:
            s.shutdown()
    return json.loads(out.read_text()), [s.server_port for s in srvs]


def test_memorised_runs_flush_only_after_the_warm_up_and_teach_every_cell_first(tmp_path):
    raw, ports = _run_against_stubs(tmp_path, "--per-set", "2", "--max-new-tokens", "9",
                                    "--min-rounds", "1", "--max-rounds", "1", "--concurrency",
                                    "1", "--ignore-eos", "on", "--flush", "never")
    out = tmp_path / "raw.json"
    assert raw["config"]["flush"] == "never"
    assert sorted(_Stub.flushes) == sorted(ports)  # the warm-up's only
    assert all(p["flushed"] is None for p in raw["passes"])
    # per server: warm-up (1 request of 9 -> 9 tokens), one unrecorded pass of each cell (2 sets x
    # 2 prompts, 9 tokens), the recorded round (the same again)
    for srv_port in ports:
        full = [k for port, k in _Stub.generates if port == srv_port and k == 9]
        assert len(full) == 1 + 4 + 4
    assert ev.main(["analyze", str(out), "--out-dir", str(tmp_path / "sum")]) == 0
    assert "# MEMORISED: no flush" in (tmp_path / "sum" / "summary.txt").read_text()


def test_run_against_stub_servers_rounds_flushes_and_order(tmp_path):
    raw, _ = _run_against_stubs(tmp_path, "--per-set", "2", "--max-new-tokens", "9",
                                "--min-rounds", "2", "--max-rounds", "2")
    assert raw["rounds_done"] == 2
    cells = 2 * 2 * 2        # sets x concurrency x ignore_eos
    assert len(raw["passes"]) == 2 * cells * 2
    # every pass flushed first (plus one flush per server after the warm-up)
    assert len(_Stub.flushes) == len(raw["passes"]) + 2
    r0 = [p["server"] for p in raw["passes"] if p["round"] == 0][:2]
    r1 = [p["server"] for p in raw["passes"] if p["round"] == 1][:2]
    assert r0 == ["A", "X"] and r1 == ["X", "A"]
    one = raw["passes"][0]["requests"][0]
    assert one["output_ids"] == list(range(9)) and one["output_tokens"] == 9
    assert one["accept_length"] == pytest.approx(9 / 5)
    assert raw["servers"][0]["emulator_metrics"] == ["sglang:pass_cost_emulated 1"]
    # identical outputs: nothing departed, so the plain server was asked nothing after the rounds
    assert raw["departures"]["distinct"] == 0 and raw["departures"]["list"] == []
    assert ev.departure_lines(ev.analyze_group(raw)["departures"], "A")[-1] == \
        "# none: every server's output was identical to the plain server's"


def test_waves_interleave_the_servers_per_few_prompts(tmp_path):
    """--interleave wave: each server runs the next c prompts in turn (flushed before each wave),
    the order reversed every wave; the requests are recorded as with passes, so the analysis pairs
    them the same way."""
    assert ev.units_of([1, 2, 3, 4, 5], 2, "wave") == [[1, 2], [3, 4], [5]]
    assert ev.units_of([1, 2, 3], 4, "pass") == [[1, 2, 3]]
    raw, (a, x) = _run_against_stubs(tmp_path, "--per-set", "3", "--sets", "grounded",
                                     "--max-new-tokens", "9", "--min-rounds", "1",
                                     "--max-rounds", "1", "--concurrency", "1", "--ignore-eos",
                                     "on", "--interleave", "wave")
    out = tmp_path / "raw.json"
    assert raw["config"]["interleave"] == "wave"
    waves = [(p["server"], p["wave"], [q["prompt_id"] for q in p["requests"]])
             for p in raw["passes"]]
    ids = [p["id"] for p in raw["prompts"]]
    assert waves == [("A", 0, ids[:1]), ("X", 0, ids[:1]), ("X", 1, ids[1:2]),
                     ("A", 1, ids[1:2]), ("A", 2, ids[2:3]), ("X", 2, ids[2:3])]
    assert len(_Stub.flushes) == len(waves) + 2  # each wave, and once after the warm-up
    # after each server's warm-up request, the generate calls alternate prompt by prompt
    ports = [port for port, k in _Stub.generates if k == 9]
    assert ports == [a, x] + [a, x, x, a, a, x]
    assert ev.main(["analyze", str(out), "--out-dir", str(tmp_path / "sum")]) == 0
    assert "servers take turns every c prompts" in (tmp_path / "sum" / "summary.txt").read_text()


class _PlainForDepartures:
    """A plain server as `judge_departures` asks it (POST /generate, non-streamed, with top
    logprobs; /flush_cache): its greedy output of a prompt is `outputs[prompt]` (extended with
    999s), its top logprobs at each position `tops(prompt, position)`, its prompt ids `ids`."""

    def __init__(self, outputs, tops, ids=(7, 8, 9), fail=False):
        self.outputs, self.tops, self.ids, self.fail = outputs, tops, list(ids), fail
        self.asked, self.flushes = [], 0

    def flush(self):
        self.flushes += 1
        return True

    def call(self, method, path, body=None, timeout=10.0):
        assert (method, path) == ("POST", "/generate")
        self.asked.append(body)
        if self.fail:
            raise OSError("connection refused")
        k = body["sampling_params"]["max_new_tokens"]
        assert body["sampling_params"]["temperature"] == 0.0 and body["top_logprobs_num"] >= 2
        if "text" in body:
            pid = next(p for p, o in self.outputs.items() if p in body["text"])
            out = (self.outputs[pid] + [999] * k)[:k]
            meta = {"output_top_logprobs": [self.tops(pid, i) for i in range(k)],
                    "input_token_logprobs": [[None, t, None] for t in self.ids]}
        else:   # a prefill of the prompt ids + prefix: the top logprobs after that prefix
            pre = body["input_ids"][len(self.ids):]
            pid = next(iter(self.outputs))
            out, meta = [0], {"output_top_logprobs": [self.tops(pid, len(pre))]}
        return 200, json.dumps({"output_ids": out, "meta_info": meta})


def _departing_raw(x_ids):
    """A and X over 2 rounds, 2 prompts a set; X's output of grounded-1 given by x_ids(round)."""
    def ids(name, s, i, r):
        if name == "X" and (s, i) == ("grounded", 1):
            return x_ids(r)
        return list(range(101))
    raw = make_raw({"X": ("fixed", 1.0)}, rounds=2, prompts=2, ids=ids)
    raw["prompts"] = [{"id": f"{s}-{i}", "set": s, "text": f"prompt {s}-{i}"}
                      for s in SETS for i in range(2)]
    return raw


def test_departures_are_found_per_distinct_prefix_and_tokens_most_frequent_first():
    def x_ids(r):
        out = list(range(101))
        out[17 if r == 0 else 40] = -1
        return out
    raw = _departing_raw(x_ids)
    raw["passes"].append({"round": 1, "server": "P", "set": "grounded", "c": 1,
                          "ignore_eos": True,
                          "requests": [rec("grounded-1", 101, 0.05, 1.0, list(range(101)))]})
    deps = ev.departures(raw)
    assert [(d["prompt_id"], d["position"], d["plain_token"], d["server_token"], d["seen"])
            for d in deps] == [("grounded-1", 17, 17, -1, {"X": 1}),
                               ("grounded-1", 40, 40, -1, {"X": 1})]
    assert deps[0]["prefix"] == list(range(17)) and deps[0]["cells"] == ["c=1 ignore_eos=on"]
    # an output that stops early departs where it ends (the server's token is then None)
    raw = _departing_raw(lambda r: list(range(30)))
    (d,) = ev.departures(raw)
    assert (d["position"], d["plain_token"], d["server_token"], d["seen"]) == (30, 30, None,
                                                                                 {"X": 2})


def test_departures_are_judged_by_plain_own_decode_step_or_a_prefill():
    def x_ids(r):
        out = list(range(101))
        out[17] = 555 if r == 0 else 666
        return out
    raw = _departing_raw(x_ids)

    def tops(pid, i):   # at 17: plain's 17 first, 555 0.125 below, 666 two nats below
        if i == 17:
            return [[-0.5, 17, None], [-0.625, 555, None], [-2.5, 666, None]]
        return [[-0.1, i, None], [-3.0, 1000 + i, None]]
    plain = _PlainForDepartures({"grounded-1": list(range(101))}, tops)
    judged = ev.judge_departures(raw, plain, time_s=60, most=10)
    v = {d["server_token"]: d for d in judged["list"]}
    assert (v[555]["verdict"], v[555]["how"]) == ("tie", "decode")
    assert v[555]["gap"] == pytest.approx(0.125)
    assert v[666]["verdict"] == "FAIL" and "2.0000 below" in v[666]["reason"]
    assert all(b["sampling_params"]["max_new_tokens"] == 18 for b in plain.asked)
    assert plain.flushes == len(plain.asked) == 2
    summ = ev.departure_summary(judged)["servers"]["X"]
    assert (summ["pairs"], summ["distinct"], summ["ties"], summ["fails"], summ["not_asked"]) == \
        (2, 2, 1, 1, 0)
    assert summ["max_tie_gap"] == pytest.approx(0.125)
    # plain alone in the batch does not reproduce its own prefix: a prefill of prompt + prefix
    moved = list(range(101))
    moved[3] = 4
    plain = _PlainForDepartures({"grounded-1": moved}, tops)
    judged = ev.judge_departures(raw, plain, time_s=60, most=1)
    late = ev.judge_departures(raw, plain, time_s=-1, most=10)   # its time already up
    assert late["asked"] == 0 and {d["reason"] for d in late["list"]} == {"not asked"}
    first, second = judged["list"]
    assert first["how"] == "prefill" and plain.asked[1]["input_ids"] == [7, 8, 9] + list(range(17))
    assert first["verdict"] in ("tie", "FAIL") and first["gap"] == pytest.approx(0.125)
    assert (second["verdict"], second["reason"]) == (None, "not asked")
    assert judged["asked"] == 1 and judged["distinct"] == 2


def test_departures_a_plain_server_that_does_not_answer_leaves_them_unjudged_and_reported():
    def x_ids(r):
        out = list(range(101))
        out[5] = -1
        return out
    raw = _departing_raw(x_ids)
    plain = _PlainForDepartures({"grounded-1": list(range(101))}, lambda p, i: [], fail=True)
    raw["departures"] = ev.judge_departures(raw, plain, time_s=60, most=10)
    (d,) = raw["departures"]["list"]
    assert d["verdict"] is None and "connection refused" in d["reason"]
    g = ev.analyze_group(raw)
    assert g["departures"]["servers"]["X"]["not_asked"] == 1
    text = "\n".join(ev.departure_lines(g["departures"], "A"))
    assert "# X: 2 pairs departed, 1 distinct: 0 ties, 0 FAIL, 1 not asked" in text
    # a FAIL is listed with its reason
    plain = _PlainForDepartures({"grounded-1": list(range(101))},
                                lambda p, i: [[-0.1, i, None], [-0.2, 1000, None]])
    raw["departures"] = ev.judge_departures(raw, plain, time_s=60, most=10)
    text = "\n".join(ev.departure_lines(ev.analyze_group(raw)["departures"], "A"))
    assert "1 FAIL" in text and "#   FAIL grounded-1 at token 5" in text
    assert "not among plain's top 2" in text
