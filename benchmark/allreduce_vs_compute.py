#!/usr/bin/env python3
"""Where one verify pass spends its time: all-reduces against GEMMs, per backend (2+ GPUs).

The same as `fastverify bench allreduce`; the code: fastverify.bench.allreduce_vs_compute.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # a checkout, not installed

from fastverify.bench.allreduce_vs_compute import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
