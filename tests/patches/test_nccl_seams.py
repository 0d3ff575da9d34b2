"""Seams of patches 0002-0004 (NCCL flags, --tp-allreduce, SM12X fusion) in the pinned SGLang.

* drift guards: the upstream functions/lines the patches hook still exist, and in the patched
  bootstrap the NCCL/all-reduce hooks run after `_set_all_reduce_flags` and before
  `_init_parallel_groups`;
* the worker hook exports the variables before a (fake) communicator is created;
* a patched SGLang (the installed one if `make test` applied the series, else a patched temp copy on
  PYTHONPATH in a subprocess) parses the flags, rejects every bad value, maps --tp-allreduce and
  applies the fusion gates with SGLang's platform detection overridden.
"""
import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MINE = ("0002-nccl-tuning-flags.patch", "0003-tp-allreduce-path.patch",
        "0004-flashinfer-fusion-sm120.patch")


def _installed_sglang():
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _version(pkg: Path) -> str:
    from importlib.metadata import version

    return version("sglang")


SG = _installed_sglang()
needs_sglang = pytest.mark.skipif(SG is None, reason="SGLang is not installed in this interpreter")
pytestmark = pytest.mark.sglang


def _series(ver):
    lines = (ROOT / f"patches/sglang-{ver}/series").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _is_patched(pkg: Path) -> bool:
    return "fastverify.glue import nccl_hook" in (pkg / "srt/distributed/bootstrap.py").read_text()


@pytest.fixture(scope="module")
def patched_root(tmp_path_factory):
    """Folder containing a patched `sglang` (None: the installed one is already patched)."""
    if _is_patched(SG):
        return None
    dest = tmp_path_factory.mktemp("sglang-patched")
    shutil.copytree(SG, dest / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    for name in _series(_version(SG)):
        r = subprocess.run(["patch", "-p1", "--fuzz=0", "-s", "-d", str(dest)],
                           stdin=open(ROOT / f"patches/sglang-{_version(SG)}/{name}"),
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{name} does not apply: {r.stdout}{r.stderr}"
    return dest


def _pkg(patched_root):
    return SG if patched_root is None else patched_root / "sglang"


# ---- series files
# -------------------------------------------------------------------------------------

@pytest.mark.parametrize("ver", ["0.5.16", "0.5.23"])
def test_series_lists_my_patches_in_order(ver):
    series = _series(ver)
    idx = [series.index(p) for p in MINE]
    assert idx == sorted(idx)
    # 0002-0004 come straight after 0001 (where the series has it), before every later concern.
    assert series[: len(MINE) + (series[0].startswith("0001-"))][-len(MINE):] == list(MINE)
    for p in MINE:
        text = (ROOT / f"patches/sglang-{ver}/{p}").read_text()
        assert (text.startswith("From: sglang-fastverify\nSubject: [PATCH] ")
                and f"Targets: SGLang {ver}" in text)


@pytest.mark.parametrize("ver", ["0.5.16", "0.5.23"])
def test_patches_stay_thin(ver):
    for p in MINE:
        added = [line for line in (ROOT / f"patches/sglang-{ver}/{p}").read_text().splitlines()
                 if line.startswith("+") and not line.startswith("+++")]
        assert len(added) <= 20, (p, len(added))


# ---- drift guards on the installed SGLang
# ---------------------------------------------------------------

def _calls_in_order(tree: ast.AST, func: str):
    """Line numbers of calls by name inside function `func`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            calls = {}
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call):
                    f = sub.func
                    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                    owner = getattr(f.value, "id", None) if isinstance(f, ast.Attribute) else None
                    calls.setdefault(f"{owner}.{name}" if owner else name, []).append(sub.lineno)
            return calls
    raise AssertionError(f"function {func} not found: the seam moved")


@needs_sglang
def test_bootstrap_hooks_run_before_first_communicator(patched_root):
    pkg = _pkg(patched_root)
    func = ("init_parallel_runtime" if _version(SG).startswith("0.5.23")
            else "init_torch_distributed")
    calls = _calls_in_order(ast.parse((pkg / "srt/distributed/bootstrap.py").read_text()), func)
    first_groups = min(calls["_init_parallel_groups"])
    assert (min(calls["_set_all_reduce_flags"]) < min(calls["nccl_hook.apply_in_worker"])
            < first_groups)
    assert min(calls["allreduce_hook.apply_in_worker"]) < first_groups


@needs_sglang
def test_upstream_seams_still_exist():
    ver = _version(SG)
    src = lambda p: (SG / p).read_text()  # noqa: E731
    boot = src("srt/distributed/bootstrap.py")
    assert "def _init_parallel_groups(" in boot and "def _set_all_reduce_flags(" in boot
    fc = src("srt/layers/flashinfer_comm_fusion.py")
    assert ("def _resolve_backend(" in fc
            and "def _flashinfer_trtllm_workspace_allocation_sizes(" in fc)
    assert "cuMulticastGetGranularity" in fc
    if ver.startswith("0.5.23"):
        assert "run_post_process_pass(server_args, _enforce_disable_allreduce_fusion)" in src(
            "srt/arg_groups/model_hook.py")
        assert "class ExecComm(" in src("srt/arg_groups/fields/exec_.py")
        assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" in src("srt/environ.py")
        assert "_is_sm100_supported = _is_cuda and get_platform().is_sm100" in src(
            "srt/layers/layer_boundary/residual/add_norm.py")
    else:
        assert "run_post_process_pass(self, _enforce_disable_allreduce_fusion)" in src(
            "srt/server_args.py")
        assert "_is_sm100_supported = _is_cuda and is_sm100_supported()" in src(
            "srt/layers/communicator.py")
        assert not (SG / "srt/distributed/device_communicators/pcie_ipc_ar.py").exists()


# ---- worker hook with a fake distributed init
# -----------------------------------------------------------

def test_worker_hook_exports_before_fake_communicator(monkeypatch):
    from fastverify.glue import nccl_hook

    nccl_hook._reset_for_tests()
    monkeypatch.setattr(nccl_hook, "nccl_version", lambda: (2, 28, 9))
    env = {"NCCL_PROTO": "Simple", "PATH": "/bin"}
    seen = {}

    class Args:
        nccl_algo, nccl_proto, nccl_min_channels, nccl_max_channels = "Tree", "LL", None, 4
        nccl_buffsize, nccl_env, nccl_tuning_profile = None, ["NCCL_P2P_LEVEL=SYS"], None

    def fake_init_parallel_groups():          # what ncclCommInitRank would read
        seen.update({k: v for k, v in env.items() if k.startswith("NCCL_")})

    def fake_bootstrap():                     # the patched order: flags -> hook -> groups
        nccl_hook.apply_in_worker(Args, rank=0, environ=env)
        fake_init_parallel_groups()

    fake_bootstrap()
    assert seen == {"NCCL_ALGO": "allreduce:tree", "NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4",
                    "NCCL_P2P_LEVEL": "SYS"}
    # a second runner in the same process (draft worker) does not re-export or re-log
    env["NCCL_PROTO"] = "LL128"
    assert nccl_hook.apply_in_worker(Args, rank=0, environ=env).exports()["NCCL_PROTO"] == "LL"
    assert env["NCCL_PROTO"] == "LL128"
    nccl_hook._reset_for_tests()


# ---- the patched SGLang end to end (one subprocess)
# ------------------------------------------------------

@pytest.fixture(scope="module")
def probe(patched_root, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 8,
        "num_hidden_layers": 2,
        "vocab_size": 1000, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16"}))
    env = dict(os.environ)
    paths = [str(ROOT / "python")] + ([str(patched_root)] if patched_root else [])
    env["PYTHONPATH"] = os.pathsep.join(paths[::-1] + [env.get("PYTHONPATH", "")])
    env.pop("NCCL_ALGO", None)
    r = subprocess.run([sys.executable,
                        str(Path(__file__).with_name("nccl_seams_probe.py")), str(d)],
                       capture_output=True, text=True, env=env, timeout=600)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("FVJSON")]
    assert line, f"probe failed rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return json.loads(line[-1][len("FVJSON"):])


@needs_sglang
@pytest.mark.slow
def test_flags_parse_through_prepare_server_args(probe):
    assert probe["flags_parsed"]["ok"] == {
        "nccl_algo": "ring", "nccl_proto": "LL", "nccl_min_channels": 2, "nccl_max_channels": 4,
        "nccl_buffsize": 1048576, "nccl_env": ["NCCL_P2P_LEVEL=SYS", "NCCL_DEBUG=INFO"],
        "nccl_tuning_profile": None, "tp_size": 4}


@needs_sglang
@pytest.mark.slow
@pytest.mark.parametrize("case,match", [
    ("bad_algo", r"--nccl-algo: unknown name 'fastest'.*Ring, Tree"),
    ("bad_proto", r"--nccl-proto: unknown name 'LL64'.*LL, LL128, Simple"),
    ("min_gt_max", r"channel min > max"),
    ("bad_channels", r"--nccl-max-channels: 0 is out of range; allowed: channels 1\.\.64"),
    ("bad_buffsize", r"--nccl-buffsize: -1 is out of range"),
    ("non_nccl_env", r"--nccl-env: 'LD_PRELOAD' is not an NCCL variable"),
    # CPU torch: NCCL version unknown
    ("global_tree", r"--nccl-algo: refused: .*Broadcast/Reduce"),
    ("bad_profile", r"--nccl-tuning-profile .*missing\.json: file not found"),
])
def test_every_bad_flag_fails_server_args_check(probe, case, match):
    import re

    assert "error" in probe[case], probe[case]
    assert re.search(match, probe[case]["error"]), probe[case]["error"]


@needs_sglang
@pytest.mark.slow
def test_tp_allreduce_mapping(probe):
    v23 = probe["version"].startswith("0.5.23")
    assert probe["tp_nccl"]["ok"] == {"tp_allreduce": "nccl", "disable_custom_all_reduce": True,
                                      "flashinfer_allreduce_fusion_backend": None}
    assert probe["tp_unset"]["ok"]["tp_allreduce"] is None
    # custom at TP4: topology unknown on a CPU machine -> allowed, custom stays on
    assert probe["tp_custom"]["ok"]["disable_custom_all_reduce"] is False
    if v23:
        assert probe["tp_pcie-ipc"]["ok"]["tp_allreduce"] == "pcie-ipc"
        assert probe["tp_pcie-ipc"]["ok"]["disable_custom_all_reduce"] is True
    else:
        assert "SGLang 0.5.16 has no PCIe IPC all-reduce" in probe["tp_pcie-ipc"]["error"]


@needs_sglang
@pytest.mark.slow
@pytest.mark.parametrize("sm", [90, 100, 120])
@pytest.mark.parametrize("fi", ["0.6.14", "0.7.2"])
def test_fusion_gate_by_sm_and_flashinfer(probe, sm, fi):
    res = probe[f"fused_sm{sm}_fi{fi}"]
    gate = probe[f"gate_sm{sm}_fi{fi}"]["ok"]
    if sm == 120 and fi == "0.6.14":
        assert "cannot build its trtllm comm kernels for SM120" in res["error"]
        assert "FlashInfer >= 0.7" in res["error"]
        assert gate is False
    else:
        assert res["ok"]["backend_field"] == "trtllm" and res["ok"]["resolved"] == "trtllm"
        assert gate is (sm == 120)


@needs_sglang
@pytest.mark.slow
def test_preflight_multicast_probe_conditional(probe):
    assert "cuMulticastGetGranularity failed" in probe["preflight_multicast_True"]["error"]
    ok = probe["preflight_multicast_False"]["ok"]
    assert (ok["asked"] == 0 and len(ok["sizes"]) == 3
            and all(s % (2 << 20) == 0 for s in ok["sizes"]))
