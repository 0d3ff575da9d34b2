"""fastverify.flags: the rules on our flags, on plain namespaces (no SGLang). The launch itself:
tests/patches/test_0010_validate_flags.py."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from fastverify import flags
from fastverify.flags import FlagError, FlagExit

ROOT = Path(__file__).resolve().parents[1]
NGRAM = dict(speculative_algorithm="NGRAM")


def ns(**kw):
    return argparse.Namespace(**kw)


def test_defaults_pass():
    flags.check(ns())
    flags.check(ns(speculative_algorithm=None, speculative_ngram_verify_mode="tree",
                   speculative_ngram_auto_hysteresis=0.03, verify_timing_interval=0))


def test_good_combinations_pass():
    flags.check(ns(**NGRAM, speculative_ngram_verify_mode="chain",
                   speculative_ngram_verify_widths="1,2,4,12"))
    flags.check(ns(**NGRAM, speculative_ngram_verify_mode="auto", speculative_num_draft_tokens=8,
                   speculative_ngram_verify_widths="1,2,4,8",
                   speculative_ngram_auto_hysteresis=0.1))
    # NCCL version unknown here: a global Tree is left to the NCCL glue
    flags.check(ns(nccl_algo="Tree", nccl_min_channels=2, nccl_max_channels=4))
    flags.check(ns(tp_allreduce="pcie-ipc", tp_size=4), sglang_version="0.5.23")
    flags.check(ns(enable_verify_timing=True, verify_timing_interval=5,
                   verify_timing_log_interval=0.0))


NG_CHAIN = dict(NGRAM, speculative_ngram_verify_mode="chain")
NG_AUTO = dict(NGRAM, speculative_ngram_verify_mode="auto")
TIMING = dict(enable_verify_timing=True)
RULES = [
    (dict(tp_allreduce_table="t.json"),
     r"--tp-allreduce-table t\.json: needs --tp-allreduce auto "
     r"\(got --tp-allreduce \(not given\)\)"),
    (dict(tp_allreduce="nccl", tp_allreduce_table="t.json"), r"\(got --tp-allreduce nccl\)"),
    (dict(speculative_ngram_auto_hysteresis=-1.0), r"must be in \[0, 0\.5\), got -1\.0; allowed"),
    (dict(NGRAM, speculative_ngram_auto_hysteresis=0.2),
     r"0\.2: needs --speculative-ngram-verify-mode auto"),
    (dict(speculative_ngram_verify_mode="chain"),
     r"chain: needs --speculative-algorithm NGRAM \(got --speculative-algorithm \(not given\)\)"),
    (dict(speculative_algorithm="EAGLE", speculative_ngram_verify_mode="auto"),
     r"got --speculative-algorithm EAGLE"),
    (dict(speculative_ngram_verify_widths="1,12"),
     r"widths 1,12: needs --speculative-algorithm NGRAM"),
    (dict(speculative_ngram_auto_cost_table="c.json"),
     r"c\.json: needs --speculative-algorithm NGRAM"),
    (dict(NG_CHAIN, speculative_ngram_auto_cost_table="c.json"),
     r"c\.json: needs --speculative-ngram-verify-mode auto \(got --speculative-ngram-verify-mode "
     r"chain\)"),
    (NG_AUTO, r"auto needs --speculative-ngram-verify-widths with 1"),
    (dict(NG_AUTO, speculative_ngram_verify_widths="2,4,12"),
     r"with 1 .*got --speculative-ngram-verify-widths 2,4,12; allowed: e\.g\. .* 1,2,4,12"),
    (dict(NG_CHAIN, speculative_ngram_verify_widths="1,3,x"),
     r"comma-separated integers .*got '1,3,x'"),
    (dict(NGRAM, speculative_ngram_verify_widths="1,12"),
     r"needs --speculative-ngram-verify-mode chain or auto"),
    (dict(NG_CHAIN, enable_watermark=True), r"cannot be combined with --enable-watermark"),
    (dict(speculative_ngram_verify_mode="fan"), r"'fan'; allowed: tree, chain, auto"),
    (dict(verify_timing_interval=5), r"--verify-timing-interval 5: needs --enable-verify-timing"),
    (dict(verify_timing_log_interval=1.0),
     r"--verify-timing-log-interval 1\.0: needs --enable-verify-timing"),
    (dict(TIMING, verify_timing_interval=-2), r"integer >= 0 .*got -2"),
    (dict(nccl_min_channels=8, nccl_max_channels=2), r"channel min > max"),
    (dict(nccl_algo="fastest"), r"--nccl-algo: unknown name 'fastest'"),
    (dict(tp_allreduce="magic"), r"--tp-allreduce 'magic'; allowed: auto, nccl, custom"),
    (dict(tp_allreduce="flashinfer-fused", tp_size=1), r"needs TP size >= 2"),
    (dict(emulate_pass_cost_compute=True),
     r"--emulate-pass-cost-compute needs --emulate-pass-cost PROFILE"),
    (dict(emulate_pass_cost="nosuch"), r"--emulate-pass-cost nosuch: no such file .*\(built in: "),
]


@pytest.mark.parametrize("kw, match", RULES)
def test_rules(kw, match):
    with pytest.raises(FlagError, match=match):
        flags.check(ns(**kw))


def test_the_default_k_is_sglangs_when_none_is_given():
    # SGLang gives NGRAM k = 12 without --speculative-num-draft-tokens: 12 must be in the widths.
    with pytest.raises(FlagError, match=r"must include k = 12"):
        flags.check(ns(**NG_CHAIN, speculative_ngram_verify_widths="1,2,4,8"))
    flags.check(ns(**NG_CHAIN, speculative_num_draft_tokens=8,
                   speculative_ngram_verify_widths="1,2,4,8"))


def test_pcie_ipc_follows_the_sglang_version():
    with pytest.raises(FlagError, match=r"SGLang 0\.5\.16 has no PCIe IPC"):
        flags.check(ns(tp_allreduce="pcie-ipc", tp_size=2), sglang_version="0.5.16")
    with pytest.raises(FlagError, match=r"TP size 3 is not supported"):
        flags.check(ns(tp_allreduce="pcie-ipc", tp_size=3), sglang_version="0.5.23")
    flags.check(ns(tp_allreduce="pcie-ipc", tp_size=3))  # no version: left to the launcher's pass


def test_environment_takes_part_in_min_max():
    with pytest.raises(FlagError, match=r"NCCL_MAX_NCHANNELS=2 \(from environment\)"):
        flags.check(ns(nccl_min_channels=8), environ={"NCCL_MAX_NCHANNELS": "2"})
    flags.check(ns(nccl_min_channels=8))


def test_known_old_nccl_refuses_a_global_tree():
    with pytest.raises(FlagError, match=r"needs NCCL >= 2\.24"):
        flags.check(ns(nccl_algo="Tree"), nccl_version=(2, 21, 5))


def test_files_are_read_at_parse(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{not json")
    with pytest.raises(FlagError, match=r"--tp-allreduce-table .*not a readable JSON file"):
        flags.check(ns(tp_allreduce="auto", tp_allreduce_table=str(bad)))
    auto = dict(NG_AUTO, speculative_ngram_verify_widths="1,12")
    with pytest.raises(FlagError, match=r"--speculative-ngram-auto-cost-table .*not valid JSON"):
        flags.check(ns(**auto, speculative_ngram_auto_cost_table=str(bad)))
    good = tmp_path / "c.json"
    good.write_text(json.dumps({"decode_ms": {"1": 5.0}, "verify_ms": {"1": 5.0, "12": 9.0}}))
    flags.check(ns(**auto, speculative_ngram_auto_cost_table=str(good)))


def test_check_parsed_ends_like_argparse(capsys):
    parser = argparse.ArgumentParser(prog="sglang serve")
    with pytest.raises(SystemExit) as e:
        flags.check_parsed(parser, ns(verify_timing_interval=5))
    assert e.value.code == 2 and isinstance(e.value, FlagExit)
    assert isinstance(e.value, ValueError)  # for callers of prepare_server_args that catch it
    assert "needs --enable-verify-timing" in str(e.value)
    assert capsys.readouterr().err == (
        "sglang serve: error: --verify-timing-interval 5: needs --enable-verify-timing; allowed: "
        "add --enable-verify-timing, or drop --verify-timing-interval\n")
    flags.check_parsed(parser, ns())  # nothing wrong: returns
    assert capsys.readouterr().err == ""


def test_our_actions_in_order():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path")
    parser.add_argument("--tp-allreduce-table")
    parser.add_argument("--nccl-algo")
    found = [a.option_strings[0] for a in flags.our_actions(parser)]
    assert found == ["--nccl-algo", "--tp-allreduce-table"]


def test_our_flags_match_the_patches():
    """Every flag in OUR_FLAGS is added by the patch it names, in both series, and no patch adds one
    that the list lacks (the demo prints exactly these)."""
    for version in ("0.5.16", "0.5.23"):
        added = {}
        for patch in sorted((ROOT / "patches" / f"sglang-{version}").glob("*.patch")):
            for m in re.finditer(r"^\+\s+(\w+): A\[", patch.read_text(), re.M):
                added.setdefault(m.group(1), patch.name[:4])
        ours = {dest: patch for dest, _, patch in flags.OUR_FLAGS}
        assert {d: added.get(d) for d in ours} == ours, version
        extra = set(added) - set(ours)
        assert not extra, f"{version}: added by patches, missing from fastverify.flags: {extra}"


def test_hysteresis_default_is_the_fields():
    field = re.compile(r"^\+    speculative_ngram_auto_hysteresis: A\[\n"
                       r"(?:\+.*\n)*?\+    \] = ([0-9.]+)$", re.M)
    for version in ("0.5.16", "0.5.23"):
        m = field.search((ROOT / "patches" / f"sglang-{version}" / "0007-ngram-verify-auto.patch")
                         .read_text())
        assert m and float(m.group(1)) == flags.DEFAULT_HYSTERESIS, version


@pytest.mark.parametrize("version, pattern", [
    ("0.5.16", r"speculative_num_draft_tokens = (\d+)"),
    ("0.5.23", r"speculative_num_draft_tokens=(\d+),"),
])
def test_ngram_default_k_is_sglangs(version, pattern):
    root = ROOT / ".scratch" / "pristine" / version
    if not (root / "sglang").is_dir():
        pytest.skip(f"no pristine SGLang {version} (scripts/setup_test_env.sh unpacks it)")
    text = (root / "sglang" / "srt" / "arg_groups" / "speculative_hook.py").read_text()
    handler = text.split("def _handle_ngram", 1)[1].split("\ndef ", 1)[0]
    assert re.findall(pattern, handler) == [str(flags.NGRAM_DEFAULT_DRAFT_TOKENS)]
