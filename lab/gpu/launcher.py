"""The common tail of the lab's launchers (idcheck.py, native_ops.py, draftlog.py): each installs
its hook when imported as the main module (and again as ``__mp_main__`` in the processes the
multiprocessing start method "spawn" starts), then hands its arguments to SGLang's server."""
import runpy
import sys


def serve() -> None:
    """Run ``python -m sglang.launch_server`` with this process's arguments."""
    sys.argv = ["sglang.launch_server"] + sys.argv[1:]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
