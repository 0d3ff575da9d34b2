"""Patch 0010: every bad value of our flags, and every broken rule between them, ends
`python -m sglang.launch_server` right after parsing, with exit status 2 and a message naming the
flag, the value and what is allowed: before SGLang resolves the model path (0.5.23) or looks for an
accelerator (0.5.16).

Runs against the SGLang of this interpreter with the series applied (scripts/run_tests.sh runs the
suite once per pinned SGLang). The model path does not exist: a check that came after any model
work would be hidden behind SGLang's own error about it, as the control case shows.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NGRAM = ["--speculative-algorithm", "NGRAM"]
CHAIN = NGRAM + ["--speculative-ngram-verify-mode", "chain"]
AUTO = NGRAM + ["--speculative-ngram-verify-mode", "auto"]
AUTO_W = AUTO + ["--speculative-ngram-verify-widths", "1,2,4,12"]
MODE = "--speculative-ngram-verify-mode"
WIDTHS = "--speculative-ngram-verify-widths"
HYST = "--speculative-ngram-auto-hysteresis"
COSTS = "--speculative-ngram-auto-cost-table"

# name -> (arguments after --model-path, a regex the "error:" line must match)
CASES = {
    # values of one flag
    "nccl_algo": (["--nccl-algo", "fastest"], r"--nccl-algo: unknown name 'fastest'.*allowed"),
    "nccl_proto": (["--nccl-proto", "LL64"], r"--nccl-proto: unknown name 'LL64'.*allowed"),
    "nccl_channels": (["--nccl-max-channels", "0"],
                      r"--nccl-max-channels: 0 is out of range; allowed"),
    "nccl_buffsize": (["--nccl-buffsize", "-1"], r"--nccl-buffsize: -1 is out of range; allowed"),
    "nccl_env": (["--nccl-env", "LD_PRELOAD=x.so"],
                 r"'LD_PRELOAD' is not an NCCL variable; allowed"),
    "nccl_profile": (["--nccl-tuning-profile", "/nonexistent/profile.json"],
                     r"--nccl-tuning-profile /nonexistent/profile.json: file not found"),
    "tp_allreduce": (["--tp-allreduce", "magic"], r"--tp-allreduce: invalid choice: 'magic'"),
    "tp_table_file": (["--tp-allreduce", "auto", "--tp-allreduce-table", "/nonexistent/t.json"],
                      r"--tp-allreduce-table /nonexistent/t.json: file not found"),
    "tp_fused_tp1": (["--tp-allreduce", "flashinfer-fused"],
                     r"flashinfer-fused: needs TP size >= 2"),
    "timing_interval": (["--enable-verify-timing", "--verify-timing-interval", "-1"],
                        r"--verify-timing-interval must be an integer >= 0 \(0: budgeted\); "
                        r"got -1"),
    "timing_log": (["--enable-verify-timing", "--verify-timing-log-interval", "nan"],
                   r"--verify-timing-log-interval must be a number of seconds >= 0; got nan"),
    "mode_choice": ([MODE, "fan"], r"--speculative-ngram-verify-mode: invalid choice: 'fan'"),
    "widths_garbage": (CHAIN + [WIDTHS, "1,3,x"],
                       r"--speculative-ngram-verify-widths takes comma-separated integers "
                       r".*got '1,3,x'"),
    "widths_range": (CHAIN + ["--speculative-num-draft-tokens", "4", WIDTHS, "1,4,8"],
                     r"widths must lie in 1\.\.4 .*got \[8\]"),
    "hysteresis_range": (AUTO_W + [HYST, "0.9"],
                         r"--speculative-ngram-auto-hysteresis must be in \[0, 0\.5\), got 0\.9"),
    "cost_table_file": (AUTO_W + [COSTS, "/nonexistent/c.json"],
                        r"--speculative-ngram-auto-cost-table /nonexistent/c.json: file not found"),
    "emulate_profile": (["--emulate-pass-cost", "nosuch"],
                        r"--emulate-pass-cost nosuch: no such file and no built-in profile "
                        r".*\(built in: "),
    # rules between flags
    "nccl_min_gt_max": (["--nccl-min-channels", "8", "--nccl-max-channels", "2"],
                        r"channel min > max: NCCL_MIN_NCHANNELS=8 .* NCCL_MAX_NCHANNELS=2"),
    "tp_table_alone": (["--tp-allreduce-table", "/nonexistent/t.json"],
                       r"--tp-allreduce-table /nonexistent/t.json: needs --tp-allreduce auto "
                       r"\(got --tp-allreduce \(not given\)\)"),
    "timing_alone": (["--verify-timing-interval", "5"],
                     r"--verify-timing-interval 5: needs --enable-verify-timing"),
    "mode_without_ngram": ([MODE, "chain"],
                           r"--speculative-ngram-verify-mode chain: needs --speculative-algorithm "
                           r"NGRAM \(got --speculative-algorithm \(not given\)\)"),
    "widths_without_ngram": ([WIDTHS, "1,12"],
                             r"--speculative-ngram-verify-widths 1,12: needs "
                             r"--speculative-algorithm NGRAM"),
    "hysteresis_without_auto": (NGRAM + [HYST, "0.1"],
                                r"--speculative-ngram-auto-hysteresis 0\.1: needs "
                                r"--speculative-ngram-verify-mode auto "
                                r"\(got --speculative-ngram-verify-mode tree\)"),
    "hysteresis_negative_alone": ([HYST, "-1"],
                                  r"--speculative-ngram-auto-hysteresis must be in \[0, 0\.5\), "
                                  r"got -1\.0"),
    "cost_table_without_auto": (CHAIN + [COSTS, "/nonexistent/c.json"],
                                r"--speculative-ngram-auto-cost-table /nonexistent/c.json: needs "
                                r"--speculative-ngram-verify-mode auto "
                                r"\(got --speculative-ngram-verify-mode chain\)"),
    "widths_in_tree": (NGRAM + [WIDTHS, "1,12"],
                       r"needs --speculative-ngram-verify-mode chain or auto; got 'tree'"),
    "auto_without_1": (AUTO + [WIDTHS, "2,4,12"],
                       r"auto needs --speculative-ngram-verify-widths with 1 .* "
                       r"got --speculative-ngram-verify-widths 2,4,12"),
    "auto_without_widths": (AUTO, r"auto needs --speculative-ngram-verify-widths with 1 "
                                  r".*\(not given\)"),
    "emulate_compute_alone": (["--emulate-pass-cost-compute"],
                              r"--emulate-pass-cost-compute needs --emulate-pass-cost PROFILE"),
}
PIN_CASES = {
    "0.5.16": {
        "tp_pcie_ipc": (["--tp-allreduce", "pcie-ipc", "--tp", "2"],
                        r"--tp-allreduce pcie-ipc: SGLang 0\.5\.16 has no PCIe IPC all-reduce"),
    },
    "0.5.23": {
        "tp_pcie_ipc": (["--tp-allreduce", "pcie-ipc", "--tp", "3"],
                        r"--tp-allreduce pcie-ipc: TP size 3 is not supported; "
                        r"allowed TP sizes: 2, 4, 8"),
        # (0.5.16 has no watermark)
        "chain_watermark": (CHAIN + ["--enable-watermark"],
                            r"--speculative-ngram-verify-mode chain cannot be combined with "
                            r"--enable-watermark"),
    },
}
ALL_NAMES = sorted({*CASES, *PIN_CASES["0.5.16"], *PIN_CASES["0.5.23"]})
BASE = ["--model-path", "/nonexistent/model"]
ERROR = "sglang serve: error: "


def _version():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("no SGLang here (scripts/run_tests.sh runs the suite in each pin's venv)")
    return importlib.metadata.version("sglang")


def _cases():
    return {**CASES, **PIN_CASES.get(_version(), {})}


def _env():
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    paths = [str(ROOT / "python"), str(ROOT / "tests" / "stubs")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def _error_line(output: str) -> str:
    lines = [x for x in output.splitlines() if x.startswith(ERROR)]
    return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every case, and a control without a bad flag, through launch_probe.py."""
    _version()
    pkg = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    source = (pkg / "srt" / "server_args.py").read_text()
    assert "_fv_flags.check_parsed" in source, "patch 0010 is not applied"
    cases = {name: BASE + extra for name, (extra, _) in _cases().items()}
    cases["control"] = BASE
    spec = tmp_path_factory.mktemp("launch") / "cases.json"
    spec.write_text(json.dumps(cases))
    probe = Path(__file__).with_name("launch_probe.py")
    r = subprocess.run([sys.executable, str(probe), str(spec)], env=_env(),
                       capture_output=True, text=True, timeout=900)
    line = [x for x in r.stdout.splitlines() if x.startswith("PROBE ")]
    assert line, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(line[0][len("PROBE "):])


@pytest.mark.parametrize("name", ALL_NAMES)
def test_bad_flag_ends_launch_at_parse(launched, name):
    cases = _cases()
    if name not in cases:
        pytest.skip(f"{name}: a case of the other pin")
    res = launched[name]
    error = _error_line(res["output"])
    assert res["rc"] == 2, res
    assert re.search(cases[name][1], error), (error, res["output"][-2000:])
    # nothing of SGLang's start-up came before it: no traceback, no model or accelerator error
    assert "Traceback" not in res["output"], res["output"][-3000:]


def test_control_fails_elsewhere(launched):
    """The same command without a bad flag gets past parsing and fails on the model path or the
    device, which is what hid the late checks before this patch."""
    res = launched["control"]
    assert res["rc"] not in (0, 2) and not _error_line(res["output"]), res


def test_dummy_model_built_in_code(launched):
    """ServerArgs(model_path="dummy") cuts SGLang's own resolution short; our rules still run."""
    res = launched["_dummy_in_code"]
    assert "error" in res, res
    assert re.match(r"FlagError: --speculative-ngram-verify-widths takes comma-separated integers",
                    res["error"]), res


@pytest.mark.parametrize("name", ["hysteresis_negative_alone", "tp_table_alone"])
def test_python_m_launch_server(name):
    """Two cases as the user types them: a fresh `python -m sglang.launch_server` process each."""
    extra, pattern = _cases()[name]
    r = subprocess.run([sys.executable, "-m", "sglang.launch_server", *BASE, *extra], env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-3000:]
    assert re.search(pattern, _error_line(r.stderr)), r.stderr[-3000:]
    assert "Traceback" not in r.stderr
