"""scripts/gpu/prebuild_jit.py: SGLang 0.5.23's module layout (sglang.kernels.ops) is built through
the functions the server calls, with the server's arguments, and --skip-sglang builds none."""
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("gpu_prebuild_jit",
                                                  ROOT / "scripts/gpu/prebuild_jit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rec(body):
    return "from sglang import CALLS\n" + textwrap.dedent(body)


# a stand-in sglang 0.5.23 tree: every builder records its call in sglang.CALLS
FILES = {
    "sglang/__init__.py": "CALLS = []\n",
    "sglang/kernels/__init__.py": "",
    "sglang/kernels/ops/__init__.py": "",
    "sglang/kernels/ops/activation/__init__.py": "",
    "sglang/kernels/ops/activation/activation.py": _rec("""
        def activation_module(dtype, *, fast_math=True):
            CALLS.append(("activation", dtype, fast_math))
    """),
    "sglang/kernels/ops/attention/__init__.py": "",
    "sglang/kernels/ops/attention/rope.py": _rec("""
        def _jit_rotary_embedding_module():
            CALLS.append(("rotary",))
        def _jit_fused_rope_module(is_neox, rope_dim, dtype, q_dtype):
            CALLS.append(("fused_rope", is_neox, rope_dim, dtype, q_dtype))
    """),
    "sglang/kernels/ops/attention/clamp_position.py": _rec("""
        def _jit_clamp_position_module(dtype):
            CALLS.append(("clamp", dtype))
    """),
    "sglang/kernels/ops/communication/__init__.py": "",
    "sglang/kernels/ops/communication/all_reduce.py": _rec("""
        def _init_communicator():
            CALLS.append(("communicator",))
        def _init_ipc_manager():
            CALLS.append(("ipc",))
        def get_all_reduce_module(dtype, world_size):
            CALLS.append(("all_reduce", dtype, world_size))
    """),
    "sglang/kernels/ops/kvcache/__init__.py": "",
    "sglang/kernels/ops/kvcache/kvcache.py": _rec("""
        def _jit_kvcache_module(k_row_bytes, v_row_bytes, num_threads):
            CALLS.append(("kvcache", k_row_bytes, v_row_bytes, num_threads))
    """),
    "sglang/kernels/ops/layernorm/__init__.py": "",
    "sglang/kernels/ops/layernorm/norm.py": _rec("""
        def _jit_qknorm_module(head_dim, dtype, half_warp=True):
            CALLS.append(("qknorm", head_dim, dtype, half_warp))
    """),
    "sglang/kernels/ops/speculative/__init__.py": "",
    "sglang/kernels/ops/speculative/ngram_corpus.py": _rec("""
        def get_ngram_corpus_cls():
            CALLS.append(("ngram",))
    """),
}


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    def make(files):
        for rel, text in files.items():
            p = tmp_path / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(textwrap.dedent(text))
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]


def test_0523_layout_builds_with_the_servers_arguments(fake_sglang):
    fake_sglang(FILES)
    pre = _load()
    pre.sglang_modules([(64, 2), (128, 4), (64, 2)], [2], [128])
    import sglang

    bf16 = torch.bfloat16
    calls = sglang.CALLS
    assert pre.FAILED == []
    assert ("activation", bf16, True) in calls
    assert [c for c in calls if c[0] == "clamp"] == [("clamp", torch.int64), ("clamp", torch.int32)]
    # one fused rope per head dim (neox, bf16 q and k) and one KV store per row width, the
    # thread count left to the server's own choice (0)
    assert [c for c in calls if c[0] == "fused_rope"] == [
        ("fused_rope", True, 64, bf16, bf16), ("fused_rope", True, 128, bf16, bf16)]
    assert [c for c in calls if c[0] == "kvcache"] == [
        ("kvcache", 256, 256, 0), ("kvcache", 1024, 1024, 0)]
    assert ("qknorm", 128, bf16, True) in calls
    assert ("all_reduce", bf16, 2) in calls
    for name in ("rotary", "ngram", "communicator", "ipc"):
        assert (name,) in calls


def test_0523_builder_failure_is_reported_not_raised(fake_sglang):
    files = dict(FILES)
    files["sglang/kernels/ops/layernorm/norm.py"] = """
        def _jit_qknorm_module(head_dim, dtype, half_warp=True):
            raise RuntimeError("nvcc failed")
    """
    fake_sglang(files)
    pre = _load()
    pre.sglang_modules([(64, 3)], [], [128])
    assert pre.FAILED == ["qknorm 128 bf16"]


def test_skip_sglang_imports_no_sglang(fake_sglang, capsys):
    fake_sglang({"sglang/__init__.py": "raise RuntimeError('sglang imported')\n"})
    pre = _load()
    assert pre.main(["--skip-sglang"]) == 0
    assert "0 failed" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="sglang imported"):
        _load().main([])
