"""lab/gpu/launcher.py: a process that the served module starts with multiprocessing's "spawn"
runs the launcher's hook too (the scheduler processes of SGLang are started that way)."""
import os
import subprocess
import sys
import textwrap

LAB_GPU = os.path.join(os.path.dirname(__file__), "..", "..", "lab", "gpu")


def test_a_spawned_child_of_the_served_module_imports_the_launcher_again(tmp_path):
    (tmp_path / "fake_worker.py").write_text(textwrap.dedent("""
        import os

        def child(q):  # as SGLang's scheduler: a function of an importable module
            q.put(os.environ.get("HOOKED_IN_CHILD"))
    """))
    (tmp_path / "fake_server.py").write_text(textwrap.dedent("""
        import multiprocessing as mp
        import sys
        from fake_worker import child

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start()
            print("args", sys.argv[1:], "child", q.get(timeout=60))
            p.join()
    """))
    (tmp_path / "hook_launcher.py").write_text(textwrap.dedent("""
        import os
        import sys
        if __name__ == "__mp_main__":
            os.environ["HOOKED_IN_CHILD"] = "yes"
        if __name__ == "__main__":
            from launcher import serve
            serve("fake_server")
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.abspath(LAB_GPU)]))
    env.pop("HOOKED_IN_CHILD", None)
    out = subprocess.run([sys.executable, str(tmp_path / "hook_launcher.py"), "--port", "1"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "args ['--port', '1'] child yes" in out.stdout
