#!/usr/bin/env python3
"""Per-kernel regression benchmarks of the verify path on one GPU.

The same as `fastverify bench kernels`; the code is fastverify.bench.kernels.run (--help).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # a checkout, not installed

from fastverify.bench.kernels.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
