"""scripts/gpu: chunked staging (split / receive / assemble with checksums) and the SmolLM2
conversion math (q/k row order, zero-head padding for TP=2 gives the same logits)."""
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name, rel):
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


stage = _load("gpu_stage_chunks", "scripts/gpu/stage_chunks.py")
convert = _load("gpu_convert_smollm2", "scripts/gpu/convert_smollm2.py")


@pytest.fixture
def payload(tmp_path):
    rng = np.random.default_rng(0)
    files = []
    for name, size in (("a.bin", 5000), ("b.tar.xz", 12345), ("c.gguf", 1)):
        p = tmp_path / "src" / name
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        files.append(p)
    return files


def test_split_receive_assemble_roundtrip(tmp_path, payload):
    out, store, rebuilt = tmp_path / "stage", tmp_path / "store", tmp_path / "rebuilt"
    max_mib = 4096 / 2**20                                   # 4 KiB parts: 18,346 bytes -> 5 parts
    assert stage.main(["split", "--out", str(out), "--max-mib", str(max_mib),
                       *map(str, payload)]) == 0
    chunks = sorted(out.iterdir())
    assert [c.name for c in chunks] == [f"chunk-0{i}" for i in range(1, 6)]
    assert all(os.path.getsize(next(c.glob("part-*.bin"))) <= 4096 for c in chunks)
    # assembling before every part arrived names what is missing
    stage.main(["receive", str(chunks[0]), str(store)])
    with pytest.raises(SystemExit, match="part-02.bin"):
        stage.main(["assemble", str(store), str(rebuilt)])
    for c in chunks[1:]:
        stage.main(["receive", str(c), str(store)])
    assert stage.main(["assemble", str(store), str(rebuilt)]) == 0
    for p in payload:
        assert (rebuilt / p.name).read_bytes() == p.read_bytes()


def test_damaged_part_is_refused(tmp_path, payload):
    out, store = tmp_path / "stage", tmp_path / "store"
    stage.main(["split", "--out", str(out), "--max-mib", str(8192 / 2**20), *map(str, payload)])
    for c in sorted(out.iterdir()):
        stage.main(["receive", str(c), str(store)])
    part = store / "part-02.bin"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match="part-02.bin is damaged"):
        stage.main(["assemble", str(store), str(tmp_path / "x")])
    # and a damaged chunk is refused on arrival
    bad = sorted(out.iterdir())[0] / "part-01.bin"
    bad.write_bytes(b"x" + bad.read_bytes()[1:])
    with pytest.raises(SystemExit, match="damaged"):
        stage.main(["receive", str(bad.parent), str(tmp_path / "store2")])


def test_split_is_stable_and_rejects_bad_input(tmp_path, payload):
    out = tmp_path / "stage"
    args = ["split", "--out", str(out), "--max-mib", str(8192 / 2**20), *map(str, payload)]
    stage.main(args)
    first = {p: p.stat().st_mtime_ns for p in out.rglob("part-*.bin")}
    # unchanged inputs: parts are not rewritten
    stage.main(args)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("part-*.bin")} == first
    with pytest.raises(SystemExit, match="--max-mib"):
        stage.main(["split", "--out", str(out), "--max-mib", "0", str(payload[0])])
    with pytest.raises(SystemExit, match="no such file"):
        stage.main(["split", "--out", str(out), str(tmp_path / "missing")])


def _llamacpp_permute(w, n_heads):
    """The row order llama.cpp's converter writes for q/k: per head, the two
    rotary halves interleaved."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2,
                     *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_undoes_the_gguf_row_order():
    rng = np.random.default_rng(1)
    for heads in (9, 3):
        w = rng.standard_normal((heads * 64, 576)).astype(np.float32)   # [heads * head_dim, hidden]
        stored = _llamacpp_permute(w, heads)
        assert not np.array_equal(stored, w)
        np.testing.assert_array_equal(convert.unpermute_rows(stored, heads), w)


def test_zero_head_padding_keeps_the_function():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hp = {"layers": 2, "hidden": 576, "ffn": 128, "heads": 9, "kv_heads": 3, "rope_theta": 1e5,
          "rms_eps": 1e-5, "ctx": 256, "vocab": 97, "bos": 1, "eos": 2}
    cfg = convert.config_dict(hp)
    ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).float().eval()
    tensors = {k: v.detach().numpy().copy() for k, v in ref.state_dict().items()
               if k != "lm_head.weight"}
    padded_hp = convert.pad_heads(hp, tensors, tp=2)
    assert (padded_hp["heads"], padded_hp["kv_heads"], padded_hp["head_dim"]) == (12, 4, 64)
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (12 * 64, 576)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (4 * 64, 576)
    assert tensors["model.layers.0.self_attn.o_proj.weight"].shape == (576, 12 * 64)
    pcfg = convert.config_dict(padded_hp)
    padded = transformers.LlamaForCausalLM(transformers.LlamaConfig(**pcfg)).float().eval()
    padded.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
    padded.tie_weights()
    ids = torch.tensor([[1, 5, 17, 33, 8, 91, 40, 2]])
    with torch.no_grad():
        a, b = ref(ids).logits, padded(ids).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0), float((a - b).abs().max())
    # TP=2 splits 12 query / 4 KV heads evenly and keeps 3 query heads per KV head
    assert pcfg["num_attention_heads"] % 2 == 0 and pcfg["num_key_value_heads"] % 2 == 0
    assert pcfg["num_attention_heads"] // pcfg["num_key_value_heads"] == 3
