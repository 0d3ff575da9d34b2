"""The common tail of the lab's launchers (idcheck.py, native_ops.py, draftlog.py): each installs
its hook when imported as the main module (and again as ``__mp_main__`` in the processes the
multiprocessing start method "spawn" starts), then hands its arguments to SGLang's server.

The server module runs under the name ``__main__`` while ``sys.modules["__main__"]`` stays the
launcher: "spawn" starts each child from the file of ``sys.modules["__main__"]``, so with the
server module swapped in there (``runpy``'s ``alter_sys``) the children would import SGLang's
``launch_server.py`` instead of the launcher and run without its hook."""
import runpy
import sys


def serve(module: str = "sglang.launch_server") -> None:
    """Run ``python -m MODULE`` with this process's arguments, the launcher left as the main
    module of the processes it spawns."""
    sys.argv = [module] + sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=False)
