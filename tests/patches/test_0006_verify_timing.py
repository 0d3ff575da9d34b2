"""Drift guards for patch 0006-verify-timing: the seams it touches still exist, with the shapes
the patch and fastverify.glue.timing_hook rely on, in every pinned SGLang (parsed from the
pristine sources with ast).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fastverify import pins

VERSIONS = pins.supported_versions()
FLAG_HOME = {  # where the flags are declared (next to decode_log_interval)
    "0.5.16": ("srt/server_args.py", "ServerArgs"),
    "0.5.23": ("srt/arg_groups/fields/observability.py", "Observability"),
}


def _tree(root: Path, rel: str) -> ast.Module:
    return ast.parse((root / "sglang" / rel).read_text())


def _class(mod: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"class {name} is gone"
    return found[0]


def _func(scope, name: str):
    found = [n for n in scope.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.name == name]
    assert found, f"function {name} is gone"
    return found[0]


def _argnames(fn) -> list:
    return [a.arg for a in fn.args.args]


@pytest.fixture(params=VERSIONS)
def src(request, pristine_source):
    return request.param, pristine_source(request.param)


def test_group_coordinator_collectives(src):
    version, root = src
    gc = _class(_tree(root, "srt/distributed/parallel_state.py"), "GroupCoordinator")
    ar = _func(gc, "all_reduce")
    assert _argnames(ar) == ["self", "input_"] and not ar.decorator_list
    fused = _func(gc, "fused_allreduce_rmsnorm")
    assert _argnames(fused) == ["self", "input_", "residual_inp_", "weight_", "eps"]
    # the glue reads these off the TP group
    init = _func(gc, "__init__")
    assigned = {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Attribute)}
    assert {"rank_in_group", "world_size", "pynccl_comm"} <= assigned, version
    ps = _tree(root, "srt/distributed/parallel_state.py")
    _func(ps, "get_tp_group")


def test_flashinfer_fused_entry_point(src):
    _, root = src
    mod = _tree(root, "srt/layers/flashinfer_comm_fusion.py")
    fn = _func(mod, "flashinfer_allreduce_residual_rmsnorm")
    assert _argnames(fn)[:4] == ["input_tensor", "residual", "weight", "eps"]
    decos = [d.func.id for d in fn.decorator_list if isinstance(d, ast.Call)
             and isinstance(d.func, ast.Name)]
    assert decos == ["register_custom_op"]  # our decorator goes above this one
    # it declines with (None, None)-style results the glue must not count
    assert any(isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)
               and isinstance(n.value.elts[0], ast.Constant) and n.value.elts[0].value is None
               for n in ast.walk(fn))


def test_model_runner_forward_seams(src):
    version, root = src
    mr = _class(_tree(root, "srt/model_executor/model_runner.py"), "ModelRunner")
    fwd = _func(mr, "forward")
    assert _argnames(fwd)[:2] == ["self", "forward_batch"]
    withs = [n for n in ast.walk(fwd) if isinstance(n, ast.With)]
    items = [ast.unparse(i.context_expr) for w in withs for i in w.items]
    assert "canary_ctx" in items and "step_span_ctx" in items, version
    raw = _func(mr, "_forward_raw")
    assert _argnames(raw)[:2] == ["self", "forward_batch"]
    src_raw = ast.unparse(raw)
    # the decode-graph decision the patch overrides, and the two graph paths
    # a sampled pass must avoid
    assert "can_run_graph = bool(" in src_raw
    assert "self.decode_cuda_graph_runner.can_run_graph(forward_batch)" in src_raw
    assert "self.prefill_cuda_graph_runner.can_run_graph(forward_batch)" in src_raw
    assert "self.eager_runner.execute(" in src_raw
    init = _func(mr, "__init__")
    assigned = {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Attribute)}
    assert {"server_args", "is_draft_worker"} <= assigned


def test_forward_mode_predicates(src):
    _, root = src
    fm = _class(_tree(root, "srt/model_executor/forward_batch_info.py"), "ForwardMode")
    for name in ("is_target_verify", "is_decode", "is_cuda_graph"):
        _func(fm, name)
    fb = _class(_tree(root, "srt/model_executor/forward_batch_info.py"), "ForwardBatch")
    fields = {n.target.id for n in fb.body if isinstance(n, ast.AnnAssign)
              and isinstance(n.target, ast.Name)}
    assert {"forward_mode", "batch_size", "input_ids"} <= fields


def test_flag_home_and_validation_hook(src):
    version, root = src
    rel, cls = FLAG_HOME[version]
    home = _class(_tree(root, rel), cls)
    fields = {n.target.id for n in home.body if isinstance(n, ast.AnnAssign)
              and isinstance(n.target, ast.Name)}
    assert "decode_log_interval" in fields and "enable_metrics" in fields
    assert not {"enable_verify_timing", "verify_timing_interval",
                "verify_timing_log_interval"} & fields
    if version == "0.5.16":
        check = _func(_class(_tree(root, "srt/server_args.py"), "ServerArgs"), "check_server_args")
        assert _argnames(check) == ["self"]
    else:
        check = _func(_tree(root, "srt/arg_groups/validation_hook.py"), "check_server_args")
        assert _argnames(check) == ["server_args"]
    assert "disable_cuda_graph_padding and" in ast.unparse(check)  # the anchor our hunk sits above


def test_pynccl_change_state(src):
    _, root = src
    pn = _class(_tree(root, "srt/distributed/device_communicators/pynccl.py"), "PyNcclCommunicator")
    assert "enable" in _argnames(_func(pn, "change_state"))
