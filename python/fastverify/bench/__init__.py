"""The microbenchmarks a user runs on their own GPUs (`fastverify bench allreduce|kernels|compare`).

- `allreduce_vs_compute`: where one verify pass spends its time, the per-layer all-reduces against
  the GEMMs, per all-reduce backend (2+ GPUs); writes the cost tables and NCCL tuning profiles that
  the server reads.
- `kernels.run` / `kernels.compare`: per-kernel regression benchmarks of the verify path (1 GPU)
  and the gate against a stored baseline.
- `common`: the preamble, tables, JSON with a repro command, and the one GPU timer and one host
  timer that every benchmark here, in benchmark/ and in lab/ uses.
"""
