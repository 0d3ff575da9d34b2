"""fastverify.passcost: profiles as data, each derived from its cited numbers, and their errors."""
import json
from pathlib import Path

import pytest

from fastverify import passcost
from fastverify.passcost import PassCostError

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmark" / "results" / "h200x2" / "allreduce_kimi.json"
KIB = 1024


def test_builtin_profiles_load_and_cite_their_sources():
    names = passcost.builtin_names()
    assert {"reference-kimi-tp8", "nccl-numa-sm120", "pcie-ipc-sm120",
            "nccl-tuned-switch"} <= set(names)
    for name in names:
        p = passcost.load_profile(name)
        assert p.name == name and p.allreduces_per_pass == 122
        assert p.source and all(len(s) > 20 for s in p.source), name
        assert "compute" in " ".join(p.source), name  # says where its compute comes from
        assert p.derivation, name
        assert not p.extrapolated(64) and p.extrapolated(65)


def test_reference_profile_reproduces_the_reference_report_on_paper():
    """The reference box's own numbers: plain decode 12.2 ms (82 tok/s), EAGLE-3's verify pass of
    3-4 tokens ~30 ms of which ~25 ms in 122 all-reduces, n-gram's 8-token pass ~33 ms."""
    p = passcost.load_profile("reference-kimi-tp8")
    assert 1000.0 / p.pass_ms(1) == pytest.approx(82.0, rel=0.01)
    assert p.pass_ms(4) == pytest.approx(30.0, rel=0.05)
    assert p.comm_ms(4) == pytest.approx(25.0, rel=0.05)
    assert p.pass_ms(8) == pytest.approx(33.0, rel=0.05)
    m = p.meta["measured"]
    assert m["plain_tok_s"] == 82 and m["eagle3_chain3"]["tok_s"] == 60
    # the jump sits between 1 and 3-4 tokens; after it the curve is nearly flat
    assert p.ar_us(4) / p.ar_us(1) > 3 and p.ar_us(8) / p.ar_us(4) < 1.2


@pytest.mark.parametrize("name", ["nccl-numa-sm120", "pcie-ipc-sm120", "nccl-tuned-switch"])
def test_payload_profiles_follow_from_their_measured_sizes(name):
    """Each curve is payload_curve() of the sizes the file cites, at 14 KiB per token."""
    p = passcost.load_profile(name)
    m = p.meta["measured"]
    assert m["bytes_per_token"] == 7168 * 2 == 14 * KIB
    derived = passcost.payload_curve({int(b): us for b, us in m["allreduce_us_by_bytes"].items()},
                                     m["bytes_per_token"])
    assert dict(p.allreduce_us) == pytest.approx({t: float(v) for t, v in derived.items()},
                                                 abs=0.051)


def test_numa_and_ipc_profiles_keep_the_docstrings_ratio():
    # SGLang 0.5.23's pcie_ipc_ar.py: 205.1 / 5.3 us at 12 KiB, 584.9 / 15.3 us at 96 KiB (~38x)
    numa, ipc = passcost.load_profile("nccl-numa-sm120"), passcost.load_profile("pcie-ipc-sm120")
    for t in (1, 2, 4, 8):
        assert 33 < numa.ar_us(t) / ipc.ar_us(t) < 40, t
    tuned = passcost.load_profile("nccl-tuned-switch")
    assert 17.0 <= tuned.ar_us(1) and tuned.ar_us(16) <= 25.0  # 14-224 KiB: inside 4-256 KB


def test_payload_curve_by_hand():
    # 12 KiB -> 205.1, 96 KiB -> 584.9; 1 token of 14 KiB: 205.1 + 379.8 * 2 / 84
    got = passcost.payload_curve({12 * KIB: 205.1, 96 * KIB: 584.9}, 14 * KIB, (1, 6, 8))
    assert got[1] == pytest.approx(205.1 + 379.8 * 2 / 84, abs=0.05)
    assert got[6] == pytest.approx(205.1 + 379.8 * 72 / 84, abs=0.05)
    assert got[8] == pytest.approx(584.9 + 379.8 * 16 / 84, abs=0.05)  # past the last: its slope
    assert passcost.payload_curve({100: 7.0}, 1000, (1, 2)) == {1: 7.0, 2: 7.0}


def test_interpolation_and_extrapolation():
    p = passcost.load_profile("reference-kimi-tp8")
    assert p.ar_us(3) == pytest.approx((110.0 + 205.0) / 2)
    assert p.ar_us(128) == pytest.approx(580.0 + (580.0 - 380.0) / 32 * 64)
    assert p.compute_pass_ms(500) == 5.0
    assert p.pass_ms(8, compute=False) == pytest.approx(122 * 0.230)


def test_cost_table_is_the_profile_per_token_count():
    p = passcost.load_profile("reference-kimi-tp8")
    t = p.cost_table((1, 2, 4, 8))
    assert t.decode_ms(1) == pytest.approx(p.pass_ms(1), abs=1e-3)
    assert t.verify_ms(4) == pytest.approx(p.pass_ms(4), abs=1e-3)
    assert t.decode_ms(8) == t.verify_ms(8)  # a decode step of 8 requests is a pass of 8 tokens


def test_microbenchmark_result_is_a_profile():
    obj = json.loads(BENCH.read_text())
    rows = {(r["backend"], r["tokens"]): r for r in obj["summary"]["rows"]}
    p = passcost.load_profile(str(BENCH))
    assert p.name == "allreduce_kimi#nccl" and p.allreduces_per_pass == 122
    assert p.ar_us(8) == pytest.approx(rows[("nccl", 8)]["ar_graph_us"])
    assert p.compute_pass_ms(64) == pytest.approx(rows[("nccl", 64)]["compute_us"] / 1000)
    assert "bfloat16 on 2x NVIDIA H200" in " ".join(p.source)
    q = passcost.load_profile(f"{BENCH}#flashinfer-pcie")
    assert q.ar_us(1) == pytest.approx(rows[("flashinfer-pcie", 1)]["ar_graph_us"])
    assert q.compute_ms == p.compute_ms
    with pytest.raises(PassCostError, match=r"backend 'nope' not in the file; allowed: .*nccl"):
        passcost.load_profile(f"{BENCH}#nope")


def _file(tmp_path, obj, name="p.json", bom=False):
    f = tmp_path / name
    text = obj if isinstance(obj, str) else json.dumps(obj)
    f.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return str(f)


GOOD = {"allreduces_per_pass": 2, "allreduce_us": {"1": 10.0, "4": 40.0}}


@pytest.mark.parametrize("obj, match", [
    ("{nope", r"p\.json: not valid JSON"),
    ([1, 2], r"expected a JSON object"),
    ({"allreduce_us": {"1": 1}}, r"missing key 'allreduces_per_pass'"),
    ({"allreduces_per_pass": 2}, r"missing key 'allreduce_us'"),
    ({"allreduces_per_pass": -1, "allreduce_us": {"1": 1}}, r"'allreduces_per_pass' = -1"),
    ({"allreduces_per_pass": 2, "allreduce_us": {"x": 1}}, r"has key 'x'; keys are token counts"),
    ({"allreduces_per_pass": 2, "allreduce_us": {"0": 1}}, r"has key '0'"),
    ({"allreduces_per_pass": 2, "allreduce_us": {"1": -3}}, r"'allreduce_us'\[1\] = -3"),
    ({"allreduces_per_pass": 2, "allreduce_us": {}}, r"'allreduce_us' must be a non-empty"),
    ({**GOOD, "compute_ms": {"1": "5"}}, r"'compute_ms'\[1\] = '5'"),
])
def test_bad_profile_files(tmp_path, obj, match):
    with pytest.raises(PassCostError, match=match):
        passcost.load_profile(_file(tmp_path, obj))


def test_load_errors_name_the_flag_and_the_choices(tmp_path):
    with pytest.raises(PassCostError, match=r"--tables nope: no such file and no built-in profile "
                                            r"of that name \(built in: .*reference-kimi-tp8"):
        passcost.load_profile("nope", "--tables")
    with pytest.raises(PassCostError, match=r"'#nccl' names a backend, but .* is a profile"):
        passcost.load_profile(_file(tmp_path, GOOD) + "#nccl")


def test_bom_and_extra_keys(tmp_path):
    p = passcost.load_profile(_file(tmp_path, {**GOOD, "note": "x"}, bom=True))
    assert p.ar_us(2) == pytest.approx(20.0) and p.meta == {"note": "x"} and not p.has_compute


def test_parse_points():
    assert passcost.parse_points("1:59, 4:205,8:230", "--allreduce-us") == \
        {1: 59.0, 4: 205.0, 8: 230.0}
    assert passcost.parse_points("5", "--compute-ms") == {1: 5.0}
    for bad, match in (("a:b", r"expected a number or TOKENS:"), ("0:3", r"token counts must be"),
                       ("1:-2", r"values finite and >= 0"), ("4;5", r"expected a number")):
        with pytest.raises(PassCostError, match=match):
            passcost.parse_points(bad, "--allreduce-us")


def test_from_numbers():
    p = passcost.from_numbers(122, {4: 205.0, 8: 230.0}, 5.0, plain_ms=12.2)
    assert p.ar_us(1) == pytest.approx((12.2 - 5.0) * 1000 / 122, abs=1e-3)
    assert p.pass_ms(1) == pytest.approx(12.2, abs=1e-4)
    assert "from --plain-ms" in p.derivation
    with pytest.raises(PassCostError, match=r"--plain-ms and a 1-token point"):
        passcost.from_numbers(122, {1: 59.0}, 5.0, plain_ms=12.2)
    with pytest.raises(PassCostError, match=r"not above the 1-token compute"):
        passcost.from_numbers(122, {4: 205.0}, 5.0, plain_ms=4.0)
    with pytest.raises(PassCostError, match=r"--allreduces 0: expected an integer >= 1"):
        passcost.from_numbers(0, {1: 5.0}, None)
    with pytest.raises(PassCostError, match=r"no per-all-reduce cost given"):
        passcost.from_numbers(122, {}, 5.0)


def test_with_compute_and_flat_what_if():
    p = passcost.load_profile("nccl-tuned-switch")
    q = p.with_compute(((1, 4.0), (64, 40.0)), "compute: test")
    assert q.allreduce_us == p.allreduce_us and q.compute_pass_ms(64) == 40.0
    assert q.source[-1] == "compute: test"
    flat = p.with_allreduce_us(10.0)
    assert flat.ar_us(1) == flat.ar_us(64) == 10.0 and flat.compute_ms == p.compute_ms


def test_describe_marks_extrapolation():
    text = passcost.describe(passcost.load_profile("pcie-ipc-sm120"), (1, 64, 128))
    assert "122 all-reduces per pass" in text
    assert text.splitlines()[-1].endswith("(extrapolated)")
    assert not text.splitlines()[-2].endswith("(extrapolated)")


def test_batched_profile_puts_that_many_requests_in_each_pass(tmp_path):
    """A batch of c requests with n tokens each is the deployment's pass of c x n tokens; the
    batch survives the what-if copies and a round trip through a file."""
    p = passcost.load_profile("reference-kimi-tp8")
    b = p.batched(4)
    for n in (1, 2, 4, 8, 16):
        assert b.ar_us(n) == pytest.approx(p.ar_us(4 * n))
        assert b.pass_ms(n) == pytest.approx(p.pass_ms(4 * n))
    assert b.name == "reference-kimi-tp8 x4 requests" and p.batched(1) == p
    assert b.extrapolated(32) and not p.extrapolated(32)  # 128 tokens lie past the curve
    assert b.with_allreduce_us(10.0).batch == 4 and b.batched(2).ar_us(1) == p.ar_us(2)
    f = tmp_path / "b.json"
    f.write_text(json.dumps(b.to_json()))
    assert passcost.load_profile(str(f)).pass_ms(8) == pytest.approx(p.pass_ms(32))
    with pytest.raises(PassCostError, match="requests per pass must be an integer >= 1"):
        p.batched(0)
    f.write_text(json.dumps({**p.to_json(), "requests_per_pass": 0}))
    with pytest.raises(PassCostError, match="'requests_per_pass' = 0"):
        passcost.load_profile(str(f))
