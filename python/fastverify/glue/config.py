"""The n-gram verify flags of a server, read once into the frozen config every glue module reads.

Patches 0005, 0007 and 0008 add the flags. SGLang keeps them on its server args: ServerArgs in
0.5.16, the resolving view in 0.5.23's launcher and the published ``get_spec()`` bag in its
workers. `verify_config` reads them off such an object once and keeps the config per object, so a
later read sees the flags as they were first read: while `verify_runtime.spec_settings` builds the
runtime of another verify width, SGLang's settings read that width as
--speculative-num-draft-tokens, and a capture dummy built meanwhile still takes the server's mode
and k from here.

    flag                                  field
    --speculative-ngram-verify-mode       mode: tree | chain | auto (unpatched SGLang: tree)
                                          shape: "tree", or "chain" for chain and auto (auto
                                          verifies chains: one path, causal attention, no mask)
    --speculative-num-draft-tokens        k, the verify width including the root
    (shape, k, --speculative-ngram-match-type)
                                          verify: the library's fastverify.chain.ChainConfig
    --speculative-ngram-verify-widths     widths: fastverify.widths.WidthsConfig (none: off)
    --speculative-ngram-auto-hysteresis   auto: fastverify.controller.AutoConfig, None unless
                                          auto (which needs widths with 1: the plain step)
    --speculative-ngram-auto-cost-table   cost_table: a path, or None (calibrated at start-up)
    --enable-watermark                    watermark (chain-shaped verify refuses it)

A bad value raises ValueError naming the flag. Nothing here imports SGLang.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

from fastverify.chain import ChainConfig
from fastverify.controller import AutoConfig
from fastverify.widths import FLAG as WIDTHS_FLAG
from fastverify.widths import WidthsConfig, parse_widths

MODE_FLAG = "--speculative-ngram-verify-mode"
MODES = ("tree", "chain", "auto")


@dataclass(frozen=True)
class NgramVerifyConfig:
    mode: str  # --speculative-ngram-verify-mode
    verify: ChainConfig  # the verify pass: its shape (ChainConfig.mode), k, the match type
    widths: WidthsConfig  # --speculative-ngram-verify-widths
    auto: Optional[AutoConfig] = None  # the controller's settings; None unless mode is auto
    cost_table: Optional[str] = None  # --speculative-ngram-auto-cost-table
    watermark: bool = False  # --enable-watermark

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"{MODE_FLAG} must be one of {', '.join(MODES)}; got {self.mode!r}")

    @property
    def shape(self) -> str:
        """The verify pass's shape: "tree" (the corpus' draft tree under a custom attention mask)
        or "chain" (one path, causal attention, no mask), which chain and auto mode share."""
        return self.verify.mode

    @property
    def k(self) -> int:
        """--speculative-num-draft-tokens: the verify width, root included."""
        return int(self.verify.num_draft_tokens)


_CACHE: dict = {}  # id(args object) -> (a reference to the object, its config)


def verify_config(spec) -> NgramVerifyConfig:
    """The config of the flags on ``spec`` (SGLang's server args or spec bag): built on the first
    call for that object, the same config object on every later call."""
    key = id(spec)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is spec:
        return hit[1]
    cfg = build(spec)
    try:
        ref = weakref.ref(spec, lambda r, key=key: _CACHE.get(key, (None,))[0] is r
                          and _CACHE.pop(key))
    except TypeError:  # no weak references to it (a namespace): kept alive with its config
        ref = _Strong(spec)
    _CACHE[key] = (ref, cfg)
    return cfg


class _Strong:
    """A strong reference, called like a weak one."""

    def __init__(self, obj):
        self.obj = obj

    def __call__(self):
        return self.obj


def build(spec) -> NgramVerifyConfig:
    """The config from the flags as ``spec`` holds them now (`verify_config` keeps one per
    object)."""
    mode = getattr(spec, "speculative_ngram_verify_mode", None) or "tree"
    if mode not in MODES:  # first: k and the widths are checked against it
        raise ValueError(f"{MODE_FLAG} must be one of {', '.join(MODES)}; got {mode!r}")
    k = int(spec.speculative_num_draft_tokens)
    # auto verifies chains (ChainConfig's modes are the two shapes)
    verify = ChainConfig(mode="tree" if mode == "tree" else "chain", num_draft_tokens=k,
                         match_type=spec.speculative_ngram_match_type)
    raw_widths = getattr(spec, "speculative_ngram_verify_widths", None)
    widths = parse_widths(raw_widths, k, mode)
    auto = None
    if mode == "auto":
        if not widths.enabled or 1 not in widths.widths:
            raise ValueError(f"{MODE_FLAG} auto needs {WIDTHS_FLAG} with 1 (the step without "
                             f"speculation) and k = {k}, e.g. {WIDTHS_FLAG} 1,2,4,{k}; "
                             f"got {raw_widths!r}")
        h = getattr(spec, "speculative_ngram_auto_hysteresis", None)
        auto = AutoConfig(max_chain=k - 1, tree_width=0,
                          chain_widths=tuple(w for w in widths.widths if w >= 2),
                          hysteresis=AutoConfig.hysteresis if h is None else float(h),
                          shape="uniform")
    return NgramVerifyConfig(mode, verify, widths, auto,
                             cost_table=getattr(spec, "speculative_ngram_auto_cost_table", None)
                             or None,
                             watermark=bool(getattr(spec, "enable_watermark", False)))
