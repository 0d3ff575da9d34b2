"""lab/gpu/lossless.py against made-up SGLang servers (an injected transport, and once over real
HTTP): identical output passes, a departure at a small gap is a tie, a big gap or a token outside
plain's top two fails; the sampled check's chi-square test and its p-values."""
import json
import math
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import eval_prompts
import lossless as L

PROMPTS = [p["id"] for p in eval_prompts.build(["grounded"], 3)]  # grounded-0, -1, -2


def prompt_key(text):
    return [len(text), sum(map(ord, text)) % 10007]


class FakeModel:
    """Greedy continuation per prompt: tokens 10, 11, 12, ... (offset by the prompt index); at
    position j plain's top two are that token and 1000 + j, ``gaps[(prompt, j)]`` apart
    (default 3.0)."""

    def __init__(self, gaps=None):
        self.gaps = gaps or {}
        self.index = {}

    def seq(self, key, n):
        i = self.index.setdefault(tuple(key), len(self.index))
        return [10 + 100 * i + t for t in range(n)]

    def top2(self, key, j):
        i = self.index[tuple(key)]
        gap = self.gaps.get((i, j), 3.0)
        return [[-0.1, self.seq(key, j + 1)[j], None], [-0.1 - gap, 1000 + j, None]]


class FakeServer:
    """/tokenize, /flush_cache and /generate as SGLang 0.5.16 answers them. ``departs``:
    prompt index -> (position, token): this server's greedy output takes that token there."""

    def __init__(self, model, departs=None, accept=None):
        self.model, self.departs, self.accept = model, departs or {}, accept
        self.calls = []

    def handle(self, path, body):
        self.calls.append((path, body))
        if path == "/flush_cache":
            return 200, "ok"
        if path == "/tokenize":
            return 200, {"tokens": prompt_key(body["prompt"]), "count": 2}
        ids, sp = body["input_ids"], body["sampling_params"]
        key, prefix = ids[:2], ids[2:]
        n = sp["max_new_tokens"]
        meta = {"completion_tokens": n}
        if self.accept:
            meta.update(spec_verify_ct=max(1, n // 2), spec_accept_length=self.accept)
        if body.get("top_logprobs_num") == L.TOP_N:
            assert body["return_logprob"] is True and n == 1
            assert prefix == self.model.seq(key, len(prefix)), "a gap asked off plain's path"
            top = self.model.top2(key, len(prefix))
            meta["output_top_logprobs"] = [top]
            return 200, {"output_ids": [top[0][1]], "meta_info": meta}
        out = self.model.seq(key, n)
        i = self.model.index[tuple(key)]
        if i in self.departs:
            pos, tok = self.departs[i]
            out = out[:pos] + [tok] + [7] * (n - pos - 1)
        return 200, {"output_ids": out, "meta_info": meta}


def transport_for(servers):
    def transport(url, path, body):
        return servers[url].handle(path, body)
    return transport


def greedy(tmp_path, servers, extra=()):
    argv = ["greedy", "--plain", "u:plain", "--sets", "grounded", "--per-set", "3",
            "--concurrency", "1,4", "--max-new-tokens", "12", "--out", str(tmp_path)]
    for name in servers:
        if name != "u:plain":
            argv += ["--server", f"{name[2:]}={name}"]
    return L.main(argv + list(extra), transport=transport_for(servers))


def test_identical_output_passes(tmp_path):
    m = FakeModel()
    rc = greedy(tmp_path, {"u:plain": FakeServer(m), "u:chain": FakeServer(m, accept=2.5)})
    assert rc == 0
    doc = json.loads((tmp_path / "summary.json").read_text())
    s = doc["servers"]["chain"]
    assert s["verdict"] == "PASS" and s["departures"] == []
    assert [(r["c"], r["identical"], r["accept_length"]) for r in s["by_concurrency"]] == [
        (1, 3, 2.5), (4, 3, 2.5)]
    assert doc["config"]["prompts"] == PROMPTS
    assert (tmp_path / "chain" / "summary.txt").read_text().startswith("# greedy lossless check")
    assert doc["servers"]["plain-self"]["noise"] is True


def test_small_gap_departure_is_a_tie_and_a_big_gap_fails(tmp_path):
    m = FakeModel(gaps={(1, 5): 0.0625, (2, 3): 1.5})
    plain = FakeServer(m)
    tie = FakeServer(m, departs={1: (5, 1005)})          # plain's second choice, gap 0.0625
    bad = FakeServer(m, departs={2: (3, 1003)})          # plain's second choice, gap 1.5
    rc = greedy(tmp_path, {"u:plain": plain, "u:tie": tie, "u:bad": bad})
    assert rc == 1
    doc = json.loads((tmp_path / "summary.json").read_text())
    t, b = doc["servers"]["tie"], doc["servers"]["bad"]
    assert t["verdict"] == "PASS" and b["verdict"] == "FAIL" and doc["verdict"] == "FAIL"
    assert [(d["c"], d["prompt"], d["position"], d["gap"], d["verdict"]) for d in t["departures"]] \
        == [(1, "grounded-1", 5, 0.0625, "tie"), (4, "grounded-1", 5, 0.0625, "tie")]
    assert [(d["position"], d["gap"], d["verdict"]) for d in b["departures"]] == [
        (3, 1.5, "FAIL")] * 2
    assert "above the tie bound 0.25" in b["departures"][0]["reason"]
    assert [r["identical"] for r in b["by_concurrency"]] == [2, 2]
    # each gap was asked of plain: the prompt + the common prefix, one new token, top 2
    asks = [b for p, b in plain.calls if p == "/generate" and b.get("top_logprobs_num")]
    assert sorted(len(b["input_ids"]) - 2 for b in asks) == [3, 3, 5, 5]
    text = (tmp_path / "summary.txt").read_text()
    assert "c=1 grounded-2 @ token 3: plain 213 vs 1003, gap 1.5000 -> FAIL" in text
    assert "# result: FAIL (tie PASS, bad FAIL, plain-self PASS)" in text
    # a wider stated bound makes the same departure a tie
    assert greedy(tmp_path / "wide", {"u:plain": plain, "u:bad": bad}, ["--tie-bound", "2"]) == 0
    wide = json.loads((tmp_path / "wide" / "summary.json").read_text())
    assert wide["tie_bound"] == 2.0 and wide["tie_bound_why"] == "given by --tie-bound"
    assert "bf16" not in (tmp_path / "wide" / "summary.txt").read_text().splitlines()[0]
    assert "bf16" in text.splitlines()[0]  # the default bound says where it comes from


class LearningServer(FakeServer):
    """Departs (a tie at position 4 of prompt 0) only once it has answered that prompt before
    since its last flush: what a verify bug seen only with memorised drafts would look like."""

    def __init__(self, model):
        super().__init__(model)
        self.seen = set()

    def handle(self, path, body):
        if path == "/flush_cache":
            self.seen.clear()
        elif path == "/generate" and not body.get("top_logprobs_num"):
            key = tuple(body["input_ids"][:2])
            self.departs = {0: (4, 1004)} if key in self.seen else {}
            self.seen.add(key)
        return super().handle(path, body)


def test_memorise_records_the_second_pass_after_one_flush(tmp_path):
    m = FakeModel(gaps={(0, 4): 0.5})
    plain, srv = FakeServer(m), LearningServer(m)
    assert greedy(tmp_path / "cold", {"u:plain": plain, "u:srv": srv}) == 0  # never seen twice
    srv.calls.clear()
    rc = greedy(tmp_path / "mem", {"u:plain": plain, "u:srv": srv}, ["--memorise"])
    assert rc == 1  # the departure of the memorised pass is found (gap 0.5 > 0.25)
    doc = json.loads((tmp_path / "mem" / "summary.json").read_text())
    assert doc["config"]["memorise"] is True
    d = doc["servers"]["srv"]["departures"]
    assert [(x["c"], x["prompt"], x["position"], x["verdict"]) for x in d] == [
        (1, "grounded-0", 4, "FAIL"), (4, "grounded-0", 4, "FAIL")]
    # per concurrency: one flush, then two passes of the three prompts
    paths = [p for p, _ in srv.calls]
    assert paths == (["/flush_cache"] + ["/generate"] * 6) * 2
    assert "# MEMORISED" in (tmp_path / "mem" / "summary.txt").read_text()


def test_a_token_outside_plains_top_two_fails_whatever_the_gap(tmp_path):
    m = FakeModel(gaps={(0, 2): 0.0})
    rc = greedy(tmp_path, {"u:plain": FakeServer(m), "u:odd": FakeServer(m, departs={0: (2, 4)})})
    d = json.loads((tmp_path / "summary.json").read_text())["servers"]["odd"]["departures"][0]
    assert rc == 1 and d["verdict"] == "FAIL" and d["gap"] == 0.0
    assert "token 4 is not among plain's top 2" in d["reason"]


def test_a_third_near_equal_token_is_a_tie_and_a_far_third_fails():
    top = [[-1.46, 28724, None], [-1.585, 351, None], [-1.585, 1003, None], [-3.0, 7, None]]
    gap, verdict, why = L.judge_departure(top, 28724, 1003, 0.25)
    assert verdict == "tie" and gap == pytest.approx(0.125) and "0.1250 <= 0.25" in why
    gap, verdict, why = L.judge_departure(top, 28724, 7, 0.25)
    assert verdict == "FAIL" and "token 7 lies 1.5400 below plain's top-1 28724" in why
    # plain's own token must be near the top too (a fresh prefill that disagrees with its decode)
    assert L.judge_departure(top, 7, 1003, 0.25)[1] == "FAIL"
    assert "not among plain's top 4" in L.judge_departure(top, 28724, 99, 0.25)[2]


def test_a_server_that_stops_early_departs_at_its_end():
    assert L.first_difference([1, 2, 3], [1, 2]) == 2
    assert L.first_difference([1, 2], [1, 2]) is None
    assert L.first_difference([1, 5, 3], [1, 2, 3]) == 1
    gap, verdict, _ = L.judge_departure([[-0.1, 3, None], [-0.2, 9, None]], 3, None, 0.25)
    assert verdict == "tie" and gap == pytest.approx(0.1)
    assert L.judge_departure(None, 3, 9, 0.25)[1] == "FAIL"


def test_bad_input_is_named(tmp_path, capsys):
    m = FakeModel()
    with pytest.raises(SystemExit):
        L.main(["greedy", "--plain", "u:p", "--server", "nourl", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        L.main(["greedy", "--plain", "u:p", "--server", "plain=u:x", "--out", str(tmp_path)])
    rc = L.main(["greedy", "--plain", "u:plain", "--server", "x=u:x", "--prompts", "nope-1",
                 "--out", str(tmp_path)],
                transport=transport_for({"u:plain": FakeServer(m), "u:x": FakeServer(m)}))
    assert rc == 2 and "--prompts: unknown id(s) nope-1" in capsys.readouterr().err

    def down(url, path, body):
        raise ConnectionRefusedError("refused")
    assert L.main(["greedy", "--plain", "u:plain", "--server", "x=u:x", "--out", str(tmp_path)],
                  transport=down) == 2


def test_over_real_http(tmp_path):
    """The default transport against a stub HTTP server that answers as FakeServer."""
    m = FakeModel(gaps={(0, 4): 0.125})
    fakes = {"plain": FakeServer(m), "spec": FakeServer(m, departs={0: (4, 1004)})}

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            st, out = fakes[self.path.split("/")[1]].handle("/" + self.path.split("/", 2)[2],
                                                            body)
            data = json.dumps(out).encode()
            self.send_response(st)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    try:
        # the fake reads its name from the first path part: http://host:port/<name>/<endpoint>
        def transport(url, path, body):
            return L.http_transport(url.rsplit("/", 1)[0], "/" + url.rsplit("/", 1)[1] + path,
                                    body)
        rc = L.main(["greedy", "--plain", f"http://127.0.0.1:{port}/plain", "--server",
                     f"spec=http://127.0.0.1:{port}/spec", "--sets", "grounded", "--per-set", "1",
                     "--concurrency", "1", "--max-new-tokens", "8", "--out", str(tmp_path)],
                    transport=transport)
    finally:
        srv.shutdown()
    s = json.loads((tmp_path / "spec" / "summary.json").read_text())
    assert rc == 0 and s["verdict"] == "PASS"
    assert [(d["position"], d["gap"], d["verdict"]) for d in s["result"]["departures"]] == [
        (4, 0.125, "tie")]


# ----------------------------------------------------------------------------- sampled

@pytest.mark.parametrize("x,df,p", [
    (3.841459, 1, 0.05), (6.634897, 1, 0.01), (20.515, 5, 0.001), (18.307038, 10, 0.05),
    (124.342113, 100, 0.05), (3.0, 2, math.exp(-1.5)), (0.0, 3, 1.0),
])
def test_chi2_sf_matches_the_tables(x, df, p):
    assert L.chi2_sf(x, df) == pytest.approx(p, rel=1e-4)


def test_chi2_sf_is_the_tail_of_simulated_chi_square_draws():
    rng = random.Random(3)
    draws = [sum(rng.gauss(0, 1) ** 2 for _ in range(4)) for _ in range(20000)]
    for x in (2.0, 5.0, 9.0):
        emp = sum(d >= x for d in draws) / len(draws)
        assert L.chi2_sf(x, 4) == pytest.approx(emp, abs=0.01)


def test_pooling_keeps_every_category_at_ten_or_more():
    xs = ["a"] * 40 + ["b"] * 30 + ["c"] * 3 + ["d"] * 2
    ys = ["a"] * 35 + ["b"] * 33 + ["c"] * 4 + ["e"] * 3
    labels, cx, cy = L.pooled_counts(xs, ys)
    assert labels == ["a", "b", "other"] and cx == [40, 30, 5] and cy == [35, 33, 7]
    labels, cx, cy = L.pooled_counts(["a"] * 20 + ["z"], ["a"] * 20 + ["y"])
    assert labels == ["a+other"] and cx == [21] and cy == [21]


class FakeSampler(FakeServer):
    """Sampled generate: each of the k tokens drawn from ``probs`` (token -> probability) with a
    seeded generator; greedy/top-2 requests as FakeServer."""

    def __init__(self, model, probs, seed):
        super().__init__(model)
        self.probs, self.rng = probs, random.Random(seed)

    def handle(self, path, body):
        if path != "/generate" or body["sampling_params"]["temperature"] == 0:
            return super().handle(path, body)
        toks, weights = zip(*sorted(self.probs.items()))
        n = body["sampling_params"]["max_new_tokens"]
        assert body["sampling_params"]["ignore_eos"] is True
        return 200, {"output_ids": self.rng.choices(toks, weights, k=n),
                     "meta_info": {"completion_tokens": n}}


def sampled(tmp_path, servers):
    argv = ["sampled", "--plain", "u:plain", "--sets", "grounded", "--per-set", "2",
            "--samples", "400", "--tokens", "3", "--concurrency", "1", "--out", str(tmp_path)]
    for name in servers:
        if name != "u:plain":
            argv += ["--server", f"{name[2:]}={name}"]
    return L.main(argv, transport=transport_for(servers))


def test_sampled_same_distribution_passes_and_a_shifted_one_fails(tmp_path):
    m = FakeModel()
    p = {1: 0.5, 2: 0.3, 3: 0.15, 4: 0.05}
    q = {1: 0.3, 2: 0.5, 3: 0.15, 4: 0.05}    # 0.2 of the mass moved from token 1 to 2
    rc = sampled(tmp_path, {"u:plain": FakeSampler(m, p, 1), "u:same": FakeSampler(m, p, 2),
                            "u:shift": FakeSampler(m, q, 3)})
    doc = json.loads((tmp_path / "summary.json").read_text())
    same, shift = doc["servers"]["same"], doc["servers"]["shift"]
    assert rc == 1 and same["verdict"] == "PASS" and shift["verdict"] == "FAIL"
    # 2 prompts x (3 positions + the sequence) tests, Bonferroni at 0.01 / 8
    assert same["tests_counted"] == 8 and same["level"] == pytest.approx(0.01 / 8)
    assert same["min_p"] > same["level"] and shift["min_p"] < 1e-4
    assert {t["what"] for t in shift["tests"] if t["verdict"] == "FAIL"} >= {"token 0"}
    assert "chi-square" in (tmp_path / "shift" / "summary.txt").read_text()


def test_sampled_flags_are_checked(tmp_path):
    with pytest.raises(SystemExit):
        L.main(["sampled", "--plain", "u:p", "--server", "a=u:a", "--temperature", "0",
                "--out", str(tmp_path)])


def test_the_gpu_command_rehearsed_against_stand_ins(tmp_path):
    """lossless_dryrun.sh: lossless.sh launches the stand-ins, waits for them, runs both checks
    and writes the GPU command's layout; the stand-in with widths departs at a tie on 7 of 12. The
    chain server (port 25020) dies at its first start: it is started again, alone, and checked;
    the last lines of its first log come back as died-chain.txt."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(["bash", str(root / "lab/gpu/lossless_dryrun.sh"), str(tmp_path)],
                       capture_output=True, text=True, timeout=180,
                       env={**os.environ, "PY": sys.executable,
                            "STAND_IN_DIE_ONCE": f"25020:{tmp_path}/died-once"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "start-up check failed" in (tmp_path / "out/died-chain.txt").read_text()
    assert "started again, alone: chain" in (tmp_path / "out/timeline.txt").read_text()
    g = json.loads((tmp_path / "out/greedy/summary.json").read_text())
    assert g["verdict"] == "PASS" and set(g["servers"]) == {"tree", "chain", "chain_w", "auto_w",
                                                            "plain-self"}
    cw = g["servers"]["chain_w"]
    assert [(r["c"], r["identical"], r["ties"]) for r in cw["by_concurrency"]] == [
        (1, 5, 7), (4, 5, 7)]
    assert {d["position"] for d in cw["departures"]} == {6}
    s = json.loads((tmp_path / "out/sampled/summary.json").read_text())
    assert set(s["servers"]) == {"tree", "chain", "chain_w", "auto_w"}
    assert (tmp_path / "out/lossless.tar.xz").exists()
    assert "chain_w: " in (tmp_path / "out/commands.txt").read_text()


def test_servers_left_by_a_killed_run_are_stopped_before_the_next_launch(tmp_path):
    """A run killed from outside (SIGKILL: no trap runs) leaves its setsid'd stand-ins serving;
    the next run stops them before it launches and checks its own servers (its logs, not the
    dead run's); a port held by a process no run recorded stops the launch with its number."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PY": sys.executable, "SAMPLED": "0",
           "LEFTOVERS_FILE": str(tmp_path / "pgids")}
    cmd = ["bash", str(root / "lab/gpu/lossless_dryrun.sh")]
    first = subprocess.Popen(cmd + [str(tmp_path / "a")], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    recorded = tmp_path / "pgids"
    deadline = time.time() + 90
    while time.time() < deadline:  # killed as soon as all five are started: long before its
        if recorded.exists() and len(recorded.read_text().split()) == 5 \
                and all(_own_group(int(g)) for g in recorded.read_text().split()):  # end stops
            break  # them; each in its own group already (forked, not yet setsid: killed too)
        time.sleep(0.05)
    else:
        os.killpg(first.pid, signal.SIGKILL)
        raise AssertionError("the first run never started its five stand-ins")
    os.killpg(first.pid, signal.SIGKILL)  # the dry run and lossless.sh; the servers live on
    first.wait()
    pgids = recorded.read_text().split()
    left_alive = []
    try:
        assert all(_group_alive(int(g)) for g in pgids)
        r = subprocess.run(cmd + [str(tmp_path / "b")], env=env, capture_output=True, text=True,
                           timeout=180)
    finally:
        for g in pgids:  # whatever the second run did, no stand-in outlives the test
            if _group_alive(int(g)):
                os.killpg(int(g), signal.SIGKILL)
                left_alive.append(g)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert not left_alive
    text = (tmp_path / "b/out/timeline.txt").read_text()
    assert "stopped 5 server(s) left running by an earlier run" in text
    assert not recorded.exists()  # a run that ended stopped its servers: nothing left recorded
    assert json.loads((tmp_path / "b/out/greedy/summary.json").read_text())["verdict"] == "PASS"

    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", 25010))
    squatter.listen()
    try:
        r = subprocess.run(cmd + [str(tmp_path / "c")], env=env, capture_output=True, text=True,
                           timeout=120)
    finally:
        squatter.close()
    assert r.returncode == 2
    assert "port 25010 is taken" in (tmp_path / "c/out/timeline.txt").read_text()
    assert not (tmp_path / "c/out/commands.txt").exists()  # nothing was started


def _own_group(pid):
    import os
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _group_alive(pgid):
    import os
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_prompts_encoded_here_reach_every_server_and_plains_tokenize_is_not_asked(tmp_path,
                                                                                    monkeypatch):
    """--tokenizer DIR: the prompts are encoded by the model folder's tokenizer on this machine
    (the bundle's server answers /tokenize with HTTP 500); every server gets those ids."""
    m = FakeModel()
    encoded = []

    def local(path):
        assert path == str(tmp_path)
        return lambda text: encoded.append(text) or prompt_key(text)
    monkeypatch.setattr(L, "local_tokenizer", local)
    plain, chain = FakeServer(m), FakeServer(m)
    rc = greedy(tmp_path / "out", {"u:plain": plain, "u:chain": chain},
                extra=["--tokenizer", str(tmp_path)])
    assert rc == 0 and len(encoded) == 3
    assert not [c for c in plain.calls if c[0] == "/tokenize"]
    sent = {tuple(b["input_ids"]) for s in (plain, chain) for p, b in s.calls if p == "/generate"
            and b["sampling_params"]["max_new_tokens"] == 12}
    assert sent == {tuple(prompt_key(t)) for t in encoded}


def test_a_tokenizer_folder_that_does_not_exist_is_named(tmp_path, capsys):
    m = FakeModel()
    rc = L.main(["greedy", "--plain", "u:plain", "--server", "x=u:x", "--tokenizer",
                 str(tmp_path / "nope"), "--out", str(tmp_path)],
                transport=transport_for({"u:plain": FakeServer(m), "u:x": FakeServer(m)}))
    assert rc == 2 and f"--tokenizer {tmp_path / 'nope'}: not a folder" in capsys.readouterr().err
