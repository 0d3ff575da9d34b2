"""Host time of the plain path's per-step work on this machine, with the CPU tests' stand-ins
(tests/test_plain_path.py: a scheduler, a batch of ``--bs`` requests in the middle of a stretch, a
target whose forward returns at once), so that what is measured is the glue's own Python.

    python lab/path_host_time.py [--bs 4] [--number 20000] [--json out.json]

Per call, the best of five repeats (timeit): `plain_path.choose_path` in the middle of a stretch
(what every step on the path pays before its decode preparation), `plain_path.step` around the
stand-in forward, and, as the baseline run in the same invocation, the two constructs those
functions used before: an import statement run inside the function, and the swap of the runner's
algorithm through `verify_runtime.plain_algorithm` (a generator context manager) instead of one
try/finally. Absolute times are this host's only; on the GPU machine the step tracer
(lab/step_trace.py) measures the step itself.
"""
import argparse
import json
import os
import platform
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests")]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bs", type=int, default=4, help="requests in the batch (default 4)")
    ap.add_argument("--number", type=int, default=20000, help="calls per repeat (default 20000)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)

    import test_plain_path as harness
    from types import SimpleNamespace

    from fastverify.glue import plain_path
    from fastverify.glue.verify_runtime import plain_algorithm

    w, state = harness._state(Path(tempfile.mkdtemp()), stretch_from_now=10 ** 6)
    books = harness.Books([[1, 2, 3]] * a.bs, "0.5.16")
    harness._run_steps(w, state, books, 3)
    sched, batch = harness._scheduler(w, books), books.batch
    assert batch.spec_algorithm.is_none(), "the stand-in batch did not reach the plain path"
    state.stretch_len = 10 ** 12  # no lookup comes due: the middle of a stretch
    w.target_worker = SimpleNamespace(forward_batch_generation=lambda b: "result")
    mr = w.model_runner

    def in_function_import():
        from fastverify.glue.auto import _plain_capable  # noqa: F401

    def generator_swap():
        with plain_algorithm(mr):
            pass

    def inline_swap():
        saved = mr.spec_algorithm
        mr.spec_algorithm = type(saved).NONE
        try:
            pass
        finally:
            mr.spec_algorithm = saved

    def module_name():
        return plain_path._plain_capable

    cases = [
        ("choose_path, middle of a stretch", lambda: plain_path.choose_path(sched, batch)),
        ("step around the forward", lambda: plain_path.step(w, batch, state)),
        ("baseline: import statement in a function", in_function_import),
        ("  now: a module-level name", module_name),
        ("baseline: plain_algorithm (generator)", generator_swap),
        ("  now: one try/finally", inline_swap),
    ]
    rows = []
    for name, fn in cases:
        best = min(timeit.repeat(fn, number=a.number, repeat=5)) / a.number * 1e6
        rows.append({"what": name, "us_per_call": round(best, 3)})
    env = {"cpu": cpu_name(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "bs": a.bs, "number": a.number}
    print(f"# plain path host time per call (best of 5 x {a.number}), {env['cpu']}, "
          f"Python {env['python']}, bs {a.bs}")
    for r in rows:
        print(f"{r['us_per_call']:9.3f} us  {r['what']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"environment": env, "rows": rows,
                       "repro_command": "python lab/path_host_time.py " + " ".join(
                           sys.argv[1:] if argv is None else argv)}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
