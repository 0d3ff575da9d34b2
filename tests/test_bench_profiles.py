"""CPU tests of the microbenchmarks: profile math, references, table/JSON output, the refusal
without GPUs, the NCCL tuning-profile document and the regression compare."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest
import torch

from fastverify import profiles as P
from fastverify.bench import allreduce_vs_compute as avc
from fastverify.bench import common
from fastverify.bench.kernels import addnorm, verify_ops as V
from fastverify.bench.kernels import compare as cmp

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- profiles

def test_kimi_profile_counts_and_shapes():
    kimi = P.get_profile("kimi-k2.5")
    assert kimi.num_layers == 61 and kimi.hidden_size == 7168
    assert kimi.allreduces_per_pass == 122
    assert kimi.allreduce_bytes(8) == 8 * 7168 * 2  # 112 KiB
    dense = P.layer_gemms(kimi, 8, 0)
    moe = P.layer_gemms(kimi, 8, 1)
    assert [g.name for g in dense] == ["qkv_a", "q_b", "kv_b", "o_proj",
                                       "gate_up_proj", "down_proj"]
    by = {g.name: g for g in moe}
    assert (by["qkv_a"].k, by["qkv_a"].n) == (7168, 1536 + 512 + 64)  # replicated
    assert (by["q_b"].k, by["q_b"].n) == (1536, 8 * 192)  # 64 heads / 8 ranks
    assert (by["o_proj"].k, by["o_proj"].n) == (8 * 128, 7168)
    assert (by["experts_gate_up"].n, by["experts_gate_up"].experts,
            by["experts_gate_up"].topk) == (512, 384, 8)
    assert (by["experts_down"].k, by["experts_down"].n) == (256, 7168)
    assert [g.name for g in moe if g.allreduce_after] == ["o_proj", "experts_down"]
    assert {g.name: g.n for g in dense}["gate_up_proj"] == 2 * 18432 // 8


def test_smollm2_does_not_shard_over_two_ranks():
    s = P.get_profile("smollm2-135m")
    with pytest.raises(P.ProfileError, match="num_attention_heads = 9 does not split over TP 2"):
        P.layer_gemms(s, 2, 0)
    g = P.layer_gemms(s, 3, 0)  # 3 heads and 1 KV head per rank
    assert g[0].n == (3 + 2 * 1) * 64 and g[1].k == 3 * 64 and g[2].n == 2 * 512


def test_kv_heads_replicated_when_fewer_than_ranks():
    prof = P.ModelProfile(name="t", num_layers=1, hidden_size=64, vocab_size=1, num_heads=8,
                          num_kv_heads=2, head_dim=8, intermediate_size=128)
    assert P.layer_gemms(prof, 4, 0)[0].n == (2 + 2 * 1) * 8


def test_expected_active_experts():
    assert P.expected_active_experts(384, 8, 1) == pytest.approx(8.0)
    assert P.expected_active_experts(384, 8, 10_000) == pytest.approx(384.0)
    # E * (1 - (1 - k/E)^T) by hand for E=4, k=2, T=2: 4 * (1 - 0.25) = 3
    assert P.expected_active_experts(4, 2, 2) == pytest.approx(3.0)
    assert P.active_experts_int(384, 8, 8) == math.ceil(384 * (1 - (1 - 8 / 384) ** 8))
    assert P.active_experts_int(4, 2, 0) == 0


def test_pass_summary_by_hand():
    prof = P.ModelProfile(name="t", num_layers=2, hidden_size=16, vocab_size=1, num_heads=4,
                          num_kv_heads=4, head_dim=4, intermediate_size=32)
    s = P.pass_summary(prof, 2, tokens=3)
    # per layer per rank: qkv 16x(2+4)*4=384, o 8x16=128, gate_up 16x32=512, down
    # 16x16=256 -> 1280 params
    assert s["weight_bytes"] == 2 * 1280 * 2
    assert s["gemm_flops"] == 2 * 3 * 2 * 1280
    assert s["allreduces"] == 4 and s["allreduce_bytes_total"] == 4 * 3 * 16 * 2


def test_moe_pass_summary_counts_only_active_experts():
    kimi = P.get_profile("kimi-k2.5")
    one = P.pass_summary(kimi, 8, 1)["weight_bytes"]
    many = P.pass_summary(kimi, 8, 4096)["weight_bytes"]
    per_expert = (7168 * 512 + 256 * 7168) * 2
    assert many - one == pytest.approx(60 * (384 - 8) * per_expert)


def test_profile_from_hf_config(tmp_path):
    llama = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
             "num_hidden_layers": 30,
             "intermediate_size": 1536, "vocab_size": 49152, "torch_dtype": "bfloat16",
             "rms_norm_eps": 1e-5}
    p = tmp_path / "smol" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(llama))
    prof = P.load_profile_arg(str(p))
    builtin = P.get_profile("smollm2-135m")
    for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
              "intermediate_size"):
        assert getattr(prof, f) == getattr(builtin, f)
    assert prof.name == "smol" and not prof.is_moe
    ds = {"text_config": {"hidden_size": 7168, "num_attention_heads": 64, "num_hidden_layers": 61,
                          "intermediate_size": 18432, "q_lora_rank": 1536, "kv_lora_rank": 512,
                          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                          "n_routed_experts": 384, "n_shared_experts": 1,
                          "moe_intermediate_size": 2048,
                          "num_experts_per_tok": 8, "first_k_dense_replace": 1,
                          "vocab_size": 163840}}
    prof2 = P.profile_from_hf_config(ds)
    kimi = P.get_profile("kimi-k2.5")
    assert P.layer_gemms(prof2, 8, 5) == P.layer_gemms(kimi, 8, 5)


def test_profile_arg_errors(tmp_path):
    with pytest.raises(P.ProfileError, match="unknown profile 'nope'; allowed"):
        P.load_profile_arg("nope")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(P.ProfileError, match="not valid JSON"):
        P.load_profile_arg(str(bad))
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(P.ProfileError, match="no 'num_attention_heads'"):
        P.load_profile_arg(str(bad))
    with pytest.raises(P.ProfileError, match="no such file"):
        P.load_profile_arg(str(tmp_path / "missing.json"))


# ----------------------------------------------------------------------------- references

def test_add_rmsnorm_torch_matches_fp32_reference():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=g).bfloat16()
    r = torch.randn(5, 96, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(96, generator=g)).bfloat16()
    out, res = addnorm.add_rmsnorm_torch(x, r, w, 1e-6)
    ref_o, ref_r = addnorm.add_rmsnorm_ref(x, r, w, 1e-6)
    assert float((out.float() - ref_o).norm() / ref_o.norm()) < 1e-2
    assert float((res.float() - ref_r).norm() / ref_r.norm()) < 1e-2
    # the reference itself: unit RMS before the gain
    assert torch.allclose((ref_o / w.float()).pow(2).mean(-1), torch.ones(5), atol=1e-3)


def test_rel_err_flags_nan_and_mismatch():
    ref = torch.ones(4, 4)
    assert avc._rel_err(ref.clone().bfloat16(), ref) == 0.0
    assert avc._rel_err(torch.full((4, 4), float("nan")), ref) == float("inf")
    assert avc._rel_err(ref * 1.1, ref) > avc.REL_TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_verify_ops_match_python_references(seed):
    rng = random.Random(seed)
    bs, k = 3, 6
    seq = [rng.randrange(1, 5) for _ in range(bs)]
    parents = [V.random_tree(k, rng) for _ in range(bs)]
    draft = [[rng.randrange(3) for _ in range(k)] for _ in range(bs)]
    target = [[rng.randrange(3) for _ in range(k)] for _ in range(bs)]
    ts, tp, td, tt = (torch.tensor(v) for v in (seq, parents, draft, target))
    assert V.chain_mask(ts, k).tolist() == V.chain_mask_ref(seq, k)
    assert V.chain_positions(ts, k).tolist() == [L + i for L in seq for i in range(k)]
    assert V.tree_mask(ts, tp).tolist() == V.tree_mask_ref(seq, parents)
    assert V.tree_positions(ts, tp).tolist() == V.tree_positions_ref(seq, parents)
    assert V.greedy_accept_chain(td, tt).tolist() == V.greedy_accept_chain_ref(draft, target)
    assert (V.greedy_accept_tree(td, tt, tp).tolist()
            == V.greedy_accept_tree_ref(draft, target, parents))


def test_chain_is_a_tree_of_one_branch():
    k = 5
    chain = [[-1, 0, 1, 2, 3]]
    draft = [[9, 1, 2, 7, 4]]
    target = [[1, 2, 3, 4, 5]]
    assert (V.greedy_accept_tree_ref(draft, target, chain)
            == V.greedy_accept_chain_ref(draft, target) == [2])
    assert V.tree_mask_ref([2], chain) == V.chain_mask_ref([2], k)


def test_layer_half_shapes_on_cpu():
    """The pass builder on CPU tensors: every half-layer returns the
    [tokens, hidden] partial sum."""
    prof = P.ModelProfile(name="tiny-moe", num_layers=3, hidden_size=32, vocab_size=1, num_heads=4,
                          num_kv_heads=4, head_dim=8, intermediate_size=64, q_lora_rank=16,
                          kv_lora_rank=8,
                          qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=6,
                          n_shared_experts=1, moe_intermediate_size=16, num_experts_per_tok=2,
                          first_k_dense_replace=1)
    ctx = object.__new__(avc._Ctx)
    ctx.torch, ctx.profile, ctx.hidden, ctx.dtype = torch, prof, 32, torch.float32
    ctx.dev = torch.device("cpu")
    ctx.plan = {"shard_tp": 2}
    ctx.opts = {"weight_slots": 2}
    ctx.max_tokens = 5
    ctx.build_weights()
    assert ctx.slot_count[ctx.layer_kinds[1]] == 2 and ctx.slot_count[ctx.layer_kinds[0]] == 1
    for t in (1, 5):
        x = torch.randn(t, 32)
        for layer in range(3):
            for half in (0, 1):
                assert ctx.layer_half(layer, x, t, half).shape == (t, 32)


# ----------------------------------------------------------------------------- output

def test_format_table_fixed_width():
    txt = common.format_table(["name", "us"], [["a", 1.0], ["long-name", 12.25], ["c", None]])
    lines = txt.splitlines()
    assert lines[0].startswith("name") and set(lines[1]) <= {"-", " "}
    assert lines[2].endswith(" 1.0") and lines[3].endswith("12.2") and lines[4].endswith("-")
    assert len({len(line) for line in lines[2:4]}) == 1


def test_preamble_and_json(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_PROTO", "LL")
    info = common.collect_env({"flashinfer": "0.6.14"})
    text = common.format_preamble(info, {"argv": "--x 1"}, ["a note"])
    assert all(line.startswith("# ") for line in text.splitlines())
    assert "NCCL_PROTO=LL" in text and "flashinfer: 0.6.14" in text and "# a note" in text
    repro = common.repro_command(["--profile", "my model"], avc.SCRIPT)
    assert repro == "python benchmark/allreduce_vs_compute.py --profile 'my model'"
    p = common.write_json(tmp_path / "o" / "r.json", {"x": 1, "path": tmp_path}, repro)
    data = json.loads(p.read_text())
    assert data["repro_command"] == repro and data["x"] == 1


def test_multicast_must_stay_off():
    env = {}
    assert common.enforce_no_multicast(env) == common.REQUIRED_ENV
    with pytest.raises(ValueError, match="NCCL_NVLS_ENABLE=1"):
        common.enforce_no_multicast({"NCCL_NVLS_ENABLE": "1"})


# ----------------------------------------------------------------------------- CLI

@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="checks the refusal on a machine without GPUs")
def test_refuses_cleanly_without_gpus(capsys):
    assert avc.main(["--profile", "kimi-k2.5"]) == 2
    err = capsys.readouterr().err
    assert "needs 2 CUDA GPU(s); this machine has none" in err and "--dry-run" in err
    from fastverify.bench.kernels import run as krun
    assert krun.main([]) == 2
    assert "needs 1 CUDA GPU(s)" in capsys.readouterr().err


def test_dry_run_plan(capsys):
    assert avc.main(["--dry-run", "--shard-tp", "8", "--batch-sizes", "1,4", "--nccl-buffsizes",
                     "default"]) == 0
    out = capsys.readouterr().out
    assert "122 all-reduces per pass" in out and "tokens [1, 2, 4, 8, 16, 32, 64, 128, 256]" in out
    assert out.count("job nccl-tuned[") == 3 * 2
    assert avc.main(["--dry-run", "--profile", "smollm2-135m"]) == 2  # 9 heads over 2 ranks


def test_bad_flags_name_the_flag():
    with pytest.raises(SystemExit, match="--backends: unknown"):
        avc.parse_args(["--backends", "nccl,bogus"])
    with pytest.raises(SystemExit, match="--widths"):
        avc.parse_args(["--widths", "1,x"])
    args = avc.parse_args(["--backends", "all"])
    assert args.backends == list(avc.ALL_BACKENDS)


def test_sweep_settings_set_variables_per_process():
    s = avc.nccl_sweep_settings(["LL", "Simple"], [2], ["default", "1048576"])
    assert len(s) == 4
    assert s[0] == {"NCCL_PROTO": "LL", "NCCL_MIN_NCHANNELS": "2", "NCCL_MAX_NCHANNELS": "2"}
    assert s[1]["NCCL_BUFFSIZE"] == "1048576"


# ------------------------------------------------------------------------ aggregation, NCCL profile

def _sweep_result(env, times):
    return {"job": "nccl-tuned[x]", "job_env": env,
            "variants": {"nccl": {"sizes": {str(t): {"ar_graph_us_per_call": us}
                                            for t, us in times.items()}}}}


def test_best_per_size_and_profile_document(tmp_path):
    a = {"NCCL_PROTO": "LL"}
    b = {"NCCL_PROTO": "Simple"}
    sweep = [_sweep_result(a, {1: 10.0, 8: 12.0, 64: 30.0}),
             _sweep_result(b, {1: 11.0, 8: 13.0, 64: 20.0})]
    sweep.append({"job": "nccl-tuned[y]", "job_env": {"NCCL_PROTO": "LL128"},
                  "variants": {"nccl": {"sizes": {"1": {"ar_graph_us_per_call": 1.0,
                                                        "error": "wrong result"}}}}})
    best = avc.best_nccl_per_size(sweep, [1, 8, 64])
    assert best[1]["env"] == a and best[64]["env"] == b  # the wrong (faster) result is never chosen
    doc = avc.nccl_profile_payload(best, hidden=7168, dtype_bytes=2, source={"gpu": "test"})
    assert doc["format"] == "fastverify-nccl-profile/1" and doc["env"] == a  # wins 2 of 3 sizes
    assert set(doc) == {"format", "env", "source", "by_size"}
    assert doc["by_size"][-1] == {"bytes": 64 * 7168 * 2, "tokens": 64, "best": b, "us": 20.0}
    path = tmp_path / "prof.json"
    avc.write_nccl_profile(str(path), doc)
    assert json.loads(path.read_text())["format"] == "fastverify-nccl-profile/1"
    try:
        from fastverify import nccl as fv_nccl
    except ImportError:
        fv_nccl = None
    if fv_nccl is not None and hasattr(fv_nccl, "load_profile"):
        fv_nccl.load_profile(str(path))  # the flag's loader accepts what the benchmark writes
    with pytest.raises(ValueError):
        avc.nccl_profile_payload({}, 7168, 2, {})
    # with NCCL's defaults measured in the same run: "env" comes only from sizes
    # where the sweep beats them
    doc2 = avc.nccl_profile_payload(best, 7168, 2, {"gpu": "t"},
                                    default_us={1: 9.0, 8: 5.0, 64: 25.0})
    # a wins more sizes overall
    assert doc2["env"] == b and doc2["source"]["beats_default_sizes"] == "1 of 3"
    assert doc2["by_size"][1]["default_us"] == 5.0
    avc.write_nccl_profile(str(path), doc2)
    if fv_nccl is not None and hasattr(fv_nccl, "load_profile"):
        fv_nccl.load_profile(str(path))


def _plan(tokens=(8,), bs=(1,)):
    return {"allreduces_per_pass": 122, "tokens": list(tokens), "batch_sizes": list(bs),
            "widths": [8]}


def test_summarize_and_targets():
    res = [
        {"job": "nccl", "compute": {"8": 10_000.0},
         "variants": {"nccl": {"sizes": {"8": {"ar_graph_us_per_call": 19.5,
                                               "ar_eager_us_per_call": 39.0,
                                                 "arnorm_graph_us_pass": 2800.0,
                                                 "arnorm_unfused_graph_us_pass": 3600.0,
                                                 "pass_graph_us": 12_500.0}}}}},
        {"job": "flashinfer", "variants": {
            "flashinfer-ar": {"sizes": {"8": {"ar_graph_us_per_call": 6.0}}},
            "flashinfer-fused": {"sizes": {"8": {"ar_graph_us_per_call": 6.0,
                                                 "arnorm_graph_us_pass": 976.0,
                                                 "pass_graph_us": 11_000.0}}}}},
        {"job": "symm", "variants": {"symm-oneshot": {"sizes": {"8": {"error": "wrong result"}}}}},
    ]
    s = avc.summarize(_plan(), res)
    assert s["wrong_results"] == 1
    nccl = next(r for r in s["rows"] if r["backend"] == "nccl")
    assert (nccl["ar_share"] == pytest.approx(0.2)
            and nccl["ar_only_pass_us"] == pytest.approx(19.5 * 122))
    t = s["targets"]
    assert t["best_unfused"]["backend"] == "flashinfer-ar" and t["best_unfused"]["met"]
    assert t["best_fused"]["us_per_call"] == pytest.approx(8.0) and t["best_fused"]["met"]
    assert t["pass_speedup_vs_nccl_unfused"]["speedup"] == pytest.approx(3600 / 976)
    assert t["pass_speedup_vs_nccl_unfused"]["met"]
    rows = avc.table_rows(s)
    assert any(r[0] == "symm-oneshot" and r[2] == "wrong result" for r in rows)


def test_plot_png(tmp_path):
    pytest.importorskip("matplotlib")
    plan = {**_plan(), "profile": {"name": "kimi-k2.5"}, "shard_tp": 8, "world": 2}
    summary = {"rows": [{"backend": "nccl", "tokens": 8, "pass_us": 12.0, "compute_us": 10.0}]}
    assert avc.plot_png(str(tmp_path / "p.png"), plan, summary)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# ----------------------------------------------------------------------------- regression compare

def _bench(ref_us, kernels):
    return {"format": cmp.FORMAT, "reference": {"name": "copy", "us": ref_us},
            "kernels": {k: ({"us": v} if v is not None else {"error": "wrong result"})
                        for k, v in kernels.items()}}


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return str(p)


def test_compare_normalizes_by_same_run_reference(tmp_path):
    base = _write(tmp_path, "b.json", _bench(100.0, {"a": 10.0, "b": 20.0}))
    # a machine 2x slower overall: both the reference and the kernels doubled -> no regression
    slow = _write(tmp_path, "s.json", _bench(200.0, {"a": 20.0, "b": 40.0}))
    assert cmp.main([base, slow]) == 0
    assert cmp.main([base, slow, "--absolute"]) == 1
    # one kernel 30% slower relative to the reference -> regression past 15%, not past 50%
    reg = _write(tmp_path, "r.json", _bench(100.0, {"a": 13.0, "b": 20.0}))
    assert cmp.main([base, reg]) == 1
    assert cmp.main([base, reg, "--threshold", "0.5"]) == 0
    rows, ok = cmp.compare(cmp.load(base), cmp.load(reg), 0.15)
    assert not ok and next(r for r in rows if r["kernel"] == "a")["ratio"] == pytest.approx(1.3)


def test_compare_missing_wrong_and_bad_input(tmp_path, capsys):
    base = _write(tmp_path, "b.json", _bench(100.0, {"a": 10.0, "b": 20.0}))
    assert cmp.main([base, _write(tmp_path, "m.json", _bench(100.0, {"a": 10.0}))]) == 1
    assert "MISSING" in capsys.readouterr().out
    assert cmp.main([base, _write(tmp_path, "w.json", _bench(100.0, {"a": 10.0, "b": None}))]) == 1
    assert cmp.main([base, _write(tmp_path, "x.json", {"format": "other"})]) == 2
    assert "expected 'fastverify-kernel-bench/1'" in capsys.readouterr().err
    assert cmp.main([base, str(tmp_path / "none.json")]) == 2


def test_extract_allreduce(tmp_path):
    ar = {"plan": {"allreduces_per_pass": 122}, "repro_command": "python x",
          "summary": {"rows": [
              {"backend": "nccl", "tokens": 1, "ar_graph_us": 20.0, "arnorm_pass_us": 122 * 25.0},
              {"backend": "nccl", "tokens": 8, "ar_graph_us": 21.0},
              {"backend": "flashinfer-fused", "tokens": 8, "ar_graph_us": 6.0,
               "arnorm_pass_us": 122 * 7.0},
              {"backend": "symm-oneshot", "tokens": 8, "error": "wrong result",
               "ar_graph_us": None}]}}
    out = cmp.extract_allreduce(ar)
    assert out["reference"] == {"name": "allreduce/nccl/T=1", "us": 20.0}
    assert out["kernels"]["allreduce_add_rmsnorm/flashinfer-fused/T=8"]["us"] == pytest.approx(7.0)
    assert "allreduce/symm-oneshot/T=8" not in out["kernels"]
    src = _write(tmp_path, "ar.json", ar)
    dst = str(tmp_path / "k.json")
    assert cmp.main(["--extract-allreduce", src, dst]) == 0
    assert cmp.main([dst, dst]) == 0


def test_cli_subcommand_dispatches(capsys):
    from fastverify.bench import cli as bench_cli
    assert bench_cli.main(["bench", "allreduce", "--dry-run", "--widths", "8", "--backends",
                           "nccl"]) == 0
    assert "122 all-reduces per pass" in capsys.readouterr().out
    assert bench_cli.main(["bench", "compare", "missing-a.json", "missing-b.json"]) == 2


def test_nccl_profile_from_committed_results(tmp_path, capsys):
    """The committed 2x H200 run rebuilds its tuning profile without a GPU, and the
    flag's loader takes it."""
    res = ROOT / "benchmark" / "results" / "h200x2" / "allreduce_kimi.json"
    if not res.exists():
        pytest.skip("no committed run")
    out = tmp_path / "p.json"
    assert avc.main(["--nccl-profile-from", str(res), "--write-nccl-profile", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["format"] == "fastverify-nccl-profile/1"
            and doc["env"]["NCCL_PROTO"] in ("LL", "LL128", "Simple"))
    assert all("default_us" in r for r in doc["by_size"])
    assert avc.main(["--nccl-profile-from", str(tmp_path / "none.json"), "--write-nccl-profile",
                     str(out)]) == 2


def test_compute_only_plan_and_rows():
    args = avc.parse_args(["--compute-only", "--world", "1", "--widths", "1,8"])
    plan = avc.build_plan(args)
    assert [j["name"] for j in plan["jobs"]] == ["compute"] and plan["compute_only"]
    s = avc.summarize({**plan},
                      [{"job": "compute", "compute": {"1": 900.0, "8": 1000.0}, "variants": {}}])
    assert [(r["backend"], r["tokens"], r["compute_us"]) for r in s["rows"]] == [
        ("compute-only", 1, 900.0), ("compute-only", 8, 1000.0)]
    with pytest.raises(SystemExit):
        avc.parse_args(["--world", "1"])


def test_host_timer_is_the_median_per_call_and_syncs_outside_the_timed_part(monkeypatch):
    """time_host_us on a fake clock: runs of 10 calls taking 30, 10 and 20 us -> 2 us per call (the
    median run); the sync before and after each run is not timed."""
    now = [0.0]
    took = iter((30e-6, 10e-6, 20e-6))
    events = []

    def run(n):
        events.append(("run", n))
        now[0] += next(took)

    def sync():
        events.append(("sync",))
        now[0] += 1.0  # would dominate every run if it were timed

    monkeypatch.setattr(common.time, "perf_counter", lambda: now[0])
    assert common.time_host_us(run, 10, 3, sync=sync) == pytest.approx(2.0)
    assert events == [("sync",), ("run", 10), ("sync",)] * 3
    calls = []
    common.calls_of(lambda: calls.append(1))(4)
    assert len(calls) == 4


def test_fastverify_bench_and_the_benchmark_scripts_run_the_package_code(capsys):
    """`fastverify bench` imports fastverify.bench (no file loaded by path), and each thin script in
    benchmark/ runs the same main."""
    import subprocess

    from fastverify import cli

    assert cli.main(["bench", "compare", "missing-a.json", "missing-b.json"]) == 2
    assert "missing-a.json" in capsys.readouterr().err
    for script, option in (("benchmark/kernels/compare.py", "--extract-allreduce"),
                           ("benchmark/kernels/run.py", "--shapes"),
                           ("benchmark/allreduce_vs_compute.py", "--write-nccl-profile")):
        r = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True,
                           text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin"}, timeout=120)
        assert r.returncode == 0 and option in r.stdout, (script, r.stderr[-2000:])
