"""Write a small Llama-architecture model with seeded random weights, for
greedy-identity checks on a GPU.

    python scripts/gpu/make_random_model.py OUT_DIR [--layers 2] [--vocab 2048] [--seed 0]

Why random weights and not `--load-format dummy`: SGLang's dummy loader fills weights with values
near zero, so the residual stream is the current token's embedding and the greedy output is a
fixed function of the last token (a short cycle that n-gram drafts always match). Such a model
cannot show a verify pass that attends wrongly. With normal(0, 0.02) weights the next token
depends on the context through attention, the greedy output wanders before it settles into loops,
and n-gram drafts are sometimes right and sometimes wrong: the regime where a wrong mask or
position changes the output.

The shapes reuse those of the TP=2 SmolLM2 run (head_dim 64, 12 query / 4 KV heads, hidden 576), so
the JIT kernels pre-built for it load unchanged; vocabulary, depth and MLP width are small so the
weights travel in one transfer with the SGLang bundle (about 11 MB in bf16 with the defaults).
Requests send token ids (`--skip-tokenizer-init`).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from safetensors.torch import save_file

    head_dim = 64
    g = torch.Generator().manual_seed(args.seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * args.std).to(torch.bfloat16)

    h, q, kv, f = args.hidden, args.heads * head_dim, args.kv_heads * head_dim, args.intermediate
    tensors = {"model.embed_tokens.weight": w(args.vocab, h),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(args.layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
            p + "mlp.gate_proj.weight": w(f, h), p + "mlp.up_proj.weight": w(f, h),
            p + "mlp.down_proj.weight": w(h, f),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        })
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
        "hidden_size": h, "intermediate_size": f, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
        "head_dim": head_dim,
        "vocab_size": args.vocab, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
        "fastverify_note": f"seeded random weights (normal std {args.std}, seed {args.seed}) for "
                           "greedy-identity checks",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    save_file(tensors, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    n = sum(t.numel() for t in tensors.values())
    print(f"wrote {args.out}: {n / 1e6:.1f} M parameters, {n * 2 / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
