"""Subprocess probe of patched SGLang (the whole series) for
tests/test_host_seq_lens.py; prints one JSON line.

Run with the patched sglang first on PYTHONPATH and tests/stubs after it:
    python host_seq_lens_probe.py MODEL_DIR
Resolves n-gram server arguments in each verify mode and asks the patched scheduler helper
(overlap_utils.decide_needs_cpu_seq_lens, patch 0009) whether the overlap scheduler must keep a host
copy of the sequence lengths, for an attention backend that needs one and for one that does not.
"""
import inspect
import json
import sys
import types

model = sys.argv[1]
from sglang.srt.managers import overlap_utils  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402

base = ["--model-path", model, "--device", "cuda", "--speculative-algorithm", "NGRAM",
        "--speculative-num-draft-tokens", "8", "--attention-backend", "triton"]
modes = {"tree": [], "chain": ["--speculative-ngram-verify-mode", "chain"],
         "auto": ["--speculative-ngram-verify-mode", "auto",
                  "--speculative-ngram-verify-widths", "1,2,4,8"]}
backends = {"backend_needs_none": types.SimpleNamespace(needs_cpu_seq_lens=False),
            "backend_needs_copy": types.SimpleNamespace(needs_cpu_seq_lens=True)}
takes_args = "server_args" in inspect.signature(overlap_utils.decide_needs_cpu_seq_lens).parameters
out = {}
for mode, extra in modes.items():
    sa = prepare_server_args(base + extra)
    if hasattr(sa, "resolve_once"):  # 0.5.23: the helper reads the published config
        sa.resolve_once()
        from sglang.srt import runtime_context as rc
        rc.publish(sa, role="test")
    for name, backend in backends.items():
        args = (sa, [backend]) if takes_args else ([backend],)
        out[f"{mode}/{name}"] = overlap_utils.decide_needs_cpu_seq_lens(*args)
print("PROBE " + json.dumps(out))
