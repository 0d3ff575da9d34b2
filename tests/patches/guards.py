"""Drift guards: what each patch relies on in pristine upstream SGLang. Patch authors append entries.

tests/patches/test_drift_guards.py checks every entry against the PRISTINE sources of each listed version
(parsed with `ast`, never imported), so an SGLang bump that moves or reshapes a seam fails here, by name,
before a patch is half-understood. Every patch of every pinned series needs at least one entry.

Fields of Guard (file is relative to the folder that contains sglang/, as in the patches):
  patch           the patch file name, e.g. "0001-ngram-corpus-cstddef.patch"
  versions        the SGLang versions whose pristine source must satisfy the entry
  file            the upstream file the patch touches
  symbol          optional, in a .py file: "func", "Class", "Class.method", "Class.field" (a class-level
                  assignment or annotation, e.g. a ServerArgs dataclass field), "NAME" (module-level)
  params          optional, the exact parameter names of that function/method in order, with "*args",
                  "**kwargs" and "*" (bare star) written as such
  params_include  optional, names that must be among the parameters (any order)
  contains        optional, text that must occur in the file (the lines the patch anchors to)
  lacks           optional, text that must NOT occur upstream (when it appears, upstream has the fix:
                  retire the patch)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Guard:
    patch: str
    versions: tuple
    file: str
    symbol: str | None = None
    params: tuple | None = None
    params_include: tuple = ()
    contains: tuple = ()
    lacks: tuple = ()

    def __str__(self):
        what = f"{self.file}::{self.symbol}" if self.symbol else self.file
        return f"{self.patch}:{what}"


GUARDS = [
    # 0001: result.h declares Result::truncate(size_t) without including <cstddef> (fails with GCC 12).
    Guard(patch="0001-ngram-corpus-cstddef.patch", versions=("0.5.16",),
          file="sglang/jit_kernel/csrc/ngram_corpus/result.h",
          contains=("#pragma once", "#include <cstdint>", "void truncate(size_t n);"),
          lacks=("#include <cstddef>",)),
    # 0006: verify-pass timing. Flags beside decode_log_interval, validation in check_server_args, the pass
    # scope in ModelRunner.forward, the graph decision in _forward_raw, decorators on the TP collectives.
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16",), file="sglang/srt/server_args.py",
          symbol="ServerArgs.decode_log_interval",
          lacks=("enable_verify_timing",)),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16",), file="sglang/srt/server_args.py",
          symbol="ServerArgs.check_server_args", params=("self",),
          contains=("assert not (self.disable_cuda_graph_padding and self.enable_torch_compile), (",)),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/fields/observability.py", symbol="Observability.decode_log_interval",
          lacks=("enable_verify_timing",)),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.23",), file="sglang/srt/arg_groups/validation_hook.py",
          symbol="check_server_args", params=("server_args",),
          contains=("assert not (cfg.disable_cuda_graph_padding and cfg.enable_torch_compile), (",)),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/model_runner.py", symbol="ModelRunner.forward",
          params_include=("self", "forward_batch"),
          contains=("            canary_ctx,\n            step_span_ctx,\n",
                    "from sglang.srt.utils.profile_utils import build_step_span_name\n")),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/model_runner.py", symbol="ModelRunner._forward_raw",
          params_include=("self", "forward_batch"),
          contains=("                and self.decode_cuda_graph_runner.can_run_graph(forward_batch)\n            )\n",
                    "and self.prefill_cuda_graph_runner.can_run_graph(forward_batch)")),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/distributed/parallel_state.py", symbol="GroupCoordinator.all_reduce",
          params=("self", "input_"),
          contains=("from sglang.srt.utils.custom_op import register_custom_op\n",)),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/distributed/parallel_state.py", symbol="GroupCoordinator.fused_allreduce_rmsnorm",
          params=("self", "input_", "residual_inp_", "weight_", "eps")),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/layers/flashinfer_comm_fusion.py", symbol="flashinfer_allreduce_residual_rmsnorm",
          params_include=("input_tensor", "residual", "weight", "eps"),
          contains=("@register_custom_op(\n    mutates_args=[\"input_tensor\", \"residual\", \"weight\"],",)),
]
