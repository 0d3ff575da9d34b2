"""Shared by the tests that run a probe script against a patched SGLang in a subprocess.

A probe (tests/*_probe.py) imports SGLang (the copy on PYTHONPATH first), exercises the patched code
with a tiny model config and prints one line ``PROBE <json>``; the tests assert on that JSON.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5}


def tiny_model(tmp_path_factory) -> Path:
    """A folder with the config.json of a 2-layer Llama (no weights: server args
    only need the config)."""
    model = tmp_path_factory.mktemp("tiny-model")
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    return model


def run_probe(script: str, model: Path, folder: Path | None = None,
              extra_env: dict | None = None) -> dict:
    """Run tests/<script> with ``folder`` (a patched SGLang copy, or None for the installed one),
    this repo's python/ and the test stand-ins on PYTHONPATH; return its PROBE JSON."""
    env = dict(os.environ, **(extra_env or {}))
    paths = ([str(folder)] if folder else []) + [str(ROOT / "python"),
                                                 str(ROOT / "tests" / "stubs")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(ROOT / "tests" / script), str(model)], env=env,
                       capture_output=True, text=True, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("PROBE ")]
    assert r.returncode == 0 and line, r.stderr[-3000:]
    return json.loads(line[0][6:])


_COPIES: dict = {}  # (version, through) -> (folder, version): one patched copy per test session


def patched_sglang(tmp_path_factory, through: str | None = None):
    """(folder, version) for a probe: `folder` holds a copy of the installed SGLang carrying this
    repository's series up to and including patch `through` (the whole series when None), or is None
    when the installed SGLang already carries those patches (`make test` applies the series before
    pytest). The patched files come from the patch tool's own plan of the series
    (fastverify.patchtool.make_plan). Skips when SGLang or its series is missing, or when the
    install carries part of the patches or a drifted copy of them."""
    import importlib.util
    from importlib.metadata import version as dist_version

    from fastverify import patchtool

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")
    version = dist_version("sglang")
    if (version, through) in _COPIES:
        return _COPIES[(version, through)]
    try:
        series = patchtool.load_series(version)
    except patchtool.PatchToolError as e:
        pytest.skip(f"no series for SGLang {version}: {e}")
    n = len(series) if through is None else [p.name for p in series].index(through) + 1
    target = patchtool.find_target()
    # the whole series' plan: a prefix alone cannot be peeled off an install that
    # carries later patches too
    plan = patchtool.make_plan(target, series)
    if all(st.state == patchtool.APPLIED for st in plan.states[:n]):
        folder = None
    elif all(st.state == patchtool.NOT_APPLIED for st in plan.states):
        if n < len(series):
            plan = patchtool.make_plan(target, series[:n])
        folder = tmp_path_factory.mktemp(f"sglang-{version}-patched")
        shutil.copytree(target.root / "sglang", folder / "sglang",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for rel, data in plan.final.items():
            dst = folder / rel
            if data is None:
                dst.unlink(missing_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(data)
    else:
        pytest.skip("the installed SGLang carries part of the series (or a drifted one); run `make "
                    "apply-patches`")
    _COPIES[(version, through)] = (folder, version)
    return folder, version
