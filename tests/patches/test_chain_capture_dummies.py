"""Chain verify must never capture a verify CUDA graph with a custom mask.

A verify graph captured with a mask reads the mask buffer at every replay; in chain mode nothing
writes that buffer, so the graph attends through a stale mask. SGLang builds NGRAM capture dummies
in more than one place (spec_info.create_dummy_verify_input and the decode graph runner's own
get_spec_info). The first GPU run of chain mode (2x H200, 2026-11-30) missed the second one and its
greedy output diverged from plain decoding at the first verify step. This test applies each pinned
series to a pristine copy and checks, statically, every ``NgramVerifyInput(...)`` construction in
SGLang: its ``custom_mask`` must be None, go through ``fv_ngram.dummy_custom_mask`` (None for
chain-shaped verify), or be the worker's own chain switch.
"""
from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from fastverify.glue import ngram as fv_ngram

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("0.5.16", "0.5.23")


def _pristine(ver: str) -> Path | None:
    src = ROOT / ".scratch" / "pristine" / ver
    if (src / "sglang").is_dir():
        return src
    wheels = sorted((ROOT / ".downloads").glob(f"sglang-{ver}-*.whl"))
    return wheels[0] if wheels else None


def _patched_tree(ver: str, dest: Path) -> Path:
    src = _pristine(ver)
    if src is None:
        pytest.skip(f"no pristine SGLang {ver} here (.scratch/pristine/{ver} or "
                    f".downloads/sglang-{ver}-*.whl)")
    if src.is_dir():
        shutil.copytree(src / "sglang" / "srt", dest / "sglang" / "srt")
    else:
        import zipfile

        with zipfile.ZipFile(src) as z:
            z.extractall(dest, [n for n in z.namelist() if n.startswith("sglang/srt/")])
    series = ROOT / "patches" / f"sglang-{ver}" / "series"
    for name in [line.strip() for line in series.read_text().splitlines() if line.strip()
                 and not line.startswith("#")]:
        text = (series.parent / name).read_text()
        if "a/sglang/srt/" not in text:
            continue  # a patch outside srt/ (the C++ corpus header) is not needed here
        r = subprocess.run(["patch", "-p1", "--fuzz=0", "-s", "-d", str(dest)], input=text,
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{name} does not apply: {r.stdout}{r.stderr}"
    return dest / "sglang" / "srt"


def _mask_sources(srt: Path):
    for path in srt.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "NgramVerifyInput(" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "NgramVerifyInput":
                for kw in node.keywords:
                    if kw.arg == "custom_mask":
                        yield (path.relative_to(srt.parent.parent), node.lineno,
                               ast.unparse(kw.value))


@pytest.mark.parametrize("ver", VERSIONS)
def test_every_ngram_capture_dummy_drops_the_mask_in_chain_mode(ver, tmp_path):
    srt = _patched_tree(ver, tmp_path)
    found = list(_mask_sources(srt))
    files = {str(f) for f, _, _ in found}
    # the two capture dummies and the worker's verify input are all there
    assert "sglang/srt/speculative/spec_info.py" in files
    assert "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py" in files
    assert "sglang/srt/speculative/ngram_worker.py" in files
    bad = [f"{f}:{line}: custom_mask={src}" for f, line, src in found
           if not (src == "None" or "dummy_custom_mask(" in src or "_fv.chain" in src)]
    assert not bad, "NGRAM verify inputs that keep a mask in chain mode:\n" + "\n".join(bad)
    # the glue reads the verify mode off the server args itself (fastverify.glue.config)
    assert not [src for _, _, src in found if "speculative_ngram_verify_mode" in src]


def test_dummy_mask_is_none_for_chain_shaped_modes():
    from types import SimpleNamespace

    def args(mode):
        return SimpleNamespace(speculative_ngram_verify_mode=mode, speculative_num_draft_tokens=8,
                               speculative_ngram_match_type="BFS",
                               speculative_ngram_verify_widths="1,2,8" if mode == "auto" else None)

    mask = object()
    assert fv_ngram.dummy_custom_mask(args("tree"), mask) is mask
    assert fv_ngram.dummy_custom_mask(args("chain"), mask) is None
    assert fv_ngram.dummy_custom_mask(args("auto"), mask) is None
