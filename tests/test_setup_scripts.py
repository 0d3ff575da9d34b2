"""The first-hour commands: which Python the Makefile's targets use, the progress lines of the setup
scripts, the `fastverify` command of a built environment, and the demo's listing of our flags."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastverify import flags

ROOT = Path(__file__).resolve().parents[1]


def _fake(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def make_tree(tmp_path):
    """The Makefile and pins.txt in a folder of their own, with a `python3` on PATH that has no
    SGLang (it answers the Makefile's SGLang probe with 1 and otherwise says who it is)."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    tree = tmp_path / "repo"
    tree.mkdir()
    for name in ("Makefile", "pins.txt"):
        shutil.copy(ROOT / name, tree / name)
    bin_dir = tmp_path / "bin"
    _fake(bin_dir / "python3",
          'case "$*" in *find_spec*) exit 1;; esac\necho "system python3 $*"\n')
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def make(*args):
        r = subprocess.run(["make", "-s", "-C", str(tree), *args], capture_output=True, text=True,
                           env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout.strip()

    return tree, make


def test_make_uses_the_venv_demo_built(make_tree):
    tree, make = make_tree
    assert make("which-python") == "python3"  # no venv yet: the system one
    newest = flags_version = [ln.split()[0] for ln in (ROOT / "pins.txt").read_text().splitlines()
                              if ln.strip() and not ln.startswith("#")][-1]
    venv_py = _fake(tree / f".venv-{newest}" / "bin" / "python", 'echo "venv python $*"\n')
    assert make("which-python") == str(venv_py)
    for target, word in (("replay", "replay"), ("sim", "sim"), ("advise", "advise")):
        out = make(target)
        assert out.startswith(f"venv python -m fastverify {word}"), (target, out)
    assert make("advise", "ADVISE_ARGS=--tp 8") == "venv python -m fastverify advise --tp 8"
    assert make("which-python", "PYTHON=/x/python") == "/x/python"  # PYTHON given wins
    assert flags_version == newest


def test_make_picks_the_version_asked_for_then_any_venv(make_tree):
    tree, make = make_tree
    old = _fake(tree / ".venv-0.0.1" / "bin" / "python", "echo old\n")
    assert make("which-python") == str(old)  # the only environment there is
    other = _fake(tree / ".venv-0.0.2" / "bin" / "python", "echo other\n")
    assert make("which-python") == str(other)  # the newest of those there are
    assert make("which-python", "VERSION=0.0.1") == str(old)


def test_make_keeps_an_active_python_that_has_sglang(make_tree, tmp_path):
    tree, make = make_tree
    _fake(tree / ".venv-0.0.1" / "bin" / "python", "echo venv\n")
    _fake(tmp_path / "bin" / "python3", "exit 0\n")  # finds SGLang: a GPU box or an activated venv
    assert make("which-python") == "python3"


def _bash(script: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/progress.sh"; {script}'], text=True,
                          capture_output=True, env=dict(os.environ, **env), timeout=60)


def test_pip_progress_keeps_one_short_line_per_package():
    pip_output = ("Looking in links: /opt/wheels\n"
                  "Collecting numpy==2.0 (from -r r.txt)\n"
                  "  Using cached numpy-2.0.whl\n"
                  "Processing /opt/pypi/files/dill-0.4.1-py3-none-any.whl (from sglang)\n"
                  "Downloading https://files.example/t/torch-2.13.0-cp311.whl (190.4 MB)\n"
                  "Installing collected packages: numpy, dill, torch\n"
                  "Successfully installed dill-0.4.1 numpy-2.0 torch-2.13.0\n")
    r = subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/progress.sh"; pip_progress'],
                       input=pip_output, text=True, capture_output=True, timeout=60)
    assert r.stdout.splitlines() == [
        "  collecting numpy==2.0",
        "  processing dill-0.4.1-py3-none-any.whl",
        "  downloading torch-2.13.0-cp311.whl",
        "  installing the collected packages ...",
        "  installed 3 packages",
    ]


def test_heartbeat_speaks_while_a_quiet_step_runs():
    t0 = time.monotonic()
    r = _bash('heartbeat "unpacking"; sleep 2.6; heartbeat_end; say done', HEARTBEAT_S="1",
              PROGRESS_TAG="setup 9.9")
    lines = r.stdout.splitlines()
    beats = [ln for ln in lines
             if re.fullmatch(r"\[setup 9\.9\] \d+s: unpacking \(still running\)", ln)]
    assert len(beats) == 2, lines
    assert re.fullmatch(r"\[setup 9\.9\] \d+s: done", lines[-1]), lines
    assert time.monotonic() - t0 < 30
    time.sleep(1.5)  # heartbeat_end stopped it: nothing more is printed after the step


def test_setup_script_speaks_before_and_during_long_steps():
    """The long pip install runs under a heartbeat and through pip_progress (not `pip -q`), with a
    line saying what it does and how long it takes before it."""
    text = (ROOT / "scripts" / "setup_test_env.sh").read_text()
    install = text[text.index('heartbeat "installing dependencies"'):text.index("heartbeat_end\n")]
    assert "| pip_progress" in install and " -q " not in install
    before = text[:text.index('heartbeat "installing dependencies"')].rsplit("\n", 3)[-3]
    assert before.startswith('say "installing') and "min" in before, before


def test_the_venv_has_a_fastverify_command():
    """In an environment scripts/setup_test_env.sh built (the one running these tests)."""
    prefix = Path(sys.prefix)
    if not (prefix / ".fastverify-stamp").is_file():
        pytest.skip("not running in an environment built by scripts/setup_test_env.sh")
    cmd = prefix / "bin" / "fastverify"
    assert cmd.is_file() and os.access(cmd, os.X_OK), f"{cmd} missing: rerun make setup"
    r = subprocess.run([str(cmd), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "patches" in r.stdout, r.stdout + r.stderr


def test_demo_prints_our_flags_only_and_in_full():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("no SGLang here (scripts/run_tests.sh runs the suite in each pin's venv)")
    env = dict(os.environ, COLUMNS="100", PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "print_flags.py")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "the flags sglang-fastverify adds:"
    heads = [ln.split()[0] for ln in lines[1:] if re.match(r"  --", ln)]
    assert heads == list(flags.OPTIONS)  # each of ours once, in order, nothing of SGLang's
    text = " ".join(ln.strip() for ln in lines[1:])
    # whole help texts, not cut: the last words of the longest ones
    assert "Default: off (one width) (sglang-fastverify)." in text.replace("- ", "-")
    assert "reports the overhead)." in text


def test_pins_txt_says_where_the_test_torch_comes_from():
    text = (ROOT / "pins.txt").read_text()
    header = "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))
    for path in re.findall(r"(?<![\w.])((?:scripts|ci|\.ci|docs)/[\w./-]+\w)", header):
        assert (ROOT / path).exists(), f"pins.txt names {path}, which does not exist"
    assert "scripts/setup_test_env.sh" in header and "torch_test" in header
    setup = (ROOT / "scripts" / "setup_test_env.sh").read_text()
    assert 'TORCH=$(pin torch_test)' in setup and '"torch==$TORCH"' in setup


def _run_tests_with_free_kib(tmp_path, free_kib: int, versions: str):
    """scripts/run_tests.sh with a `df` first on PATH that reports ``free_kib`` free everywhere;
    VERSIONS names a release whose venv does not exist, so nothing is installed (the setup script
    of a made-up release fails at once where the guard lets it pass)."""
    shims = tmp_path / "bin"
    shims.mkdir()
    df = shims / "df"
    df.write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted'\n"
                  f"echo 'fake 999999999 1 {free_kib} 1% /'\n")
    df.chmod(0o755)
    env = dict(os.environ, PATH=f"{shims}:{os.environ['PATH']}", VERSIONS=versions,
               TMPDIR=str(tmp_path))
    return subprocess.run(["bash", str(ROOT / "scripts" / "run_tests.sh")], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_test_command_refuses_a_full_disk_before_installing(tmp_path):
    r = _run_tests_with_free_kib(tmp_path, 1024 * 1024, "0.0.1")  # 1 GiB free, 3 + 2 GiB needed
    assert r.returncode == 1
    assert "not enough disk for the tests: 1.0 GiB free" in r.stderr
    assert "setup of SGLang" not in r.stderr  # stopped before any environment was made


def test_the_test_command_goes_on_with_enough_disk(tmp_path):
    r = _run_tests_with_free_kib(tmp_path, 64 * 1024 * 1024, "0.0.1")
    assert "not enough disk" not in r.stderr
    assert "setup of SGLang 0.0.1 failed" in r.stderr  # past the guard, into the setup
