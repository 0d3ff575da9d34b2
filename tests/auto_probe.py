"""Subprocess probe of patched SGLang (series through 0007) for
tests/test_glue_auto.py; prints one JSON line.

Run with the patched sglang first on PYTHONPATH and tests/stubs after it:
    python auto_probe.py MODEL_DIR
Resolves server arguments with --speculative-ngram-verify-mode auto (the flag, 0005's chain
overrides (auto is chain-shaped), the launcher-side checks).
"""
import json
import sys

model = sys.argv[1]
from sglang.srt.server_args import prepare_server_args  # noqa: E402

base = ["--model-path", model, "--device", "cuda", "--speculative-algorithm", "NGRAM",
        "--speculative-num-draft-tokens", "8", "--attention-backend", "triton"]
out = {}
for name, extra in {
    "ok": ["--speculative-ngram-verify-mode", "auto",
           "--speculative-ngram-verify-widths", "1,2,4,8"],
    "no_widths": ["--speculative-ngram-verify-mode", "auto"],
    "bad_hysteresis": ["--speculative-ngram-verify-mode", "auto",
                       "--speculative-ngram-verify-widths", "1,2,4,8",
                       "--speculative-ngram-auto-hysteresis", "0.9"],
    "table_without_auto": ["--speculative-ngram-auto-cost-table", "/nonexistent.json"],
}.items():
    try:
        sa = prepare_server_args(base + extra)
        src = sa
        # 0.5.23: resolved settings are read from the published config
        if hasattr(sa, "resolve_once"):
            sa.resolve_once()
            from sglang.srt import runtime_context as rc
            rc.publish(sa, role="test")
            src = rc.get_spec()
        out[name] = {k: getattr(src, k)
                     for k in ("speculative_ngram_verify_mode", "speculative_eagle_topk",
                               "speculative_num_steps", "speculative_ngram_auto_hysteresis")}
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}"}
print("PROBE " + json.dumps(out))
