"""The scheduler step trace: the recorder (lab/steptrace/steptrace.py) on a stand-in scheduler
driven by a fake clock, its import hook on a throwaway module, and lab/step_trace.py on records
whose statistics are known by construction."""

import gc
import gzip
import importlib
import json
import sys
import types

import pytest
import step_trace  # lab/ and lab/steptrace/ are on sys.path (tests/conftest.py)
import steptrace


@pytest.fixture(autouse=True)
def no_automatic_gc():
    """The recorder writes a G record for every garbage collection; one that the interpreter starts
    on its own in the middle of a test would add a record the test does not expect (collections the
    tests start still run)."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t

    def advance(self, s):
        self.t += s


def make_classes(clock):
    """A scheduler whose launch takes 1 ms and whose result processing waits 3 ms on
    an event, then 0.5 ms."""

    class Event:
        def synchronize(self):
            clock.advance(0.003)

    class Scheduler:
        idles = 0

        def __init__(self):
            self.draft_worker = None

        def run_batch(self, batch):
            clock.advance(0.001)
            return "result"

        def process_batch_result(self, batch, result):
            Event().synchronize()
            clock.advance(0.0005)

        def on_idle(self):
            Scheduler.idles += 1

    return Scheduler, Event


def write_traces(tmp_path, **servers) -> list:
    """Each server's records as a trace file; the LABEL=FILE arguments of
    step_trace.main, in order."""
    paths = []
    for name, recs in servers.items():
        f = tmp_path / f"{name}.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in recs))
        paths.append(f"{name}={f}")
    return paths


def by_bs_table(capsys, out=None) -> list:
    """The rows of the printed per-batch-size table (of `out`, else of what was
    printed), split into words."""
    lines = (capsys.readouterr().out if out is None else out).splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("decode steps by batch size, sampling"))
    return [line.split() for line in lines[start + 2:]]


def batch(mode="DECODE", bs=2, greedy=None):
    b = types.SimpleNamespace(forward_mode=types.SimpleNamespace(name=mode), reqs=[object()] * bs)
    if greedy is not None:
        b.sampling_info = types.SimpleNamespace(is_all_greedy=greedy)
    return b


def test_recorder_wraps_scheduler_and_writes_records(tmp_path):
    clock = Clock()
    Scheduler, Event = make_classes(clock)
    path = tmp_path / "steps-1.jsonl"
    trace = steptrace.StepTrace(str(path), flush_every=4, clock=clock)
    steptrace.instrument(Scheduler, Event, trace)
    try:
        s = Scheduler()
        assert s.run_batch(batch("EXTEND", 1)) == "result"
        s.process_batch_result(batch(), "result")
        s.run_batch(batch(greedy=True))
        s.process_batch_result(batch(), "result")  # 4 records: flushed
        assert path.exists() and trace.records == []
        s.run_batch(batch(greedy=False))
        s.on_idle()  # idle: noted once after a launch, and the rest is written too
        s.on_idle()
        assert Scheduler.idles == 2
    finally:
        gc.callbacks.remove(trace.on_gc)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r[0] for r in recs] == ["R", "P", "R", "P", "R", "I"]
    assert recs[-1][1] >= recs[-2][2]
    assert recs[0][3:] == ["EXTEND", 1, None, None, None, {}, None]  # no sampling info: not said
    assert recs[2][-1] == "greedy" and recs[4][-1] == "sampled"
    assert recs[0][2] - recs[0][1] == pytest.approx(0.001)
    p = recs[1]
    assert p[2] - p[1] == pytest.approx(0.0035) and p[3] == pytest.approx(0.003)


def test_records_wait_for_the_idle_scheduler_by_default(tmp_path):
    """A load of 2000 steps writes nothing while it runs (a write on the scheduler thread stalls a
    step); the scheduler's first idle moment writes it all."""
    clock = Clock()
    Scheduler, Event = make_classes(clock)
    path = tmp_path / "steps-2.jsonl"
    trace = steptrace.StepTrace(str(path), clock=clock)
    assert trace.flush_every == steptrace.FLUSH_EVERY > 4000
    steptrace.instrument(Scheduler, Event, trace)
    try:
        s = Scheduler()
        for _ in range(2000):
            s.run_batch(batch())
            s.process_batch_result(batch(), "result")
        assert not path.exists() and sum(1 for r in trace.records if r[0] in ("R", "P")) == 4000
        held = len(trace.records)  # (and a garbage collection's record now and then)
        s.on_idle()
    finally:
        gc.callbacks.remove(trace.on_gc)
    # and the idle mark
    assert len(path.read_text().splitlines()) == held + 1 and trace.records == []


def test_spans_time_functions_inside_each_step(tmp_path, monkeypatch):
    clock = Clock()
    Scheduler, Event = make_classes(clock)
    helpers = types.ModuleType("fv_span_helpers")

    def glue(n):
        clock.advance(0.0002 * n)
        return n

    class Worker:
        def step(self):
            clock.advance(0.0004)
            return helpers.glue(2)

    helpers.glue, helpers.Worker = glue, Worker
    monkeypatch.setitem(sys.modules, "fv_span_helpers", helpers)
    trace = steptrace.StepTrace(str(tmp_path / "s.jsonl"), clock=clock)
    trace.span_targets = (("fv_span_helpers", "glue", "glue"),
                          ("fv_span_helpers", "Worker.step", "worker"),
                          ("fv_not_imported", "f", "missing"),
                          ("fv_span_helpers", "Worker.nope", "nope"))
    worker = Worker()
    orig_run = Scheduler.run_batch
    Scheduler.run_batch = lambda self, b: (worker.step(), orig_run(self, b))[1]
    steptrace.instrument(Scheduler, Event, trace)
    try:
        s = Scheduler()
        s.run_batch(batch())
        s.run_batch(batch())
    finally:
        gc.callbacks.remove(trace.on_gc)
    assert trace._spans_installed
    first, second = trace.records
    # the worker step (0.4 ms) includes the glue (2 x 0.2 ms); both wrapped once,
    # not again at the 2nd step
    assert first[8] == {"glue": pytest.approx(0.0004), "worker": pytest.approx(0.0008)}
    assert second[8] == first[8]
    assert trace.install_spans() == []  # already wrapped: nothing twice


def test_spans_off_leaves_only_the_compile_step():
    """FASTVERIFY_STEP_TRACE_SPANS=0: no function of SPANS is wrapped but Triton's compile step,
    so servers with more glue pay no more tracing a step than a plain server."""
    assert steptrace.span_targets({}) == steptrace.SPANS
    assert steptrace.span_targets({steptrace.SPANS_ENV: "1"}) == steptrace.SPANS
    off = steptrace.span_targets({steptrace.SPANS_ENV: "0"})
    assert [t[2] for t in off] == [steptrace.COMPILE_LABEL]
    assert any(t[2] == "path_choice" for t in steptrace.SPANS)


def test_the_span_table_names_functions_that_exist(monkeypatch):
    """Every SPANS entry whose module imports here resolves to a function (a renamed one
    would silently stop being timed); Triton's compile step among them where this Triton has
    it. The same for GPU_SPANS."""
    assert {m for m, _, _ in steptrace.GPU_SPANS} <= {m for m, _, _ in steptrace.SPANS}
    for module_name, qualname, label in steptrace.SPANS + steptrace.GPU_SPANS:
        try:
            owner = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - SGLang's GPU modules need what this machine lacks
            continue
        for part in qualname.split("."):
            owner = getattr(owner, part, None)
        if module_name.startswith("triton") and owner is None:
            continue  # older Triton: no such step (the recorder skips it)
        assert callable(owner), (module_name, qualname, label)


def test_no_library_module_binds_a_traced_function_at_import():
    """The recorder times a function of SPANS by replacing it on its own module. A library module
    that bound the same function at import (``from fastverify.glue.auto import probe_behind`` at
    module level) keeps the unwrapped one, and its calls vanish from the trace's column without a
    word: so no fastverify module other than the function's own holds it in its globals
    (``plain_path._probe`` imports the two it shares with auto inside the function for this)."""
    import pkgutil

    import fastverify

    for info in pkgutil.walk_packages(fastverify.__path__, "fastverify."):
        if not info.name.endswith("__main__"):  # (runs the command line)
            importlib.import_module(info.name)
    traced = {}
    for module_name, qualname, label in steptrace.SPANS:
        if module_name.startswith("fastverify.") and "." not in qualname:
            traced[id(getattr(importlib.import_module(module_name), qualname))] = (module_name,
                                                                                   label)
    assert len(traced) >= 10  # the glue's pieces, the plain path's among them
    found = []
    for name, module in list(sys.modules.items()):
        if name.startswith("fastverify") and isinstance(module, types.ModuleType):
            for key, value in vars(module).items():
                home = traced.get(id(value))
                if home and home[0] != name:
                    found.append(f"{name}.{key} is {home[0]}'s (span {home[1]})")
    assert not found, found


def test_spans_wrap_functions_that_other_decorators_wrapped(tmp_path, monkeypatch):
    import functools

    def plain(x):
        return x + 1

    @functools.wraps(plain)
    def decorated(x):  # like SGLang's nvtx decorator: __wrapped__ set, not ours
        return plain(x)

    mod = types.ModuleType("fv_span_decorated")
    mod.decorated = decorated
    monkeypatch.setitem(sys.modules, "fv_span_decorated", mod)
    trace = steptrace.StepTrace(str(tmp_path / "d.jsonl"), clock=Clock())
    trace.span_targets = (("fv_span_decorated", "decorated", "dec"),)
    assert trace.install_spans() == ["dec"]
    assert mod.decorated(1) == 2 and "dec" in trace.spans


def test_triton_compiles_are_timed_and_named(tmp_path, monkeypatch):
    """Triton's compile step is a span and a C record: the kernel's name and its
    compile-time constants."""
    clock = Clock()

    class JITFunction:
        def __init__(self, name):
            self.__name__ = name

        def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
            clock.advance(0.15)
            return "kernel"

    jit_mod = types.ModuleType("fv_fake_triton_jit")
    jit_mod.JITFunction = JITFunction
    monkeypatch.setitem(sys.modules, "fv_fake_triton_jit", jit_mod)
    trace = steptrace.StepTrace(str(tmp_path / "c.jsonl"), clock=clock)
    trace.span_targets = (("fv_fake_triton_jit", "JITFunction._do_compile",
                           steptrace.COMPILE_LABEL),)
    assert trace.install_spans() == ["triton_compile"]
    k = JITFunction("assign_extend_cache_locs")
    sig = {"req_pool_indices": "*i64", "req_to_token": "*i32", "pool_len": "constexpr"}
    assert k._do_compile("key", sig, 0, {(5,): 4096, (6,): 4}, {}, {}, False) == "kernel"
    assert trace.spans == {"triton_compile": pytest.approx(0.15)}
    (rec,) = trace.records
    assert rec[0] == "C" and rec[2] == pytest.approx(0.15) and rec[3] == "assign_extend_cache_locs"
    assert rec[4] == "{(5,): 4096, (6,): 4}"
    assert rec[5] == "req_pool_indices:*i64,req_to_token:*i32,pool_len:constexpr"
    assert trace.install_spans() == []  # wrapped once


def test_recorder_reads_auto_step_kind():
    state = types.SimpleNamespace(last_step=("probe", 4, 1),
                                  controller=types.SimpleNamespace(planned="probe"))
    sched = types.SimpleNamespace(draft_worker=types.SimpleNamespace(_fv_auto=state))
    # a probe step is written as a lean step that probed
    assert steptrace.auto_step(sched) == ["lean", 1, True]
    state.last_step = ("lean", 4, 1)
    assert steptrace.auto_step(sched) == ["lean", 1, False]
    state.last_step, state.controller.planned = ("spec", 4, 8), "wanted"
    assert steptrace.auto_step(sched) == ["spec", 8, False]
    state.last_step = None
    assert steptrace.auto_step(sched) == [None, None, None]
    assert steptrace.auto_step(types.SimpleNamespace()) == [None, None, None]


def test_a_prefill_record_carries_no_auto_kind(tmp_path):
    """The worker's last step kind stays its last decode step's through a prefill: the record of the
    prefill does not take it, the next decode step's does."""
    clock = Clock()
    Scheduler, Event = make_classes(clock)
    state = types.SimpleNamespace(last_step=("lean", 1, 1),
                                  controller=types.SimpleNamespace(planned=None))
    trace = steptrace.StepTrace(str(tmp_path / "steps-8.jsonl"), clock=clock)
    steptrace.instrument(Scheduler, Event, trace)
    try:
        s = Scheduler()
        s.draft_worker = types.SimpleNamespace(_fv_auto=state)
        s.run_batch(batch("EXTEND", 1))
        s.run_batch(batch("DECODE", 2))
    finally:
        gc.callbacks.remove(trace.on_gc)
    assert [r[5:8] for r in trace.records] == [[None, None, None], ["lean", 1, False]]


def test_a_step_on_the_plain_decode_path_is_written_as_its_own_kind(tmp_path):
    """A batch of an auto server's that reads as not speculative runs on SGLang's own decode path
    (patch 0012): its record says so, whatever the worker's last step was; the worker's own steps
    keep their kind; a server without auto writes no kind for a batch that reads the same. A path
    step whose launch made a probe (the controller's count of them moved) is marked as one."""
    clock = Clock()
    Base, Event = make_classes(clock)
    counters = {"plain_path_probes": 0}

    class Scheduler(Base):
        def run_batch(self, batch):
            counters["plain_path_probes"] += getattr(batch, "probes", 0)
            return super().run_batch(batch)

    state = types.SimpleNamespace(last_step=("lean", 1, 1),
                                  controller=types.SimpleNamespace(planned=None, counters=counters))
    trace = steptrace.StepTrace(str(tmp_path / "steps-9.jsonl"), clock=clock)
    steptrace.instrument(Scheduler, Event, trace)

    def algo(none):
        return types.SimpleNamespace(is_none=lambda: none)

    try:
        s = Scheduler()
        s.draft_worker = types.SimpleNamespace(_fv_auto=state)
        for none, probes in ((False, 0), (True, 0), (True, 1), (False, 0)):
            b = batch("DECODE", 2)
            b.spec_algorithm, b.probes = algo(none), probes
            s.run_batch(b)
        plain = Scheduler()
        b = batch("DECODE", 2)
        b.spec_algorithm = algo(True)
        plain.run_batch(b)
    finally:
        gc.callbacks.remove(trace.on_gc)
    assert [r[5:8] for r in trace.records] == [
        ["lean", 1, False], ["path", 1, False], ["path", 1, True], ["lean", 1, False],
        [None, None, None]]
    rows = [{"kind": k, "probe": p, "width": 1}
            for k, p in (("path", False), ("path", True), ("lean", False), (None, False))]
    assert [step_trace._kind_label(r) for r in rows] == ["plain path", "path probe", "lean",
                                                         "plain"]


def test_recorder_times_garbage_collections(tmp_path):
    clock = Clock()
    trace = steptrace.StepTrace(str(tmp_path / "t.jsonl"), clock=clock)
    trace.on_gc("start", {"generation": 2})
    clock.advance(0.012)
    trace.on_gc("stop", {"generation": 2})
    trace.on_gc("stop", {"generation": 0})  # a stop without its start is ignored
    assert trace.records == [["G", 2, 100.0, pytest.approx(0.012)]]


def test_import_hook_instruments_module_when_imported(tmp_path, monkeypatch):
    pkg = tmp_path / "fakesched_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "scheduler.py").write_text("class Scheduler:\n    def run_batch(self, b):\n        "
                                      "return 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = steptrace._AfterImport("fakesched_pkg.scheduler", lambda m: seen.append(m.Scheduler))
    sys.meta_path.insert(0, hook)
    try:
        mod = importlib.import_module("fakesched_pkg.scheduler")
    finally:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        sys.modules.pop("fakesched_pkg.scheduler", None)
        sys.modules.pop("fakesched_pkg", None)
    assert seen == [mod.Scheduler] and mod.Scheduler().run_batch(None) == 7
    assert hook not in sys.meta_path  # once: removed after it fired


def test_install_import_hook_needs_the_variable():
    before = list(sys.meta_path)
    assert steptrace.install_import_hook({}) is False
    assert sys.meta_path == before


# ---- the analysis
# -----------------------------------------------------------------------------------------

def server_records(n_steps=200, period=0.005, busy=0.003, late_every=0, late_extra=0.0, gc_every=0,
                   kinds=None, bs=1, t0=0.0, sampling=None):
    """Decode steps of a fixed period at batch size `bs`: the host works `busy` s, then waits period
    - busy on the GPU; every `late_every`-th step the host is late by `late_extra` s (no wait); a
    prefill first. `sampling` ("greedy"/"sampled"): written after the spans, as the recorder does
    (None: an older trace's records, which end with the spans)."""
    recs, t = [], t0
    recs.append(["R", t, t + 0.002, "EXTEND", 1, None, None, None])
    t += 0.04
    for i in range(n_steps):
        kind = kinds(i) if kinds else [None, None, None]
        spans = {"glue": 0.001, **({"lookup": 0.002} if kind[0] == "spec" else {})}
        recs.append(["R", t, t + 0.001, "DECODE", bs, *kind, spans]
                    + ([sampling] if sampling else []))
        late = late_every and i % late_every == late_every - 1
        wait = 0.0 if late else period - busy
        recs.append(["P", t + 0.001, t + 0.0015 + wait, wait])
        if gc_every and i % gc_every == 0:
            recs.append(["G", 0, t + 0.0016, 0.0004])
        t += (busy + late_extra) if late else period
    recs.append(["R", t, t + 0.001, "DECODE", bs, None, None, None])
    return recs


def test_steady_steps_statistics():
    res = step_trace.analyze(server_records(n_steps=200, late_every=10,
                                            late_extra=0.002, gc_every=50))
    d = res["decode"]
    assert d["steps"] == 200
    assert d["period_median"] == pytest.approx(5.0)
    # 20 late steps of 3 + 2 = 5 ms busy with no wait; the others 5 ms with a 2 ms wait
    assert d["late_share"] == pytest.approx(0.1)
    assert d["wait_median"] == pytest.approx(2.0)
    assert d["busy_mean"] == pytest.approx(0.9 * 3.0 + 0.1 * 5.0)
    assert d["gc_per_1000"] == pytest.approx(20.0)
    assert d["gc_max_ms"] == pytest.approx(0.4)
    assert res["prefills"] == 1
    assert res["after_prefill_ms"][0] == pytest.approx(40.0)
    assert res["after_prefill_ms"][1] == pytest.approx(5.0)
    assert res["gc_total"] == {"0": 4, "1": 0, "2": 0}


def test_first_decode_step_after_each_prefill(tmp_path, capsys):
    """A new request's first decode step: its host launch and whether it verified drafts. Two
    requests of an auto server, the first starting with a verify step launched in 4 ms, the second
    with a plain one in 2 ms."""
    first = server_records(n_steps=30, kinds=lambda i: ["spec", 8, False] if i == 0
                           else ["lean", 1, False])
    second = server_records(n_steps=30, t0=1.0, kinds=lambda i: ["lean", 1, False])
    for recs, launch in ((first, 0.004), (second, 0.002)):
        rs = [r for r in recs if r[0] == "R"]
        rs[1][2] = rs[1][1] + launch  # the step after the prefill
    res = step_trace.analyze(first + second)
    assert res["prefills"] == 2
    assert res["first_decode_launch_ms"] == pytest.approx(3.0)
    assert res["first_decode_spec_share"] == pytest.approx(0.5)
    plain = step_trace.analyze(server_records(n_steps=30))
    assert (plain["first_decode_launch_ms"] == pytest.approx(1.0)
            and plain["first_decode_spec_share"] is None)
    assert step_trace.main(write_traces(tmp_path, plain=server_records(n_steps=30),
                                        auto=first + second)) == 0
    lines = {line[:34].strip(): line[34:].split() for line in capsys.readouterr().out.splitlines()}
    assert lines["prefill + 1: launch (median ms)"] == ["1.000", "3.000", "(+2.000)"]
    assert lines["prefill + 1: verify passes"] == ["-", "50", "%"]


def test_pauses_and_batch_size_changes_are_not_steady_steps():
    recs = server_records(n_steps=20)
    last_t = recs[-1][1]
    # after a 2 s pause
    recs.append(["R", last_t + 2.0, last_t + 2.001, "DECODE", 1, None, None, None])
    recs.append(["R", last_t + 2.005, last_t + 2.006, "DECODE", 3, None, None, None])  # batch grew
    recs.append(["R", last_t + 2.010, last_t + 2.011, "DECODE", 3, None, None, None])
    d = step_trace.analyze(recs)["decode"]
    # 20 steps + the step ending at the pause is dropped, the bs 1 -> 3 step is
    # not steady, bs 3 -> 3 is
    assert d["steps"] == 21


def test_steps_by_auto_kind():
    def kinds(i):
        if i % 4 == 0:
            return ["spec", 8, False]
        return ["lean", 1, i % 4 == 1]

    res = step_trace.analyze(server_records(n_steps=80, kinds=kinds))
    assert set(res["by_kind"]) == {"spec w8", "lean", "lean probe"}
    # every launch record carries 1 ms in "glue", the spec steps 2 ms more in "lookup"
    assert res["by_kind"]["lean"]["spans_mean_ms"] == {"glue": pytest.approx(1.0)}
    assert res["by_kind"]["spec w8"]["spans_mean_ms"] == {"glue": pytest.approx(1.0),
                                                          "lookup": pytest.approx(2.0)}
    assert res["decode"]["spans_mean_ms"]["lookup"] == pytest.approx(0.5)
    assert res["by_kind"]["spec w8"]["steps"] == 20
    assert res["by_kind"]["lean probe"]["steps"] == 20
    assert res["by_kind"]["lean"]["steps"] == 40


def test_time_by_category_splits_a_difference_into_where_it_arose(tmp_path, capsys):
    """Two servers on one load: the prefill (40 ms), the three steps after it, and the other decode
    steps, summed over every step (steady or not). The auto server's probe steps (every tenth) come
    out 2 ms longer; its categories' differences add up to the difference in total time."""
    plain = server_records(n_steps=40)
    auto = server_records(n_steps=40, kinds=lambda i: ["lean", 1, i % 10 == 9], late_every=10,
                          late_extra=0.004)
    t = step_trace.analyze(plain)["time_by_category"]
    assert t["prefills"] == {"steps": 1, "ms": pytest.approx(40.0)}
    assert t["3 steps after each prefill"] == {"steps": 3, "ms": pytest.approx(15.0)}
    assert t["other decode steps"] == {"steps": 37, "ms": pytest.approx(185.0)}
    assert t["other decode steps: plain"] == t["other decode steps"]
    a = step_trace.analyze(auto)["time_by_category"]
    # steps 9, 19, 29, 39
    assert a["other decode steps: lean probe"] == {"steps": 4, "ms": pytest.approx(28.0)}
    assert a["other decode steps: lean"] == {"steps": 33, "ms": pytest.approx(165.0)}
    assert step_trace.main(write_traces(tmp_path, plain=plain, auto=auto)) == 0
    lines = {line[:34].strip(): line[34:].split() for line in capsys.readouterr().out.splitlines()}
    assert lines["prefills"] == ["40.0", "[1]", "40.0", "[1]", "(+0.0)"]
    assert lines["other decode steps"] == ["185.0", "[37]", "193.0", "[37]", "(+8.0)"]
    assert lines["lean probe"] == ["0.0", "[0]", "28.0", "[4]"]
    assert lines["all steps but pauses"] == ["240.0", "[41]", "248.0", "[41]", "(+8.0)"]


def test_long_steps_are_listed_with_where_their_time_went():
    """Steps over the threshold, one by one: the first step of a new kind (batch size 3 at width 8)
    that spent its time in the n-gram step, and a later step of a kind seen before whose time is in
    no recorded function."""
    recs, t = [], 0.0
    for i in range(30):
        kind = ["spec", 8, False]
        bs = 3 if i >= 20 else 1
        spans = {"ngram_step": 0.2 if i == 20 else 0.004}
        recs.append(["R", t, t + 0.001, "DECODE", bs, *kind, spans])
        recs.append(["P", t + 0.001, t + 0.0012, 0.0002])
        t += 0.21 if i in (20, 25) else 0.005
    recs.append(["R", t, t + 0.001, "DECODE", 3, "spec", 8, False, {}])
    res = step_trace.analyze(recs, long_ms=50.0)["long_steps"]
    assert res["count"] == 2 and res["first_of_kind"] == 1
    first, later = res["steps"]
    assert first["bs"] == 3 and first["kind"] == "spec w8" and first["first_of_kind"]
    assert first["ms"] == pytest.approx(210.0) and first["spans_ms"] == {"ngram_step": 200.0}
    assert first["at_s"] == pytest.approx(19 * 0.005 + 0.005)
    assert not later["first_of_kind"] and later["spans_ms"] == {"ngram_step": 4.0}
    assert step_trace.analyze(recs, long_ms=500.0)["long_steps"]["count"] == 0
    text = step_trace.render({"a": step_trace.analyze(recs)})
    assert ("a: 2 decode steps over the long-step threshold, 1 of them the first of their kind"
            in text)
    assert "(first)" in text and "in: ngram_step 200.0" in text
    # a kernel compiled during the first one is named there, and in the per-kernel list
    built = recs + [["C", 20 * 0.005 + 0.01, 0.15, "assign_req_to_token_pool", "{(6,): 4}"]]
    res = step_trace.analyze(built, long_ms=50.0)
    assert res["long_steps"]["steps"][0]["compiled"] == [["assign_req_to_token_pool", 150.0]]
    assert res["long_steps"]["steps"][1]["compiled"] == []
    assert res["compiled"] == {"assign_req_to_token_pool": {"count": 1, "ms": 150.0,
                                                            "constexprs": ["{(6,): 4}"],
                                                           "signatures": []}}
    text = step_trace.render({"a": res})
    assert "compiled: assign_req_to_token_pool 150.0" in text
    assert ("a: Triton kernels compiled while serving (ms in all): assign_req_to_token_pool x1 "
            "(150.0)") in text
    # the scheduler went idle during the later one (it waited for requests): counted, not listed
    idle = recs + [["I", 25 * 0.005 + 0.21 + 0.1]]
    res = step_trace.analyze(idle, long_ms=50.0)["long_steps"]
    assert res["count"] == 1 and res["idle_ended"] == 1 and res["steps"][0]["bs"] == 3


def test_cli_compares_servers_and_writes_json(tmp_path, capsys):
    for name, extra in (("plain", 0.0), ("auto", 0.004)):
        d = tmp_path / name
        d.mkdir()
        (d / "steps-7.jsonl").write_text("")  # the launcher process: no steps
        recs = server_records(late_every=5, late_extra=extra)
        text = "\n".join(json.dumps(r) for r in recs) + "\n"
        if name == "auto":  # a gzipped trace reads the same
            with gzip.open(d / "steps-9.jsonl.gz", "wt") as fh:
                fh.write(text)
        else:
            (d / "steps-9.jsonl").write_text(text)
    out = tmp_path / "st.json"
    rc = step_trace.main([f"plain={tmp_path / 'plain'}", f"auto={tmp_path / 'auto'}",
                          "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "period mean" in text and "(+" in text
    data = json.loads(out.read_text())
    assert data["files"]["auto"].endswith("steps-9.jsonl.gz")
    assert data["repro_command"].startswith("python lab/step_trace.py")
    # every fifth step is late: 3 ms of host work (plain: shorter than the 5 ms step) against 3 + 4
    # ms (auto): the auto server's mean period is 0.2 * 4 = 0.8 ms longer
    delta = (data["results"]["auto"]["decode"]["period_mean"]
             - data["results"]["plain"]["decode"]["period_mean"])
    assert delta == pytest.approx(0.8, abs=1e-6)


def test_cli_errors_on_missing_or_bad_traces(tmp_path, capsys):
    assert step_trace.main([f"x={tmp_path / 'nope'}"]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert step_trace.main([f"x={tmp_path / 'empty'}"]) == 2
    assert "FASTVERIFY_STEP_TRACE" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('["R", 1.0, 1.1, "DECODE", 1]\n{"x": 1}\n')
    assert step_trace.main([f"x={bad}"]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err


def test_segments_split_loads_and_one_is_analyzed_alone(tmp_path, capsys):
    """Two loads a client ran one after the other (a 0.3 s gap between them): --segments lists them,
    and --segment keeps one, so two servers are compared on the same load."""
    fast = server_records(n_steps=50, period=0.004, busy=0.002)
    slow = server_records(n_steps=60, period=0.006, busy=0.002)
    shift = fast[-1][1] + 0.3 - slow[0][1]
    for r in slow:  # launch and result records only (no collections here): start and end times move
        r[1] += shift
        r[2] += shift
    # compiled in the second
    recs = fast + slow + [["C", slow[5][1] + 0.0002, 0.15, "some_kernel", {}, []]]
    segs = step_trace.segments(recs)
    assert [n for _, _, n in segs] == [52, 62]  # prefill + 50 steps + the closing launch; then 62
    second = step_trace.in_window(recs, segs[1][0], segs[1][1])
    assert [r[3] for r in second if r[0] == "C"] == ["some_kernel"]
    assert not any(r[0] == "C" for r in step_trace.in_window(recs, segs[0][0], segs[0][1]))
    d = step_trace.analyze(second)["decode"]
    assert d["steps"] == 60 and d["period_median"] == pytest.approx(6.0)
    path = tmp_path / "steps-3.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert step_trace.main([f"a={path}", "--segments"]) == 0
    listed = capsys.readouterr().out
    assert "2 stretches" in listed and "62 launches" in listed
    out = tmp_path / "one.json"
    assert step_trace.main([f"a={path}", f"b={path}", "--segment", "a:1", "--segment", "0",
                            "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["results"]["a"]["decode"]["period_median"] == pytest.approx(6.0)
    # the unlabelled index: 0
    assert data["results"]["b"]["decode"]["period_median"] == pytest.approx(4.0)
    assert data["files"]["a"].endswith("stretch 1")
    capsys.readouterr()
    assert step_trace.main([f"a={path}", "--segment", "5"]) == 2
    assert "no stretch 5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        step_trace.main([f"a={path}", "--segment", "a:x"])


def test_steps_compared_per_batch_size_and_kind(tmp_path, capsys):
    """A plain server at bs 1 (5 ms) and bs 4 (6 ms); auto's lean steps 1 % slower at bs 4
    only, its spec steps rarer than the table's minimum at bs 1. Each row is against the
    baseline at its own batch size."""
    def plain():
        return (server_records(n_steps=150, period=0.005)
                + server_records(n_steps=150, period=0.006, bs=4, t0=5.0))

    def lean(i):
        return ["lean", 1, False]

    def some_spec(i):
        return ["spec", 8, False] if i % 10 == 0 else ["lean", 1, False]
    auto = (server_records(n_steps=150, period=0.005, kinds=some_spec)
            + server_records(n_steps=150, period=0.00606, bs=4, t0=5.0, kinds=lean))
    groups = {(g["bs"], g["kind"]): g for g in step_trace.analyze(auto)["by_bs_kind"]}
    assert {g["sampling"] for g in step_trace.analyze(auto)["by_bs_kind"]} == {""}  # not recorded
    # 15 spec steps at bs 1: under the table's minimum
    assert set(groups) == {(1, "lean"), (4, "lean")}
    assert groups[(4, "lean")]["period_median"] == pytest.approx(6.06)
    assert groups[(1, "lean")]["steps"] == 135
    assert step_trace.main(write_traces(tmp_path, plain=plain(), auto=auto)) == 0
    table = by_bs_table(capsys)
    assert table[0][:5] == ["plain", "1", "-", "plain", "150"]
    assert table[1][:5] == ["auto", "1", "-", "lean", "135"] and table[1][6:8] == ["(+0.0", "%)"]
    assert (table[3][:5] == ["auto", "4", "-", "lean", "150"]
            and table[3][5:8] == ["6.060", "(+1.0", "%)"])


def test_greedy_and_sampled_steps_are_compared_apart(tmp_path, capsys):
    """The plain server ran a greedy load (4.5 ms steps) and a sampled one (4.7 ms: the sampler's
    softmax and draw); auto ran its lean steps on the sampled load only (speculating on the greedy
    one), at 4.7 ms. Pooled, auto would look 2 % slower than the plain server's mixed steps; by
    sampling it is even with the plain server's sampled steps, and auto's few greedy steps fall
    under the table's minimum."""
    plain = (server_records(n_steps=300, period=0.0045, sampling="greedy")
             + server_records(n_steps=300, period=0.0047, t0=5.0, sampling="sampled"))
    auto = (server_records(n_steps=40, period=0.0045, sampling="greedy",
                           kinds=lambda i: ["spec", 8, False])
            + server_records(n_steps=300, period=0.0047, t0=5.0, sampling="sampled",
                             kinds=lambda i: ["lean", 1, False]))
    groups = {(g["bs"], g["sampling"], g["kind"]): g
              for g in step_trace.analyze(plain)["by_bs_kind"]}
    assert set(groups) == {(1, "greedy", "plain"), (1, "sampled", "plain")}
    assert groups[(1, "sampled", "plain")]["period_median"] == pytest.approx(4.7)
    assert step_trace.main(write_traces(tmp_path, plain=plain, auto=auto)) == 0
    table = by_bs_table(capsys)[:3]
    assert table[0][:5] == ["plain", "1", "greedy", "plain", "300"]
    assert table[1][:5] == ["plain", "1", "sampled", "plain", "300"]
    assert (table[2][:5] == ["auto", "1", "sampled", "lean", "300"]
            and table[2][5:8] == ["4.700", "(+0.0", "%)"])


# ---- the device side of each step (E records)
# -------------------------------------------------------------

class FakeGpu:
    """A forward stream that runs each launched step for `step_ms` of device time, starting when the
    previous one ended or when the host launched it, whichever is later; events read its clock.
    `host` is the fake host clock (s), so a host that launches late leaves the stream idle."""

    def __init__(self, host, step_ms):
        self.host, self.step_ms = host, step_ms
        self.busy_until = 0.0  # ms on the device clock
        self.recorded = []  # (event, stream) in order

    def event_cls(self):
        gpu = self

        class Event:
            created = 0

            def __init__(self, enable_timing=False):
                assert enable_timing
                Event.created += 1
                self.at = None

            def record(self, stream=None):
                gpu.recorded.append((self, stream))
                self.at = max(gpu.busy_until, 1000.0 * gpu.host())  # when the stream reaches it

            def query(self):
                return self.at is not None and self.at <= 1000.0 * gpu.host()

            def elapsed_time(self, other):
                assert self.query() and other.query(), "elapsed_time of an event not passed yet"
                return other.at - self.at

            def synchronize(self):
                pass

        return Event

    # device work (default: a whole step's), queued behind what was launched before
    def launch(self, ms=None):
        self.busy_until = (max(self.busy_until, 1000.0 * self.host())
                           + (self.step_ms if ms is None else ms))


def test_gpu_marks_tell_device_time_from_a_late_host(tmp_path):
    """Each step 4 ms on the device; the host launches each step 1 ms after the previous launch,
    then waits for the previous step, except every 5th step, where it comes 2 ms after the device
    went idle. The E records give each step's span 4 ms, the gap 0 while the host is ahead and 2 ms
    where it came late; events are reused."""
    clock = Clock()
    gpu = FakeGpu(clock, step_ms=4.0)
    Event = gpu.event_cls()

    class Scheduler:
        forward_stream = "forward"
        draft_worker = None

        def run_batch(self, batch):
            gpu.launch()
            clock.advance(0.001)

        def process_batch_result(self, batch, result):
            pass

    trace = steptrace.StepTrace(str(tmp_path / "steps-5.jsonl"), clock=clock,
                                gpu=steptrace.GpuMarks(Event))
    steptrace.instrument(Scheduler, Event, trace)
    try:
        s = Scheduler()
        for i in range(20):
            s.run_batch(batch(bs=1))
            # the host waits for the previous step (overlap: one step in
            # flight); now and then it is late
            clock.t = max(clock.t, (gpu.busy_until - gpu.step_ms) / 1000.0)
            if i % 5 == 4:
                clock.t = gpu.busy_until / 1000.0 + 0.002
    finally:
        gc.callbacks.remove(trace.on_gc)
    e = [r for r in trace.records if r[0] == "E"]
    starts = [r[1] for r in trace.records if r[0] == "R"]
    assert len(e) >= 15 and [r[1] for r in e] == starts[:len(e)]
    assert all(stream == "forward" for _, stream in gpu.recorded)
    assert all(r[2] == pytest.approx(4.0) for r in e)
    gaps = [r[3] for r in e]
    assert [i for i, g in enumerate(gaps) if g > 0.1] == [i for i in range(len(e)) if i % 5 == 4]
    assert all(g == pytest.approx(2.0) for g in gaps if g > 0.1)
    assert Event.created <= 8  # read events are recorded again, not created anew


def test_gpu_marks_split_the_span_into_forward_sample_and_rest(tmp_path, monkeypatch):
    """A step of 0.5 ms of other device work, then the model's forward (3 ms) and the sampler (0.5
    ms), both wrapped: each E record carries forward 3.0 and sample 0.5, and the analysis puts 0.5
    ms in the rest. Calls outside a step (a warm-up before serving) record nothing."""
    clock = Clock()
    gpu = FakeGpu(clock, step_ms=4.0)
    Event = gpu.event_cls()
    helpers = types.ModuleType("fv_gpu_helpers")

    class Runner:
        def forward(self):
            gpu.launch(3.0)

        def sample(self):
            gpu.launch(0.5)

    helpers.Runner = Runner
    monkeypatch.setitem(sys.modules, "fv_gpu_helpers", helpers)
    runner = Runner()

    class Scheduler:
        draft_worker = None

        def run_batch(self, batch):
            gpu.launch(0.5)
            runner.forward()
            runner.sample()
            clock.advance(0.001)

        def process_batch_result(self, batch, result):
            clock.t = max(clock.t, (gpu.busy_until - gpu.step_ms) / 1000.0)

    trace = steptrace.StepTrace(str(tmp_path / "steps-7.jsonl"), clock=clock,
                                gpu=steptrace.GpuMarks(Event))
    trace.span_targets = ()
    trace.gpu_span_targets = (("fv_gpu_helpers", "Runner.forward", "forward"),
                              ("fv_gpu_helpers", "Runner.sample", "sample"),
                              ("fv_gpu_helpers", "Runner.no", "x"))
    steptrace.instrument(Scheduler, Event, trace)
    try:
        s = Scheduler()
        for _ in range(12):
            s.run_batch(batch(bs=1, greedy=False))
            s.process_batch_result(None, None)
        n_recorded = len(gpu.recorded)
        runner.forward()  # outside a step: no events
        assert len(gpu.recorded) == n_recorded
    finally:
        gc.callbacks.remove(trace.on_gc)
    assert trace.install_spans() == []  # wrapped once
    e = [r for r in trace.records if r[0] == "E"]
    assert len(e) >= 9  # (the last steps: read once a later step's first mark has passed)
    assert all(r[2] == pytest.approx(4.0)
               and r[4] == {"forward": pytest.approx(3.0), "sample": pytest.approx(0.5)} for r in e)
    d = step_trace.analyze(trace.records)["decode"]
    assert (d["gpu_forward_median"] == pytest.approx(3.0)
            and d["gpu_sample_median"] == pytest.approx(0.5))
    assert d["gpu_rest_median"] == pytest.approx(0.5)


def test_gpu_marks_are_off_unless_asked(tmp_path, monkeypatch):
    calls = []

    class Event:
        def __init__(self, enable_timing=False):
            calls.append("created")

        def record(self, stream=None):
            calls.append("record")

        def synchronize(self):
            pass

    clock = Clock()
    Scheduler, _ = make_classes(clock)
    trace = steptrace.StepTrace(str(tmp_path / "steps-6.jsonl"), clock=clock)
    steptrace.instrument(Scheduler, Event, trace)
    try:
        Scheduler().run_batch(batch())
    finally:
        gc.callbacks.remove(trace.on_gc)
    assert calls == [] and [r[0] for r in trace.records] == ["R"]


def with_device(recs, span_ms, gap_ms=lambda i: 0.0):
    """E records for every launch of `recs`: span_ms(i), gap_ms(i) for the i-th launch."""
    out = list(recs)
    for i, r in enumerate(r for r in recs if r[0] == "R"):
        out.append(["E", r[1], span_ms(i), gap_ms(i)])
    return out


def test_device_side_per_batch_size(tmp_path, capsys):
    """Both servers' steps last 4.6 ms on the host clock; auto's device span is 25 us longer
    and its gaps 0, the plain server's span shorter by as much with a 25 us gap every step: the
    same period, told apart."""
    plain = with_device(server_records(n_steps=200, period=0.0046, sampling="sampled"),
                        span_ms=lambda i: 4.575, gap_ms=lambda i: 0.025)
    auto = with_device(server_records(n_steps=200, period=0.0046, sampling="sampled",
                                      kinds=lambda i: ["lean", 1, False]), span_ms=lambda i: 4.6)
    d = step_trace.analyze(plain)["decode"]
    assert (d["gpu_span_median"] == pytest.approx(4.575)
            and d["gpu_gap_mean"] == pytest.approx(0.025))
    assert d["gpu_gap_share"] == 1.0 and step_trace.analyze(auto)["decode"]["gpu_gap_share"] == 0.0
    assert step_trace.main(write_traces(tmp_path, plain=plain, auto=auto)) == 0
    out = capsys.readouterr().out
    assert "gpu span median" in out and "gpu gap > 5 us (share)" in out
    table = by_bs_table(capsys, out)
    assert table[1][:5] == ["auto", "1", "sampled", "lean", "200"]
    assert (table[1][-4:] == ["4.600", "(+0.5", "%)", "0.000"]
            and table[0][-2:] == ["4.575", "0.025"])


def test_traces_without_device_side_print_no_device_columns(tmp_path, capsys):
    plain = server_records(n_steps=150, sampling="sampled")
    assert "gpu_span_median" not in step_trace.analyze(plain)["decode"]
    assert step_trace.main(write_traces(tmp_path, plain=plain)) == 0
    assert "gpu" not in capsys.readouterr().out


def test_slow_stretches_are_found_and_isolated_long_steps_are_not(tmp_path, capsys):
    """300 steps of 4.6 ms with 80 of 5.6 ms in a row from step 100: one slow stretch holding the 80
    ms those steps lost; a long step every 10th (1 ms more, 2 % a window) makes none."""
    def periods(i):
        return 0.0056 if 100 <= i < 180 else 0.0046
    recs, t = [["R", 0.0, 0.002, "EXTEND", 1, None, None, None]], 0.04
    for i in range(300):
        recs.append(["R", t, t + 0.001, "DECODE", 1, None, None, None, {}, "sampled"])
        recs.append(["P", t + 0.001, t + 0.002, 0.001])
        t += periods(i)
    recs.append(["R", t, t + 0.001, "DECODE", 1, None, None, None, {}, "sampled"])
    slow = step_trace.analyze(recs)["slow_stretches"]
    assert slow["count"] == 1
    (s,) = slow["stretches"]
    # the windows reaching into the slow run from either side (more than 5 % over: 12+ of
    # their 50 steps slow) widen the stretch by up to 38 steps each way; what it holds is the
    # 80 ms the slow steps lost
    assert 80 <= s["steps"] <= 80 + 2 * 38 and s["over_ms"] == pytest.approx(80.0, abs=0.5)
    assert slow["in_stretches_ms"] == pytest.approx(slow["total_over_ms"], abs=0.5)
    # 3 + 2.6 ms
    spiky = server_records(n_steps=300, period=0.0046, late_every=10, late_extra=0.0026)
    res = step_trace.analyze(spiky)
    assert res["decode"]["period_max"] == pytest.approx(5.6) and res["slow_stretches"]["count"] == 0
    assert step_trace.main(write_traces(tmp_path, slow=recs)) == 0
    assert "1 slow stretch (50-step windows" in capsys.readouterr().out
