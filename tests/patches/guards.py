"""Drift guards: what each patch relies on in pristine upstream SGLang.
Patch authors append entries.

tests/patches/test_drift_guards.py checks every entry against the PRISTINE sources of each
listed version (parsed with `ast`, never imported), so an SGLang bump that moves or reshapes a
seam fails here, by name, before a patch is half-understood. Every patch of every pinned series
needs at least one entry.

Fields of Guard (file is relative to the folder that contains sglang/, as in the patches):
  patch           the patch file name, e.g. "0001-ngram-corpus-cstddef.patch"
  versions        the SGLang versions whose pristine source must satisfy the entry
  file            the upstream file the patch touches
  symbol          optional, in a .py file: "func", "Class", "Class.method", "Class.field"
                  (a class-level assignment or annotation, e.g. a ServerArgs dataclass
                  field), "NAME" (module-level)
  params          optional, the exact parameter names of that function/method in order, with
                  "*args", "**kwargs" and "*" (bare star) written as such
  params_include  optional, names that must be among the parameters (any order)
  contains        optional, text that must occur in the file (the lines the patch anchors to)
  lacks           optional, text that must NOT occur upstream (when it appears, upstream has
                  the fix: retire the patch)
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
    # 0001: result.h declares Result::truncate(size_t) without including
    # <cstddef> (fails with GCC 12).
    Guard(patch="0001-ngram-corpus-cstddef.patch", versions=("0.5.16",),
          file="sglang/jit_kernel/csrc/ngram_corpus/result.h",
          contains=("#pragma once", "#include <cstdint>", "void truncate(size_t n);"),
          lacks=("#include <cstddef>",)),
    # 0006: verify-pass timing. Flags beside decode_log_interval, validation in
    # check_server_args, the pass scope in ModelRunner.forward, the graph decision in
    # _forward_raw, decorators on the TP collectives.
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16",), file="sglang/srt/server_args.py",
          symbol="ServerArgs.decode_log_interval",
          lacks=("enable_verify_timing",)),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16",), file="sglang/srt/server_args.py",
          symbol="ServerArgs.check_server_args", params=("self",),
          contains=("assert not (self.disable_cuda_graph_padding and "
                    "self.enable_torch_compile), (",)),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/fields/observability.py",
          symbol="Observability.decode_log_interval", lacks=("enable_verify_timing",)),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/validation_hook.py",
          symbol="check_server_args", params=("server_args",),
          contains=("assert not (cfg.disable_cuda_graph_padding and "
                    "cfg.enable_torch_compile), (",)),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/model_runner.py", symbol="ModelRunner.forward",
          params_include=("self", "forward_batch"),
          contains=("            canary_ctx,\n            step_span_ctx,\n",
                    "from sglang.srt.utils.profile_utils import build_step_span_name\n")),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/model_runner.py", symbol="ModelRunner._forward_raw",
          params_include=("self", "forward_batch"),
          contains=("                and "
                    "self.decode_cuda_graph_runner.can_run_graph(forward_batch)\n            )\n",
                    "and self.prefill_cuda_graph_runner.can_run_graph(forward_batch)")),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/distributed/parallel_state.py", symbol="GroupCoordinator.all_reduce",
          params=("self", "input_"),
          contains=("from sglang.srt.utils.custom_op import register_custom_op\n",)),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/distributed/parallel_state.py",
          symbol="GroupCoordinator.fused_allreduce_rmsnorm",
          params=("self", "input_", "residual_inp_", "weight_", "eps")),
    Guard(patch="0006-verify-timing.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/layers/flashinfer_comm_fusion.py",
          symbol="flashinfer_allreduce_residual_rmsnorm",
          params_include=("input_tensor", "residual", "weight", "eps"),
          contains=("@register_custom_op(\n    mutates_args=[\"input_tensor\", \"residual\", "
                    "\"weight\"],",)),
    # 0005: the decode graph runner builds its own NGRAM capture dummy (not through
    # create_dummy_verify_input); in chain mode it must capture without a mask too.
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
          symbol="DecodeCudaGraphRunner.get_spec_info", params=("self", "num_tokens"),
          contains=("        elif self.model_runner.spec_algorithm.is_ngram():\n",
                    "                custom_mask=self.buffers.custom_mask,\n")),
    # 0005: n-gram chain verify. Flag beside the ngram fields, spec overrides in _handle_ngram, the
    # worker's corpus call / full-mask build / verify input / on_verify_complete_cpu,
    # NgramVerifyInput's device line and mask padding, and the CUDA-graph dummy verify input.
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.16",),
          file="sglang/srt/server_args.py",
          symbol="ServerArgs.speculative_ngram_external_corpus_max_tokens",
          lacks=("speculative_ngram_verify_mode",)),
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/fields/spec.py",
          symbol="Spec.speculative_ngram_external_corpus_max_tokens",
          lacks=("speculative_ngram_verify_mode",)),
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.16",),
          file="sglang/srt/arg_groups/speculative_hook.py",
          symbol="_handle_ngram", params=("server_args",),
          contains=("    if server_args.speculative_ngram_external_corpus_path is not None:\n",)),
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/speculative_hook.py",
          symbol="_handle_ngram", params=("server_args",),
          contains=("    if cfg.speculative_ngram_external_corpus_path is not None:\n",)),
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py", symbol="NGRAMWorker._prepare_draft_tokens",
          params=("self", "batch"),
          contains=("        req_drafts, mask = self.ngram_corpus.batch_get(\n            req_ids, "
                    "batch_tokens, total_lens\n        )\n",
                    "        if USE_FULL_MASK and not _is_cpu:\n",
                    "            custom_mask=tree_mask,\n",
                    "from sglang.srt.utils import is_cpu\n",
                    "        self._prev_decode_rids: set = set()\n")),
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py",
          symbol="NGRAMWorker.on_verify_complete_cpu",
          params=("self", "num_correct_drafts_per_req", "batch_size"),
          contains=("            "
                    "self.adaptive_controller.on_verify_complete(num_correct_drafts_per_req)\n",)),
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py",
          symbol="NGRAMWorker._prepare_for_speculative_decoding", params=("self", "batch")),
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_info.py",
          symbol="NgramVerifyInput.generate_attn_arg_prefill",
          params_include=("self", "req_pool_indices", "paged_kernel_lens", "paged_kernel_lens_sum"),
          contains=("custom_mask.device if custom_mask is not None else new_seq_lens.device",
                    "        # Pad custom_mask when CUDA graph pads batch size beyond the actual "
                    "number of requests.\n")),
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.16",),
          file="sglang/srt/speculative/spec_info.py", symbol="create_dummy_verify_input",
          params=("spec_algorithm", "server_args", "custom_mask", "num_tokens_per_req",
                  "is_draft_worker"),
          contains=("        spec_info = NgramVerifyInput(\n            "
                    "draft_token=None,\n            custom_mask=custom_mask,\n",)),
    Guard(patch="0005-ngram-chain-verify.patch", versions=("0.5.23",),
          file="sglang/srt/speculative/spec_info.py", symbol="create_dummy_verify_input",
          params=("spec_algorithm", "custom_mask", "num_tokens_per_req", "is_draft_worker"),
          contains=("    spec = get_spec_config()\n",
                    "        spec_info = NgramVerifyInput(\n            "
                    "draft_token=None,\n            custom_mask=custom_mask,\n")),
    # 0002: --nccl-* flags. Fields after pre_warm_nccl, validation in check_server_args, export
    # in the TP worker right after _set_all_reduce_flags and before _init_parallel_groups
    # (first NCCL communicator).
    Guard(patch="0002-nccl-tuning-flags.patch", versions=("0.5.16",),
          file="sglang/srt/server_args.py", symbol="ServerArgs.pre_warm_nccl", lacks=("nccl_algo",),
          contains=("from sglang.srt.arg_groups.arg_utils import A, Arg, "
                    "add_cli_args_from_dataclass\n",)),
    Guard(patch="0002-nccl-tuning-flags.patch", versions=("0.5.16",),
          file="sglang/srt/server_args.py",
          symbol="ServerArgs.check_server_args", params=("self",)),
    Guard(patch="0002-nccl-tuning-flags.patch", versions=("0.5.16",),
          file="sglang/srt/distributed/bootstrap.py",
          symbol="init_torch_distributed", params_include=("server_args", "ps"),
          contains=("    _set_all_reduce_flags(server_args=server_args)\n",
                    "        _init_parallel_groups(\n")),
    Guard(patch="0002-nccl-tuning-flags.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/fields/exec_.py",
          symbol="ExecComm.pre_warm_nccl", lacks=("nccl_algo",)),
    Guard(patch="0002-nccl-tuning-flags.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/validation_hook.py",
          symbol="check_server_args", params=("server_args",),
          contains=("    cfg = resolving_view(server_args)\n\n    # Check parallel size "
                    "constraints\n",)),
    Guard(patch="0002-nccl-tuning-flags.patch", versions=("0.5.23",),
          file="sglang/srt/distributed/bootstrap.py",
          symbol="init_parallel_runtime", params=("*", "server_args", "device", "dist_port"),
          contains=("    _set_all_reduce_flags()\n\n", "    _init_parallel_groups(\n")),
    # 0003: --tp-allreduce. Fields after flashinfer_allreduce_fusion_backend, the pass right
    # after the upstream enforce-disable pass, an exact "--tp" alias on tp_size, the worker
    # env next to 0002's hook.
    Guard(patch="0003-tp-allreduce-path.patch", versions=("0.5.16",),
          file="sglang/srt/server_args.py",
          symbol="ServerArgs.flashinfer_allreduce_fusion_backend", lacks=("tp_allreduce",),
          contains=("        run_post_process_pass(self, _enforce_disable_allreduce_fusion)\n",
                    'aliases=["--tensor-parallel-size"],')),
    Guard(patch="0003-tp-allreduce-path.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/distributed/bootstrap.py", symbol="_set_all_reduce_flags"),
    Guard(patch="0003-tp-allreduce-path.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/fields/exec_.py",
          symbol="ExecComm.flashinfer_allreduce_fusion_backend", lacks=("tp_allreduce",)),
    Guard(patch="0003-tp-allreduce-path.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/model_hook.py",
          contains=("    run_post_process_pass(server_args, "
                    "_enforce_disable_allreduce_fusion)\n",)),
    Guard(patch="0003-tp-allreduce-path.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/fields/parallel.py",
          symbol="Parallel.tp_size", contains=('aliases=["--tensor-parallel-size"],',)),
    # 0004: SM12X fusion. The SM gate in _resolve_backend, the multicast granularity in the
    # preflight, the per-call gate constants.
    Guard(patch="0004-flashinfer-fusion-sm120.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/layers/flashinfer_comm_fusion.py", symbol="_resolve_backend",
          params=("backend", "is_multi_node"), contains=("requires SM90 or SM10X NVIDIA GPUs.",)),
    Guard(patch="0004-flashinfer-fusion-sm120.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/layers/flashinfer_comm_fusion.py",
          symbol="_flashinfer_trtllm_workspace_allocation_sizes",
          params=("cuda_driver", "prop", "world_size", "max_token_num", "hidden_dim", "dtype"),
          contains=("err, mc_granularity = cuda_driver.cuMulticastGetGranularity(",)),
    Guard(patch="0004-flashinfer-fusion-sm120.patch", versions=("0.5.16",),
          file="sglang/srt/layers/communicator.py",
          symbol="apply_flashinfer_allreduce_fusion",
          contains=("(_is_sm90_supported or _is_sm100_supported)",)),
    Guard(patch="0004-flashinfer-fusion-sm120.patch", versions=("0.5.23",),
          file="sglang/srt/layers/layer_boundary/residual/add_norm.py",
          symbol="flashinfer_ar_fusion_applies",
          contains=("(_is_sm90_supported or _is_sm100_supported)",)),
    # 0008: verify widths. Flag after speculative_ngram_capacity, validation at the end of
    # _handle_ngram, an init_cuda_graphs added to NGRAMWorker (none upstream), the worker's buffer
    # views, draft preparation order, carried-token stride and result stride.
    Guard(patch="0008-ngram-verify-widths.patch", versions=("0.5.16",),
          file="sglang/srt/server_args.py",
          symbol="ServerArgs.speculative_ngram_capacity",
          lacks=("speculative_ngram_verify_widths",)),
    Guard(patch="0008-ngram-verify-widths.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/fields/spec.py",
          symbol="Spec.speculative_ngram_capacity", lacks=("speculative_ngram_verify_widths",)),
    Guard(patch="0008-ngram-verify-widths.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/arg_groups/speculative_hook.py", symbol="_handle_ngram",
          params=("server_args",),
          contains=('            "Currently ngram speculative decoding does not support dp '
                    'attention."\n        )\n\n\n'
                    "def _maybe_disable_adaptive(",)),
    Guard(patch="0008-ngram-verify-widths.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py",
          symbol="NGRAMWorker._init_preallocated_tensors",
          params=("self",), lacks=("def init_cuda_graphs(",),
          contains=("            self.retrieve_indexes_batch.append(self.retrieve_indexes[:bs, "
                    ":])\n",
                    "            self.positions_batch.append(self.positions[: bs * "
                    "self.draft_token_num])\n",
                    "USE_FULL_MASK = True\n")),
    Guard(patch="0008-ngram-verify-widths.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py",
          symbol="NGRAMWorker._prepare_for_speculative_decoding", params=("self", "batch"),
          contains=("        req_drafts, mask = self._prepare_draft_tokens(batch)\n",
                    "        retrieve_index = self.retrieve_indexes_batch[bs]\n",
                    "        draft_tokens = self.draft_tokens_batch[bs]\n")),
    Guard(patch="0008-ngram-verify-widths.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py", symbol="NGRAMWorker._update_ngram_corpus",
          params=("self", "batch"), contains=("        i, stride = 0, self.draft_token_num\n",)),
    Guard(patch="0008-ngram-verify-widths.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py",
          symbol="NGRAMWorker.forward_batch_generation",
          params_include=("self", "batch", "on_publish"),
          contains=("        # Construct the next draft input\n",
                    "            speculative_num_draft_tokens="
                    "self.speculative_num_draft_tokens,\n")),
    # 0007: auto verify. Flags after the 0005 verify-mode field (itself after the external-corpus
    # fields), calls in _handle_ngram, the worker's init_cuda_graphs (0008) and draft preparation;
    # none of them may exist upstream.
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16",),
          file="sglang/srt/server_args.py",
          symbol="ServerArgs.speculative_ngram_external_corpus_max_tokens",
          lacks=("speculative_ngram_auto_cost_table", "speculative_ngram_auto_hysteresis")),
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/fields/spec.py",
          symbol="Spec.speculative_ngram_external_corpus_max_tokens",
          lacks=("speculative_ngram_auto_cost_table", "speculative_ngram_auto_hysteresis")),
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/arg_groups/speculative_hook.py", symbol="_handle_ngram",
          params=("server_args",)),
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py",
          symbol="NGRAMWorker._prepare_for_speculative_decoding",
          params=("self", "batch"), contains=("        self._prev_decode_rids: set = set()\n",)),
    # 0007's plain decode step (fastverify.glue.auto.run_plain_decode): called first in the worker's
    # step; leaves the corpus update to SGLang's own _update_ngram_corpus with empty carried tokens
    # and erases departed match states as the verify step does; gathers the root from the previous
    # step's accept tokens; builds the next NgramVerifyInput from the same four fields as the
    # worker; the DECODE graphs are captured and replayed while ModelRunner.spec_algorithm reads
    # NONE, which decides the graph runner's capture mode;
    # a DECODE pass takes its positions from seq_lens - 1 (seq_lens count the new token).
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py", symbol="NGRAMWorker._update_ngram_corpus",
          params=("self", "batch"),
          contains=("self.prev_token_ids[i * stride : i * stride + self.prev_accept_lens[i]]",
                    "batch.spec_info.accept_lens,",
                    "        record_stream_for_v2_verify(batch, None, fwd_stream)\n        bs = "
                    "len(batch.reqs)\n",
                    "self.ngram_corpus.erase_match_state(list(departed_rids))",
                    "            new_seq_lens=new_seq_lens,\n            "
                    "accept_tokens=accept_tokens,\n            accept_lens=accept_lens,\n")),
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py",
          symbol="NGRAMWorker.forward_batch_generation",
          params_include=("self", "batch", "on_publish")),
    # 0007's probe lookups (auto.probe_behind) build SGLang's own query with the worker's helper
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py",
          symbol="NGRAMWorker._efficient_concat_last_n", params=("self", "seq1", "seq2", "n")),
    # 0009: the n-gram force in decide_needs_cpu_seq_lens (its reason: the tree verify's full mask
    # reads seq_lens_cpu; chain mode skips that build behind 0005's `not self._fv.chain`).
    Guard(patch="0009-ngram-chain-host-seq-lens.patch", versions=("0.5.16",),
          file="sglang/srt/managers/overlap_utils.py", symbol="decide_needs_cpu_seq_lens",
          params=("server_args", "attn_backends"),
          contains=("    if algo.is_ngram():\n", "        return True\n    # Skip unset slots")),
    Guard(patch="0009-ngram-chain-host-seq-lens.patch", versions=("0.5.23",),
          file="sglang/srt/managers/overlap_utils.py", symbol="decide_needs_cpu_seq_lens",
          params=("attn_backends",),
          contains=("    if algo.is_ngram():\n", "        return True\n    # Skip unset slots")),
    # 0012: auto's stretches on the plain decode path (fastverify.glue.plain_path). The hook sits
    # after the running batch's filter and before its memory check; the n-gram branch of the relay
    # returns at once upstream; the plain path's token gather is gated on the server's algorithm;
    # plain_path writes the future map's token buffer.
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.16",),
          file="sglang/srt/managers/scheduler.py", symbol="Scheduler.update_running_batch",
          params=("self", "batch"),
          contains=("        batch.filter_batch()\n        if batch.is_empty():\n",
                    "        # Check if decode out of memory\n"), lacks=("fv_plain_path",)),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.16",),
          file="sglang/srt/managers/scheduler.py", symbol="Scheduler._relay_forward_payload",
          params=("self", "future_indices", "batch_result"),
          contains=("        if self.spec_algorithm.is_ngram():\n            return\n",)),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.16",),
          file="sglang/srt/managers/overlap_utils.py", symbol="resolve_forward_inputs",
          params=("batch", "future_map"),
          contains=("    elif batch.input_ids is None and future_map.spec_algo.is_none():\n",
                    "        batch.input_ids = future_map.output_tokens_buf"
                    "[batch.req_pool_indices]\n")),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/managers/overlap_utils.py", symbol="FutureMap.__init__",
          contains=("            self.output_tokens_buf = torch.empty(\n",)),
    # the worker's step begins with its stream bookkeeping for a verify pass, which a batch on the
    # plain path skips (plain_path.worker_step is asked first)
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/ngram_worker.py",
          symbol="NGRAMWorker.forward_batch_generation",
          params_include=("self", "batch", "on_publish"),
          contains=("        fwd_stream = torch.get_device_module(self.device).current_stream()\n"
                    "        record_stream_for_v2_verify(batch, None, fwd_stream)\n",),
          lacks=("fv_plain_path",)),
    # 0012 in 0.5.23: the filter takes the requests finishing in flight and the memory check may
    # skip the step (return None) after the hook; the relay takes the batch and its n-gram branch
    # stashes the accept tokens and lengths before returning; the future map's n-gram gathers and
    # its lengths go by the batch input's future indices, so a batch without speculative input
    # (the plain path) or with one without future indices (leave's) is left alone.
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.23",),
          file="sglang/srt/managers/scheduler.py", symbol="Scheduler.update_running_batch",
          params=("self", "batch"),
          contains=("        batch.filter_batch(reqs_to_exclude=finishing_reqs)\n"
                    "        if batch.is_empty():\n            batch.batch_is_full = False\n"
                    "            return batch\n\n"
                    "        kv_full_retract_flag = not batch.check_decode_mem()\n",),
          lacks=("fv_plain_path",)),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.23",),
          file="sglang/srt/managers/scheduler.py", symbol="Scheduler._relay_forward_payload",
          params=("self", "batch", "future_indices", "batch_result"),
          contains=("        if self.spec_algorithm.is_ngram():\n"
                    "            if batch_result.next_draft_input is not None:\n"
                    "                payload = RelayPayload.from_ngram("
                    "batch_result.next_draft_input)\n"
                    "                self.future_map.stash(future_indices, payload)\n"
                    "            return\n",)),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.23",),
          file="sglang/srt/managers/overlap_utils.py", symbol="resolve_forward_inputs",
          params=("batch", "future_map"),
          contains=("    elif batch.input_ids is None and future_map.spec_algo.is_none():\n",
                    "        batch.input_ids = future_map.output_tokens_buf"
                    "[batch.req_pool_indices]\n",
                    "    if batch.enable_overlap and not batch.spec_algorithm.is_none():\n"
                    "        future_map._resolve_spec_extras(batch)\n")),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.23",),
          file="sglang/srt/managers/overlap_utils.py", symbol="FutureMap._resolve_spec_extras",
          params=("self", "batch"),
          contains=("        if self.spec_algo.is_ngram():\n"
                    "            draft_input = batch.spec_info\n"
                    "            if draft_input is None or draft_input.future_indices is None:\n"
                    "                return\n",)),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.23",),
          file="sglang/srt/managers/overlap_utils.py", symbol="FutureMap.resolve_seq_lens_cpu",
          params=("self", "batch", "stream_ordered"),
          contains=("        fi = draft_input.future_indices\n        if fi is None:\n"
                    "            return\n",)),
    # 0010: our flags checked right after parse_args in prepare_server_args, and for
    # ServerArgs built in code before the dummy-model boundary (0.5.16 __post_init__) / the
    # resolution pipeline (0.5.23).
    Guard(patch="0010-validate-flags-at-parse.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/server_args.py", symbol="prepare_server_args", params=("argv",),
          contains=("    raw_args = parser.parse_args(argv)\n",), lacks=("_fv_flags",)),
    Guard(patch="0010-validate-flags-at-parse.patch", versions=("0.5.16",),
          file="sglang/srt/server_args.py", symbol="ServerArgs.__post_init__", params=("self",),
          contains=('        self._resolved_overrides = []\n\n'
                    '        if self.model_path.lower() in ["none", "dummy"]:\n',)),
    Guard(patch="0010-validate-flags-at-parse.patch", versions=("0.5.23",),
          # (ServerArgs is rebound to a msgspec struct: text only)
          file="sglang/srt/server_args.py",
          contains=("    def resolve_once(self) -> None:\n",
                    "        from sglang.srt.arg_groups.pipeline import run_resolution_pipeline\n\n"
                    "        self._input_frozen = True\n",)),
    # 0011: pass-cost emulator. Flags after the debug tensor dump fields, validation beside 0006's
    # in check_server_args, install in ModelRunner.__init__ once the forward stream exists (device
    # set), the pass scope in forward, the eager wait before _forward_raw's last return (the
    # decode/verify graph replay returns earlier: its wait is inside the graph).
    Guard(patch="0011-pass-cost-emulator.patch", versions=("0.5.16",),
          file="sglang/srt/server_args.py", symbol="ServerArgs.debug_tensor_dump_input_file",
          contains=('        "The input filename for dumping tensors",\n    ] = None\n\n',),
          lacks=("emulate_pass_cost",)),
    Guard(patch="0011-pass-cost-emulator.patch", versions=("0.5.16",),
          file="sglang/srt/server_args.py",
          symbol="ServerArgs.check_server_args", params=("self",)),
    Guard(patch="0011-pass-cost-emulator.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/fields/observability.py",
          symbol="Observability.debug_tensor_dump_input_file",
          contains=('        "The input filename for dumping tensors",\n    ] = None\n\n',),
          lacks=("emulate_pass_cost",)),
    Guard(patch="0011-pass-cost-emulator.patch", versions=("0.5.23",),
          file="sglang/srt/arg_groups/validation_hook.py", symbol="check_server_args",
          params=("server_args",)),
    Guard(patch="0011-pass-cost-emulator.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/model_runner.py", symbol="ModelRunner.__init__",
          params_include=("self", "gpu_id", "server_args", "is_draft_worker"),
          contains=("        self.capture_tail_hooks = []\n",
                    "        self.forward_stream = torch.get_device_module(self.device)"
                    ".Stream()\n")),
    Guard(patch="0011-pass-cost-emulator.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/model_runner.py", symbol="ModelRunner._forward_raw",
          params=("self", "forward_batch", "pp_proxy_tensors", "reinit_attn_backend",
                  "split_forward_count"),
          contains=("                ret = self.decode_cuda_graph_runner.execute(\n",
                    "                forward_batch.post_forward_mlp_sync_batch(ret)\n\n"
                    "            return ModelRunnerOutput(logits_output=ret, "
                    "can_run_graph=can_run_graph)\n"),
          lacks=("emulator_hook",)),
    Guard(patch="0011-pass-cost-emulator.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/model_runner.py", symbol="ModelRunner.forward",
          params_include=("self", "forward_batch")),
]


# What a patch's glue (python/fastverify/glue) relies on in upstream files the patch does not touch:
# checked against the pristine sources like GUARDS (tests/patches/test_drift_guards.py), without the
# "the patch touches this file" rule.
GLUE_SEAMS = [
    # fastverify.glue.verify_runtime.plain_algorithm / auto.run_plain_decode (0007's plain decode
    # step): the graph runner's capture mode follows ModelRunner.spec_algorithm (an attribute set
    # from the server args), and a DECODE pass takes its positions from seq_lens - 1; the plain pass
    # reads as SpeculativeAlgorithm.NONE.
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/spec_info.py", symbol="SpeculativeAlgorithm.NONE"),
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/model_runner.py",
          symbol="ModelRunner.decode_num_tokens_per_req",
          contains=("        self.spec_algorithm = SpeculativeAlgorithm.from_string(\n",)),
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
          symbol="DecodeCudaGraphRunner.__init__",
          params_include=("attn_backend", "speculative_num_steps", "speculative_num_draft_tokens"),
          contains=("        if model_runner.spec_algorithm.is_speculative():\n",
                    "            self.capture_forward_mode = ForwardMode.TARGET_VERIFY\n")),
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/forward_batch_info.py", symbol="ForwardBatch.init_new",
          contains=("                ret.positions = clamp_position(batch.seq_lens)\n",)),
    # auto.probe_behind: the corpus' lookup and its wait for pending inserts
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/cpp_ngram/ngram_corpus.py", symbol="NgramCorpus.batch_get",
          params=("self", "req_ids", "batch_tokens", "total_lens")),
    Guard(patch="0007-ngram-verify-auto.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/speculative/cpp_ngram/ngram_corpus.py", symbol="NgramCorpus.synchronize",
          params=("self",)),
    # fastverify.glue.plain_path (0012): where a request's committed KV length and pool row live
    # (0.5.16: the request; 0.5.23: its KV record), and the n-gram input's merge and filter, which
    # handle an input without future indices (leave's) by its tensors in 0.5.23.
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.16",),
          file="sglang/srt/managers/schedule_batch.py", symbol="ReqKvInfo.kv_allocated_len"),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.16",),
          file="sglang/srt/managers/schedule_batch.py", symbol="Req.__init__",
          contains=("        self.kv_committed_len = 0\n",)),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.23",),
          file="sglang/srt/managers/schedule_batch.py", symbol="ReqKvInfo.kv_committed_len"),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.23",),
          file="sglang/srt/managers/schedule_batch.py", symbol="ReqKvInfo.req_pool_idx"),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.23",),
          file="sglang/srt/speculative/ngram_info.py", symbol="NgramVerifyInput.merge_batch",
          params=("self", "spec_info"),
          contains=("        if self.future_indices is not None:\n"
                    "            assert spec_info.future_indices is not None\n",)),
    Guard(patch="0012-ngram-auto-plain-path.patch", versions=("0.5.23",),
          file="sglang/srt/speculative/ngram_info.py", symbol="NgramVerifyInput.filter_batch",
          params_include=("self", "new_indices")),
    # fastverify.glue.emulator_hook (0011): the decode/verify graph runner calls the model
    # runner's capture_tail_hooks as hook(graph_runner, out, forward_batch, num_tokens) after
    # the forward inside every capture (the wait is recorded into each graph), and keeps the
    # replayed graph's batch size in .bs (the pass is counted at that graph's token count); the
    # pass kinds the hook tells apart.
    Guard(patch="0011-pass-cost-emulator.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
          symbol="DecodeCudaGraphRunner.capture_one_shape",
          params_include=("self", "size", "forward"),
          contains=("        num_tokens = size * self.captured_req_width\n",
                    "for capture_hook in self.model_runner.capture_tail_hooks:\n",
                    "capture_hook(self, out, forward_batch, num_tokens)\n",
                    "        self.bs = bs\n")),
    Guard(patch="0011-pass-cost-emulator.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/forward_batch_info.py",
          symbol="ForwardMode.is_split_prefill", params=("self",)),
    Guard(patch="0011-pass-cost-emulator.patch", versions=("0.5.16", "0.5.23"),
          file="sglang/srt/model_executor/forward_batch_info.py",
          symbol="ForwardMode.is_target_verify", params=("self",)),
]
