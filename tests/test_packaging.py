"""pyproject.toml installs what the package reads at run time: every module folder is a package
that setuptools finds, every data file under fastverify/data matches a package-data pattern, and
the console script points at the CLI's entry function. (Without the package-data patterns a wheel
silently left the replay tool's embedded trace and the built-in pass-cost profiles out.)"""
import fnmatch
import importlib
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "python" / "fastverify"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_module_folder_is_a_package_setuptools_finds():
    assert _pyproject()["tool"]["setuptools"]["packages"]["find"]["where"] == ["python"]
    folders = {p.parent for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(d.relative_to(PKG)) for d in folders if not (d / "__init__.py").is_file())
    assert not missing, f"module folders without __init__.py (left out of a wheel): {missing}"


def test_every_data_file_is_package_data():
    patterns = _pyproject()["tool"]["setuptools"]["package-data"]["fastverify"]
    files = [p.relative_to(PKG).as_posix() for p in (PKG / "data").rglob("*") if p.is_file()]
    assert "data/smollm2_135m_greedy.jsonl" in files
    assert any(f.startswith("data/profiles/") for f in files)
    left_out = [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)]
    assert not left_out, f"data files no package-data pattern installs: {left_out}"


def test_console_script_is_the_cli_entry():
    target = _pyproject()["project"]["scripts"]["fastverify"]
    module, _, func = target.partition(":")
    assert target == "fastverify.cli:main"
    assert callable(getattr(importlib.import_module(module), func))
