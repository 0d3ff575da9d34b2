"""Shared test setup.

- tests/stubs goes on sys.path *after* site-packages: where a real package exists
  (sgl_kernel on a GPU machine) it wins; on a CPU machine the stand-ins fill in
  (tests/stubs/README.md says what each one is).
- The JIT caches of SGLang's C++ n-gram corpus point into the work tree, so a CI
  run reuses its own builds.
- Tests marked ``gpu`` are skipped when CUDA is not available.
"""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUBS = ROOT / "tests" / "stubs"
if str(STUBS) not in sys.path:
    sys.path.append(str(STUBS))
# the lab's tools (lab/README.md), tested under tests/lab/, import by their file names
for _lab in (ROOT / "lab", ROOT / "lab" / "gpu", ROOT / "lab" / "steptrace"):
    if str(_lab) not in sys.path:
        sys.path.append(str(_lab))

os.environ.setdefault("TVM_FFI_CACHE_DIR", str(ROOT / ".cache" / "tvm-ffi"))
os.environ.setdefault("SGLANG_JIT_CACHE_DIR", str(ROOT / ".cache" / "sglang-jit"))


def _cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def repo_root():
    return ROOT
