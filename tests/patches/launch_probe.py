"""Runs `python -m sglang.launch_server ARGS` once per case (tests/patches/test_0010_*.py).

    python launch_probe.py CASES.json     ({"name": [arg, ...], ...}; prints one line PROBE <json>)

Importing SGLang takes ~10 s of CPU on the test machine, so this process imports what launch_server
imports once and then forks one child per case; each child runs the module as `python -m` does
(runpy, as __main__, sys.argv set) with its output in a file of its own, and its exit status is the
case's result. The test also runs two cases as separate `python -m sglang.launch_server` processes.
"""
import json
import os
import runpy
import sys
import tempfile
import time
import traceback

cases = json.load(open(sys.argv[1]))

import sglang.launch_server  # noqa: E402,F401  (its imports, once; the module runs in each child)

del sys.modules["sglang.launch_server"]  # runpy runs it afresh as __main__ without a warning
out = {}
for name, argv in cases.items():
    with tempfile.TemporaryFile(mode="w+") as err:
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: stdout and stderr into the file, then the module as __main__
            os.dup2(err.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.argv = ["-m", *argv]
            code = 0
            try:
                runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        err.seek(0)
        text = err.read()
    out[name] = {"rc": os.waitstatus_to_exitcode(status), "output": text[-4000:],
                 "seconds": round(time.monotonic() - t0, 2)}

# ServerArgs built in code with the dummy model path, whose resolution SGLang cuts short: the same
# rules still run (0.5.16: in __post_init__; 0.5.23: in resolve_once).
from sglang.srt.server_args import ServerArgs  # noqa: E402

try:
    sa = ServerArgs(model_path="dummy", speculative_algorithm="NGRAM",
                    speculative_ngram_verify_mode="chain", speculative_ngram_verify_widths="1,3,x")
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
    out["_dummy_in_code"] = {"accepted": True}
except ValueError as e:
    out["_dummy_in_code"] = {"error": f"{type(e).__name__}: {e}"}
print("PROBE " + json.dumps(out))
