"""Helpers for the patch-series tests: where pristine upstream sources are,
which SGLang is installed.

Pristine sources come from .scratch/pristine/<ver>/ (an unpacked wheel, read-only: tests copy from
it) or, on a fresh machine, from the wheel in .downloads/ unpacked into a session temp folder.
"""
from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

from fastverify import pins

ROOT = Path(__file__).resolve().parents[2]


def installed_version() -> str | None:
    """The SGLang version of the running interpreter, if it is one of the pinned ones."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
    return version if version in pins.supported_versions() else None


def copy_tree(src: Path, dest: Path) -> Path:
    """Copy the sglang package and its dist-info (what site-packages holds) into dest."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name == "sglang" or item.name.endswith(".dist-info"):
            shutil.copytree(item, dest / item.name, symlinks=True)
    return dest
