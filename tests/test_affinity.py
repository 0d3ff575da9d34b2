"""fastverify.affinity: the CPU list, the choice per GPU, the pinned thread, and the hook on the real scheduler."""
import importlib
import os
import sys
import threading

import pytest

from fastverify import affinity

linux = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux thread affinity")


def test_cpu_lists_parse_and_bad_ones_are_refused():
    assert affinity.parse_cpus("3,17") == [3, 17]
    assert affinity.parse_cpus(" 0-2, 8 ") == [0, 1, 2, 8]
    for bad in ("", " , ", "a,b", "5-3", "-1"):
        with pytest.raises(ValueError):
            affinity.parse_cpus(bad)


def test_each_gpu_gets_its_cpu_and_more_gpus_than_cpus_wrap_around():
    assert [affinity.cpu_for([5, 9], i) for i in range(4)] == [5, 9, 5, 9]


def test_a_cpu_outside_the_process_is_left_alone():
    calls = []
    assert not affinity.pin_current_thread(7, setaffinity=lambda *a: calls.append(a), allowed={0, 1})
    assert calls == []
    assert affinity.pin_current_thread(1, setaffinity=lambda *a: calls.append(a), allowed={0, 1})
    assert calls == [(0, {1})]


@linux
def test_only_the_calling_thread_is_pinned():
    cpus = sorted(os.sched_getaffinity(0))
    target = cpus[-1]
    seen = {}

    def worker():
        seen["pinned"] = affinity.pin_current_thread(target)
        seen["inside"] = os.sched_getaffinity(0)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"pinned": True, "inside": {target}}
    assert sorted(os.sched_getaffinity(0)) == cpus  # this thread (and so the process's others) unchanged


@linux
def test_the_wrapped_event_loop_runs_pinned_and_returns_what_the_loop_returns():
    cpus = sorted(os.sched_getaffinity(0))
    seen = {}

    def loop(scheduler, x):
        seen["cpus"] = os.sched_getaffinity(0)
        return (scheduler, x)

    wrapped = affinity.wrap_event_loop(loop, [cpus[0], cpus[-1]], device_index=lambda: 1)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", wrapped("s", 3)))
    t.start()
    t.join()
    assert out["r"] == ("s", 3) and seen["cpus"] == {cpus[-1]}
    assert wrapped.__wrapped__ is loop


def test_the_hook_wraps_the_real_schedulers_event_loop(monkeypatch):
    """On the installed SGLang: importing its scheduler after the hook leaves run_event_loop wrapped."""
    pytest.importorskip("sglang")
    name = affinity.SCHEDULER_MODULE
    monkeypatch.delitem(sys.modules, name, raising=False)
    before = list(sys.meta_path)
    try:
        assert affinity.install_import_hook({affinity.ENV: "0"})
        module = importlib.import_module(name)
    finally:
        sys.meta_path[:] = before
        sys.modules.pop(name, None)  # the next importer gets an unwrapped module
    assert hasattr(module.Scheduler.run_event_loop, "__wrapped__")
    assert not affinity.install_import_hook({})
    with pytest.raises(ValueError):
        affinity.install_import_hook({affinity.ENV: "x"})
