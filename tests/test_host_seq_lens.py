"""Patch 0009: chain-shaped n-gram verify needs no host copy of the sequence
lengths (glue/ngram.py)."""
import pytest

from fastverify.glue import ngram


class Spec:
    def __init__(self, mode):
        self.speculative_ngram_verify_mode = mode
        self.speculative_num_draft_tokens = 8
        self.speculative_ngram_match_type = "BFS"
        self.speculative_ngram_verify_widths = "1,2,4,8" if mode == "auto" else None


@pytest.mark.parametrize("mode,needed",
                         [("tree", True), (None, True), ("chain", False), ("auto", False)])
def test_only_tree_verify_reads_host_lengths(mode, needed):
    assert ngram.needs_host_seq_lens(Spec(mode)) is needed


@pytest.mark.sglang
@pytest.mark.slow
def test_patched_scheduler_keeps_the_copy_for_tree_and_where_a_backend_needs_it(tmp_path_factory):
    from probe_support import patched_sglang, run_probe, tiny_model

    folder, _version = patched_sglang(tmp_path_factory)
    probe = run_probe("host_seq_lens_probe.py", tiny_model(tmp_path_factory), folder)
    assert probe == {
        "tree/backend_needs_none": True,  # SGLang's own rule: the tree verify reads it
        "tree/backend_needs_copy": True,
        "chain/backend_needs_none": False,  # no blocking copy before each step
        "chain/backend_needs_copy": True,  # the backend still decides
        "auto/backend_needs_none": False,
        "auto/backend_needs_copy": True,
    }
