"""A diagnostic launcher of the patched SGLang server: each forward's input ids checked on the host.

    python3 lab/gpu/idcheck.py [sglang.launch_server arguments]      (as SGLANG_LAUNCH)

A token id outside the vocabulary reaches the target's embedding as a device-side assert, and the
server dies at the next synchronisation with a stack that names neither the forward nor where the
id came from. Under this launcher every call of the target worker's forward first reads the
batch's input ids back (a synchronisation, so the host no longer runs ahead of the device: a
diagnosis, never a measurement) and, where one lies outside [0, vocab), logs the batch (forward
mode, request ids, input ids, the carried accept tokens and lengths), the auto state of the n-gram
worker and the last steps' host record, then raises before the forward is launched.

FV_IDCHECK_SYNC=0 keeps the host record only (no read-back, no check): its last entries are logged
when processing a batch result raises (where an asynchronous device assert surfaces), so the order
of the steps that led to a crash is known.

Installed at import, so the scheduler processes, which the multiprocessing start method "spawn"
starts by importing this file again, check as well.
"""
import collections
import os
import sys

SYNC = os.environ.get("FV_IDCHECK_SYNC", "1") != "0"
RECORD = collections.deque(maxlen=int(os.environ.get("FV_IDCHECK_RECORD", "16")))
WORKERS = []  # n-gram workers of this process (their auto state)


def _auto_state() -> dict:
    for w in WORKERS:
        st = getattr(w, "_fv_auto", None)
        if st is None:
            continue
        behind = st.behind
        return {"last_step": st.last_step, "lean_before": st.lean_before, "steps": st.steps,
                "since_prefill": st.since_prefill,
                "in_flight_rids": sorted(map(str, st.in_flight_rids or ())),
                "last_batch_rids": sorted(map(str, st.last_batch_rids or ())),
                "behind": None if behind is None else {"in_flight": behind.in_flight,
                                                       "lens": list(map(int, behind.lens))}}
    return {}


def _tensor(t, n=64):
    if t is None:
        return None
    try:
        return t.reshape(-1)[:n].tolist()
    except Exception as e:  # noqa: BLE001 - a dump must not raise
        return f"<{type(e).__name__}: {e}>"


def _entry(batch) -> dict:
    info = getattr(batch, "spec_info", None)
    mode = getattr(getattr(batch, "forward_mode", None), "name", None)
    ids = getattr(batch, "input_ids", None)
    return {"mode": mode, "bs": len(getattr(batch, "reqs", ()) or ()),
            "rids": [str(r.rid)[:8] for r in (getattr(batch, "reqs", ()) or ())],
            "n_ids": None if ids is None else int(ids.numel()),
            "spec_info": type(info).__name__ if info is not None else None,
            "auto": _auto_state()}


def _say(fmt, *args) -> None:
    print(fmt % args, file=sys.stderr, flush=True)  # the server log, whatever logging is set up


def dump(reason: str, batch=None) -> None:
    _say("idcheck: %s", reason)
    if batch is not None:
        info = getattr(batch, "spec_info", None)
        _say("idcheck: batch %s input_ids %s seq_lens %s accept_tokens %s accept_lens %s",
             _entry(batch), _tensor(getattr(batch, "input_ids", None)),
             _tensor(getattr(batch, "seq_lens", None)),
             _tensor(getattr(info, "accept_tokens", None)),
             _tensor(getattr(info, "accept_lens", None)))
    for i, e in enumerate(RECORD):
        _say("idcheck: step -%d %s", len(RECORD) - i, e)


def install() -> None:
    from sglang.srt.managers import tp_worker
    from sglang.srt.speculative import ngram_worker

    cls = tp_worker.TpModelWorker
    if getattr(cls, "_fv_idcheck", False):
        return
    forward = cls.forward_batch_generation

    def checked(self, batch=None, *args, **kwargs):
        ids = getattr(batch, "input_ids", None) if batch is not None else None
        if batch is not None:
            RECORD.append(_entry(batch))
        if SYNC and ids is not None and getattr(ids, "is_cuda", False) and ids.numel():
            vocab = self.model_runner.model_config.vocab_size
            lo, hi = int(ids.min().item()), int(ids.max().item())
            if lo < 0 or hi >= vocab:
                dump(f"input ids outside [0, {vocab}): min {lo} max {hi}", batch)
                raise RuntimeError(f"idcheck: input ids outside the vocabulary ({lo}, {hi})")
        return forward(self, batch, *args, **kwargs)

    cls.forward_batch_generation = checked
    cls._fv_idcheck = True
    init = ngram_worker.NGRAMWorker.__init__

    def init_recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        WORKERS.append(self)

    ngram_worker.NGRAMWorker.__init__ = init_recorded
    from sglang.srt.managers.scheduler import Scheduler

    process = Scheduler.process_batch_result

    def process_recorded(self, batch, result, *args, **kwargs):
        try:
            return process(self, batch, result, *args, **kwargs)
        except Exception as e:
            dump(f"processing a batch result raised {type(e).__name__}: {e}")
            raise

    Scheduler.process_batch_result = process_recorded


install()

if __name__ == "__main__":
    from launcher import serve  # this folder's launcher.py

    serve()
