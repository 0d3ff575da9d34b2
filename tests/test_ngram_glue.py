"""Glue of patch 0005 (fastverify.glue.ngram), and the patched SGLang worker's draft path
in tree and chain mode."""
import types

import numpy as np
import pytest

from fastverify.chain import ChainConfig
from fastverify.glue import ngram as g


def cfg(**kw):
    base = dict(speculative_ngram_verify_mode="tree", speculative_num_draft_tokens=8,
                speculative_ngram_match_type="BFS")
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_spec_overrides():
    assert g.spec_overrides(cfg()) == {}
    assert g.spec_overrides(cfg(speculative_ngram_verify_mode="chain")) == {
        "speculative_eagle_topk": 1, "speculative_num_steps": 7}
    # auto verifies chains: the same overrides
    auto = cfg(speculative_ngram_verify_mode="auto", speculative_ngram_verify_widths="1,2,8")
    assert g.spec_overrides(auto) == {"speculative_eagle_topk": 1, "speculative_num_steps": 7}
    with pytest.raises(ValueError, match="--speculative-ngram-verify-mode chain cannot be combined "
                                         "with --enable-watermark"):
        g.spec_overrides(cfg(speculative_ngram_verify_mode="chain", enable_watermark=True))
    with pytest.raises(ValueError, match="--speculative-ngram-verify-mode must be one of tree, "
                                         "chain, auto; got 'path'"):
        g.spec_overrides(cfg(speculative_ngram_verify_mode="path"))


def test_dummy_mask_and_device():
    import torch

    m = torch.ones(4, dtype=torch.bool)
    assert g.dummy_custom_mask(cfg(), m) is m
    assert g.dummy_custom_mask(cfg(speculative_ngram_verify_mode="chain"), m) is None
    assert g.verify_input_device(None, torch.zeros(2), None) == torch.device("cpu")


def test_hook_from_args_reduces_to_chains_in_chain_and_auto_mode():
    """The worker's hook: chain-shaped for chain and auto (its log and metrics name that shape, as
    before), tree otherwise."""
    auto = g.NgramVerifyHook.from_args(cfg(speculative_ngram_verify_mode="auto",
                                           speculative_ngram_verify_widths="1,2,8"))
    assert auto.chain and auto.config == ChainConfig(mode="chain", num_draft_tokens=8)
    assert not g.NgramVerifyHook.from_args(cfg()).chain


def test_hook_chain_and_accounting():
    h = g.NgramVerifyHook(ChainConfig(mode="chain", num_draft_tokens=4), log_interval=2)
    toks = np.array([3, 4, 44, 55, 9, 0, 0, 0])
    mask = np.concatenate([np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0],
                                     [1, 0, 1, 1]]).reshape(-1),
                           np.tril(np.ones((4, 4)))[:, :].reshape(-1) * 0 + np.eye(4).reshape(-1)])
    mask[16:20] = [1, 0, 0, 0]
    mask[20:24] = [1, 1, 0, 0]
    mask[24:28] = [1, 0, 1, 0]
    mask[28:32] = [1, 0, 0, 1]
    ct, cm = h.after_batch_get(toks, mask, 2)
    assert ct.tolist() == [3, 44, 55, 0, 9, 0, 0, 0]
    h.on_verify_complete([2, 0])
    s = h.stats.summary()
    assert (s["accept_length"] == 2.0 and s["verified_tokens_per_step"] == 8
            and s["no_match_fraction"] == 0.5)
    tree = g.NgramVerifyHook(ChainConfig(mode="tree", num_draft_tokens=4))
    t2, m2 = tree.after_batch_get(toks, mask, 2)
    assert t2 is toks and m2 is mask


def test_steps_without_drafts_count_as_decode_steps_however_announced():
    """auto's plain steps announce themselves with expect_no_drafts (a plan kept per batch
    size); the accounting must read as if each had announced all-zero draft lengths, also
    between steps that did draft."""
    cfg = ChainConfig(mode="chain", num_draft_tokens=4)
    a, b = g.NgramVerifyHook(cfg, log_interval=100), g.NgramVerifyHook(cfg, log_interval=100)
    steps = [(3, None), (2, [2, 0]), (3, None), (1, None), (3, None), (2, [0, 1])]
    for bs, lens in steps:
        a.expect(lens if lens is not None else [0] * bs)
        if lens is None:
            b.expect_no_drafts(bs)
        else:
            b.expect(lens)
    for bs, lens in steps:
        accepted = [1] * bs if lens is None else [x + 1 for x in lens]
        a.on_verify_complete([x - 1 for x in accepted])
        b.on_verify_complete([x - 1 for x in accepted])
    assert b.stats.summary() == a.stats.summary()
    assert (b.stats.no_match_steps == a.stats.no_match_steps == 4
            and b.stats.tokens_planned == 3 + 8 + 3 + 1 + 3 + 8)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from probe_support import patched_sglang, run_probe, tiny_model

    # through 0005; on 0.5.16 that includes 0001, without which the corpus
    # does not build with GCC 12
    folder, _version = patched_sglang(tmp_path_factory, through="0005-ngram-chain-verify.patch")
    return run_probe("ngram_probe.py", tiny_model(tmp_path_factory), folder)


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_flags(probe):
    assert probe["args_chain"] == {"speculative_ngram_verify_mode": "chain",
                                   "speculative_eagle_topk": 1,
                                   "speculative_num_steps": 7, "speculative_num_draft_tokens": 8}
    # the same flags in tree mode hit stock SGLang's topk>1 + page_size>1
    # restriction, which chain mode lifts
    assert "only supported for the 'flashinfer' backend" in probe["args_tree"]["error"]


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_worker_tree_mode_is_stock(probe):
    w = probe["worker_tree"]
    assert not w["mask_is_none"]
    assert w["draft"][:2] == [[3, 4, 44, 5, 55, 6, 66, 77], [44, 55, 66, 77, 88, 99, 100, 0]]
    assert w["positions"][0] == [4, 5, 5, 6, 6, 7, 7, 8]
    assert w["next_token"][0] == [1, 3, 4, 5, 6, -1, 7, -1]
    assert w["next_sibling"][0][:3] == [-1, 2, -1]


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_worker_chain_mode(probe):
    w = probe["worker_chain"]
    assert w["mask_is_none"] and w["device"] == "cpu"
    assert w["draft"] == [[3, 44, 55, 66, 77, 0, 0, 0], [44, 55, 66, 77, 88, 99, 100, 0],
                          [999] + [0] * 7]
    assert w["positions"] == [list(range(s, s + 8)) for s in (4, 3, 3)]
    assert w["next_token"] == [[1, 2, 3, 4, 5, 6, 7, -1]] * 3
    assert w["next_sibling"] == [[-1] * 8] * 3
    assert w["retrieve_index"] == [list(range(b * 8, b * 8 + 8)) for b in range(3)]
    s = w["stats"]
    assert (s["steps"] == 1 and s["no_match_fraction"] == pytest.approx(1 / 3)
            and s["verified_tokens_per_step"] == 24)
