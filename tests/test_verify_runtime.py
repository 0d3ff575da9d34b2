"""Glue of patch 0008 (fastverify.glue.verify_runtime) and the patched SGLang n-gram worker
switching verify widths."""
import contextlib
import types

import pytest
import torch

from fastverify.glue import verify_runtime as vr
from fastverify.widths import WidthsConfig

FLAG = "--speculative-ngram-verify-widths"


def spec(**kw):
    base = dict(speculative_ngram_verify_widths="1,2,8", speculative_num_draft_tokens=8,
                speculative_ngram_verify_mode="chain", speculative_ngram_match_type="BFS")
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_validate_server_args():
    assert vr.validate_server_args(spec()).widths == (1, 2, 8)
    assert not vr.validate_server_args(spec(speculative_ngram_verify_widths=None)).enabled
    unpatched = types.SimpleNamespace(speculative_num_draft_tokens=8,
                                      speculative_ngram_match_type="BFS")
    assert not vr.validate_server_args(unpatched).enabled
    for name, flag in (("enable_lora", "--enable-lora"), ("enable_pdmux", "--enable-pdmux")):
        with pytest.raises(ValueError, match=f"{FLAG} cannot be combined with {flag}"):
            vr.validate_server_args(spec(), types.SimpleNamespace(**{name: True}))
    with pytest.raises(ValueError, match="chain or auto"):
        vr.validate_server_args(spec(speculative_ngram_verify_mode="tree"))


def _worker(widths=(1, 2, 8), k=8, max_bs=3, mode="chain"):
    w = types.SimpleNamespace(draft_token_num=k, speculative_num_draft_tokens=k,
                              max_batch_size=max_bs, device="cpu")
    w.model_runner = types.SimpleNamespace(attn_backend="A8", decode_cuda_graph_runner="G8")
    for name, buf, per, rows in vr.VIEW_LISTS:
        shape = (max_bs, k) if rows else (max_bs * k * (k if per == "w*w" else 1),)
        setattr(w, buf, torch.zeros(shape, dtype=torch.int64))
        setattr(w, name, [f"{name}@k"])
    cfg = WidthsConfig(tuple(widths), k, mode)
    rts = {k: vr._capture(w, k)}
    for width in cfg.extra:
        rts[width] = vr.VerifyRuntime(width, f"A{width}", f"G{width}", vr._worker_views(w, width))
    w._fv_widths = vr.WidthRuntimes(cfg, rts, k, log_interval=2)
    return w


def test_select_and_finish_restore_k():
    w = _worker()
    toks = torch.tensor([5, 11, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0]).numpy()
    mask = torch.ones(2 * 64, dtype=torch.int64).numpy()
    t, m = vr.step_drafts(w, toks, mask, 2)  # longest draft 1 -> width 2
    assert t.tolist() == [5, 11, 6, 0] and m.size == 8
    assert (w.draft_token_num, w.model_runner.attn_backend,
            w.model_runner.decode_cuda_graph_runner) == (2, "A2", "G2")
    assert w.retrieve_indexes_batch[2].shape == (2, 2) and vr.carried_stride(w) == 8
    carried, width = vr.finish_step(w, torch.tensor([11, 7, 3, 9]), 2)
    assert width == 2 and carried.tolist() == [11, 7, 0, 0, 0, 0, 0, 0, 3, 9, 0, 0, 0, 0, 0, 0]
    assert (w.draft_token_num, w.speculative_num_draft_tokens,
            w.model_runner.attn_backend) == (8, 8, "A8")
    assert w.draft_tokens_batch == ["draft_tokens_batch@k"]
    # a step that selected nothing (prefill) passes through at k and is not counted
    acc = torch.zeros(16)
    assert vr.finish_step(w, acc, 2) == (acc, 8) and w._fv_widths.stats.steps == 1
    # no drafts -> width 1
    t, _ = vr.step_drafts(w, torch.tensor([5] + [0] * 7 + [6] + [0] * 7).numpy(), mask, 2)
    assert t.tolist() == [5, 6] and w.model_runner.decode_cuda_graph_runner == "G1"
    vr.finish_step(w, torch.tensor([1, 2]), 2)
    assert w._fv_widths.stats.summary()["steps_by_width"] == {1: 1, 2: 1}


def test_errors_and_flag_off():
    w = _worker()
    with pytest.raises(ValueError, match=r"verify width 4 was not captured; .* gives \(1, 2, 8\)"):
        vr.select_runtime(w, 4)
    off = types.SimpleNamespace(draft_token_num=8, speculative_num_draft_tokens=8, _fv_widths=None)
    with pytest.raises(ValueError, match=f"start the server with {FLAG}"):
        vr.select_runtime(off, 2)
    toks, mask = object(), object()
    assert vr.step_drafts(off, toks, mask, 2) == (toks, mask)  # returns its inputs untouched
    acc = torch.arange(16)
    assert vr.finish_step(off, acc, 2) == (acc, 8) and vr.carried_stride(off) == 8
    auto = _worker(mode="auto")
    # auto: its controller calls select_runtime
    assert vr.step_drafts(auto, toks, mask, 2) == (toks, mask)
    vr.select_runtime(auto, 1)
    assert auto.model_runner.attn_backend == "A1"


# ----------------------------------------------------------------------- patched SGLang (both pins)
@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from probe_support import patched_sglang, run_probe, tiny_model

    folder, _version = patched_sglang(tmp_path_factory, through="0008-ngram-verify-widths.patch")
    return run_probe("widths_probe.py", tiny_model(tmp_path_factory), folder)


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_flag(probe):
    assert probe["args_ok"] == {"widths": "1,2,4,8"} and probe["args_default"] == {"widths": None}
    assert "must include k = 8" in probe["args_missing_k"]["error"]
    assert "needs --speculative-ngram-verify-mode chain or auto" in probe["args_tree"]["error"]
    assert f"{FLAG} takes comma-separated integers" in probe["args_garbage"]["error"]


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_runtimes_built_under_the_width(probe):
    assert probe["widths"] == [1, 2, 4, 8] and probe["spec_k_after_build"] == 8
    assert [(b["width"], b["steps"], b["spec_k_seen"])
            for b in probe["built"]] == [(1, 0, 1), (2, 1, 2), (4, 3, 4)]
    assert [b["backend"] for b in probe["built"]] == [f"backend@{w}/new=True" for w in (1, 2, 4)]


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_worker_switches_per_step(probe):
    restored = {"draft_token_num": 8, "runner_width": 8, "backend": "backend@8",
                "views_restored": True}
    s = probe["step_nomatch"]  # no request has a draft: width 1, the root = the plain decode token
    assert s["verified_tokens"] == {"runner_width": 1, "backend": "backend@1/new=True", "tokens": 2}
    assert s["draft"] == [3, 9] and s["result_stride"] == 1 and s["next_token_ids"] == [10, 10]
    assert (s["carried_stride"] == 8 and s["carried"] == [10] + [0] * 7 + [10] + [0] * 7
            and s["after"] == restored)
    s = probe["step_long"]  # a 7-token chain: width k
    assert (s["verified_tokens"]["runner_width"] == 8 and s["accept_lens"] == [8, 1]
            and s["after"] == restored)
    s = probe["step_short"]  # longest draft 2 -> width 4 (smallest captured >= 3)
    assert s["verified_tokens"] == {"runner_width": 4, "backend": "backend@4/new=True", "tokens": 8}
    assert (s["draft"] == [5, 15, 25, 0, 6, 0, 0, 0] and s["result_stride"] == 4
            and s["after"] == restored)
    assert s["carried"] == [10, 10, 10, 10, 0, 0, 0, 0, 10, 10, 10, 10, 0, 0, 0, 0]
    s = probe["step_splice"]  # carried tokens of step_long read back at stride 8 (overlap splice)
    assert s["draft"] == [90, 100, 110, 0, 0, 0, 0, 0, 10, 20, 30, 40, 50, 60, 70, 80]
    assert s["accept_lens"] == [3, 8]
    assert probe["stats"]["steps_by_width"] == {"1": 1, "4": 1, "8": 2}


@pytest.mark.sglang
def test_own_graph_pool_gives_a_capture_a_fresh_pool_and_puts_the_shared_one_back(monkeypatch):
    """On the installed SGLang's pool helpers: inside, a runner that starts capturing
    makes a new pool (as the plain server's first capture does); after, later captures
    share SGLang's pool again."""
    pool = pytest.importorskip("sglang.srt.model_executor.runner_utils.pool")
    shared = object()
    made = []
    device = types.SimpleNamespace(graph_pool_handle=lambda: made.append(object()) or made[-1])
    pool.set_global_graph_memory_pool(shared)
    try:
        with vr.own_graph_pool():
            assert pool.get_global_graph_memory_pool() is None
            own = pool.get_or_create_global_graph_memory_pool(device)
            assert own is made[0] and own is not shared
            # one pool for all its graphs
            assert pool.get_or_create_global_graph_memory_pool(device) is own
        assert pool.get_global_graph_memory_pool() is shared
        assert pool.get_or_create_global_graph_memory_pool(device) is shared and len(made) == 1
        with pytest.raises(RuntimeError):
            with vr.own_graph_pool():
                raise RuntimeError("capture failed")
        assert pool.get_global_graph_memory_pool() is shared  # put back on an error too
    finally:
        pool.set_global_graph_memory_pool(None)


def test_own_graph_pool_for_the_plain_runtime_only(monkeypatch):
    entered = []

    @contextlib.contextmanager
    def fake_pool():
        entered.append(True)
        yield

    monkeypatch.setattr(vr, "own_graph_pool", fake_pool)
    monkeypatch.setattr(vr, "spec_settings", lambda mr, w: contextlib.nullcontext())
    monkeypatch.setattr(vr, "plain_algorithm", lambda mr: contextlib.nullcontext())
    mr = types.SimpleNamespace(decode_cuda_graph_runner=None, init_new_workspace=False,
                               _get_attention_backend=lambda init_new_workspace: "backend")
    worker = types.SimpleNamespace(model_runner=mr, device="cpu")
    vr._build_one(worker, 1, plain=True)
    assert entered == [True]
    monkeypatch.setattr(vr, "_worker_views", lambda w, width: {})
    vr._build_one(worker, 2)  # a verify width: the shared pool
    assert entered == [True]
