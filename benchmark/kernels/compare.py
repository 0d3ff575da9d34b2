#!/usr/bin/env python3
"""Regression gate: a kernel-benchmark JSON against a stored baseline (exit 1 past the threshold).

The same as `fastverify bench compare`; the code is fastverify.bench.kernels.compare (--help).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # a checkout, not installed

from fastverify.bench.kernels.compare import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
