"""fastverify.allreduce: --tp-allreduce mapping per SGLang version, fusion gates,
measured-table decisions."""
import json

import pytest

from fastverify.allreduce import (BUILTIN_ROWS, TABLE_FORMAT, AllReduceConfigError,
                                  Topology, decide,
                                  fusion_blocker, fusion_sm_allowed, load_table,
                                  preflight_probes_multicast, write_table)

PCIE120 = Topology(sm=120, has_nvlink=False, p2p=True, multicast=False)
NVL90 = Topology(sm=90, has_nvlink=True, p2p=True, multicast=True)
NVL100 = Topology(sm=100, has_nvlink=True, p2p=True, multicast=True)


def d(choice, ver="0.5.23", topo=PCIE120, tp=8, **kw):
    return decide(choice, sglang_version=ver, topology=topo, tp_size=tp, **kw)


# ---- explicit choices
# --------------------------------------------------------------------------------

def test_unset_keeps_sglang():
    p = d(None)
    assert p.path is None and p.fields == () and p.env == ()


@pytest.mark.parametrize("ver,env",
                         [("0.5.23", {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0"}), ("0.5.16", {})])
def test_nccl_disables_custom_and_fusion(ver, env):
    p = d("nccl", ver)
    assert p.field_dict() == {"disable_custom_all_reduce": True,
                              "flashinfer_allreduce_fusion_backend": None}
    assert p.env_dict() == env


def test_pcie_ipc_on_0_5_23():
    p = d("pcie-ipc")
    assert p.env_dict() == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    # "ca" is checked before "pcie_ipc"
    assert p.field_dict()["disable_custom_all_reduce"] is True
    assert p.field_dict()["flashinfer_allreduce_fusion_backend"] is None


def test_pcie_ipc_refused_on_0_5_16_with_alternative():
    with pytest.raises(AllReduceConfigError,
                       match=r"--tp-allreduce pcie-ipc: SGLang 0\.5\.16 has no PCIe IPC "
                             r"all-reduce.*Use SGLang 0\.5\.23.*--tp-allreduce nccl"):
        d("pcie-ipc", "0.5.16")


@pytest.mark.parametrize("tp", [3, 6, 16])
def test_pcie_ipc_tp_sizes(tp):
    with pytest.raises(AllReduceConfigError,
                       match=rf"TP size {tp} is not supported; allowed TP sizes: 2, 4, 8"):
        d("pcie-ipc", tp=tp)


def test_custom_refused_on_more_than_two_pcie_gpus():
    with pytest.raises(AllReduceConfigError,
                       match=r"more than two PCIe-only GPUs.*Allowed here: pcie-ipc, nccl"):
        d("custom", tp=4)
    with pytest.raises(AllReduceConfigError,
                       match=r"Allowed here: nccl \(SGLang 0\.5\.16 has no pcie-ipc\)"):
        d("custom", "0.5.16", tp=4)
    assert d("custom", tp=2).field_dict()["disable_custom_all_reduce"] is False
    assert d("custom", topo=NVL90, tp=8).path == "custom"


def test_unknown_choice():
    with pytest.raises(AllReduceConfigError,
                       match=r"allowed: auto, nccl, custom, pcie-ipc, flashinfer-fused"):
        d("fast")


# ---- FlashInfer fusion gates: sm90/sm100/sm120 x multicast x TP
# ----------------------------------------

@pytest.mark.parametrize("sm", [90, 100, 120])
@pytest.mark.parametrize("multicast", [True, False])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_fused_explicit_allowed_on_supported_sm(sm, multicast, tp):
    topo = Topology(sm=sm, has_nvlink=multicast, multicast=multicast)
    p = d("flashinfer-fused", topo=topo, tp=tp, flashinfer_version="0.7.2")
    assert (p.path == "flashinfer-fused"
            and p.field_dict() == {"flashinfer_allreduce_fusion_backend": "trtllm"})
    assert ("no multicast" in p.reason) == (not multicast)
    # PCIe: point at the measured regression
    assert ("sglang#32330" in p.reason) == (not multicast)


def test_fused_needs_tp_and_single_node():
    with pytest.raises(AllReduceConfigError, match=r"needs TP size >= 2"):
        d("flashinfer-fused", tp=1, flashinfer_version="0.7.2")
    with pytest.raises(AllReduceConfigError,
                       match=r"single-node only; allowed: nccl, custom, pcie-ipc"):
        d("flashinfer-fused", nnodes=2, flashinfer_version="0.7.2")


def test_fused_sm120_on_flashinfer_0_6_14_stops_with_remedy():
    with pytest.raises(AllReduceConfigError,
                       match=r"FlashInfer 0\.6\.14 cannot build its trtllm comm kernels for "
                             r"SM120.*use SGLang 0\.5\.23 with FlashInfer >= 0\.7"):
        d("flashinfer-fused", "0.5.16", flashinfer_version="0.6.14")
    with pytest.raises(AllReduceConfigError, match=r"SM121"):
        fusion_sm_allowed(121, "trtllm", "0.6.14")
    # SM90/SM100 are fine on 0.6.14 (upstream)
    assert d("flashinfer-fused", "0.5.16", topo=NVL90,
             flashinfer_version="0.6.14").path == "flashinfer-fused"


def test_fused_refused_on_other_sm():
    with pytest.raises(AllReduceConfigError, match=r"needs SM90, SM10x or SM12x; this GPU is SM80"):
        d("flashinfer-fused", topo=Topology(sm=80, has_nvlink=True), flashinfer_version="0.7.2")


@pytest.mark.parametrize("sm,backend,fi,allowed", [
    (90, "auto", "0.6.14", True), (100, "mnnvl", "0.6.14", True), (120, "trtllm", "0.7.2", True),
    (120, "auto", "0.7.2", True), (121, "trtllm", "0.7.2", True), (120, "mnnvl", "0.7.2", False),
    (120, None, "0.7.2", False), (80, "trtllm", "0.7.2", False), (None, "trtllm", "0.7.2", False),
])
def test_fusion_sm_gate(sm, backend, fi, allowed):
    assert fusion_sm_allowed(sm, backend, fi) is allowed


def test_fusion_blocker_unknown_is_not_a_blocker():
    assert fusion_blocker(None, None) is None and fusion_blocker(120, None) is None


@pytest.mark.parametrize("mc,probe", [(True, True), (False, False), (None, True)])
def test_preflight_multicast(mc, probe):
    assert preflight_probes_multicast(mc) is probe


# ---- auto: only from measured rows
# -------------------------------------------------------------------

def test_auto_builtin_sm120_pcie_tp8_picks_pcie_ipc_on_0_5_23():
    p = d("auto")
    assert p.path == "pcie-ipc"
    assert ("pcie-ipc 5.3 us" in p.reason and "nccl 205 us" in p.reason
            and "pcie_ipc_ar.py" in p.reason)


def test_auto_without_two_measured_candidates_keeps_sglang():
    # 0.5.16 has no pcie-ipc, so only the NCCL row is left: no decision.
    p = d("auto", "0.5.16")
    assert p.path is None and "fewer than two measured paths for SM120/pcie/TP8" in p.reason
    # H200 TP2: only NCCL measured in the built-in table -> no decision either.
    assert d("auto", topo=NVL90, tp=2).path is None
    # unmeasured TP size
    assert d("auto", tp=4).path is None


def test_auto_unknown_topology_or_tp1():
    assert ("unknown" in d("auto", topo=Topology()).reason
            and d("auto", topo=Topology()).path is None)
    assert d("auto", tp=1).path is None


def test_auto_never_fuses_on_pcie_without_its_own_row():
    rows = [dict(sm=120, fabric="pcie", tp=4, bytes=114688, path="nccl", us=30.0),
            dict(sm=120, fabric="pcie", tp=4, bytes=114688, path="pcie-ipc", us=12.0)]
    assert d("auto", tp=4, table=rows, flashinfer_version="0.7.2").path == "pcie-ipc"
    rows.append(dict(sm=120, fabric="pcie", tp=4, bytes=114688, path="flashinfer-fused", us=40.0))
    # measured slower (TP4)
    assert d("auto", tp=4, table=rows, flashinfer_version="0.7.2").path == "pcie-ipc"
    rows[-1]["us"] = 9.0
    p = d("auto", tp=4, table=rows, flashinfer_version="0.7.2")
    assert (p.path == "flashinfer-fused"
            and p.field_dict() == {"flashinfer_allreduce_fusion_backend": "trtllm"})
    # but not on a FlashInfer that cannot build SM12x kernels
    assert d("auto", "0.5.16", tp=4, table=rows, flashinfer_version="0.6.14").path is None


def test_auto_uses_row_nearest_the_payload():
    rows = [dict(sm=90, fabric="nvlink", tp=2, bytes=14336, path="nccl", us=19.8),
            dict(sm=90, fabric="nvlink", tp=2, bytes=14336, path="custom", us=30.0),
            dict(sm=90, fabric="nvlink", tp=2, bytes=917504, path="nccl", us=24.8),
            dict(sm=90, fabric="nvlink", tp=2, bytes=917504, path="custom", us=12.0)]
    assert d("auto", topo=NVL90, tp=2, table=rows, payload_bytes=14336).path == "nccl"
    assert d("auto", topo=NVL90, tp=2, table=rows, payload_bytes=900000).path == "custom"


def test_auto_excludes_custom_on_pcie_above_tp2():
    rows = [dict(sm=120, fabric="pcie", tp=8, bytes=12288, path="custom", us=1.0),
            dict(sm=120, fabric="pcie", tp=8, bytes=12288, path="nccl", us=20.0)]
    assert d("auto", "0.5.16", table=rows).path is None


def test_builtin_rows_cite_source_and_date():
    for row in BUILTIN_ROWS:
        assert row["source"] and row["date"] and row["us"] > 0


# ---- table files
# --------------------------------------------------------------------------------------

def test_table_roundtrip(tmp_path):
    p = tmp_path / "t.json"
    write_table(p, [dict(sm=120, fabric="pcie", tp=8, bytes=12288, path="nccl", us=20.0,
                         source="x", date="d")])
    assert load_table(p)[0]["us"] == 20.0


@pytest.mark.parametrize("content,match", [
    ("nope", r"--tp-allreduce-table .*: not a readable JSON"),
    (json.dumps({"format": "x", "rows": []}),
     r"expected \{\"format\": \"fastverify-allreduce-table/1\""),
    (json.dumps({"format": TABLE_FORMAT, "rows": [{"sm": 90}]}), r"row 0 needs 'fabric'"),
    (json.dumps({"format": TABLE_FORMAT,
                 "rows": [dict(sm=90, fabric="ib", tp=2, bytes=1, path="nccl", us=1)]}),
     r"fabric 'ib'; allowed: nvlink, pcie"),
    (json.dumps({"format": TABLE_FORMAT,
                 "rows": [dict(sm=90, fabric="pcie", tp=2, bytes=1, path="mpi", us=1)]}),
     r"path 'mpi'; allowed: nccl, custom, pcie-ipc, flashinfer-fused"),
    (json.dumps({"format": TABLE_FORMAT,
                 "rows": [dict(sm=90, fabric="pcie", tp=2, bytes=1, path="nccl", us=0)]}),
     r"positive 'us'"),
])
def test_bad_table(tmp_path, content, match):
    p = tmp_path / "t.json"
    p.write_text(content)
    with pytest.raises(AllReduceConfigError, match=match):
        load_table(p)
