"""Per-kernel benchmarks of the verify path (`run`), their gate against a baseline (`compare`)."""
