"""Fixtures for the patch-series tests (helpers in pristine.py)."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pristine import ROOT


@pytest.fixture(scope="session")
def pristine_source(tmp_path_factory):
    """pristine_source(version) -> folder holding sglang/ and
    sglang-<ver>.dist-info/ (never modify it)."""
    found = {}

    def get(version: str) -> Path:
        if version in found:
            return found[version]
        unpacked = ROOT / ".scratch" / "pristine" / version
        if ((unpacked / "sglang" / "__init__.py").is_file()
                and (unpacked / f"sglang-{version}.dist-info" / "RECORD").is_file()):
            found[version] = unpacked
            return unpacked
        wheels = sorted((ROOT / ".downloads").glob(f"sglang-{version}-*.whl"))
        if not wheels:
            pytest.skip(f"no pristine SGLang {version}: neither .scratch/pristine/{version} nor "
                        f".downloads/sglang-{version}-*.whl")
        dest = tmp_path_factory.mktemp(f"pristine-{version}")
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(dest)
        found[version] = dest
        return dest

    return get
