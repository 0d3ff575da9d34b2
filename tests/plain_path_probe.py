"""Subprocess probe of patched SGLang (the whole series) for tests/test_plain_path.py; prints one
JSON line.

Run with the patched sglang first on PYTHONPATH and tests/stubs after it:
    python plain_path_probe.py MODEL_DIR

Runs patch 0012's hunks in SGLang's own code on stand-in objects: the scheduler's
update_running_batch (where fastverify.glue.plain_path.choose_path is called, relative to the
batch's filter, memory check and decode preparation), the n-gram branch of _relay_forward_payload,
and resolve_forward_inputs' gather of the input ids for a batch that reads as not speculative in
an n-gram server.
"""
import json
import sys
import types

import torch

from sglang.srt.managers import overlap_utils  # noqa: E402
from sglang.srt.managers import scheduler as sched_mod  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

out = {}
NONE, NGRAM = SpeculativeAlgorithm.NONE, SpeculativeAlgorithm.NGRAM

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
sched_mod.Scheduler._relay_forward_payload(fake, torch.tensor([2, 4]),
                                           types.SimpleNamespace(next_token_ids="tokens"))
out["relayed"] = relayed

# update_running_batch: the order of the hook among the batch's own calls
order = []


class Batch:
    reqs = [object()]

    def batch_size(self):
        return 1

    def filter_batch(self):
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
                                 decay_step=lambda: order.append("decay")))
ret = sched_mod.Scheduler.update_running_batch(fake, b)
out["order"] = order
out["returned_batch"] = ret is b
print("PROBE " + json.dumps(out))
sys.stdout.flush()
