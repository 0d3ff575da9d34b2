"""Model profiles: the per-rank work of one forward pass under tensor parallelism.

A profile names the shapes that decide what a verify pass costs on a TP group: how many layers, the
hidden size (the all-reduce payload is ``[tokens, hidden]``), and the GEMMs each rank runs per layer
at the TP-sharded shapes. The benchmarks build a pass from these shapes; the verify-cost model can
use the same byte and FLOP counts.

Built-in profiles:
- ``kimi-k2.5``: 61 layers, hidden 7168, MLA attention (q_lora 1536, kv_lora 512, 64 heads of
  128+64/128), MoE with 384 routed experts of width 2048, top-8, one shared expert, the first layer
  dense (18432). Facts from the public Kimi-K2 configuration (DeepSeek-V3 architecture), which
  Kimi-K2.5's text model keeps.
- ``smollm2-135m``: 30 layers, hidden 576, 9 heads / 3 KV heads of 64, MLP 1536, vocab 49152.
  9 heads do not split over 2 ranks, so its TP-sharded shapes exist only for TP 1, 3 and 9.
- ``dummy-7168``: the Llama-shaped random-weight model of the end-to-end runs: 61 layers,
  hidden 7168, 56 heads / 8 KV heads of 128, MLP 18432, vocab 32000 (override with a
  config.json if yours differs).

A custom profile comes from a Hugging Face ``config.json`` (Llama/Qwen-style dense, DeepSeek-V3/Kimi
MLA+MoE; a ``text_config`` inside a multimodal config is used when present).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

__all__ = [
    "GemmShape",
    "ModelProfile",
    "BUILTIN_PROFILES",
    "ProfileError",
    "get_profile",
    "profile_from_hf_config",
    "load_profile_arg",
    "layer_gemms",
    "expected_active_experts",
    "pass_summary",
]

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class ProfileError(ValueError):
    """A profile that cannot be built or sharded as asked."""


@dataclasses.dataclass(frozen=True)
class GemmShape:
    """One GEMM a rank runs per layer: ``[tokens, k] @ [k, n]``.

    ``experts > 1`` marks a routed-expert group: ``experts`` weight matrices of ``[k, n]``,
    of which each token uses ``topk``. ``allreduce_after`` marks the GEMM whose partial sums
    the TP group all-reduces.
    """

    name: str
    k: int
    n: int
    experts: int = 1
    topk: int = 0
    allreduce_after: bool = False

    def weight_elems(self) -> int:
        return self.k * self.n * self.experts


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    # MLA (DeepSeek-V3 / Kimi): all four set, else 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE: n_routed_experts > 0
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int = 0
    num_experts_per_tok: int = 0
    first_k_dense_replace: int = 0
    dtype: str = "bfloat16"
    rms_norm_eps: float = 1e-6
    source: str = ""

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def allreduces_per_pass(self) -> int:
        # one after attention (o_proj), one after the MLP/MoE (down_proj) in every layer
        return 2 * self.num_layers

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.dtype]

    def allreduce_bytes(self, tokens: int) -> int:
        """Payload of one all-reduce: ``[tokens, hidden]`` in the activation dtype."""
        return tokens * self.hidden_size * self.dtype_bytes

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


BUILTIN_PROFILES: Dict[str, ModelProfile] = {
    "kimi-k2.5": ModelProfile(
        name="kimi-k2.5",
        num_layers=61,
        hidden_size=7168,
        vocab_size=163840,
        num_heads=64,
        num_kv_heads=64,
        head_dim=128,
        intermediate_size=18432,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=384,
        n_shared_experts=1,
        moe_intermediate_size=2048,
        num_experts_per_tok=8,
        first_k_dense_replace=1,
        source="built-in: public Kimi-K2 config (DeepSeek-V3 architecture), kept by Kimi-K2.5's "
               "text model",
    ),
    "smollm2-135m": ModelProfile(
        name="smollm2-135m",
        num_layers=30,
        hidden_size=576,
        vocab_size=49152,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        intermediate_size=1536,
        rms_norm_eps=1e-5,
        source="built-in: SmolLM2-135M (LlamaForCausalLM)",
    ),
    "dummy-7168": ModelProfile(
        name="dummy-7168",
        num_layers=61,
        hidden_size=7168,
        vocab_size=32000,
        num_heads=56,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=18432,
        rms_norm_eps=1e-5,
        source="built-in: Llama-shaped random-weight model with Kimi's hidden size and layer count",
    ),
}


def get_profile(name: str) -> ModelProfile:
    try:
        return BUILTIN_PROFILES[name]
    except KeyError:
        raise ProfileError(
            f"--profile: unknown profile {name!r}; allowed: {', '.join(sorted(BUILTIN_PROFILES))} "
            f"or a path to a Hugging Face config.json"
        ) from None


def _req(cfg: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ProfileError(f"{path}: config has no {key!r}; cannot build a profile from it")
    return cfg[key]


def profile_from_hf_config(cfg: Mapping[str, Any], name: str = "custom",
                           path: str = "config.json") -> ModelProfile:
    """Build a profile from a Hugging Face config dict (dense Llama-style, or
    DeepSeek-V3/Kimi MLA+MoE)."""
    if isinstance(cfg.get("text_config"), Mapping):
        cfg = cfg["text_config"]
    hidden = int(_req(cfg, "hidden_size", path))
    heads = int(_req(cfg, "num_attention_heads", path))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    n_routed = int(cfg.get("n_routed_experts") or cfg.get("num_experts")
                   or cfg.get("num_local_experts") or 0)
    topk = int(cfg.get("num_experts_per_tok") or cfg.get("num_experts_per_token") or 0)
    if n_routed and not topk:
        raise ProfileError(f"{path}: MoE config ({n_routed} experts) without num_experts_per_tok")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if dtype not in _DTYPE_BYTES:
        dtype = "bfloat16"
    return ModelProfile(
        name=name,
        num_layers=int(_req(cfg, "num_hidden_layers", path)),
        hidden_size=hidden,
        vocab_size=int(cfg.get("vocab_size") or 0),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(_req(cfg, "intermediate_size", path)),
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
        qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        v_head_dim=int(cfg.get("v_head_dim") or 0),
        n_routed_experts=n_routed,
        n_shared_experts=int(cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0),
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0) if n_routed else 0,
        num_experts_per_tok=topk,
        first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
        dtype=dtype,
        rms_norm_eps=float(cfg.get("rms_norm_eps") or 1e-6),
        source=f"config.json: {path}",
    )


def load_profile_arg(value: str) -> ModelProfile:
    """``--profile`` value: a built-in name or a path to a config.json."""
    if value in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[value]
    p = Path(value)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        if not p.is_file():
            raise ProfileError(f"--profile: no such file {str(p)!r}")
        try:
            cfg = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ProfileError(f"--profile: {p} is not valid JSON: {e}") from None
        return profile_from_hf_config(cfg, name=p.parent.name or "custom", path=str(p))
    return get_profile(value)


def _shard(total: int, tp: int, what: str, profile: ModelProfile) -> int:
    if total % tp:
        raise ProfileError(
            f"profile {profile.name}: {what} = {total} does not split over TP {tp} "
            f"(TP must divide it; try --shard-tp with a divisor of {total})"
        )
    return total // tp


def layer_gemms(profile: ModelProfile, tp: int, layer: int) -> List[GemmShape]:
    """The GEMMs one rank runs in ``layer`` at tensor-parallel size ``tp``, in order.

    Column-parallel projections split their output dimension, row-parallel ones (o_proj, down_proj)
    their input dimension and are followed by the all-reduce of ``[tokens, hidden]``. KV heads are
    replicated when there are fewer of them than ranks. Routed experts are split by their
    intermediate width (TP-MoE).
    """
    if tp < 1:
        raise ProfileError(f"TP size must be >= 1, got {tp}")
    h = profile.hidden_size
    g: List[GemmShape] = []
    heads = _shard(profile.num_heads, tp, "num_attention_heads", profile)
    if profile.is_mla:
        qk_head = profile.qk_nope_head_dim + profile.qk_rope_head_dim
        # q_a + kv_a fused, replicated on every rank: [h] -> [q_lora + kv_lora + rope]
        g.append(GemmShape("qkv_a", h,
                           profile.q_lora_rank + profile.kv_lora_rank + profile.qk_rope_head_dim))
        g.append(GemmShape("q_b", profile.q_lora_rank, heads * qk_head))
        g.append(GemmShape("kv_b", profile.kv_lora_rank,
                           heads * (profile.qk_nope_head_dim + profile.v_head_dim)))
        g.append(GemmShape("o_proj", heads * profile.v_head_dim, h, allreduce_after=True))
    else:
        kv = profile.num_kv_heads // tp if profile.num_kv_heads >= tp else 1
        if profile.num_kv_heads >= tp:
            _shard(profile.num_kv_heads, tp, "num_key_value_heads", profile)
        g.append(GemmShape("qkv_proj", h, (heads + 2 * kv) * profile.head_dim))
        g.append(GemmShape("o_proj", heads * profile.head_dim, h, allreduce_after=True))
    if profile.is_moe and layer >= profile.first_k_dense_replace:
        inter = _shard(profile.moe_intermediate_size, tp, "moe_intermediate_size", profile)
        g.append(GemmShape("router", h, profile.n_routed_experts))
        if profile.n_shared_experts:
            sh = profile.n_shared_experts * inter
            g.append(GemmShape("shared_gate_up", h, 2 * sh))
            g.append(GemmShape("shared_down", sh, h))
        g.append(GemmShape("experts_gate_up", h, 2 * inter, profile.n_routed_experts,
                           profile.num_experts_per_tok))
        g.append(GemmShape("experts_down", inter, h, profile.n_routed_experts,
                           profile.num_experts_per_tok, allreduce_after=True))
    else:
        inter = _shard(profile.intermediate_size, tp, "intermediate_size", profile)
        g.append(GemmShape("gate_up_proj", h, 2 * inter))
        g.append(GemmShape("down_proj", inter, h, allreduce_after=True))
    return g


def expected_active_experts(n_experts: int, topk: int, tokens: int) -> float:
    """Expected number of distinct experts hit by ``tokens`` tokens each picking ``topk`` of
    ``n_experts`` uniformly: ``E * (1 - (1 - topk/E)^tokens)``. Decides the expert weight bytes
    a small batch streams."""
    if n_experts <= 0 or topk <= 0 or tokens <= 0:
        return 0.0
    return n_experts * (1.0 - (1.0 - topk / n_experts) ** tokens)


def active_experts_int(n_experts: int, topk: int, tokens: int) -> int:
    """``expected_active_experts`` rounded up, at least ``topk`` and at most ``n_experts``."""
    if tokens <= 0:
        return 0
    return int(min(n_experts,
                   max(topk, math.ceil(expected_active_experts(n_experts, topk, tokens) - 1e-9))))


def pass_summary(profile: ModelProfile, tp: int, tokens: int,
                 weight_bytes: Optional[int] = None) -> Dict[str, Any]:
    """Counts for one pass of ``tokens`` tokens on one rank: GEMM FLOPs, weight
    bytes streamed, all-reduces.

    ``weight_bytes`` per parameter defaults to the profile's dtype (pass 0.5 for
    INT4-class weights).
    """
    wb = profile.dtype_bytes if weight_bytes is None else weight_bytes
    flops = 0.0
    wbytes = 0.0
    for layer in range(profile.num_layers):
        for gm in layer_gemms(profile, tp, layer):
            if gm.experts > 1:
                active = active_experts_int(gm.experts, gm.topk, tokens)
                flops += 2.0 * tokens * gm.topk * gm.k * gm.n
                wbytes += active * gm.k * gm.n * wb
            else:
                flops += 2.0 * tokens * gm.k * gm.n
                wbytes += gm.k * gm.n * wb
    n_ar = profile.allreduces_per_pass
    return {
        "profile": profile.name,
        "tp": tp,
        "tokens": tokens,
        "gemm_flops": flops,
        "weight_bytes": wbytes,
        "allreduces": n_ar,
        "allreduce_bytes_each": profile.allreduce_bytes(tokens),
        "allreduce_bytes_total": n_ar * profile.allreduce_bytes(tokens),
    }
