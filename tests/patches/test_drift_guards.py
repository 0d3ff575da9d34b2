"""Drift guards: the seams each patch touches still exist, unchanged in shape, in pristine upstream.

Entries live in tests/patches/guards.py (one or more per patch, added by the patch author). Sources
are parsed with `ast`; nothing of SGLang is imported, so this runs in any venv.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fastverify import patchtool, pins
from guards import GLUE_SEAMS, GUARDS, Guard

VERSIONS = pins.supported_versions()
CASES = [(g, v) for g in GUARDS for v in g.versions]


def _params(fn: ast.FunctionDef) -> list:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        names.append("*")
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def _assigned_names(body) -> dict:
    """Names bound at this level: functions, classes, assignments and annotated fields."""
    found = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    found[t.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node
    return found


def resolve(source: str, symbol: str):
    """The ast node of a dotted symbol ("Class.method") in a module's source,
    or raise LookupError."""
    node_body, node = ast.parse(source).body, None
    for part in symbol.split("."):
        names = _assigned_names(node_body)
        if part not in names:
            raise LookupError(f"{symbol}: {part!r} not found (have: "
                              f"{', '.join(sorted(names)[:30])} ...)")
        node = names[part]
        node_body = getattr(node, "body", [])
    return node


def check_guard(guard: Guard, root: Path) -> None:
    path = root / guard.file
    assert path.is_file(), f"{guard}: {guard.file} does not exist upstream"
    text = path.read_text(encoding="utf-8")
    for snippet in guard.contains:
        assert snippet in text, f"{guard}: upstream {guard.file} no longer contains {snippet!r}"
    for snippet in guard.lacks:
        assert snippet not in text, (f"{guard}: upstream {guard.file} now contains {snippet!r}: "
                                     "upstream has the change; retire the patch")
    if guard.symbol:
        try:
            node = resolve(text, guard.symbol)
        except LookupError as e:
            pytest.fail(f"{guard}: {e}")
        if guard.params is not None or guard.params_include:
            assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), \
                f"{guard}: not a function"
            have = _params(node)
            if guard.params is not None:
                assert have == list(guard.params), (f"{guard}: parameters are {have}, expected "
                                                    f"{list(guard.params)}")
            missing = [p for p in guard.params_include if p not in have]
            assert not missing, f"{guard}: parameters {missing} are gone (have {have})"


@pytest.mark.parametrize("guard,version", CASES, ids=[f"{v}:{g}" for g, v in CASES])
def test_guard_holds_upstream(guard, version, pristine_source):
    check_guard(guard, pristine_source(version))


SEAM_CASES = [(g, v) for g in GLUE_SEAMS for v in g.versions]


@pytest.mark.parametrize("guard,version", SEAM_CASES, ids=[f"{v}:{g}" for g, v in SEAM_CASES])
def test_glue_seam_holds_upstream(guard, version, pristine_source):
    check_guard(guard, pristine_source(version))


@pytest.mark.parametrize("version", VERSIONS)
def test_every_patch_has_a_guard(version):
    named = {g.patch for g in GUARDS if version in g.versions}
    unguarded = [p.name for p in patchtool.load_series(version) if p.name not in named]
    assert not unguarded, (f"SGLang {version}: add entries to tests/patches/guards.py for "
                           f"{unguarded} (see patches/REGISTRY.md, 'Drift guards')")


@pytest.mark.parametrize("guard,version", CASES, ids=[f"{v}:{g}" for g, v in CASES])
def test_guard_matches_its_patch(guard, version):
    assert version in VERSIONS, f"{guard}: SGLang {version} is not pinned"
    series = {p.name: p for p in patchtool.load_series(version)}
    assert guard.patch in series, f"{guard}: {guard.patch} is not in the SGLang {version} series"
    touched = [fp.path for fp in series[guard.patch].files]
    assert guard.file in touched, (f"{guard}: {guard.patch} does not touch {guard.file} (it "
                                   f"touches {touched})")


def test_resolver_on_a_known_source():
    src = ("X = 1\n@dataclass\nclass A:\n    f: int = 0\n    def m(self, a, /, b, *c, d, **e): "
           "...\ndef g(x, *, y): ...\n")
    assert _params(resolve(src, "A.m")) == ["self", "a", "b", "*c", "d", "**e"]
    assert _params(resolve(src, "g")) == ["x", "*", "y"]
    assert isinstance(resolve(src, "A.f"), ast.AnnAssign)
    assert isinstance(resolve(src, "X"), ast.Assign)
    with pytest.raises(LookupError, match="'n' not found"):
        resolve(src, "A.n")
