"""0001-ngram-corpus-cstddef: SGLang 0.5.16's C++ n-gram corpus fails to build with g++ 12 as
shipped and builds (and works) with the patch.

Both builds run for real: each in a fresh subprocess with its own empty JIT cache folder, importing
the copied sources (PYTHONPATH) rather than the venv's SGLang. About 30 s per build on 2 cores.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastverify import patchtool
from pristine import ROOT, copy_tree, installed_version

PATCH = ROOT / "patches" / "sglang-0.5.16" / "0001-ngram-corpus-cstddef.patch"
pytestmark = [
    pytest.mark.slow, pytest.mark.sglang,
    pytest.mark.skipif(installed_version() != "0.5.16",
                       reason="needs SGLang 0.5.16's dependencies in the running venv (patch 0001 "
                              "is 0.5.16 only)"),
    pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                       reason="no C++ compiler"),
]

# A tiny corpus: two sequences sharing the prefix [1, 2, 3], then three queries.
PROBE = r"""
import json, sys
import sglang
from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus
corpus = NgramCorpus(max_trie_depth=12, draft_token_num=8, min_bfs_breadth=1, max_bfs_breadth=8,
                     match_type="BFS", capacity=100000)
corpus.batch_put([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 44, 55, 66, 77, 88, 99, 100]])
corpus.synchronize()
queries = [[1, 2, 3], [3, 44], [3, 6, 999]]
ids, masks = corpus.batch_get(req_ids=["q0", "q1", "q2"], batch_tokens=queries,
                              total_lens=[len(q) for q in queries])
print("RESULT " + json.dumps({"sglang": sglang.__file__, "ids": ids.reshape(-1, 8).tolist(),
                              "masks": masks.reshape(-1, 8, 8).tolist()}))
"""


def _build_and_probe(tree: Path, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(tree), TVM_FFI_CACHE_DIR=str(cache / "tvm-ffi"),
               SGLANG_JIT_CACHE_DIR=str(cache / "sglang-jit"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("CXX", None)  # the compiler as installed: no "-include cstddef" workaround
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, timeout=540)


def test_corpus_fails_before_and_builds_after(tmp_path, pristine_source):
    tree = copy_tree(pristine_source("0.5.16"), tmp_path / "site")
    header = tree / "sglang/jit_kernel/csrc/ngram_corpus/result.h"
    assert b"<cstddef>" not in header.read_bytes()

    before = _build_and_probe(tree, tmp_path / "cache-pristine")
    assert before.returncode != 0, "pristine 0.5.16 corpus unexpectedly built"
    log = before.stdout + before.stderr
    assert "size_t" in log and "has not been declared" in log, log[-4000:]
    assert "RESULT" not in before.stdout

    run = patchtool.run_patch(tree, patchtool.parse_patch(PATCH))
    assert run.ok, run.output
    assert b"#include <cstddef>" in header.read_bytes()

    after = _build_and_probe(tree, tmp_path / "cache-patched")
    assert after.returncode == 0, (after.stdout + after.stderr)[-4000:]
    assert any((tmp_path / "cache-patched").rglob("*.so")), ("no freshly built module in the new "
                                                             "cache")
    result = json.loads(after.stdout.split("RESULT ", 1)[1])
    assert result["sglang"].startswith(str(tree))
    ids, masks = result["ids"], result["masks"]
    # q0 [1,2,3]: root 3, then both continuations 4.. and 44.. interleaved breadth-first
    assert ids[0] == [3, 4, 44, 5, 55, 6, 66, 77]
    # q1 [3,44]: a single chain 55..100, padded with 0
    assert ids[1] == [44, 55, 66, 77, 88, 99, 100, 0]
    # q2 ends in an unseen token: no match, just the root
    assert ids[2] == [999, 0, 0, 0, 0, 0, 0, 0]
    # mask row i = ancestors-or-self of node i; node 3 (token 5) descends from
    # 1 (token 4) and the root
    assert masks[0][3] == [1, 1, 0, 1, 0, 0, 0, 0]
    assert all(masks[0][i][i] == 1 and masks[0][i][0] == 1 for i in range(8))
