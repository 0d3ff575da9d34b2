"""The real patch series of the SGLang installed in the running venv, on a
pristine copy of its wheel.

Generic over whatever the series holds at run time: apply -> second apply is a no-op -> revert ->
every RECORD hash matches; a deliberately edited line of each patch's first hunk is reported as
drift naming the patch, the file and the hunk, and nothing changes; the patched tree imports and
`python -m sglang.launch_server --help` runs.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pristine import ROOT, copy_tree, installed_version
from fastverify import patchtool

VERSION = installed_version()
pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(VERSION is None,
                                 reason="no pinned SGLang installed in this interpreter")]
SERIES = patchtool.load_series(VERSION) if VERSION else []


def _quiet():
    return patchtool.Reporter(out=io.StringIO())


@pytest.fixture(scope="module")
def tree(tmp_path_factory, pristine_source):
    return copy_tree(pristine_source(VERSION), tmp_path_factory.mktemp(f"sglang-{VERSION}"))


def _touched_state(tree: Path) -> dict:
    return {rel: ((tree / rel).read_bytes() if (tree / rel).exists() else None,
                  (tree / rel).stat().st_mtime_ns if (tree / rel).exists() else None)
            for rel in patchtool.touched_files(SERIES)}


def _record_mismatches(tree: Path) -> list:
    record = patchtool.read_record(next(tree.glob("sglang-*.dist-info")) / "RECORD")
    assert len(record) > 1000  # the whole package, not an empty list
    return [rel for rel, want in record.items()
            if not (tree / rel).is_file()
            or patchtool.record_hash((tree / rel).read_bytes()) != want]


def test_apply_reapply_revert(tree):
    assert _record_mismatches(tree) == []
    assert patchtool.cmd_apply(sglang_dir=str(tree), say=_quiet()) == 0
    rep = patchtool.status_report(patchtool.find_target(tree), SERIES)
    assert [s.state for s in rep.plan.states] == ["applied"] * len(SERIES)
    assert rep.verdict == ("patched by us" if SERIES else "pristine")
    assert rep.modified == [] and rep.missing == [] and rep.foreign == []
    for p in SERIES:  # every '+' line of every patch is now in its file
        for fp in p.files:
            if not fp.deleted:
                assert (tree / fp.path).is_file(), (p.name, fp.path)

    before = _touched_state(tree)
    out = io.StringIO()
    assert patchtool.cmd_apply(sglang_dir=str(tree), say=patchtool.Reporter(out=out)) == 0
    assert "nothing to do" in out.getvalue()
    assert _touched_state(tree) == before

    assert patchtool.cmd_revert(sglang_dir=str(tree), say=_quiet()) == 0
    assert _record_mismatches(tree) == []
    for p in SERIES:
        for fp in p.files:
            if fp.created:
                assert not (tree / fp.path).exists(), fp.path
    assert patchtool.status_report(patchtool.find_target(tree), SERIES).verdict == "pristine"


def _hunk_bodies(patch: patchtool.Patch, path: str) -> list:
    """The body lines of each hunk of one file of a patch, in order."""
    lines = patch.path.read_text(encoding="utf-8").splitlines()
    hunks, inside = [], False
    for i, line in enumerate(lines):
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            inside = patchtool._strip_header_path(lines[i + 1][4:]) == path
            continue
        if not inside or line.startswith("+++ "):
            continue
        if line.startswith("@@"):
            hunks.append([])
        elif hunks and line[:1] in (" ", "-", "+"):
            hunks[-1].append(line)
    return hunks


def _drift_site(patch, tree):
    """(file, hunk number, line) of a pre-image line of the patch that occurs
    exactly once upstream."""
    for fp in patch.files:
        if fp.created:
            continue
        text = (tree / fp.path).read_text(encoding="utf-8").splitlines()
        for n, body in enumerate(_hunk_bodies(patch, fp.path), start=1):
            for line in body:
                if line[:1] in (" ", "-") and line[1:].strip() and text.count(line[1:]) == 1:
                    return fp.path, n, line[1:]
    return None


@pytest.mark.parametrize("patch_name", [p.name for p in SERIES] or ["(empty series)"])
def test_drift_is_named_and_changes_nothing(tree, patch_name):
    if not SERIES:
        pytest.skip(f"the SGLang {VERSION} series is empty: nothing can drift")
    patch = next(p for p in SERIES if p.name == patch_name)
    site = _drift_site(patch, tree)
    assert site is not None, f"{patch.name}: no upstream line of its hunks occurs exactly once"
    rel, hunk, line = site
    path = tree / rel
    original = path.read_bytes()
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace(line + "\n", line + "  # changed upstream\n", 1), encoding="utf-8")
    try:
        before = _touched_state(tree)
        with pytest.raises(patchtool.DriftError) as e:
            patchtool.cmd_apply(sglang_dir=str(tree), say=_quiet())
        msg = str(e.value)
        block = msg.split(f"patch {patch.name} no longer applies")[1].split("\npatch ")[0]
        assert f"{rel}: hunk #{hunk}" in block, msg
        assert _touched_state(tree) == before
        with pytest.raises(patchtool.DriftError, match=patch.name):
            patchtool.cmd_check(sglang_dir=str(tree), say=_quiet())
    finally:
        path.write_bytes(original)
    assert _record_mismatches(tree) == []


def _touched_modules() -> list:
    mods = []
    for rel in patchtool.touched_files(SERIES):
        if rel.endswith(".py"):
            mod = rel[:-3].replace("/", ".")
            mods.append(mod[: -len(".__init__")] if mod.endswith(".__init__") else mod)
    return mods


# One interpreter (one ~8 s SGLang import): import every touched module from the patched copy, print
# where each came from, then run `python -m sglang.launch_server --help` in the same process.
_PROBE = """
import importlib, runpy, sys
sys.path.append(sys.argv[1])  # test stand-ins after site-packages, as tests/conftest.py does
for m in sys.argv[2:]:
    print("MODULE", importlib.import_module(m).__file__)
sys.argv = ["sglang.launch_server", "--help"]
runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_patched_tree_imports_and_launch_server_help(tree):
    assert patchtool.cmd_apply(sglang_dir=str(tree), say=_quiet()) == 0
    try:
        mods = _touched_modules()
        r = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT / "tests" / "stubs"), *mods],
                           capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(tree)), timeout=300)
        assert r.returncode == 0, r.stderr[-4000:]
        files = [line.split(" ", 1)[1] for line in r.stdout.splitlines()
                 if line.startswith("MODULE ")]
        assert len(files) == len(mods)
        # the patched copy, not the venv's SGLang
        assert all(f.startswith(str(tree)) for f in files), files
        assert "--speculative-algorithm" in r.stdout  # the help text was printed
    finally:
        assert patchtool.cmd_revert(sglang_dir=str(tree), say=_quiet()) == 0
