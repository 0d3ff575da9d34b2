"""lab/gpu_timeline.py on made-up torch-profiler traces whose step anatomy is
known by construction."""

import gzip
import json

import gpu_timeline  # lab/ is on sys.path (tests/conftest.py)
import pytest


class Trace:
    """Builds Chrome-trace events: graph launches (host call + kernels with its correlation id) and
    loose kernels (each with its own launch call)."""

    def __init__(self):
        self.events, self.corr = [], 0

    def _call(self, name, ts):
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 3.0,
                            "pid": 100, "tid": 1, "args": {"correlation": self.corr}})
        return self.corr

    def graph(self, host_ts, start, kernel_durs, gap=1.0, device=0, names=None, grids=None):
        c = self._call("cudaGraphLaunch", host_ts)
        t = start
        for i, d in enumerate(kernel_durs):
            name = names[i] if names else "gemm"
            args = {"correlation": c, "device": device}
            if grids:
                args.update({"grid": list(grids[i]), "block": [384, 1, 1],
                             "registers per thread": 168, "shared memory": 221460})
            self.events.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": d,
                                "pid": device, "tid": 7, "args": args})
            t += d + gap
        return t - gap  # end of the last kernel

    def loose(self, name, start, dur, cat="kernel", device=0):
        c = self._call("cudaLaunchKernel", start - 20.0)
        self.events.append({"ph": "X", "cat": cat, "name": name, "ts": start, "dur": dur,
                            "pid": device, "tid": 7, "args": {"correlation": c, "device": device}})


def _steady(n_steps=6, pause_after=None):
    """Steps of period 1000 us: a graph of three 200-us kernels (span 602 us), then an index
    kernel (10 us) and a copy (5 us) outside the graph; the host launches each graph 300 us
    before its first kernel."""
    tr = Trace()
    t = 10_000.0
    for i in range(n_steps):
        end = tr.graph(t - 300.0, t, [200.0, 200.0, 200.0])
        tr.loose("index_kernel", end + 50.0, 10.0)
        tr.loose("Memcpy DtoH", end + 100.0, 5.0, cat="gpu_memcpy")
        t += 1000.0
        if pause_after is not None and i == pause_after:
            t += 50_000.0  # no request for 50 ms
    return tr


def test_step_anatomy_by_construction():
    r = gpu_timeline.analyze(_steady().events)
    assert r["steps"] == 5 and r["pauses_dropped"] == 0
    m = r["median_us"]
    assert m["period"] == pytest.approx(1000.0)
    assert m["graph"] == pytest.approx(602.0)
    assert m["around"] == pytest.approx(15.0)
    assert m["idle"] == pytest.approx(1000.0 - 602.0 - 15.0)
    assert m["ops"] == 2 and m["lead"] == pytest.approx(300.0)
    assert m["in_graph"] == pytest.approx(600.0) and m["graph_gaps"] == pytest.approx(2.0)
    assert r["graph_sizes"] == {3: 5}
    ops = r["ops_by_name"]
    assert list(ops) == ["index_kernel", "Memcpy DtoH"]  # heaviest first
    assert (ops["index_kernel"]["per_step"] == pytest.approx(1.0)
            and ops["index_kernel"]["mean_us"] == 10.0)


def test_pauses_between_requests_are_not_steps():
    r = gpu_timeline.analyze(_steady(n_steps=8, pause_after=3).events)
    assert r["pauses_dropped"] == 1 and r["steps"] == 6
    assert r["mean_us"]["period"] == pytest.approx(1000.0)


def test_overlapping_operations_count_once_and_other_devices_are_ignored():
    tr = _steady()
    # a second stream's kernel overlapping the index kernel of the first step: busy time is a union
    first_end = 10_000.0 + 602.0
    tr.loose("other_stream", first_end + 55.0, 10.0)
    # device 1's activity (fewer events) must not mix in
    tr.graph(9_000.0, 9_500.0, [100.0], device=1)
    tr.loose("dev1", 9_700.0, 1.0, device=1)
    r = gpu_timeline.analyze(tr.events)
    rows_around = r["mean_us"]["around"]
    # one step gains 5 us of union busy time (55..65 overlaps 50..60 by 5):
    # mean over 5 steps = 15 + 1
    assert rows_around == pytest.approx(16.0)
    assert "dev1" not in r["ops_by_name"]


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="no GPU activity"):
        gpu_timeline.analyze([{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 1}])
    tr = Trace()
    tr.graph(0.0, 10.0, [5.0])
    with pytest.raises(ValueError, match="need two or more"):
        gpu_timeline.analyze(tr.events)
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert gpu_timeline.main([str(bad)]) == 2


def test_cli_reads_gzip_compares_and_writes_json(tmp_path, capsys):
    base, auto = _steady(), _steady()
    # the second server runs two more 20-us kernels outside the graph each step
    for ev in [e for e in auto.events if e.get("name") == "index_kernel"]:
        auto.loose("gather_kernel", ev["ts"] + 200.0, 20.0)
        auto.loose("gather_kernel", ev["ts"] + 250.0, 20.0)
    paths = []
    for name, tr in (("plain", base), ("auto", auto)):
        p = tmp_path / f"{name}.trace.json.gz"
        with gzip.open(p, "wt") as f:
            json.dump({"traceEvents": tr.events}, f)
        paths.append(f"{name}={p}")
    out = tmp_path / "tl.json"
    assert gpu_timeline.main(paths + ["--json", str(out)]) == 0
    text = capsys.readouterr().out
    around = next(line for line in text.splitlines() if line.startswith("around"))
    assert around.split()[1:] == ["15.0", "55.0", "(+40.0)"]
    data = json.loads(out.read_text())
    assert data["results"]["auto"]["ops_by_name"]["gather_kernel"]["per_step"] == pytest.approx(2.0)
    assert data["repro_command"].startswith("python lab/gpu_timeline.py plain=")
    assert data["repro_command"].endswith(f"--json {out}")


def test_graph_launches_found_without_host_calls_and_steps_split_by_graph():
    """A trace recorded without the host calls still shows graph launches (several kernels share one
    correlation id); a server with two graphs (decode and verify) gets the statistics of each."""
    tr = Trace()
    t = 10_000.0
    for i in range(6):
        durs = [200.0] * 3 if i % 2 else [300.0] * 4  # alternate a 3-kernel and a 4-kernel graph
        end = tr.graph(t - 300.0, t, durs)
        tr.loose("k", end + 10.0, 4.0 if i % 2 else 8.0)
        t += 1500.0
    events = [e for e in tr.events if e["cat"] not in ("cuda_runtime",)]
    r = gpu_timeline.analyze(events)
    assert r["graph_sizes"] == {3: 2, 4: 3}
    assert r["median_us"]["lead"] is None
    g3, g4 = r["by_graph"][3], r["by_graph"][4]
    assert (g3["median_us"]["graph"] == pytest.approx(602.0)
            and g4["median_us"]["graph"] == pytest.approx(1203.0))
    assert (g3["median_us"]["around"] == pytest.approx(4.0)
            and g4["median_us"]["around"] == pytest.approx(8.0))
    text = gpu_timeline.render({"x": r})
    assert "x/g3" in text and "x/g4" in text


def test_inside_the_graph_slower_kernels_and_gaps_are_told_apart(tmp_path, capsys):
    """Two servers with the same graph: in the second, the attention kernel takes 30 us more
    and the kernels wait 10 us for each other (a graph submitted just in time); the table names
    the kernel and the gaps."""
    names = ["gemm", "attn", "gemm"]
    traces = {}
    for label, attn, gap in (("plain", 100.0, 1.0), ("auto", 130.0, 11.0)):
        tr = Trace()
        t = 10_000.0
        for _ in range(6):
            tr.graph(t - 300.0, t, [200.0, attn, 200.0], gap=gap, names=names)
            t += 1000.0
        p = tmp_path / f"{label}.json"
        p.write_text(json.dumps({"traceEvents": tr.events}))
        traces[label] = f"{label}={p}"
        r = gpu_timeline.analyze(tr.events)
        k = r["by_graph"][3]["kernels_by_name"]
        assert k["gemm"]["per_step"] == 2 and k["gemm"]["us_per_step"] == pytest.approx(400.0)
        assert k["attn"]["us_per_step"] == pytest.approx(attn)
        assert r["median_us"]["in_graph"] == pytest.approx(400.0 + attn)
        assert r["median_us"]["graph_gaps"] == pytest.approx(2 * gap)
    assert gpu_timeline.main([traces["plain"], traces["auto"]]) == 0
    lines = capsys.readouterr().out.splitlines()
    gaps = next(line for line in lines if line.startswith("graph_gaps"))
    assert gaps.split()[1:] == ["2.0", "22.0", "(+20.0)"]
    start = next(i for i, line in enumerate(lines) if line.startswith("inside the graph"))
    first = lines[start + 2].split()
    assert first[-1] == "attn" and first[1:4] == ["100.0", "130.0", "(+30.0)"]


def test_one_kernel_call_by_call_and_its_launch_configurations():
    """--kernel: the k-th call of a kernel in each launch of the dominant graph (one per layer), its
    median over the launches, the sum, and the launch configurations; a second trace whose second
    call is 3 us slower on every step but one shows it at that call only."""
    names = ["gemm_big", "norm", "gemm_big", "gemm_small"]

    def trace(second_us):
        tr = Trace()
        t = 10_000.0
        for i in range(7):
            second = 80.0 if i == 3 else second_us  # one odd launch: the median ignores it
            tr.graph(t - 300.0, t, [60.0, 5.0, second, 20.0], names=names,
                     grids=[(4, 24, 1), (1, 1, 1), (4, 24, 1), (2, 24, 1)])
            t += 1000.0
        return tr.events

    base = gpu_timeline.analyze(trace(61.0), kernel="gemm_big")
    slow = gpu_timeline.analyze(trace(64.0), kernel="gemm_big")
    kc = base["kernel_calls"]
    assert kc["name"] == ["gemm_big"] and kc["calls"] == 2 and kc["us"] == [60.0, 61.0]
    # six windows between seven launches, two calls each
    assert kc["configs"] == {"grid (4, 24, 1) block (384, 1, 1) regs 168 smem 221460": 12}
    assert slow["kernel_calls"]["us"] == [60.0, 64.0]
    assert "kernel_calls" not in gpu_timeline.analyze(trace(61.0))
    text = gpu_timeline.render({"plain": base, "auto": slow})
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("kernel call by call"))
    assert lines[i + 2].split() == ["0", "60.00", "60.00", "(+0.00)"]
    assert lines[i + 3].split() == ["1", "61.00", "64.00", "(+3.00)"]
    assert lines[i + 4].split() == ["sum", "121.00", "124.00", "(+3.00)"]
    assert "plain: grid (4, 24, 1) block (384, 1, 1) regs 168 smem 221460 x12" in text
