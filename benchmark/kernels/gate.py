#!/usr/bin/env python3
"""The kernel gate run N times: benchmark + compare per time, one verdict each (stability check).

The same as `fastverify bench gate`; the code is fastverify.bench.kernels.gate (--help).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # a checkout, not installed

from fastverify.bench.kernels.gate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
