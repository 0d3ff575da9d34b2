"""fastverify.nccl: flag validation, Tree translation, precedence/provenance, tuning profiles."""
import json

import pytest

from fastverify.nccl import (MAX_CHANNELS, PROFILE_FORMAT, NcclConfigError, NcclTuning,
                             load_profile,
                             normalize_algo, normalize_proto, tuning_from_args, write_profile)

NEW, OLD = (2, 28, 9), (2, 21, 5)


def build(**kw):
    kw.setdefault("nccl_version", NEW)
    return NcclTuning.from_flags(**kw)


# ---- names and list syntax
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    ("ring", "Ring"), ("RING,tree", "Ring,Tree"), ("^nvls", "^NVLS"),
    ("nvlstree,Ring", "NVLSTree,Ring"),
    ("allreduce:tree", "allreduce:tree"),
    ("ring;allreduce:^ring,nvls", "Ring;allreduce:^ring,nvls"),
    ("collnetdirect,collnetchain,ring,pat", "CollNetDirect,CollNetChain,Ring,PAT"),
])
def test_algo_names_case_insensitive_and_lists(value, expected):
    assert normalize_algo(value, "--nccl-algo", NEW) == (expected, "")


@pytest.mark.parametrize("value,expected", [("ll", "LL"), ("ll128,SIMPLE", "LL128,Simple"),
                                            ("^LL", "^LL"), ("allreduce:ll", "allreduce:ll")])
def test_proto_names(value, expected):
    assert normalize_proto(value, "--nccl-proto", NEW) == expected


@pytest.mark.parametrize("kw,match", [
    (dict(algo="Trees"),
     r"--nccl-algo: unknown name 'Trees'.*Ring, Tree, CollNetDirect, CollNetChain, NVLS, NVLSTree, "
     r"PAT"),
    (dict(proto="LL256"), r"--nccl-proto: unknown name 'LL256'.*LL, LL128, Simple"),
    (dict(algo=""), r"--nccl-algo: empty value"),
    (dict(algo="ring,,tree"), r"--nccl-algo: empty name"),
    (dict(algo="allgathr:ring"), r"--nccl-algo: unknown collective 'allgathr'.*allreduce"),
    (dict(algo="allreduce:tree;ring"), r"only the first ';' group may omit"),
    (dict(min_channels=0), r"--nccl-min-channels: 0 is out of range; allowed: channels 1\.\.64"),
    (dict(max_channels=MAX_CHANNELS + 1),
     r"--nccl-max-channels: 65 is out of range; allowed: channels 1\.\.64"),
    (dict(max_channels=-3), r"--nccl-max-channels: -3 is out of range"),
    (dict(min_channels=8, max_channels=4),
     r"channel min > max: NCCL_MIN_NCHANNELS=8 \(from --nccl-min-channels\)"),
    (dict(buffsize=0), r"--nccl-buffsize: 0 is out of range; allowed: bytes 65536\.\.1073741824"),
    (dict(buffsize=1 << 31), r"--nccl-buffsize: 2147483648 is out of range"),
    (dict(env=["PATH=/tmp"]),
     r"--nccl-env: 'PATH' is not an NCCL variable; allowed: names matching NCCL_"),
    (dict(env=["CUDA_VISIBLE_DEVICES=0"]),
     r"--nccl-env: 'CUDA_VISIBLE_DEVICES' is not an NCCL variable"),
    (dict(env=["NCCL_P2P_LEVEL"]), r"--nccl-env: 'NCCL_P2P_LEVEL' is not NAME=VALUE"),
    (dict(env=["NCCL_X=1", "NCCL_X=2"]), r"--nccl-env: NCCL_X is given twice"),
    (dict(env=["NCCL_PROTO=LL"], proto="Simple"),
     r"--nccl-env NCCL_PROTO=LL conflicts with --nccl-proto"),
    (dict(env=["NCCL_PROTO=bogus"]), r"--nccl-env: unknown name 'bogus'.*LL, LL128, Simple"),
    (dict(env=["NCCL_MAX_NCHANNELS=many"]),
     r"--nccl-env: 'many' is not an integer; allowed: channels 1\.\.64"),
])
def test_every_bad_flag_is_a_clear_error(kw, match):
    with pytest.raises(NcclConfigError, match=match):
        build(**kw)


def test_per_collective_syntax_needs_2_24():
    with pytest.raises(NcclConfigError,
                       match=r"per-collective syntax needs NCCL >= 2\.24; this NCCL is 2\.21\.5"):
        build(algo="allreduce:tree", nccl_version=OLD)
    with pytest.raises(NcclConfigError,
                       match=r"--nccl-proto: per-collective syntax needs NCCL >= 2\.24"):
        build(proto="allreduce:LL", nccl_version=OLD)
    assert build(algo="Ring,Tree", nccl_version=OLD).exports() == {"NCCL_ALGO": "Ring,Tree"}


# ---- Tree translation
# --------------------------------------------------------------------------------

def test_global_tree_becomes_per_collective_on_new_nccl():
    t = build(algo="Tree")
    assert t.exports() == {"NCCL_ALGO": "allreduce:tree"}
    (s,) = t.settings
    assert "translated from 'Tree'" in s.note and "2.28.9 >= 2.24" in s.note


@pytest.mark.parametrize("version", [OLD, (2, 23, 4), None])
def test_global_tree_refused_on_old_or_unknown_nccl(version):
    with pytest.raises(NcclConfigError,
                       match=r"--nccl-algo: refused: .*Broadcast/Reduce have no algorithm but Ring"
                                              r".*needs NCCL >= 2\.24"):
        build(algo="Tree", nccl_version=version)


def test_translation_rules():
    assert normalize_algo("Tree,NVLS", "x", NEW)[0] == "allreduce:tree,nvls"
    assert normalize_algo("^Ring", "x", NEW)[0] == "allreduce:^ring"
    assert normalize_algo("tree;allgather:ring", "x", NEW)[0] == "allreduce:tree;allgather:ring"
    # Ring kept: valid everywhere
    assert normalize_algo("Tree,Ring", "x", OLD) == ("Tree,Ring", "")
    assert normalize_algo("^Tree", "x", OLD) == ("^Tree", "")
    with pytest.raises(NcclConfigError, match="names allreduce explicitly"):
        normalize_algo("tree;allreduce:ring", "--nccl-algo", NEW)


def test_tree_in_profile_and_env_flag_also_translated():
    assert build(env=["NCCL_ALGO=tree"]).exports()["NCCL_ALGO"] == "allreduce:tree"


# ---- precedence and provenance
# -----------------------------------------------------------------------

def test_precedence_flag_over_profile_over_environment(tmp_path):
    prof = tmp_path / "p.json"
    write_profile(prof, {"NCCL_PROTO": "LL128", "NCCL_MAX_NCHANNELS": 8, "NCCL_BUFFSIZE": 1 << 20},
                  {"gpu": "test"})
    env = {"NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": "2", "NCCL_DEBUG": "WARN", "HOME": "/root"}
    t = build(proto="LL", profile=str(prof), environ=env)
    by = {s.name: s for s in t.settings}
    assert t.effective() == {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "8",
                             "NCCL_BUFFSIZE": "1048576", "NCCL_DEBUG": "WARN"}
    assert by["NCCL_PROTO"].source == "--nccl-proto"
    assert by["NCCL_PROTO"].replaced == (f"profile {prof}", "LL128")
    assert by["NCCL_MAX_NCHANNELS"].source == f"profile {prof}"
    assert by["NCCL_MAX_NCHANNELS"].replaced == ("environment", "2")
    assert by["NCCL_DEBUG"].source == "environment" and by["NCCL_DEBUG"].replaced is None
    # only what flags/profile set is exported; HOME never appears
    assert t.exports() == {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "8",
                           "NCCL_BUFFSIZE": "1048576"}
    line = t.log_line(3)
    assert line.startswith("fastverify NCCL settings (rank 3, NCCL 2.28.9): ")
    assert f"NCCL_MAX_NCHANNELS=8 [profile {prof}; overrides environment value '2']" in line
    assert "NCCL_DEBUG=WARN [environment]" in line and "HOME" not in line


def test_flag_overriding_environment_is_reported():
    t = build(max_channels=4, environ={"NCCL_MAX_NCHANNELS": "16"})
    assert t.provenance_lines() == ["NCCL_MAX_NCHANNELS=4 [--nccl-max-channels; overrides "
                                    "environment value '16']"]


def test_same_value_is_not_reported_as_override():
    t = build(proto="LL", environ={"NCCL_PROTO": "LL"})
    assert t.settings[0].replaced is None


def test_min_max_checked_across_sources():
    with pytest.raises(NcclConfigError, match=r"NCCL_MIN_NCHANNELS=8 \(from --nccl-min-channels\).*"
                                              r"NCCL_MAX_NCHANNELS=4 \(from environment\)"):
        build(min_channels=8, environ={"NCCL_MAX_NCHANNELS": "4"})


def test_nothing_requested_leaves_environment_alone():
    t = build(environ={"NCCL_DEBUG": "INFO"})
    assert not t.requested and t.exports() == {}


def test_tuning_is_frozen():
    t = build(proto="LL")
    with pytest.raises(Exception):
        t.settings = ()


def test_tuning_from_args_reads_sglang_field_names():
    class Args:
        nccl_algo, nccl_proto, nccl_min_channels, nccl_max_channels = "ring", "ll128", 2, 8
        nccl_buffsize, nccl_env, nccl_tuning_profile = 4 << 20, ["NCCL_P2P_LEVEL=SYS"], None
    t = tuning_from_args(Args, {}, NEW)
    assert t.exports() == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128", "NCCL_MIN_NCHANNELS": "2",
                           "NCCL_MAX_NCHANNELS": "8", "NCCL_BUFFSIZE": "4194304",
                           "NCCL_P2P_LEVEL": "SYS"}


# ---- profiles
# ----------------------------------------------------------------------------------------

def test_profile_roundtrip(tmp_path):
    p = tmp_path / "prof.json"
    data = write_profile(p, {"NCCL_PROTO": "LL"},
                         {"gpu": "2x H200", "nccl": "2.28.9", "command": "x"},
                         [{"bytes": 14336, "best": {"NCCL_PROTO": "LL"}, "us": 9.5}])
    assert load_profile(p) == data and data["format"] == PROFILE_FORMAT


@pytest.mark.parametrize("content,match", [
    ("{not json", r"--nccl-tuning-profile .*: not valid JSON"),
    ("[]", r"\"format\" must be 'fastverify-nccl-profile/1'"),
    (json.dumps({"format": "other/1", "env": {"NCCL_PROTO": "LL"}}), r"\"format\" must be"),
    (json.dumps({"format": PROFILE_FORMAT}), r"\"env\" must be a non-empty object"),
    (json.dumps({"format": PROFILE_FORMAT, "env": {"OMP_NUM_THREADS": "1"}}),
     r"'OMP_NUM_THREADS' is not an NCCL"),
    (json.dumps({"format": PROFILE_FORMAT, "env": {"NCCL_PROTO": ["LL"]}}),
     r"must be a string or integer"),
    (json.dumps({"format": PROFILE_FORMAT, "env": {"NCCL_PROTO": "LL"},
                 "by_size": [{"bytes": "1"}]}),
     r"\"by_size\" must be a list"),
])
def test_malformed_profile(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(NcclConfigError, match=match):
        build(profile=str(p))


def test_profile_values_validated_like_flags(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"format": PROFILE_FORMAT, "env": {"NCCL_MAX_NCHANNELS": "100"}}))
    with pytest.raises(NcclConfigError,
                       match=r"--nccl-tuning-profile .*NCCL_MAX_NCHANNELS: 100 is out of range"):
        build(profile=str(p))


def test_missing_profile(tmp_path):
    with pytest.raises(NcclConfigError,
                       match=r"--nccl-tuning-profile .*nope\.json: file not found"):
        build(profile=str(tmp_path / "nope.json"))
