"""Shared by the tests that run a probe script against a patched SGLang in a subprocess.

A probe (tests/*_probe.py) imports SGLang (the copy on PYTHONPATH first), exercises the patched code with a tiny
model config and prints one line ``PROBE <json>``; the tests assert on that JSON.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5}


def tiny_model(tmp_path_factory) -> Path:
    """A folder with the config.json of a 2-layer Llama (no weights: server args only need the config)."""
    model = tmp_path_factory.mktemp("tiny-model")
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    return model


def run_probe(script: str, model: Path, folder: Path | None = None, extra_env: dict | None = None) -> dict:
    """Run tests/<script> with ``folder`` (a patched SGLang copy, or None for the installed one), this repo's
    python/ and the test stand-ins on PYTHONPATH; return its PROBE JSON."""
    env = dict(os.environ, **(extra_env or {}))
    paths = ([str(folder)] if folder else []) + [str(ROOT / "python"), str(ROOT / "tests" / "stubs")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(ROOT / "tests" / script), str(model)], env=env,
                       capture_output=True, text=True, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("PROBE ")]
    assert r.returncode == 0 and line, r.stderr[-3000:]
    return json.loads(line[0][6:])
