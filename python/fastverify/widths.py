"""Per-step verify width for n-gram chain verify: which width a step runs at, and
the host-side reshaping.

SGLang captures verify CUDA graphs (and sizes attention-backend state) for one number of tokens per
request, k = --speculative-num-draft-tokens. With ``--speculative-ngram-verify-widths 1,2,4,8`` the
server also builds one verify runtime (attention backend + verify graph runner) per extra width
(fastverify.glue.verify_runtime), and each decode step runs at the width this module picks:

    chain drafts (corpus format at k)                 tokens [bs*k], mask [bs*k*k]
                                                      (fastverify.chain)
      -> chain_draft_lengths(tokens, k)               [bs] real draft tokens per request
      -> choose_width(lens, cfg)                      smallest captured width >= 1 + max(lens); 1
                                                      (or the smallest width) when no request has
                                                      a draft
      -> truncate_drafts(tokens, mask, k, width)      tokens [bs*w], mask [bs*w*w]
      -> verify at width w                            (the glue swaps the runtime for this step)
      -> pad_accept_tokens(accept [bs*w], bs, w, k)   [bs*k] for the next step's bookkeeping

Why this is lossless: truncation keeps every real draft token (the width fits the longest draft) and
keeps the drafts' order and ancestry; what is verified at width w is a prefix of what would be
verified at k. Greedy verification accepts the longest draft prefix that matches the target's own
argmax tokens, plus one bonus token, so a prefix of the drafts can only accept a prefix of the same
run, and all the accepted tokens are the target's tokens. Width 1 is the root alone: the verify pass
emits exactly the plain decode token.

Why the accepted tokens are padded back to k: the next step's draft preparation, SGLang's batch
filter (``accept_tokens.reshape(-1, draft_token_num)``) and batch merge (concatenation with freshly
prefilled requests, laid out at k) all assume one stride per batch. Keeping the carried tokens at
stride k makes every batch operation independent of the width a step ran at; only the step's own
result (next_token_ids with its ``speculative_num_draft_tokens`` stride) is at width w, which
SGLang's result processor reads per result.

Nothing here imports SGLang.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from fastverify.chain import VerifyPlan, plan_verify

FLAG = "--speculative-ngram-verify-widths"
MODES_WITH_WIDTHS = ("chain", "auto")


@dataclass(frozen=True)
class WidthsConfig:
    """Captured verify widths, built once from the server flags by the glue.

    widths: sorted unique widths (tokens per request, root included), always containing k; () = off.
    k: --speculative-num-draft-tokens.  mode: --speculative-ngram-verify-mode.
    """

    widths: tuple = ()
    k: int = 12
    mode: str = "tree"

    @property
    def enabled(self) -> bool:
        return bool(self.widths)

    @property
    def extra(self) -> tuple:
        """The widths that need a runtime beyond the one SGLang builds at k."""
        return tuple(w for w in self.widths if w != self.k)

    @property
    def per_step(self) -> bool:
        """Chain mode picks the width itself each step; auto mode leaves it
        to its controller glue."""
        return self.enabled and self.mode == "chain"


def parse_widths(value, k: int, mode: str = "chain") -> WidthsConfig:
    """Validate the flag value (``"1,2,4,8"`` or a sequence of ints) against
    k and the verify mode."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return WidthsConfig((), int(k), mode)
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
    else:
        parts = list(value)
    widths = []
    for p in parts:
        try:
            if isinstance(p, bool) or (isinstance(p, float) and not p.is_integer()):
                raise ValueError
            w = int(p)
            if isinstance(p, str) and str(w) != p:
                raise ValueError
        except (TypeError, ValueError):
            raise ValueError(f"{FLAG} takes comma-separated integers such as 1,2,4,{k}; got "
                             f"{value!r}") from None
        widths.append(w)
    if k is None or int(k) < 2:
        raise ValueError(f"{FLAG} needs --speculative-num-draft-tokens >= 2; got {k!r}")
    k = int(k)
    bad = [w for w in widths if not 1 <= w <= k]
    if bad:
        raise ValueError(f"{FLAG} widths must lie in 1..{k} (--speculative-num-draft-tokens); got "
                         f"{bad} in {value!r}")
    if widths != sorted(set(widths)):
        raise ValueError(f"{FLAG} must list widths in increasing order without repeats; got "
                         f"{value!r}")
    if k not in widths:
        raise ValueError(f"{FLAG} must include k = {k} (--speculative-num-draft-tokens); got "
                         f"{value!r}")
    if mode not in MODES_WITH_WIDTHS:
        raise ValueError(
            f"{FLAG} needs --speculative-ngram-verify-mode {' or '.join(MODES_WITH_WIDTHS)}; got "
            f"{mode!r} (a tree's custom mask is captured at k only)"
        )
    return WidthsConfig(tuple(widths), k, mode)


def chain_draft_lengths(tokens, k: int) -> np.ndarray:
    """[bs] real draft tokens per request of chain-format drafts ``tokens`` [bs*k] (root first).

    fastverify.chain pads a chain with token 0 after its last real token, so the length is k - 1
    minus the trailing run of zeros after the root. A real draft ending in token 0 reads one
    shorter: harmless, it only narrows what is verified, never what is emitted.
    """
    t = np.asarray(tokens).reshape(-1, k)[:, 1:]  # [bs, k-1] drafts without the root
    nonzero = t != 0
    last = np.where(nonzero.any(axis=1), k - 1 - np.argmax(nonzero[:, ::-1], axis=1), 0)
    return last.astype(np.int64)  # [bs]


def choose_width(draft_lens: Sequence[int], cfg: WidthsConfig) -> tuple:
    """(width, plan) of one step: chain.plan_verify over the captured widths; no drafts -> width 1.

    When 1 is not captured, a step with no draft runs at the smallest captured width (every
    request's drafts are padding then, verified as plain decode plus padding).
    """
    plan: VerifyPlan = plan_verify(draft_lens, cfg.k, cfg.widths)
    if plan.action == "decode":
        return (1 if 1 in cfg.widths else cfg.widths[0]), plan
    return plan.width, plan


def truncate_drafts(tokens, mask, k: int, width: int, keep: Sequence[int] | None = None):
    """Corpus-format drafts at k -> the same format at ``width`` (the first
    ``width`` nodes of each request).

    tokens [bs*k] -> [bs*width]; mask [bs*k*k] -> [bs*width*width] (dtype kept). The nodes are in
    breadth-first order (a parent precedes its children), so the first ``width`` nodes of a chain
    or a tree are a valid chain or tree. ``keep`` [bs] optionally limits each request to its first
    ``1 + keep[i]`` nodes (per-request gating, e.g. by the auto controller); the nodes past it
    become padding token 0, which verification accepts only where the target itself predicts token
    0, so output is unchanged.
    """
    if not 1 <= width <= k:
        raise ValueError(f"verify width must lie in 1..{k}; got {width}")
    tok = np.asarray(tokens).reshape(-1, k)
    bs = tok.shape[0]
    m = np.asarray(mask).reshape(bs, k, k)
    out_t = np.ascontiguousarray(tok[:, :width])  # [bs, w]
    out_m = np.ascontiguousarray(m[:, :width, :width])  # [bs, w, w]
    if keep is not None:
        keep = np.asarray(keep, dtype=np.int64).reshape(bs)
        cols = np.arange(width)[None, :]  # [1, w]
        out_t = np.where(cols > keep[:, None], 0, out_t).astype(tok.dtype)
    return out_t.reshape(-1), out_m.reshape(-1)


def batch_views(buffer, max_bs: int, per_req: int, width: int, rows: bool = False) -> list:
    """Per-batch-size views of a worker buffer allocated for k, laid out for ``width``.

    ``buffer`` holds max_bs * per_req(k) elements (flat, or [max_bs, k] when ``rows``);
    ``per_req`` is the number of elements one request needs at ``width`` (width for
    tokens/positions, width*width for the mask). Entry bs is a contiguous view of the first bs *
    per_req elements, shaped [bs, width] when ``rows``. No copy: the views share the k buffer's
    storage (only one width runs per step).
    """
    flat = buffer.reshape(-1)
    if max_bs * per_req > flat.numel():
        raise ValueError(f"buffer of {flat.numel()} elements cannot hold {max_bs} requests x "
                         f"{per_req}")
    if rows:
        return [flat[: bs * per_req].view(bs, width) for bs in range(max_bs + 1)]
    return [flat[: bs * per_req] for bs in range(max_bs + 1)]


def pad_accept_tokens(accept_tokens, bs: int, width: int, k: int):
    """Accepted tokens of a width-``width`` step [bs*width] -> [bs*k], each
    request's row zero-padded.

    Only the first accept_len entries of a row are ever read (SGLang leaves the rest unspecified),
    so padding changes no value that is read; it restores the stride k that batch filter/merge and
    the next step assume.
    """
    if width == k:
        return accept_tokens
    import torch

    out = torch.zeros((bs, k), dtype=accept_tokens.dtype, device=accept_tokens.device)  # [bs, k]
    out[:, :width] = accept_tokens.reshape(bs, width)
    return out.reshape(-1)


@dataclass
class WidthStats:
    """Steps and verified tokens per width (what ran), against the static width k."""

    steps_by_width: dict
    tokens_run: int = 0  # sum of bs * width over steps
    tokens_static: int = 0  # sum of bs * k over steps
    steps: int = 0

    @classmethod
    def empty(cls) -> "WidthStats":
        return cls(steps_by_width={})

    def record(self, bs: int, width: int, k: int) -> None:
        self.steps += 1
        self.steps_by_width[width] = self.steps_by_width.get(width, 0) + 1
        self.tokens_run += bs * width
        self.tokens_static += bs * k

    def summary(self) -> dict:
        steps = max(self.steps, 1)
        return {
            "steps": self.steps,
            "steps_by_width": dict(sorted(self.steps_by_width.items())),
            "verified_tokens_per_step": self.tokens_run / steps,
            "static_tokens_per_step": self.tokens_static / steps,
        }
