"""glue/config.py: the n-gram verify flags read once per args object into one frozen config."""
import dataclasses
import gc
from types import SimpleNamespace

import pytest

from fastverify.chain import ChainConfig
from fastverify.glue import config


def args(**kw):
    base = dict(speculative_ngram_verify_mode="auto", speculative_num_draft_tokens=8,
                speculative_ngram_match_type="BFS", speculative_ngram_verify_widths="1,2,4,8",
                speculative_ngram_auto_hysteresis=0.05, speculative_ngram_auto_cost_table=None)
    base.update(kw)
    return SimpleNamespace(**base)


class Args:
    """Server args that take weak references (as SGLang's ServerArgs and spec bag do)."""

    def __init__(self, **kw):
        self.__dict__.update(vars(args(**kw)))


@pytest.mark.parametrize("mode,shape", [("tree", "tree"), ("chain", "chain"), ("auto", "chain")])
def test_the_shape_of_each_mode(mode, shape):
    widths = None if mode == "tree" else "1,2,4,8"
    cfg = config.verify_config(args(speculative_ngram_verify_mode=mode,
                                    speculative_ngram_verify_widths=widths))
    assert cfg.mode == mode and cfg.shape == shape and cfg.k == 8
    assert cfg.verify == ChainConfig(mode=shape, num_draft_tokens=8, match_type="BFS")
    assert (cfg.auto is not None) is (mode == "auto")


def test_unpatched_or_unset_mode_reads_as_tree():
    bare = SimpleNamespace(speculative_num_draft_tokens=8, speculative_ngram_match_type="PROB")
    cfg = config.verify_config(bare)
    assert (cfg.mode, cfg.shape, cfg.widths.enabled) == ("tree", "tree", False)
    assert cfg.auto is None and cfg.cost_table is None
    assert config.verify_config(args(speculative_ngram_verify_mode=None,
                                     speculative_ngram_verify_widths=None)).mode == "tree"


def test_auto_settings_come_from_the_flags():
    cfg = config.verify_config(args(speculative_ngram_auto_cost_table="costs.json",
                                    enable_watermark=True))
    a = cfg.auto
    assert (a.max_chain, a.tree_width, a.chain_widths) == (7, 0, (2, 4, 8))
    assert (a.hysteresis, a.shape) == (0.05, "uniform")
    assert cfg.widths.widths == (1, 2, 4, 8) and cfg.cost_table == "costs.json" and cfg.watermark
    # no hysteresis flag (a series without 0007's fields): the controller's default
    assert config.build(args(speculative_ngram_auto_hysteresis=None)).auto.hysteresis == 0.03


def test_the_server_and_the_simulator_share_the_probe_and_sync_steps():
    from fastverify import sim
    from fastverify.controller import AutoConfig

    a = config.verify_config(args()).auto
    assert (a.probe_max, a.cost_sync_steps) == (sim.PROBE_MAX, sim.COST_SYNC_STEPS) == (32, 64)
    for name in ("probe_max", "cost_sync_steps"):
        with pytest.raises(ValueError, match=f"{name} must be an integer >= 1, got 0"):
            AutoConfig(**{name: 0})


def test_the_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.verify_config(args()).mode = "tree"


def test_built_once_per_args_object_whatever_the_object_reads_later():
    """While verify_runtime.spec_settings builds another width, SGLang's settings read that width
    as k: the config of the object stays the one first built."""
    for a in (args(), Args()):
        first = config.verify_config(a)
        a.speculative_num_draft_tokens = 2
        a.speculative_ngram_verify_mode = "tree"
        assert config.verify_config(a) is first and first.k == 8 and first.mode == "auto"
        # another object with the same flags gets a config of its own, built from what it holds
        assert config.verify_config(args(speculative_ngram_verify_mode="tree",
                                         speculative_ngram_verify_widths=None)).mode == "tree"


def test_a_dead_args_object_leaves_the_cache():
    a = Args()
    config.verify_config(a)
    key = id(a)
    assert key in config._CACHE
    del a
    gc.collect()
    assert key not in config._CACHE


@pytest.mark.parametrize("kw,message", [
    (dict(speculative_ngram_verify_mode="path"),
     "--speculative-ngram-verify-mode must be one of tree, chain, auto; got 'path'"),
    (dict(speculative_ngram_verify_widths="2,4,8"),
     "--speculative-ngram-verify-mode auto needs --speculative-ngram-verify-widths with 1"),
    (dict(speculative_ngram_verify_widths=None),
     r"auto needs --speculative-ngram-verify-widths with 1 .* got None"),
    (dict(speculative_ngram_verify_mode="tree"),
     "--speculative-ngram-verify-widths needs --speculative-ngram-verify-mode chain or auto"),
    (dict(speculative_ngram_auto_hysteresis=0.7),
     r"--speculative-ngram-auto-hysteresis must be in \[0, 0.5\)"),
    (dict(speculative_ngram_match_type="DFS"),
     "--speculative-ngram-match-type must be one of BFS, PROB"),
    (dict(speculative_num_draft_tokens=1, speculative_ngram_verify_widths=None,
          speculative_ngram_verify_mode="chain"),
     "--speculative-num-draft-tokens must be an integer >= 2"),
])
def test_bad_flags_name_the_flag(kw, message):
    with pytest.raises(ValueError, match=message):
        config.verify_config(args(**kw))
    # a failed build is not kept: the same object, fixed, builds
    a = args(**kw)
    with pytest.raises(ValueError):
        config.verify_config(a)
    for name, value in vars(args()).items():
        setattr(a, name, value)
    assert config.verify_config(a).mode == "auto"
