"""Subprocess probe of patched SGLang (the whole series) for tests/test_plain_path.py; prints one
JSON line.

Run with the patched sglang first on PYTHONPATH and tests/stubs after it:
    python plain_path_probe.py MODEL_DIR

Runs patch 0012's hunks in SGLang's own code on stand-in objects: the scheduler's
update_running_batch (where fastverify.glue.plain_path.choose_path is called, relative to the
batch's filter, memory check and decode preparation), the n-gram branch of _relay_forward_payload,
and resolve_forward_inputs' gather of the input ids for a batch that reads as not speculative in
an n-gram server; then a stretch's way through SGLang's own FutureMap of an n-gram server (live
for n-gram in 0.5.23: it stashes the accept tokens and lengths and gathers them by future indices)
with plain_path's own relay, leave and fill_roots; last, the scheduler's run_batch (overlap path)
for a decode batch of a plain server, of the plain path in an n-gram server and of a speculative
one: the lengths it publishes to the future map, and whether the worker is handed on_publish.
"""
import collections
import inspect
import json
import sys
import types

import torch

from sglang.srt.managers import overlap_utils  # noqa: E402
from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode  # noqa: E402
from sglang.srt.managers import scheduler as sched_mod  # noqa: E402
from sglang.srt.speculative.ngram_info import NgramVerifyInput  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from fastverify.glue import plain_path  # noqa: E402

RELAY = plain_path.relay  # (the relay's stand-in below replaces it in the module)

out = {}
NONE, NGRAM = SpeculativeAlgorithm.NONE, SpeculativeAlgorithm.NGRAM
K = 4


def relay_forward_payload(scheduler, batch, future_indices, result):
    """Scheduler._relay_forward_payload: (future_indices, result) in 0.5.16, (batch,
    future_indices, result) in 0.5.23."""
    fn = sched_mod.Scheduler._relay_forward_payload
    if "batch" in inspect.signature(fn).parameters:
        return fn(scheduler, batch, future_indices, result)
    return fn(scheduler, future_indices, result)


def rows(t):
    return None if t is None else t.tolist()


# a stretch through the n-gram server's own future map: the worker's step without speculation,
# one step on the plain path, the way back
fmap = overlap_utils.FutureMap(torch.device("cpu"), NGRAM,
                               types.SimpleNamespace(req_to_token=torch.zeros(8, 64,
                                                                              dtype=torch.int32)),
                               needs_cpu_seq_lens=False)
state = types.SimpleNamespace(path_ok=True, k=K, info_type=NgramVerifyInput, spec_algorithm=NGRAM,
                              controller=types.SimpleNamespace(
                                  note_plain_path=lambda bs, n, ends=True: None),
                              stretch=0, stretch_len=4, noted=0, put=0, probe_now=False,
                              path_bs=0,
                              since_prefill=0, last_start=None,
                              step_before=None, last_forward_plain=True, path_logged_at=0.0,
                              clock=lambda: 1.0, future_map=None,
                              path_ended=collections.Counter())
worker = types.SimpleNamespace(_fv_auto=state)
server = types.SimpleNamespace(spec_algorithm=NGRAM, future_map=fmap, model_worker=worker)
fi = torch.tensor([2, 5])
fm = {}


def accept_roots():
    buf = getattr(fmap, "accept_tokens_buf", None)
    return None if buf is None else buf[fi, 0].tolist()


# the worker's step without speculation (a speculative batch): its next draft input and its
# token per request
draft = NgramVerifyInput(draft_token_num=K, new_seq_lens=torch.tensor([11, 21]),
                         accept_tokens=torch.tensor([31, 0, 0, 0, 32, 0, 0, 0],
                                                    dtype=torch.int32),
                         accept_lens=torch.ones(2, dtype=torch.int32))
spec_batch = types.SimpleNamespace(spec_algorithm=NGRAM, beam_tail=None)
relay_forward_payload(server, spec_batch, fi, types.SimpleNamespace(
    next_draft_input=draft, next_token_ids=torch.tensor([31, 32]), has_sampled_token_ids=True))
fm["worker_step"] = {"tokens": rows(fmap.output_tokens_buf[fi]), "accept": accept_roots()}
# the first step on the plain path (after choose_path's enter: no speculative input)
fmap.new_seq_lens_buf[fi] = torch.tensor([11, 21])
batch = types.SimpleNamespace(
    prefill_input_ids_cpu=None, input_ids=None, spec_algorithm=NONE, spec_info=None,
    req_pool_indices=fi, enable_overlap=True, seq_lens=torch.tensor([12, 22]),
    seq_lens_cpu=torch.tensor([12, 22]), seq_lens_sum=34, reqs=[object(), object()])
fmap.resolve_seq_lens_cpu(batch)
overlap_utils.resolve_forward_inputs(batch, fmap)
fm["plain_step"] = {"input_ids": rows(batch.input_ids), "seq_lens": rows(batch.seq_lens),
                    "seq_lens_cpu": rows(batch.seq_lens_cpu)}
# its result: the target's own (no draft input), one token per request; the scheduler of an
# n-gram server publishes no lengths for a batch without speculation (patched run_batch, below)
relay_forward_payload(server, batch, fi, types.SimpleNamespace(
    next_draft_input=None, next_token_ids=torch.tensor([41, 42]), has_sampled_token_ids=True))
fm["plain_result"] = {"tokens": rows(fmap.output_tokens_buf[fi]), "accept": accept_roots()}
# a request joins the batch on the plain path: its prefill's result relayed like any result of
# one token per request, then SGLang's own merge (ScheduleBatch.merge_batch) of the prefill batch,
# as run_batch left it, into the running batch, and the patched resolve of the merged batch
prefill = types.SimpleNamespace(
    spec_algorithm=NGRAM, spec_info=None, reqs=["r2"], req_pool_indices=torch.tensor([6]),
    req_pool_indices_cpu=torch.tensor([6]), seq_lens=torch.tensor([7]),
    seq_lens_cpu=torch.tensor([7]), orig_seq_lens=torch.tensor([7], dtype=torch.int32),
    input_ids=None, beam_tail=None, return_logprob=False, has_grammar=False,
    return_hidden_states=False, return_hidden_states_mode=CaptureHiddenMode.NULL,
    is_prefill_only=False, multimodal_inputs=None,
    sampling_info=types.SimpleNamespace(merge_batch=lambda other: None))
relay_forward_payload(server, prefill, prefill.req_pool_indices, types.SimpleNamespace(
    next_draft_input=NgramVerifyInput(
        draft_token_num=K, new_seq_lens=torch.tensor([7]),
        accept_tokens=torch.tensor([51, 0, 0, 0], dtype=torch.int32),
        accept_lens=torch.ones(1, dtype=torch.int32)),
    next_token_ids=torch.tensor([51]), has_sampled_token_ids=True))
prefill.spec_info = NgramVerifyInput(draft_token_num=K, new_seq_lens=torch.tensor([7]),
                                     accept_tokens=torch.tensor([51, 0, 0, 0], dtype=torch.int32),
                                     accept_lens=torch.ones(1, dtype=torch.int32))
prefill.spec_info.future_indices = prefill.req_pool_indices
running = types.SimpleNamespace(**{**vars(prefill), **dict(
    spec_algorithm=NONE, spec_info=None, reqs=["r0", "r1"], req_pool_indices=fi,
    req_pool_indices_cpu=fi.clone(), seq_lens=batch.seq_lens + 1, seq_lens_cpu=batch.seq_lens + 1,
    orig_seq_lens=(batch.seq_lens + 1).to(torch.int32),
    sampling_info=types.SimpleNamespace(merge_batch=lambda other: None))},
    model_config=types.SimpleNamespace(is_encoder_decoder=False), enable_overlap=True,
    prefill_input_ids_cpu=None)
ScheduleBatch.merge_batch(running, prefill)
fmap.resolve_seq_lens_cpu(running)
overlap_utils.resolve_forward_inputs(running, fmap)
fm["joined"] = {"algorithm": running.spec_algorithm.name, "spec_info": running.spec_info,
                "reqs": running.reqs, "seq_lens": rows(running.seq_lens),
                "seq_lens_cpu": rows(running.seq_lens_cpu), "input_ids": rows(running.input_ids)}
# the way back: leave's speculative input, through the resolves of the next run_batch, and the
# roots the worker's first step writes
batch.input_ids = None
plain_path.leave(server, batch, state, "probe due")
fmap.resolve_seq_lens_cpu(batch)
overlap_utils.resolve_forward_inputs(batch, fmap)
plain_path.fill_roots(worker, batch, state)
info = batch.spec_info
fm["back"] = {"algorithm": batch.spec_algorithm.name, "future_indices": rows(info.future_indices),
              "seq_lens": rows(batch.seq_lens), "seq_lens_cpu": rows(batch.seq_lens_cpu),
              "roots": rows(info.accept_tokens.view(2, K)[:, 0]),
              "accept_lens": rows(info.accept_lens), "input_ids": rows(batch.input_ids),
              "last_forward_plain": state.last_forward_plain}
# what the same resolves would have made of an input with future indices
other = types.SimpleNamespace(
    prefill_input_ids_cpu=None, input_ids=None, spec_algorithm=NGRAM, req_pool_indices=fi,
    enable_overlap=True, seq_lens=torch.tensor([12, 22]), seq_lens_cpu=torch.tensor([12, 22]),
    seq_lens_sum=34, spec_info=NgramVerifyInput(
        draft_token_num=K, new_seq_lens=torch.tensor([12, 22]),
        accept_tokens=torch.tensor([41, 0, 0, 0, 42, 0, 0, 0], dtype=torch.int32),
        accept_lens=torch.ones(2, dtype=torch.int32)))
other.spec_info.future_indices = fi
fmap.resolve_seq_lens_cpu(other)
overlap_utils.resolve_forward_inputs(other, fmap)
fm["with_future_indices"] = {"seq_lens": rows(other.seq_lens),
                             "roots": rows(other.spec_info.accept_tokens.view(2, K)[:, 0])}
# were that batch not run (0.5.23's update_running_batch may skip the step), a prefill's requests
# would merge into it: SGLang's own merge of a speculative input without future indices and one
# with them
joined = NgramVerifyInput(draft_token_num=K, new_seq_lens=torch.tensor([7]),
                          accept_tokens=torch.tensor([51, 0, 0, 0], dtype=torch.int32),
                          accept_lens=torch.ones(1, dtype=torch.int32))
joined.future_indices = torch.tensor([6])
info.merge_batch(joined)
fm["merged"] = {"roots": rows(info.accept_tokens.view(-1, K)[:, 0]),
                "new_seq_lens": rows(info.new_seq_lens),
                "future_indices": rows(info.future_indices)}
out["future_map"] = fm

# resolve_forward_inputs: an n-gram server's future map, a decode batch without input ids
extras = []
fmap = types.SimpleNamespace(spec_algo=NGRAM,
                             output_tokens_buf=torch.tensor([0, 11, 12, 13, 14]),
                             _resolve_spec_extras=lambda b: extras.append(b.spec_algorithm.name))
for name, algo in (("none", NONE), ("ngram", NGRAM)):
    batch = types.SimpleNamespace(prefill_input_ids_cpu=None, input_ids=None, spec_algorithm=algo,
                                  req_pool_indices=torch.tensor([3, 1]), enable_overlap=True,
                                  spec_info=None)
    overlap_utils.resolve_forward_inputs(batch, fmap)
    out[f"resolve_{name}"] = None if batch.input_ids is None else batch.input_ids.tolist()
out["spec_extras"] = extras

# the relay: what the scheduler hands to plain_path.relay in an n-gram server
relayed = []
sched_mod.fv_plain_path.relay = lambda s, fi, r: relayed.append((fi.tolist(), r.next_token_ids))
fake = types.SimpleNamespace(spec_algorithm=NGRAM)
relay_forward_payload(fake, None, torch.tensor([2, 4]),
                      types.SimpleNamespace(next_token_ids="tokens", next_draft_input=None))
out["relayed"] = relayed

# update_running_batch: the order of the hook among the batch's own calls
order = []


class Batch:
    reqs = [object()]

    def batch_size(self):
        return 1

    def filter_batch(self, **kw):
        order.append("filter")

    def is_empty(self):
        return False

    def check_decode_mem(self):
        order.append(f"mem_check:{self.spec_algorithm.name}")
        return True

    def prepare_for_decode(self):
        order.append(f"prepare:{self.spec_algorithm.name}")


def choose(s, b):
    order.append("choose_path")
    b.spec_algorithm = NONE  # the hook switched the batch to the plain path


sched_mod.fv_plain_path.choose_path = choose
b = Batch()
b.spec_algorithm, b.batch_is_full = NGRAM, True
fake = types.SimpleNamespace(enable_hierarchical_cache=False, forward_ct=1,
                             new_token_ratio_tracker=types.SimpleNamespace(
                                 decay_step=lambda: order.append("decay")),
                             _reqs_finishing_inflight=lambda batch: [])  # (0.5.23)
ret = sched_mod.Scheduler.update_running_batch(fake, b)
out["order"] = order
out["returned_batch"] = ret is b
# the n-gram worker's step: a batch on the plain path goes to plain_path.worker_step before the
# worker's stream bookkeeping for a verify pass; any other batch does that bookkeeping, then auto's
# plain_step (both stand-ins here)
from sglang.srt.speculative import ngram_worker as nw  # noqa: E402

calls = []
nw.record_stream_for_v2_verify = lambda *a: calls.append("record_stream")
plain_path.step = lambda worker, batch, state: calls.append("path_step") or "path result"
nw.fv_auto.plain_step = lambda *a, **k: calls.append("plain_step") or "worker result"
worker = object.__new__(nw.NGRAMWorker)
worker._fv_auto, worker.device = types.SimpleNamespace(), "cpu"
seen = {}
for algo in (NONE, NGRAM):
    calls.clear()
    got = nw.NGRAMWorker.forward_batch_generation(
        worker, types.SimpleNamespace(spec_algorithm=algo, reqs=[1, 2]))
    seen[algo.name] = [got, list(calls)]
out["worker_entry"] = seen

# run_batch's overlap path, SGLang's own, on a stand-in scheduler (the attributes it reads in both
# pinned versions) and a CPU future map: which lengths it publishes for a decode batch, whether the
# worker is handed on_publish, and what reaches the token buffer
from dataclasses import dataclass, field  # noqa: E402

from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402


@dataclass
class RunBatch:  # the fields run_batch reads (a dataclass: its isolation snapshots the fields)
    spec_algorithm: object
    spec_info: object = None
    reqs: list = field(default_factory=lambda: ["r0", "r1"])
    seq_lens: object = field(default_factory=lambda: torch.tensor([12, 22]))
    req_pool_indices: object = field(default_factory=lambda: torch.tensor([2, 5]))
    forward_mode: object = ForwardMode.DECODE
    input_ids: object = None
    prefill_input_ids_cpu: object = None
    mix_running_indices: object = None
    sampling_info: object = None
    enable_overlap: bool = True
    return_logprob: bool = False
    return_hidden_states: bool = False
    extend_num_tokens: int = 0
    split_index: int = 0
    beam_tail: object = None
    forward_iter: int = 0


def run_batch(server_algo, batch_algo):
    dev = torch.get_device_module("cpu")
    fmap = overlap_utils.FutureMap(torch.device("cpu"), server_algo, types.SimpleNamespace(
        req_to_token=torch.zeros(8, 64, dtype=torch.int32)), needs_cpu_seq_lens=False)
    published, handed = [], []
    real_publish = fmap.publish
    fmap.publish = lambda fi, lens, *a, **k: (published.append(lens.tolist()),
                                              real_publish(fi, lens, *a, **k))[1]
    batch = RunBatch(spec_algorithm=batch_algo)
    fmap.output_tokens_buf[batch.req_pool_indices] = torch.tensor([31, 32])
    fmap.new_seq_lens_buf[batch.req_pool_indices] = torch.tensor([11, 21])
    draft = None
    if not batch_algo.is_none():
        draft = NgramVerifyInput(draft_token_num=K, new_seq_lens=torch.tensor([13, 23]),
                                 accept_tokens=torch.tensor([41, 0, 0, 0, 42, 0, 0, 0],
                                                            dtype=torch.int32),
                                 accept_lens=torch.ones(2, dtype=torch.int32))

    def forward(b, **kw):
        handed.append(sorted(kw))
        if "on_publish" in kw:  # (the worker's verify publishes the accepted lengths)
            kw["on_publish"](torch.tensor([13, 23]))
        return GenerationBatchResult(next_token_ids=torch.tensor([41, 42]),
                                     next_draft_input=draft)

    s = object.__new__(sched_mod.Scheduler)
    stand_in = dict(
        spec_algorithm=server_algo, future_map=fmap, forward_ct=0, scripted_scheduler_hook=None,
        profiler_manager=types.SimpleNamespace(_profile_batch_predicate=lambda b: None),
        forward_sleep_time=None, disaggregation_mode=DisaggregationMode.NULL, is_generation=True,
        enable_overlap=True, _confidence_budget_prepare=None, forward_stream=dev.Stream(),
        schedule_stream=dev.Stream(), copy_stream=dev.Stream(), device_module=dev,
        model_worker=types.SimpleNamespace(forward_batch_generation=forward,
                                           _fv_auto=types.SimpleNamespace(path_ok=True)),
        enable_unified_memory=False, batch_record_ct=0, batch_record_buf=[None, None],
        enable_dp_attention=False, enable_pdmux=False,
        # (0.5.23)
        metrics_reporter=types.SimpleNamespace(record_scheduler_active=lambda t: None),
        scheduler_stage_metrics=None, _sched_idled=False, processed_tokens_counter=0,
        enable_async_d2h_copy=False, enable_unified_cache_external_linker=False,
        attn_dp_enabled=False, chunked_req=None,
        beam_coordinator=types.SimpleNamespace(maybe_select_and_relay=lambda *a, **k: None))
    for name, value in stand_in.items():
        setattr(s, name, value)
    s.forward_stream_ctx = dev.stream(s.forward_stream)
    s.copy_stream_ctx = dev.stream(s.copy_stream)
    sched_mod.Scheduler.run_batch(s, batch)
    return {"published": published, "handed": handed,
            "lengths": fmap.new_seq_lens_buf[batch.req_pool_indices].tolist(),
            "tokens": fmap.output_tokens_buf[batch.req_pool_indices].tolist()}


plain_path.relay = RELAY
out["run_batch"] = {"plain server": run_batch(NONE, NONE),
                    "n-gram server, plain path": run_batch(NGRAM, NONE),
                    "n-gram server, speculative": run_batch(NGRAM, NGRAM)}
print("PROBE " + json.dumps(out))
sys.stdout.flush()
