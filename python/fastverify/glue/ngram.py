"""N-gram verify-mode glue: what patch 0005-ngram-chain-verify calls from SGLang's n-gram worker.

Seams (both pinned SGLang versions; the patch holds the exact hunks):
    speculative_hook._handle_ngram     spec_overrides(cfg): chain, auto -> topk 1, num_steps k-1
    ngram_worker.NGRAMWorker.__init__  NgramVerifyHook.from_args(spec, observability): chain-shaped
                                       (chain, auto) reduces the drafts to chains
    ngram_worker._prepare_draft_tokens hook.after_batch_get(tokens, mask, bs): the chain, plus the
                                       step's plan
    ngram_worker (full-mask build)     skipped in chain mode; the verify input gets custom_mask=None
    ngram_worker.on_verify_complete_cpu  hook.on_verify_complete(num_correct_drafts_per_req):
                                         accounting
    ngram_info.NgramVerifyInput        verify_input_device(...), and no mask padding when the mask
                                       is None
    spec_info.create_dummy_verify_input  dummy_custom_mask(spec, mask): None for chain-shaped verify
    decode graph runner's own dummy      the same (CUDA-graph capture)
    overlap_utils.decide_needs_cpu_seq_lens  needs_host_seq_lens(spec): tree mode only (patch 0009)

The flags are read once per args object, by fastverify.glue.config (`verify_config`); chain and
auto verify share the chain shape. Nothing here imports SGLang.
"""
from __future__ import annotations

import logging
from collections import deque

from fastverify.chain import (ChainConfig, VerifyStats, plan_verify, real_draft_lengths,
                              reduce_to_chain)
from fastverify.glue.config import MODE_FLAG as FLAG
from fastverify.glue.config import verify_config

logger = logging.getLogger("fastverify.ngram")


def spec_overrides(cfg) -> dict:
    """Server-argument values chain-shaped verify (chain and auto) imposes during spec resolution
    (empty in tree mode).

    ``cfg`` is the (resolving) server-args view after the draft-token default is applied. A chain of
    k = speculative_num_draft_tokens tokens (root included) is topk 1 and k - 1 steps, which makes
    FA3/TRTLLM-MHA take their causal topk-1 path and skips the topk>1 + page_size>1 backend
    restriction.
    """
    conf = verify_config(cfg)
    if conf.shape != "chain":
        return {}
    if conf.watermark:
        raise ValueError(f"{FLAG} {conf.mode} cannot be combined with --enable-watermark (its "
                         "verify path reads the tree mask); use tree")
    return {"speculative_eagle_topk": 1, "speculative_num_steps": conf.k - 1}


def dummy_custom_mask(spec, custom_mask):
    """Mask for a CUDA-graph capture dummy of the server whose args are ``spec``: None for
    chain-shaped verify.

    Every place that builds the capture dummy must go through this: a verify graph captured with a
    mask keeps reading the mask buffer at replay, and in chain mode nothing writes that buffer (seen
    on 2x H200, 2026-11-30: the graph captured in the decode graph runner's own dummy attended
    through a stale mask and greedy output diverged from the first verify step).
    """
    return None if verify_config(spec).shape == "chain" else custom_mask


def needs_host_seq_lens(spec) -> bool:
    """Does the n-gram worker read the host copy of the sequence lengths (batch.seq_lens_cpu)? Only
    its tree verify does: it sizes the full custom mask of each request from it; chain-shaped verify
    builds no such mask. SGLang makes the scheduler keep that copy for every n-gram server, a
    blocking device-to-host copy before every decode step that also keeps the host from preparing
    the next step while the GPU runs the current one; without it the attention backends alone decide
    (triton, FlashAttention 3 and TRT-LLM MHA do not need it). Patch 0009 asks this."""
    return verify_config(spec).shape == "tree"


def verify_input_device(custom_mask, draft_token, new_seq_lens):
    """Device of an NgramVerifyInput: the mask's, else the drafts', else new_seq_lens',
    else the current device."""
    for t in (custom_mask, draft_token, new_seq_lens):
        if t is not None:
            return t.device
    import torch

    return (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
            else torch.device("cpu"))


class NgramVerifyHook:
    """Per-worker state: the frozen config, the chain reduction, and verify
    accounting for logs/metrics."""

    def __init__(self, config: ChainConfig, log_interval: int = 40, enable_metrics: bool = False):
        self.config = config
        self.chain = config.mode == "chain"
        self.k = int(config.num_draft_tokens)
        self.log_interval = max(int(log_interval or 40), 1)
        self.stats = VerifyStats()
        self.window = VerifyStats()
        # plans of drafted steps whose verify result has not arrived yet
        self._plans = deque(maxlen=64)
        self._no_draft_plans: dict = {}  # bs -> the (immutable) plan of a step without drafts
        self._gauges = _make_gauges() if enable_metrics else None
        logger.info("n-gram verify mode %s, k=%d, match type %s", config.mode, self.k,
                    config.match_type)

    @classmethod
    def from_args(cls, spec, observability=None) -> "NgramVerifyHook":
        obs = observability if observability is not None else spec
        return cls(verify_config(spec).verify, getattr(obs, "decode_log_interval", 40),
                   getattr(obs, "enable_metrics", False))

    def after_batch_get(self, tokens, mask, bs: int):
        """Corpus output of one step -> what the worker verifies (the chain in chain
        mode, unchanged in tree)."""
        if self.chain:
            tokens, mask, lens = reduce_to_chain(tokens, mask, self.k, self.config.match_type)
        else:
            lens = real_draft_lengths(tokens, mask, self.k)
        self.expect(lens)
        return tokens, mask

    def expect(self, draft_lens) -> None:
        """A step whose result will reach `on_verify_complete` (in step order), with these real
        draft lengths per request (all 0: a step without drafts, such as auto's plain steps)."""
        self._plans.append(plan_verify(draft_lens, self.k, self.config.buckets))

    def expect_no_drafts(self, bs: int) -> None:
        """`expect` for a step without drafts (auto's plain steps: most steps of a load that does
        not speculate), its plan made once per batch size."""
        plan = self._no_draft_plans.get(bs)
        if plan is None:
            plan = self._no_draft_plans[bs] = plan_verify([0] * bs, self.k, self.config.buckets)
        self._plans.append(plan)

    def on_verify_complete(self, num_correct_drafts_per_req) -> None:
        """Verify results on the host (the scheduler already copied them): record
        accept lengths and log."""
        accept_lens = [int(x) + 1 for x in num_correct_drafts_per_req]
        plan = self._plans.popleft() if self._plans else None
        if plan is not None and len(plan.draft_lens) != len(accept_lens):
            # a result from a batch this hook did not draft (should not happen): count accepts only
            plan = None
        self.stats.record(accept_lens, plan)
        self.window.record(accept_lens, plan)
        if self.window.steps >= self.log_interval:
            self._flush()

    def _flush(self) -> None:
        s = self.window.summary()
        logger.info(
            "n-gram verify (%s, k=%d): accept len %.2f, verified tok/step %.1f, with no-match "
            "gating %.1f, no-match %.0f%%, accept len hist %s",
            self.config.mode, self.k, s["accept_length"], s["verified_tokens_per_step"],
            s["planned_tokens_per_step"], 100 * s["no_match_fraction"], s["accept_hist"],
        )
        if self._gauges is not None:
            self._gauges["accept_length"].labels(mode=self.config.mode).set(s["accept_length"])
            self._gauges["verified_tokens_per_step"].labels(mode=self.config.mode).set(s["verified_tokens_per_step"])
            self._gauges["planned_tokens_per_step"].labels(mode=self.config.mode).set(s["planned_tokens_per_step"])
        self.window.reset()


def _make_gauges() -> dict:
    from prometheus_client import Gauge

    def g(name, doc):
        return Gauge(f"sglang:fastverify_ngram_{name}", doc, labelnames=["mode"],
                     multiprocess_mode="mostrecent")

    return {
        "accept_length": g("accept_length",
                           "Tokens emitted per request per n-gram verify step (drafts + bonus)."),
        "verified_tokens_per_step": g("verified_tokens_per_step",
                                      "Tokens the target verifies per step (bs * k)."),
        "planned_tokens_per_step": g("planned_tokens_per_step",
                                     "Tokens per step with no-match gating and the smallest "
                                     "fitting verify width."),
    }
