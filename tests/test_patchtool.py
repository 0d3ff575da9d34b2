"""The patch-series tool on a synthetic SGLang tree (standard library + the patch program only).

The fake tree has a dist-info with METADATA and a pip-style RECORD, and a series of three patches:
0001 edits sglang/a.py, 0002 edits a.py again (stacked on 0001) and two hunks of sglang/sub/b.py,
0003 creates sglang/newpkg/new_mod.py in a folder that does not exist upstream.
"""
from __future__ import annotations

import base64
import difflib
import hashlib
import io
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from fastverify import cli, patchtool, pins
from fastverify.patchtool import DriftError, PatchToolError

ROOT = Path(__file__).resolve().parents[1]
VERSION = "9.9.1"

A0 = [f"a_{i} = {i}\n" for i in range(1, 41)]
A1 = A0[:5] + ["inserted_by_0001 = True\n"] + A0[5:]
A2 = [("a_30 = 'changed by 0002'\n" if line == "a_30 = 30\n" else line) for line in A1]
B0 = [f"def b_{i}():\n    return {i}\n" for i in range(1, 16)]
B0 = "".join(B0).splitlines(keepends=True)  # 30 lines
B2 = list(B0)
B2[2] = "def b_2_renamed():\n"
B2[24] = "    return 'hunk two'\n"
NEW = ["def added():\n", "    return 'new module'\n"]
UNTOUCHED = {"sglang/__init__.py": "", "sglang/c.txt": "leave me alone\n",
             "sglang/sub/__init__.py": ""}


def _diff(old, new, path, created=False):
    src = "/dev/null" if created else f"a/{path}"
    return "".join(difflib.unified_diff(old, new, fromfile=src, tofile=f"b/{path}"))


def _patch_text(subject, *diffs):
    return (f"From: sglang-fastverify\nSubject: [PATCH] {subject}\n\nWhy: test.\nTargets: SGLang "
            f"{VERSION}\nSwitched on by: always\n---\n" + "".join(diffs))


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_tree(root: Path, version=VERSION) -> Path:
    files = dict(UNTOUCHED)
    files["sglang/a.py"] = "".join(A0)
    files["sglang/sub/b.py"] = "".join(B0)
    rows = []
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        rows.append(f"{rel},{_hash(text.encode())},{len(text.encode())}")
    dist = root / f"sglang-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.4\nName: sglang\nVersion: "
                                   f"{version}\n\nlong text\n")
    rows.append(f"sglang-{version}.dist-info/METADATA,,")
    rows.append(f"sglang-{version}.dist-info/RECORD,,")
    (dist / "RECORD").write_text("\n".join(rows) + "\n")
    return root


def make_series(patches_dir: Path, version=VERSION, extra_series_line=None) -> Path:
    d = patches_dir / f"sglang-{version}"
    d.mkdir(parents=True)
    (d / "0001-first.patch").write_text(_patch_text("first", _diff(A0, A1, "sglang/a.py")))
    (d / "0002-second.patch").write_text(_patch_text(
        "second", _diff(A1, A2, "sglang/a.py"), _diff(B0, B2, "sglang/sub/b.py")))
    (d / "0003-new-module.patch").write_text(_patch_text(
        "new module", _diff([], NEW, "sglang/newpkg/new_mod.py", created=True)))
    lines = ["# test series", "0001-first.patch", "0002-second.patch", "",
             "0003-new-module.patch  # creates"]
    if extra_series_line:
        lines.append(extra_series_line)
    (d / "series").write_text("\n".join(lines) + "\n")
    return patches_dir


@pytest.fixture
def env(tmp_path):
    tree = make_tree(tmp_path / "site")
    patches_dir = make_series(tmp_path / "patches")
    pins_file = tmp_path / "pins.txt"
    pins_file.write_text(f"# test pins\n{VERSION} torch_pin=2.0\n9.9.2\n")
    out = io.StringIO()
    kw = dict(sglang_dir=str(tree), patches_dir=patches_dir, pins_file=pins_file,
              say=patchtool.Reporter(out=out))
    return tree, patches_dir, pins_file, out, kw


def snapshot(root: Path) -> dict:
    """Every file (bytes) and folder under root."""
    snap = {}
    for p in sorted(root.rglob("*")):
        snap[p.relative_to(root).as_posix()] = p.read_bytes() if p.is_file() else "<dir>"
    return snap


def cli_args(kw, action, *extra):
    return ["patches", action, "--sglang-dir", kw["sglang_dir"], "--patches-dir",
            str(kw["patches_dir"]), "--pins", str(kw["pins_file"]), *extra]


# --------------------------------------------------------------------------------------------- pins

def test_pins_parse_and_unsupported(tmp_path):
    parsed = pins.parse_pins("# c\n0.5.16 torch_pin=2.11.0 x=y  # tail\n\n0.5.23\n")
    assert list(parsed) == ["0.5.16", "0.5.23"]
    assert parsed["0.5.16"].facts == {"torch_pin": "2.11.0", "x": "y"}
    with pytest.raises(pins.PinsError, match=r"pins.txt:2: expected key=value"):
        pins.parse_pins("0.1\n0.2 novalue\n")
    with pytest.raises(pins.PinsError, match="listed twice"):
        pins.parse_pins("0.1\n0.1\n")
    f = tmp_path / "p.txt"
    f.write_text("1.0\n2.0\n")
    with pytest.raises(pins.PinsError,
                       match=r"SGLang 3\.0 is not supported; supported versions: 1\.0, 2\.0"):
        pins.pin_for("3.0", f)


def test_repo_pins_have_a_series_each():
    for version in pins.supported_versions():
        assert (ROOT / "patches" / f"sglang-{version}" / "series").is_file(), version
        patchtool.load_series(version)  # every named patch exists and parses


# -------------------------------------------------------------------------------------------- apply

def test_apply_then_reapply_is_a_noop(env):
    tree, _, _, out, kw = env
    assert patchtool.cmd_apply(**kw) == 0
    assert (tree / "sglang/a.py").read_text() == "".join(A2)
    assert (tree / "sglang/sub/b.py").read_text() == "".join(B2)
    assert (tree / "sglang/newpkg/new_mod.py").read_text() == "".join(NEW)
    assert "applied 0003-new-module.patch" in out.getvalue()
    before = snapshot(tree)
    mtimes = {p: p.stat().st_mtime_ns for p in tree.rglob("*") if p.is_file()}
    assert patchtool.cmd_apply(**kw) == 0
    assert snapshot(tree) == before
    assert {p: p.stat().st_mtime_ns for p in tree.rglob("*") if p.is_file()} == mtimes
    assert "nothing to do: all 3 patch(es) already applied" in out.getvalue()


def test_apply_completes_a_partly_applied_series(env):
    tree, patches_dir, _, out, kw = env
    subprocess.run(["patch", "-p1", "-s", "-d", str(tree), "-i",
                    str(patches_dir / f"sglang-{VERSION}" / "0002-second.patch")], check=False)
    # 0002 was made on top of 0001 but applies by offset; 0001 and 0003 are still missing
    assert patchtool.cmd_apply(**kw) == 0
    assert (tree / "sglang/a.py").read_text() == "".join(A2)
    assert "done: 2 applied, 1 were already applied" in out.getvalue()


def test_revert_restores_upstream_byte_for_byte(env):
    tree, _, _, out, kw = env
    pristine = snapshot(tree)
    mode = (tree / "sglang/a.py").stat().st_mode
    patchtool.cmd_apply(**kw)
    assert patchtool.cmd_revert(**kw) == 0
    assert snapshot(tree) == pristine  # also: new_mod.py and its new folder are gone
    assert (tree / "sglang/a.py").stat().st_mode == mode
    # only 2 touched files are in RECORD
    assert "3/3 touched file(s) match RECORD" not in out.getvalue()
    assert "2/2 touched file(s) match RECORD byte for byte" in out.getvalue()
    record = patchtool.read_record(next(tree.glob("*.dist-info")) / "RECORD")
    for rel, want in record.items():
        assert patchtool.record_hash((tree / rel).read_bytes()) == want, rel
    assert patchtool.cmd_revert(**kw) == 0
    assert "nothing to do" in out.getvalue()


def test_pycache_of_touched_modules_is_removed(env):
    tree, _, _, _, kw = env
    cache = tree / "sglang" / "__pycache__"
    cache.mkdir()
    (cache / "a.cpython-311.pyc").write_bytes(b"stale")
    (cache / "c.cpython-311.pyc").write_bytes(b"keep")
    patchtool.cmd_apply(**kw)
    assert not (cache / "a.cpython-311.pyc").exists()
    assert (cache / "c.cpython-311.pyc").exists()


# -------------------------------------------------------------------------------------------- drift

def test_drift_names_patch_file_and_hunk_and_changes_nothing(env):
    tree, _, _, _, kw = env
    text = (tree / "sglang/sub/b.py").read_text().replace("    return 13\n", "    return 1300\n")
    (tree / "sglang/sub/b.py").write_text(text)  # line 26: context of 0002's second hunk in b.py
    before = snapshot(tree)
    with pytest.raises(DriftError) as e:
        patchtool.cmd_apply(**kw)
    msg = str(e.value)
    assert "patch 0002-second.patch no longer applies" in msg
    assert "sglang/sub/b.py: hunk #2" in msg
    assert "0001" not in msg and "sglang/a.py" not in msg
    assert "Nothing changed" in msg
    assert snapshot(tree) == before
    with pytest.raises(DriftError, match="0002-second.patch"):
        patchtool.cmd_check(**kw)


def test_drift_after_apply_blocks_revert(env):
    tree, _, _, out, kw = env
    patchtool.cmd_apply(**kw)
    p = tree / "sglang/a.py"
    # context of 0002's a.py hunk
    p.write_text(p.read_text().replace("a_29 = 29\n", "a_29 = 'edited'\n"))
    before = snapshot(tree)
    with pytest.raises(DriftError, match=r"(?s)0002-second.patch.*sglang/a.py: hunk #1"):
        patchtool.cmd_revert(**kw)
    assert snapshot(tree) == before
    assert patchtool.cmd_status(**kw) == 1
    assert "0002-second.patch: drifted" in out.getvalue()
    assert "0001-first.patch: applied" in out.getvalue()


def test_half_applied_patch_is_reported_per_hunk(env):
    tree, _, _, _, kw = env
    patchtool.cmd_apply(**kw)
    p = tree / "sglang/sub/b.py"
    # undo hunk #2 only
    p.write_text(p.read_text().replace("    return 'hunk two'\n", "def b_13():\n"))
    with pytest.raises(DriftError) as e:
        patchtool.cmd_apply(**kw)
    msg = str(e.value)
    assert "partly applied, this hunk is missing: sglang/sub/b.py: hunk #2" in msg
    assert "partly applied, this hunk is in place: sglang/sub/b.py: hunk #1" in msg


def test_missing_file_is_drift(env):
    tree, _, _, _, kw = env
    (tree / "sglang/sub/b.py").unlink()
    with pytest.raises(DriftError, match=r"(?s)0002-second.patch.*sglang/sub/b.py: file not found"):
        patchtool.cmd_apply(**kw)
    assert (tree / "sglang/a.py").read_text() == "".join(A0)


def test_failure_half_way_restores_every_file(env, monkeypatch):
    tree, _, _, _, kw = env
    before = snapshot(tree)
    real = patchtool.run_patch
    calls = []

    def flaky(root, patch, *, reverse=False, dry_run=False):
        r = real(root, patch, reverse=reverse, dry_run=dry_run)
        if Path(root) == tree and not dry_run:
            calls.append(patch.name)
            # it did write new_mod.py (and its folder), then "fails"
            if patch.name.startswith("0003"):
                assert (tree / "sglang/newpkg/new_mod.py").exists()
                return patchtool.PatchRun(ok=False, output="simulated failure")
        return r

    monkeypatch.setattr(patchtool, "run_patch", flaky)
    with pytest.raises(DriftError,
                       match=r"(?s)0003-new-module.patch failed.*Restored every touched file"):
        patchtool.cmd_apply(**kw)
    assert calls == ["0001-first.patch", "0002-second.patch", "0003-new-module.patch"]
    assert snapshot(tree) == before


STOPS = [s for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s)]
RESTORED = r"error: interrupted by {} while applying: restored every touched file byte for byte; " \
           r"nothing changed in .*"


@pytest.mark.parametrize("name", STOPS)
def test_signal_mid_apply_restores_every_file(env, monkeypatch, capsys, name):
    """The signal arrives after 0002 is written for real: the CLI restores the tree, says so in one
    line and exits 128 + the signal number (no traceback)."""
    tree, _, _, _, kw = env
    before = snapshot(tree)
    real = patchtool.run_patch
    sig = getattr(signal, name)

    def stopped(root, patch, *, reverse=False, dry_run=False):
        r = real(root, patch, reverse=reverse, dry_run=dry_run)
        if Path(root) == tree and not dry_run and patch.name.startswith("0002"):
            assert (tree / "sglang/sub/b.py").read_text() == "".join(B2)  # half-applied now
            os.kill(os.getpid(), sig)
        return r

    monkeypatch.setattr(patchtool, "run_patch", stopped)
    assert cli.main(cli_args(kw, "apply")) == 128 + sig
    err = capsys.readouterr().err
    assert re.fullmatch(RESTORED.format(name) + r"\n", err), err
    assert snapshot(tree) == before
    assert signal.getsignal(sig) is not patchtool._raise_interrupted  # handlers put back


@pytest.mark.parametrize("name", STOPS)
def test_signal_to_a_running_apply_process(env, tmp_path, name):
    """`python -m fastverify patches apply` as its own process, stopped while `patch` runs on 0002
    in the tree (a wrapper applies it for real, says so through a file and waits)."""
    tree, _, _, _, kw = env
    before = snapshot(tree)
    bin_dir, ready = tmp_path / "bin", tmp_path / "ready"
    bin_dir.mkdir()
    wrapper = bin_dir / "patch"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'"{shutil.which("patch")}" "$@"; rc=$?\n'
        'case " $* " in *" --dry-run "*) exit $rc;; esac\n'
        f'case "$*" in *"-d {tree} "*0002-second.patch*) touch "{ready}"; exec sleep 60;; esac\n'
        "exit $rc\n")
    wrapper.chmod(0o755)
    env_vars = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                    PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.Popen([sys.executable, "-m", "fastverify", *cli_args(kw, "apply")],
                            env=env_vars, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate(timeout=60)
    assert (tree / "sglang/sub/b.py").read_text() == "".join(B2)  # half-applied at the signal
    proc.send_signal(getattr(signal, name))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + getattr(signal, name), (out, err)
    assert "Traceback" not in err and re.fullmatch(RESTORED.format(name) + r"\n", err), err
    assert snapshot(tree) == before


# ------------------------------------------------------------------------------------------- status

def test_status_classification(env):
    tree, _, _, out, kw = env
    rep = patchtool.status_report(patchtool.find_target(tree), patchtool.load_series(
        VERSION, kw["patches_dir"], kw["pins_file"]))
    assert rep.verdict == "pristine" and rep.checked == 3 and not rep.modified
    patchtool.cmd_apply(**kw)
    series = patchtool.load_series(VERSION, kw["patches_dir"], kw["pins_file"])
    rep = patchtool.status_report(patchtool.find_target(tree), series)
    assert rep.verdict == "patched by us"
    assert [s.state for s in rep.plan.states] == ["applied"] * 3
    (tree / "sglang/c.txt").write_text("someone else\n")  # untouched by any patch
    a = tree / "sglang/a.py"
    # touched, but outside our hunks
    a.write_text(a.read_text() + "# appended far from every hunk\n")
    (tree / "sglang/sub/__init__.py").unlink()
    rep = patchtool.status_report(patchtool.find_target(tree), series)
    assert rep.verdict == "modified by someone else"
    assert rep.modified == ["sglang/c.txt"]
    assert rep.missing == ["sglang/sub/__init__.py"]
    assert rep.foreign == ["sglang/a.py"]
    assert [s.state for s in rep.plan.states] == ["applied"] * 3
    assert patchtool.cmd_status(**kw) == 1
    text = out.getvalue()
    assert "modified by someone else: sglang/c.txt" in text
    assert "modified by someone else (beyond our patches): sglang/a.py" in text
    assert "missing: sglang/sub/__init__.py" in text
    # revert refuses (a.py would not match RECORD) unless told to keep the foreign change
    before = snapshot(tree)
    with pytest.raises(PatchToolError,
                       match=r"(?s)someone else modified them:\n  sglang/a.py.*--keep-foreign"):
        patchtool.cmd_revert(**kw)
    assert snapshot(tree) == before
    assert patchtool.cmd_revert(keep_foreign=True, **kw) == 0
    assert a.read_text() == "".join(A0) + "# appended far from every hunk\n"


def test_status_of_not_applied_patches(env):
    tree, _, _, out, kw = env
    assert patchtool.cmd_status(**kw) == 0
    assert "0001-first.patch: not applied" in out.getvalue()
    assert "3 of 3 file(s) no patch touches are pristine" in out.getvalue()
    assert "status: pristine (0/3 patch(es) applied)" in out.getvalue()


# ------------------------------------------------------------------------------------------- errors

def test_unsupported_version(tmp_path, env):
    _, patches_dir, pins_file, _, kw = env
    tree = make_tree(tmp_path / "other", version="1.2.3")
    with pytest.raises(PatchToolError,
                       match=r"SGLang 1\.2\.3 is not supported; supported versions: 9\.9\.1, "
                             r"9\.9\.2"):
        patchtool.cmd_apply(**dict(kw, sglang_dir=str(tree)))


def test_pinned_version_without_series(tmp_path, env):
    _, _, _, _, kw = env
    tree = make_tree(tmp_path / "other", version="9.9.2")
    with pytest.raises(PatchToolError, match=r"SGLang 9\.9\.2 is pinned but has no series file"):
        patchtool.cmd_apply(**dict(kw, sglang_dir=str(tree)))


def test_series_naming_a_missing_patch(tmp_path):
    tree = make_tree(tmp_path / "site")
    patches_dir = make_series(tmp_path / "patches", extra_series_line="0004-gone.patch")
    pins_file = tmp_path / "pins.txt"
    pins_file.write_text(f"{VERSION}\n")
    before = snapshot(tree)
    with pytest.raises(PatchToolError,
                       match=r"series:6: names 0004-gone.patch, which does not exist"):
        patchtool.cmd_apply(sglang_dir=str(tree), patches_dir=patches_dir, pins_file=pins_file,
                            say=patchtool.Reporter(out=io.StringIO()))
    assert snapshot(tree) == before


def test_patch_with_path_outside_the_package(tmp_path):
    f = tmp_path / "x.patch"
    f.write_text("--- a/python/sglang/x.py\n+++ b/python/sglang/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchToolError, match=r"'python/sglang/x.py' is not under sglang/"):
        patchtool.parse_patch(f)


def test_no_sglang_in_folder(tmp_path):
    with pytest.raises(PatchToolError, match="no SGLang package there"):
        patchtool.find_target(tmp_path)
    with pytest.raises(PatchToolError, match="no such folder"):
        patchtool.find_target(tmp_path / "nope")


def test_missing_patch_program(env, monkeypatch, capsys):
    tree, _, _, _, kw = env
    before = snapshot(tree)
    empty = tree.parent / "emptybin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(PatchToolError,
                       match=r"'patch' program \(GNU patch\) is not installed.*apt-get install "
                             r"patch"):
        patchtool.cmd_apply(**kw)
    assert cli.main(cli_args(kw, "apply")) == 2
    assert "apt-get install patch" in capsys.readouterr().err
    assert snapshot(tree) == before


def test_read_only_target(tmp_path):
    """A user who cannot write the installation gets a clear error and nothing changes."""
    base = Path(tempfile.mkdtemp(prefix="fv-ro-", dir="/tmp"))
    try:
        tree = make_tree(base / "site")
        patches_dir = make_series(base / "patches")
        (base / "pins.txt").write_text(f"{VERSION}\n")
        for p in [base, *base.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        cmd = [*cli_args(dict(sglang_dir=str(tree), patches_dir=patches_dir,
                              pins_file=base / "pins.txt"),
                         "apply")]
        # root may write anywhere: run as nobody, for whom the 0755 tree is read-only
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None or not os.access("/usr/bin/python3", os.X_OK):
                pytest.skip("running as root without setpriv and /usr/bin/python3 to drop "
                            "privileges")
            argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                    "/usr/bin/python3", "-m", "fastverify", *cmd]
        else:
            for p in [base, *base.rglob("*")]:
                p.chmod(0o555 if p.is_dir() else 0o444)
            argv = [sys.executable, "-m", "fastverify", *cmd]
        before = snapshot(tree)
        r = subprocess.run(argv, capture_output=True, text=True, cwd="/",
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "python")})
        assert r.returncode == 2, r.stdout + r.stderr
        assert "is read-only for this user; cannot write" in r.stderr
        assert "sglang/a.py" in r.stderr and "Nothing changed" in r.stderr
        assert snapshot(tree) == before
    finally:
        for p in [base, *base.rglob("*")]:
            p.chmod(stat.S_IRWXU | (p.stat().st_mode & 0o777))
        shutil.rmtree(base)


# ------------------------------------------------------------------------------------------ layouts

def test_checkout_layout(tmp_path, env):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    _, patches_dir, pins_file, out, kw = env
    co = tmp_path / "checkout"
    make_tree(co / "python")
    shutil.rmtree(next((co / "python").glob("*.dist-info")))
    (co / "python/sglang/version.py").write_text(f'__version__ = "{VERSION}"\n')
    git = ["git", "-C", str(co), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(co)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "upstream"], check=True)
    kw = dict(kw, sglang_dir=str(co))
    t = patchtool.find_target(co)
    assert (t.layout, t.version, t.root, t.record) == ("git checkout", VERSION, co / "python", None)
    assert patchtool.cmd_apply(**kw) == 0
    assert (co / "python/sglang/a.py").read_text() == "".join(A2)
    assert patchtool.cmd_status(**kw) == 0
    assert "git HEAD of" in out.getvalue() and "status: patched by us" in out.getvalue()
    (co / "python/sglang/c.txt").write_text("edited\n")
    assert patchtool.cmd_status(**kw) == 1
    assert "modified by someone else: sglang/c.txt" in out.getvalue()
    (co / "python/sglang/c.txt").write_text("leave me alone\n")
    assert patchtool.cmd_revert(**kw) == 0
    r = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, check=True)
    assert r.stdout == ""  # byte for byte what git has, and new_mod.py is gone


def test_installed_layout_found_without_importing(tmp_path, env):
    """With no --sglang-dir the tool finds the importable sglang (here: on PYTHONPATH)
    without importing it."""
    tree, _, _, _, kw = env
    (tree / "sglang/__init__.py").write_text("raise RuntimeError('imported!')\n")
    rec = next(tree.glob("*.dist-info")) / "RECORD"
    rec.write_text(rec.read_text().replace(patchtool.record_hash(b""), patchtool.record_hash(
        b"raise RuntimeError('imported!')\n"), 1))
    args = cli_args(kw, "status")
    del args[2:4]  # no --sglang-dir
    r = subprocess.run([sys.executable, "-m", "fastverify", *args], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT / 'python'}"))
    assert f"SGLang {VERSION} at site-packages {tree}" in r.stdout, r.stdout + r.stderr
    assert "imported!" not in r.stdout + r.stderr
    assert r.returncode == 0, r.stderr


def test_no_sglang_installed(tmp_path):
    py = "/usr/bin/python3"
    if not os.access(py, os.X_OK):
        pytest.skip("needs a system python3 without sglang")
    r = subprocess.run([py, "-s", "-m", "fastverify", "patches", "status"],
                       capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "python")},
                       cwd=tmp_path)
    if "SGLang" in r.stdout and "at site-packages" in r.stdout:
        pytest.skip("the system python3 has SGLang installed")
    assert r.returncode == 2
    assert "no SGLang found" in r.stderr and "--sglang-dir" in r.stderr


# ---------------------------------------------------------------------------------------- CLI, make

def test_cli_help_lists_subcommands_and_exit_codes(env, capsys):
    _, _, _, _, kw = env
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    assert "patches" in capsys.readouterr().out
    assert cli.main(cli_args(kw, "check")) == 0
    assert cli.main(cli_args(kw, "apply", "--verbose")) == 0
    assert "| patching file sglang/a.py" in capsys.readouterr().out
    assert cli.main(cli_args(kw, "status")) == 0


def test_cli_registry_imports_lazily(monkeypatch):
    monkeypatch.setitem(cli.SUBCOMMANDS, "broken",
                        cli.Subcommand("fastverify_no_such_module:add_parser", "x"))
    parser = cli.build_parser(["patches", "status"])  # the broken entry is listed, never imported
    assert "broken" in parser.format_help()
    with pytest.raises(ModuleNotFoundError):
        cli.build_parser(["broken"])


def test_cli_patches_needs_only_the_standard_library():
    code = ("import sys, fastverify.cli as c; c.build_parser(['patches']); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'sglang')]; "
            "print(bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "python")))
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def _upstream_0516(rel: str) -> bytes | None:
    """One file of pristine SGLang 0.5.16 (the unpacked wheel in .scratch, else the
    wheel in .downloads)."""
    pristine = ROOT / ".scratch/pristine/0.5.16" / rel
    if pristine.is_file():
        return pristine.read_bytes()
    for whl in sorted((ROOT / ".downloads").glob("sglang-0.5.16-*.whl")):
        with zipfile.ZipFile(whl) as z:
            return z.read(rel) if rel in z.namelist() else None
    return None


def test_make_targets_with_system_python_and_no_venv(tmp_path):
    """`make apply-patches SGLANG_DIR=...` with a plain python3 (no venv, no torch) on a 0.5.16 tree
    that holds just the upstream files the real series touches."""
    if shutil.which("make") is None or not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs make and /usr/bin/python3")
    rel_h = "sglang/jit_kernel/csrc/ngram_corpus/result.h"
    if _upstream_0516(rel_h) is None:
        pytest.skip("no SGLang 0.5.16 sources (.scratch/pristine or .downloads wheel)")
    tree = tmp_path / "sgl"
    files = {"sglang/__init__.py": _upstream_0516("sglang/__init__.py")}
    for rel in patchtool.touched_files(patchtool.load_series("0.5.16")):
        data = _upstream_0516(rel)
        if data is not None:  # files a patch creates are not upstream
            files[rel] = data
    records = []
    for rel, data in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
        records.append(f"{rel},{_hash(data)},{len(data)}\n")
    dist = tree / "sglang-0.5.16.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.4\nName: sglang\nVersion: 0.5.16\n")
    (dist / "RECORD").write_text("".join(records))
    before = snapshot(tree)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    def make(target):
        return subprocess.run(["make", "-s", "-C", str(ROOT), target, f"SGLANG_DIR={tree}",
                               "PYTHON=/usr/bin/python3"],
                              capture_output=True, text=True, env=env)

    r = make("apply-patches")
    assert r.returncode == 0, r.stdout + r.stderr
    assert b"#include <cstddef>" in (tree / rel_h).read_bytes()
    r = make("status-patches")
    assert r.returncode == 0 and "status: patched by us" in r.stdout, r.stdout + r.stderr
    r = make("check-patches")
    assert r.returncode == 0, r.stdout + r.stderr
    r = make("revert-patches")
    assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot(tree) == before
