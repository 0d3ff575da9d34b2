"""Auto's stretches without speculation on SGLang's own decode path: what patch
0012-ngram-auto-plain-path calls from SGLang's scheduler.

A step of auto that verifies nothing runs inside the n-gram worker as a plain decode pass
(`glue.auto.run_plain_decode`), wrapped in the worker's speculative step: the scheduler still
prepares it as a speculative step (draft KV slots reserved, the whole batch snapshotted and
restored around the forward, the result processed as a verify), and the worker converts its inputs
and outputs, puts the corpus and keeps the controller's books. On one H200 at TP=1, where every step
is host-bound, that wrapping cost 0.75 ms a step over the plain server's 2.2 ms
(benchmark/results/h200/auto-floor-smollm2-tp1/).

Here, once a step has run without speculation and the controller's next lookup is not a real one
due at once (`Controller.lookup_is_real`: the requests' last drafts would not be verified), the
running batch is handed to SGLang's own non-speculative path for the steps that follow: from the
scheduler's point of view it is a batch of a server without speculation. Its preparation allocates
one KV slot per request, its input ids come from the future map's token buffer as a plain server's
do, its result is processed as a plain server's, and the n-gram worker only swaps in the plain
decode runtime around the forward and, one step in eight, times it (`_time`: its period is what the
controller's no speculation costs). When the controller's next lookup comes due, the stretch's
steps are counted in one call (`Controller.note_plain_path`) and the controller says what that
lookup is (`Controller.lookup_on_plain_path`): a probe (drafts looked up only to learn from, or to
find drafts worth verifying where drafts that matched in full would be) is made on the path, on the
host behind the step's forward, the corpus given the stretch's output a few steps before
(`put_lead`: so that the probe's lookup does not wait for the insert), and one held for want of
probe credit waits there; the stretch then goes on to the next lookup. Requests that join the batch
(their prefill merged into it between two of its steps) stay on the path, their first lookup a
probe there, where even drafts that matched in full would not be verified (`_join`). A stretch ends
when a lookup is a real one (drafts would be verified: a probe found them worth it), when requests
join whose first lookup could pay, or when the batch cannot run plain (`auto._plain_capable`); the
batch then reads as speculative again, with each request's last token as the root of its next step,
and the worker's own logic goes on (`auto.plain_step`); the stretch's last output goes to the
corpus once that step has looked up (`put_pending`). An excursion for a real lookup is timed until
the batch is back on the path, against the costs of its steps in the worker as the controller
decided them: what it took beyond them is what starting a spell of speculation costs
(`_excursion_ends`, `StepCosts.switch_ms`).

Seams (patch 0012, the same shape in both pinned versions):
    Scheduler.update_running_batch      choose_path(scheduler, batch): after the batch's filter,
                                        before its memory check and its decode preparation
    Scheduler._relay_forward_payload    relay(scheduler, future_indices, result): an n-gram
                                        server's result of one token per request (a prefill, a
                                        step without speculation) leaves each request's token in
                                        the future map's token buffer, where the plain path reads
                                        its input ids (0.5.23: after the n-gram branch's own stash
                                        of the accept tokens and lengths; 0.5.16 stashes nothing)
    Scheduler.run_batch                 after the forward of a batch that reads as not
                                        speculative, an n-gram server publishes no lengths to
                                        its future map (a step on the plain path: nothing reads
                                        them; the scatter, and the event a speculative server's
                                        map records, took ~0.04 ms of a 1.9 ms step on one H200)
    resolve_forward_inputs              the plain path's gather of the input ids from that buffer
                                        runs for a batch that reads as not speculative, not only in
                                        a server without speculation
    NGRAMWorker.forward_batch_generation
                                        worker_step(worker, batch): first, before the worker's
                                        stream bookkeeping; a batch on the plain path runs `step`

What the two versions keep where (read from the objects, not from a version string): a request's
committed KV length and its row in the request-to-token pool are fields of the request in 0.5.16
and of its KV record (``req.kv``) in 0.5.23 (`_committed`, `_row`). In 0.5.23 the future map
relays an n-gram batch's accept tokens and lengths (gathered into ``spec_info`` by its
``future_indices``) and its lengths (``resolve_seq_lens_cpu``, which leaves ``seq_lens_cpu``
None where no attention backend needs it, patch 0009). A batch on the plain path has no
``spec_info``, so neither gather touches it, and the scheduler publishes no lengths for it
(patch 0012; a plain server publishes one more than the next step starts from): none would be
read, because the input `leave` makes has no future indices either. The first step back takes
the lengths the plain path left and the roots `fill_roots` writes, and its own result is relayed
and published as any speculative step's.

When the batch switches (`enter`), the forward in flight is the worker's step without speculation
(one token per request, the first of the KV slots the scheduler reserved for its drafts): what the
host knows of each request's KV is then exact. Each request holds ``kv_committed_len + 1`` KV
entries once that forward is done; the slots reserved past them are freed, so that the plain
allocation, which places a request's next slot at its length and knows nothing of reservations,
meets a request laid out as a plain server's. The lengths come from the host too. The other way
(`leave`) needs nothing freed: a plain step leaves KV exactly as long as committed, and the
speculative preparation reserves from there.

The plain path needs overlap scheduling (the worker's one-step-late logic is what it returns to),
a page size of 1 (the freeing of reserved slots is per token), no mixed chunked prefill and no
pipeline stages; without any of these auto's steps without speculation stay in the worker. Every TP
rank takes the same decisions: they depend on the controller's state and the batch only.
"""
from __future__ import annotations

import logging

from fastverify.controller import HELD, LOOKUP, PLAN_PROBE
from fastverify.costs import PATH, PATH_PROBE, SWITCH
# (imported once here, not in the functions a step calls: an import statement run on every step of
# a stretch took 40 % of the path choice's host time)
from fastverify.glue.auto import REFILL_STEPS, _plain_capable, erase_departed, samples, view

logger = logging.getLogger("fastverify.plain_path")

# the controller is asked again after this many steps without a lookup at most
MAX_STRETCH = 256
# one step in this many of a stretch is timed (`_time`)
TIME_EVERY = 8
# why a stretch ends where the controller's next lookup is a real one
LOOKUP_DUE = "a lookup is due"
# an excursion of more steps in the worker than this measures no switch (`_excursion_ends`)
SWITCH_MAX_STEPS = 8
# why a stretch ends where requests joined its batch and their first lookup is left to the worker
REQUEST_JOINED = "request joined"
# the most steps before its next lookup that a stretch's output goes to the corpus (`put_lead`)
PUT_LEAD_MAX = 16


def put_lead(bs: int) -> int:
    """How many steps before the next lookup the corpus is given a stretch's output at batch size
    ``bs``, so that a probe's lookup, which waits for the corpus' pending inserts, finds them done.
    SGLang's corpus inserts on a thread of its own, one request's context at a time; with its
    default capacity (10,000,000 trie nodes) one request's put of a 32-step stretch (49 new tokens
    at trie depth 18) took 0.8-0.93 ms on an AMD EPYC host, and a probe whose put was made one 1.9
    ms step earlier waited 1.1-2.6 ms at bs 4 and 15-17 ms at bs 16; made `put_lead` steps earlier,
    0.16-0.36 and 0.30-0.44 ms, the lookup's own time (bs 1: 0.07-0.11 ms either way; three runs of
    `lab/probe_put_lead.py`). Two steps, and one more for every two requests (a step takes >= 1.5
    ms): the probe's drafts then miss only n-grams whose continuation lies in those last steps'
    output."""
    return min(2 + bs // 2, PUT_LEAD_MAX)


def _state(scheduler):
    """The auto state of the scheduler's n-gram worker where the plain path may run, else None.
    Whether it may (the server's settings) is decided once and kept."""
    state = getattr(getattr(scheduler, "model_worker", None), "_fv_auto", None)
    if state is None:
        return None
    if state.path_ok is None:
        state.path_ok, why = path_possible(scheduler, state)
        if state.path_ok:
            logger.info("auto verify: stretches without speculation run on the server's own "
                        "decode path")
        else:
            logger.info("auto verify: steps without speculation stay in the n-gram worker (%s)",
                        why)
    return state if state.path_ok else None


def path_possible(scheduler, state) -> tuple:
    """(True, "") where the server's settings allow the plain path, else (False, why)."""
    sa = getattr(scheduler, "server_args", None)
    if state.plain is None:
        return False, "no plain decode runtime"
    if not getattr(scheduler, "enable_overlap", False):
        return False, "overlap scheduling is off"
    if getattr(scheduler, "future_map", None) is None:
        return False, "no future map"
    if int(getattr(sa, "page_size", 1) or 1) != 1:
        return False, f"page size {sa.page_size}"
    if getattr(sa, "enable_mixed_chunk", False):
        return False, "mixed chunked prefill"
    if int(getattr(sa, "pp_size", 1) or 1) != 1:
        return False, "pipeline stages"
    return True, ""


def choose_path(scheduler, batch) -> None:
    """Before the running batch's decode preparation: hand it to the plain path or take it back
    (see the module's docstring). A no-op unless auto runs with the plain path possible."""
    state = _state(scheduler)
    if state is None or not batch.reqs:
        return
    if batch.spec_algorithm.is_none():
        why = must_leave(state, batch, scheduler.model_worker)
        if not why and state.stretch >= state.stretch_len:
            why = _lookup_due(state, batch)
        if why:
            leave(scheduler, batch, state, why)
        else:
            _count_spec_step(scheduler, len(batch.reqs))
        return
    if state.stretch:
        _emptied(state, scheduler.model_worker)
    n, why, lens = may_enter(state, batch)
    if why:
        state.path_refusals[why] += 1
        _log_stretches(state, None)
        return
    begun = BEGUN_AFTER_PLAIN if state.last_forward_plain else BEGUN_AFTER_PREFILL
    state.path_begun[begun] += 1
    enter(batch, state, n, lens)
    if n == 0:  # this first step is the one the next lookup is due at: a probe, or one held
        why = _lookup_due(state, batch)
        if why:  # (not met: may_enter ruled a real lookup out)
            leave(scheduler, batch, state, why)
            return
    _count_spec_step(scheduler, len(batch.reqs))


def _count_spec_step(scheduler, bs: int) -> None:
    """A step on the plain path counts in the scheduler's speculative decode statistics as a step
    that verified nothing: ``bs`` forwards, one token each. SGLang counts only speculative batches
    there, and its decode log line divides by the forwards counted since the last line: a log
    interval run wholly on the plain path (40 steps, longer than any stretch while probes left the
    path) stopped the scheduler with a ZeroDivisionError. Counted before the step runs, as the
    per-request count in `step` is (both versions keep these two sums under these names)."""
    reporter = getattr(scheduler, "metrics_reporter", None)
    if reporter is not None and hasattr(reporter, "spec_num_forward_ct"):
        reporter.spec_num_forward_ct += bs
        reporter.spec_num_accept_tokens += bs


def _emptied(state, worker) -> None:
    """A speculative batch meets a stretch still open: the batch of that stretch emptied on the
    plain path (its requests all finished, and SGLang drops an empty running batch before asking
    `choose_path`). Its steps not counted yet go to the controller's books, the corpus is given
    the finished requests' output since the last put (`_put_departed`) and the stretch ends
    there."""
    _note(state, state.path_bs, ends=True)
    _put_departed(worker, state, frozenset())
    _new_stretch(state, 0)
    state.path_ended[FINISHED] += 1
    _log_stretches(state, FINISHED)


def must_leave(state, batch, worker) -> str:
    """Why a batch on the plain path goes back to speculation before this step ("" while it
    stays). Requests that joined it stay with it where they can (`_join`; ``worker``: the n-gram
    worker, whose corpus is given the stretch's output so far)."""
    if not _plain_capable(state, batch, None):
        return "batch needs the worker"
    if any(req.rid not in state.features for req in batch.reqs):
        return _join(state, batch, worker)
    return ""


def _join(state, batch, worker) -> str:
    """Requests joined the stretch's batch: their prefill ran between two of its steps, and the
    scheduler merged them into it (the merged batch reads as not speculative, as the running batch
    did). They stay on the path, their first lookup a probe there, where (a) not even drafts that
    matched in full would be verified for any request of the batch (`Controller.defer_first_lookup`,
    as for the worker's first step after a prefill; it sets the probe gap to 1), and (b) every
    request's KV is laid out as a plain server's would be (`_join_lens`). Then the stretch's
    steps so far are counted at the batch size they ran at and their output is put for the requests
    that ran them, the new requests get the features of no draft, the host lengths are the
    requests' committed ones, and the stretch runs on to the next lookup the controller expects
    (the steps right after a prefill hold their probes: ``refill``). Returns why the batch leaves
    instead ("" where it stays).

    Nothing else differs from a plain server's join: SGLang's merge concatenated the lengths, pool
    rows and sampling of both batches, dropped the prefill's speculative input (the running batch
    has none) and its input ids (the step's input ids are gathered from the future map's token
    buffer, where `relay` left the prefill's token), and the plain decode preparation allocates
    each request's next slot at its length (a prefill allocates exactly the prompt's slots).
    Without this a join cost two steps in the worker (the first of them looking up for real, 3.6-4.1
    ms against a path step's 1.6 ms on one H200 at TP=1): at c=4 with 128-token replies, a join
    every 32 steps, ~4 % of the decode time."""
    lens = _join_lens(batch)
    if lens is None:
        return REQUEST_JOINED + " (KV books)"
    joined = [req for req in batch.reqs if req.rid not in state.features]
    ran = [req for req in batch.reqs if req.rid in state.features]
    # (the controller is asked with the stretch's steps counted, as at any lookup)
    _note(state, state.path_bs or len(ran), ends=False)
    if not _first_lookups_wait(state, batch, joined):
        return REQUEST_JOINED
    # (with the requests that finished on the path since its last step)
    _put_stretch(worker, _departed(state, frozenset(r.rid for r in ran)) + ran,
                 state.stretch - state.put)
    state.put = state.stretch
    if batch.seq_lens_cpu is None:
        import torch

        batch.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
    state.path_timing = None  # the period of the step before holds the prefill
    state.controller.counters["plain_path_joins"] += len(joined)
    state.stretch_len = state.stretch + _steps_to_lookup(state, batch)
    return ""


def _first_lookups_wait(state, batch, new) -> bool:
    """Requests ``new`` to the batch (a join, or a batch just prefilled): may their first lookups
    wait, to be made by a probe on the path (`Controller.defer_first_lookup`, asked for the whole
    batch; it sets the probe gap to 1)? The controller is first told whether each samples or
    decodes greedily (as the worker's step tells it, `auto._sync_requests`): a full match, and the
    features of no draft, are judged by the drafts of requests that decode alike. Where they may,
    the new requests get those features."""
    ctl = state.controller
    for req in new:
        ctl.note_sampling(req.rid, samples(req))
    # known to the controller from now on: forgotten when they leave the batch (`_sync_requests`),
    # even before their first probe, or before the worker's step where their lookups cannot wait
    state.prev_rids = state.prev_rids | {req.rid for req in new}
    if not ctl.defer_first_lookup([req.rid for req in batch.reqs]):
        return False
    for req in new:
        state.features[req.rid] = ctl.no_draft(req.rid)
    return True


def _steps_to_lookup(state, batch) -> int:
    """The steps the batch runs from now before the controller's next lookup comes due
    (`Controller.steps_without_lookup`, at most `MAX_STRETCH`), a probe held through the steps
    right after a prefill (`auto.REFILL_STEPS`), which would otherwise ask again at each of them."""
    ctl = state.controller
    return ctl.steps_without_lookup(ctl.cfg.probe_max, MAX_STRETCH,
                                    [req.rid for req in batch.reqs], len(batch.reqs),
                                    refill_steps=max(REFILL_STEPS - state.since_prefill, 0))


def _join_lens(batch):
    """Each request's committed KV length where the batch can go on decoding plainly from there
    (every request holds exactly its committed entries: the stretch's requests since their last
    plain preparation, the new ones since their prefill; and the host lengths, where the batch has
    them, are those), else None."""
    lens = []
    for req in batch.reqs:
        if getattr(req, "kv", None) is None:
            return None
        kv = _committed(req)
        if req.kv.kv_allocated_len != kv:
            return None
        lens.append(kv)
    host = batch.seq_lens_cpu
    if host is not None and host.tolist() != lens:
        return None
    return lens


def _lookup_due(state, batch) -> str:
    """The stretch reached the step its next lookup was due at: its steps so far are counted, and
    the controller is asked again. Returns why the batch leaves the path ("" while it stays: the
    stretch goes on to the next lookup, or this step probes or holds its probe on the path)."""
    ctl, bs = state.controller, len(batch.reqs)
    _note(state, bs, ends=False)
    n = _steps_to_lookup(state, batch)
    if n > 0:
        state.stretch_len = state.stretch + n
        return ""
    views = [view(state, req.rid) for req in batch.reqs]
    answer = ctl.lookup_on_plain_path(views, ctl.cfg.probe_max,
                                      refill=state.since_prefill + 1 <= REFILL_STEPS)
    if answer == LOOKUP:
        return LOOKUP_DUE
    # this step is counted now (held: as a lean step) or by its probe (`_probe`)
    state.probe_now = answer == PLAN_PROBE
    if answer == HELD:
        ctl.counters["plain_path_steps"] += 1
    state.noted += 1
    state.stretch_len = state.stretch + 1
    return ""


def _note(state, bs: int, ends: bool) -> None:
    """The stretch's steps not counted yet go to the controller's books in one call. A step
    counted ahead (`_lookup_due`: the next one, held or probing) stays counted where it has not run
    yet (0.5.23 may skip a decode step after `choose_path`)."""
    n = state.stretch - state.noted
    state.controller.note_plain_path(bs, n, ends=ends)
    state.noted = max(state.noted, state.stretch)


def _kv_lens(batch):
    """Each request's KV entries once the forward in flight is done (that forward gave every
    request one token: `may_enter`), or None where the host's books do not add up (a request's
    prompt and output do not account for its committed KV and the token in flight, or less KV is
    allocated than that)."""
    lens = []
    for req in batch.reqs:
        if getattr(req, "kv", None) is None:
            return None
        kv = _committed(req) + 1
        if (len(req.origin_input_ids) + len(req.output_ids) != kv
                or req.kv.kv_allocated_len < kv):
            return None
        lens.append(kv)
    return lens


def _committed(req) -> int:
    """A request's committed KV length: a field of its KV record in 0.5.23, of the request itself
    in 0.5.16 (whose KV record has no such field)."""
    return req.kv.kv_committed_len if hasattr(req.kv, "kv_committed_len") else req.kv_committed_len


def _row(req) -> int:
    """A request's row in the request-to-token pool (where it is kept: see `_committed`)."""
    return req.kv.req_pool_idx if hasattr(req.kv, "req_pool_idx") else req.req_pool_idx


def may_enter(state, batch) -> tuple:
    """(the steps before the next lookup the controller expects, "", each request's KV length once
    the forward in flight is done or None: a stretch on the plain path starts at this step) or
    (0, why the batch stays speculative, None): the forward launched last must be a step of the
    worker's that gave every request of this batch one token (no new request since), or the prefill
    of all of its requests (`_after_prefill`), the batch must be one a plain step serves, and the
    next lookup must not be a real one (a probe, or one held, is made on the path:
    `_lookup_due`)."""
    if not state.last_forward_plain:
        return _after_prefill(state, batch)
    if any(req.rid not in state.last_batch_rids or req.rid not in state.features
           for req in batch.reqs):
        return 0, "a request joined", None
    if not _plain_capable(state, batch, None):
        return 0, "the batch needs the worker", None
    ctl = state.controller
    n = _steps_to_lookup(state, batch)
    if n == 0 and ctl.lookup_is_real([view(state, req.rid) for req in batch.reqs]):
        return 0, "a lookup is due", None
    if _kv_lens(batch) is None:
        if not state.books_warned:
            state.books_warned = True
            logger.warning("auto verify: a request's KV books do not add up (%s); this batch "
                           "stays in the n-gram worker", [
                               (r.rid, len(r.origin_input_ids), len(r.output_ids),
                                _committed(r) if getattr(r, "kv", None) is not None else None,
                                getattr(r.kv, "kv_allocated_len", None))
                               for r in batch.reqs][:4])
        return 0, "KV books", None
    return n, "", None


def _after_prefill(state, batch) -> tuple:
    """`may_enter` where the forward launched last was no step of the worker's without
    speculation: a stretch starts only where the forwards since the last decode step were the
    prefills of every request of this batch and of no other (the running batch was empty, and the
    prefill's batch became it; or requests arrived one after another, SGLang ran their prefills
    back to back and merged them before the first decode step, as at c=4: `AutoState.prefill_rids`;
    before, that step ran in the worker, a likely cause of most of the ~70 decode steps each auto
    server ran there in `twins-smollm2-tp1`, at 5.3 ms median against 1.96 ms on the path), their
    KV is laid out as a plain server's would be (`_join_lens`: the prefill allocated exactly the
    prompts' slots) and their first lookups may wait (`Controller.defer_first_lookup`, as for the
    worker's first step after a prefill). The new requests then get the features of no draft, and
    the stretch starts from their committed lengths (the prefill's tokens are written by the first
    step on the path, as a plain server's first decode step writes them). Before, the step right
    after a prefill ran in the worker: 0.5-0.86 ms over a plain server's step on one H200 at
    TP=1."""
    why = (0, "the last forward verified or prefilled", None)
    rids = [req.rid for req in batch.reqs]
    if (state.since_prefill != 0 or frozenset(rids) != state.prefill_rids
            or any(rid in state.features for rid in rids)):
        return why
    if not _plain_capable(state, batch, None):
        return 0, "the batch needs the worker", None
    lens = _join_lens(batch)
    if lens is None or not _first_lookups_wait(state, batch, batch.reqs):
        return why
    return _steps_to_lookup(state, batch), "", lens


def enter(batch, state, n: int, lens=None) -> None:
    """The batch reads as a plain server's from this step on, for up to ``n`` steps: the KV slots
    reserved past each request's length (``lens``; None: `_kv_lens`) are freed, the lengths are
    the host's, and the batch has no speculative input. Where the batch comes back from an
    excursion for a lookup, what the excursion took beyond its steps' decided costs is recorded
    (`_excursion_ends`)."""
    import torch

    _excursion_ends(state, len(batch.reqs))
    lens = _kv_lens(batch) if lens is None else lens
    pool = batch.req_to_token_pool.req_to_token
    freed = []
    for req, kv in zip(batch.reqs, lens):
        allocated = req.kv.kv_allocated_len
        if allocated > kv:
            freed.append(pool[_row(req), kv:allocated])
            req.kv.kv_allocated_len = kv
    if freed:
        batch.token_to_kv_pool_allocator.free(torch.cat(freed))
    host = torch.tensor(lens, dtype=torch.int64)
    device = batch.seq_lens.device
    batch.seq_lens_cpu = host
    batch.seq_lens = host.to(device=device, dtype=batch.seq_lens.dtype, non_blocking=True)
    if batch.orig_seq_lens is not None:
        batch.orig_seq_lens = host.to(device=batch.orig_seq_lens.device,
                                      dtype=batch.orig_seq_lens.dtype, non_blocking=True)
    batch.seq_lens_sum = int(sum(lens))
    state.info_type = type(batch.spec_info)
    state.spec_algorithm = batch.spec_algorithm
    batch.spec_info = None
    batch.spec_algorithm = type(batch.spec_algorithm).NONE
    _new_stretch(state, n)


def _new_stretch(state, n: int) -> None:
    """The stretch's books from scratch: no step run, counted or put yet, ``n`` steps to its next
    lookup (0 where no stretch runs)."""
    state.stretch, state.stretch_len = 0, n
    state.noted = state.put = 0
    state.probe_now = False
    state.path_reqs = None


def leave(scheduler, batch, state, why: str = "") -> None:
    """The batch reads as speculative again: a speculative input that accepted one token per
    request (as after a prefill; the roots are filled on the device by `fill_roots`, from the
    future map's token buffer), no future indices (the lengths the plain step left are the ones the
    next step starts from), the controller's books advanced by the stretch, and the stretch's
    output since its last put held back for the corpus until the worker's step that follows has
    looked up (`put_pending`)."""
    import torch

    bs = len(batch.reqs)
    device = batch.seq_lens.device
    k = state.k
    info = state.info_type(draft_token_num=k, new_seq_lens=batch.seq_lens,
                           accept_tokens=torch.zeros(bs * k, dtype=torch.int32, device=device),
                           accept_lens=torch.ones(bs, dtype=torch.int32, device=device))
    info.fv_roots = True
    batch.spec_info = info
    batch.spec_algorithm = state.spec_algorithm
    state.future_map = scheduler.future_map
    # until the worker runs this batch: 0.5.23's update_running_batch may skip the decode step
    # after this call (its memory check fails while requests finish in flight), and the next
    # choose_path must not take the plain path's last step for a forward of the worker's in flight
    # (the KV lengths `enter` would take from the host are one too long: `_kv_lens` refuses them
    # with a warning meant for books that do not add up)
    state.last_forward_plain = False
    _note(state, state.path_bs or bs, ends=True)  # (at the size the steps ran at: not a join's)
    # the first step back is measured from scratch (its period holds the switch)
    state.last_start, state.step_before = None, None
    # the stretch's output since its last put: the worker's step that follows may look up (the
    # lookup the batch leaves for, a joining request's first), which would wait for this put's
    # insert (at bs 4 on the CPU host 0.8-1.5 ms, against 0.15-0.21 ms with the lookup first;
    # lab/probe_put_lead.py): it goes to the corpus after that step's lookups (`put_pending`),
    # which find the corpus as a probe here would have
    n = state.stretch - state.put
    if n > 0:  # (after any output still held back: a batch that emptied before the worker ran)
        # (with the requests that finished on the path since its last step)
        state.pending_put = (state.pending_put or []) + _stretch_contexts(
            _departed(state, frozenset(r.rid for r in batch.reqs)) + list(batch.reqs), n,
            int(scheduler.model_worker.max_trie_depth))
    state.put = state.stretch
    _new_stretch(state, 0)
    if why == LOOKUP_DUE:
        state.controller.excursion_begins(state.clock(), bs)
    state.path_ended[why or "-"] += 1
    _log_stretches(state, why)


def _excursion_ends(state, bs: int) -> None:
    """The batch is back on the path: where it left for a lookup (`leave`) at the same batch size,
    nothing voided the excursion since (a prefill: `auto.not_a_decode_step`) and it ran at most
    `SWITCH_MAX_STEPS` steps in the worker, the time it took less the costs of those steps as the
    controller decided them is recorded (SWITCH: what starting a spell costs beyond its steps,
    `StepCosts.switch_ms`). A longer spell would add its estimates' errors over every step to it
    (a spell of verifies that pays runs for hundreds of steps). Each rank records its own; the
    controller reads rank 0's, shared as the other costs are."""
    over = state.controller.excursion_ends(state.clock(), bs, SWITCH_MAX_STEPS)
    if over is not None and state.costs is not None:
        state.costs.record(SWITCH, bs, 1, over)


# seconds between two log lines on the stretches
LOG_EVERY_S = 30.0
# what came before a stretch (its log line counts them): the prefill of all of its requests
# (`_after_prefill`), or a step of the worker's without speculation
BEGUN_AFTER_PREFILL, BEGUN_AFTER_PLAIN = "after a prefill", "after a worker's plain step"
# why a stretch ended where its batch emptied (else a `leave` reason)
FINISHED = "its requests finished"


def _log_stretches(state, why) -> None:
    """Now and then (`LOG_EVERY_S`), a line on the stretches so far: how many, how many steps, why
    the last one ended (``why``; None: asked where no stretch started), why steps of the worker
    did not start one, what came before the stretches and why they ended, the probes held for
    want of credit (on the path and in the worker), and a probe's host time on the path (the median
    of the recent ones at each batch size, as measured for the probe credit)."""
    now = state.clock()
    if state.path_logged_at is not None and now - state.path_logged_at < LOG_EVERY_S:
        return
    state.path_logged_at = now
    c = state.controller.counters
    n, steps = c["plain_path_stretches"], c["plain_path_steps"]
    probe_ms = ({bs: round(ms, 3) for bs, ms in state.costs.medians_by_bs(PATH_PROBE).items()}
                if state.costs is not None else {})
    logger.info("auto verify: %d stretches on the plain decode path, %d steps (%.1f each, %.0f %% "
                "of the decode steps, %d probes on it, %d requests joined it)%s; no stretch from a "
                "worker's step: %s; begun: %s; ended: %s; probes held: %d; a probe on it, ms by "
                "batch size: %s", n, steps,
                steps / max(n, 1), 100.0 * steps / max(c["steps"], 1), c["plain_path_probes"],
                c["plain_path_joins"], f", the last one ended: {why}" if why else "",
                dict(sorted(state.path_refusals.items())) or "-",
                dict(sorted(state.path_begun.items())) or "-",
                dict(sorted(state.path_ended.items())) or "-", c["probes_held"], probe_ms or "-")


def _put_stretch(worker, reqs, n: int) -> None:
    """The corpus learns the output of ``n`` steps of a stretch (those since its last put) in one
    put per request of ``reqs``: its last ``max_trie_depth + n - 1`` tokens on the host (the corpus
    inserts the n-grams starting at every position of what it is given; the step in flight's token
    comes with the next put)."""
    if n > 0 and reqs:
        worker.ngram_corpus.batch_put(_stretch_contexts(reqs, n, int(worker.max_trie_depth)))


def _stretch_contexts(reqs, n: int, depth: int) -> list:
    """What `_put_stretch` gives the corpus for ``n`` steps: each request's last depth + n - 1
    tokens on the host (prompt tokens before its output where it has fewer); [] for no step."""
    if n <= 0 or not reqs:
        return []
    span = depth + n - 1
    contexts = []
    for req in reqs:
        out = req.output_ids
        if len(out) >= span:
            contexts.append(list(out[-span:]))
        else:
            prompt = getattr(req, "origin_input_ids_unpadded", None)
            prompt = req.origin_input_ids if prompt is None else prompt
            contexts.append(list(prompt[-(span - len(out)):]) + list(out))
    return contexts


def _departed(state, rids) -> list:
    """The requests of the stretch's last step not among ``rids`` (those that finished since)."""
    return [r for r in state.path_reqs or () if r.rid not in rids]


def _put_departed(worker, state, rids) -> None:
    """Requests of the stretch's last step that are no longer in the batch (``rids``: its requests
    now) finished on the path: the corpus gets their output since the stretch's last put, as it
    gets the output of the requests still running at the next put. Without it a request that
    finished on the path left its last up to `probe_max` tokens out of the corpus, and a memorised
    load (a prompt repeated) decoded them without drafts again the next time, and lost them again
    (one H100, SmolLM2: the last 26-31 steps of an open prompt's reply on the path in two
    successive rounds, where chain + widths, whose worker puts every step's output, verified
    them)."""
    gone = _departed(state, rids)
    if gone:
        _put_stretch(worker, gone, state.stretch - state.put)


def put_pending(worker, state) -> None:
    """The stretch's output held back by `leave` goes to the corpus once the worker's step that
    follows has looked up (`auto.step_drafts`, once the step's drafts are there; the end of
    `auto.plain_step`'s step without speculation), or at the next step on the path, whichever
    comes first."""
    contexts, state.pending_put = state.pending_put, None
    if contexts:
        worker.ngram_corpus.batch_put(contexts)


def _put_upto(worker, batch, state, upto: int) -> None:
    """The corpus gets the output of the stretch's steps from its last put up to step ``upto``
    (`_put_stretch`), and that put is noted."""
    _put_stretch(worker, batch.reqs, upto - state.put)
    state.put = upto


def worker_step(worker, batch):
    """First in the n-gram worker's step: a batch on the plain path runs `step` at once, before the
    worker's stream bookkeeping for a verify pass (it marks the batch's tensors as used on the
    forward stream, since a verify rebinds them mid-step; a plain step rebinds none, and a plain
    server does no such bookkeeping): 0.03 ms a step of the worker's entry on one H200, in a launch
    whose host set the pace. None for any other batch (the worker goes on), or anything without a
    speculative algorithm to read."""
    algorithm = getattr(batch, "spec_algorithm", None)
    if algorithm is None or not algorithm.is_none():
        return None
    state = getattr(worker, "_fv_auto", None)
    return None if state is None else step(worker, batch, state)


def step(worker, batch, state):
    """The n-gram worker's step for a batch on the plain path: SGLang's plain decode pass with the
    plain decode runtime (its attention backend and DECODE graphs) in place and the model runner
    reading as not speculative (as `verify_runtime.plain_algorithm` makes it read, written out
    here: the generator behind that context manager cost a step on the path a third of this
    function's own host time); the result is the target's own."""
    before, state.path_bs = state.stretch, len(batch.reqs)
    _time(state, before, state.path_bs)
    if state.pending_put is not None:  # (back on the path before the worker's step flushed it)
        put_pending(worker, state)
    mr = worker.model_runner
    now = frozenset(r.rid for r in batch.reqs)
    state.in_flight_rids, state.last_batch_rids = state.last_batch_rids, now
    saved = (mr.attn_backend, mr.decode_cuda_graph_runner, mr.spec_algorithm)
    plain = state.plain
    mr.attn_backend, mr.decode_cuda_graph_runner = plain.attn_backend, plain.graph_runner
    mr.spec_algorithm = type(saved[2]).NONE
    try:
        result = worker.target_worker.forward_batch_generation(batch)
    finally:
        mr.attn_backend, mr.decode_cuda_graph_runner, mr.spec_algorithm = saved
    if state.path_reqs is not None and now != state.in_flight_rids:
        # (the requests of the stretch's step before: after the launch, as the corpus' insert
        # runs on its own thread)
        _put_departed(worker, state, now)
    state.path_reqs = list(batch.reqs)
    state.stretch += 1
    # counted here, not with the controller's books (`_note`): a prefill between two steps of a
    # stretch (a request joining, a chunk of a longer one) restarts the count
    state.since_prefill += 1
    state.last_forward_plain = True
    # SGLang's accept length of a request is its tokens over its speculative steps, and the result
    # processor counts only those of a speculative batch: a step here counts as one that verified
    # nothing, as the worker's own steps without speculation do (else a server that never verifies
    # reported 17 tokens a step). Counted at launch: a request that finished on the step before
    # (its result processed after this launch) counts one step more than it kept.
    for req in batch.reqs:
        req.spec_verify_ct += 1
    # the step before the first step back in the worker (which measures no period: `leave`
    # cleared the start) gave every request one token
    state.last_step = (PATH, len(batch.reqs), 1)
    if state.probe_now:
        state.probe_now = False
        _probe(worker, batch, state, before)
    elif before == state.stretch_len - put_lead(state.path_bs) and before > state.put:
        # the controller is asked for its next lookup `put_lead` steps from here: the corpus gets
        # the stretch's output now, so that a probe there does not wait for the insert (the lookup
        # waits for the corpus' pending puts; on one H200 a probe that put first took 1.2 ms
        # median, one whose put was made a step earlier 0.62 ms)
        _put_upto(worker, batch, state, before)
    return result


def _time(state, k: int, bs: int) -> None:
    """At the start of the stretch's step ``k`` (0: its first) at batch size ``bs``: the period of
    the step timed ends here where this is the step after it in the same stretch at the same batch
    size, and is recorded as a step on the path (PATH, what no speculation costs:
    `StepCosts.decode_ms`); the stretch's 2nd, 10th, 18th, ... steps are timed (`TIME_EVERY`), so
    that the other steps pay one comparison: timing each step cost 0.01-0.015 ms of a 1.5 ms step
    on one H200 at TP=1. A period is never one that held a prefill (`auto.not_a_decode_step` and
    `_join` drop the timing), a probe (`_probe` drops it) or the worker's steps (the next stretch
    starts at step 0 and finds no step timed before it)."""
    if state.costs is None:
        return
    timed = state.path_timing
    if timed is not None:
        state.path_timing = None
        if timed[2] + 1 == k and timed[1] == bs:
            state.costs.record(PATH, bs, 1, 1000.0 * (state.clock() - timed[0]))
    if (k - 1) % TIME_EVERY == 0:
        state.path_timing = (state.clock(), bs, k)


def _probe(worker, batch, state, before: int) -> None:
    """A probe on the plain path, on the host while the GPU runs the step just launched: the drafts
    of earlier probes are scored against the output the host has, and drafts are looked up on the
    host's tokens, recorded to be scored later and reported (`Controller.note_probe`, which counts
    this step). The stretch then runs until the next lookup the controller expects; none where the
    drafts found make speculation look worthwhile (the next step goes back to the worker, which
    looks up for real). The corpus was given the stretch's output `put_lead` steps before (`step`):
    the lookup waits for the corpus' pending inserts, and those few steps' output only holds
    n-grams whose continuation is yet to come or lies in those steps. Where no put was made then
    (``before``: the stretch's steps launched before this one; a lookup due sooner), the output
    since the last put is put after the lookup. The probe's host time is measured (PATH_PROBE:
    `Controller.probe_cost`, what the probe credit weighs) and the controller's copy of the
    measured costs refreshed once `AutoConfig.cost_sync_steps` of the controller's steps passed
    since the last, the cadence of the worker's steps and the simulator's: with TP > 1 from rank
    0's (a CPU-side broadcast every rank makes at the same probe; probes come 1, 2, 4, ... steps
    apart again after every join and at every stretch's start, and each broadcast pickles the
    costs and runs two collectives on the host). With one rank it was refreshed at every probe
    before: a new copy makes every answer the controller keeps per costs miss, and the asks that
    follow a probe took 65 against 45 us at bs 1 and 98 against 77 at bs 4 on the CPU
    (`lab/path_host_time.py`'s two asks, with and without a new copy)."""
    # (looked up on auto at each probe, not bound at import: the step tracer, lab/steptrace,
    # times these two by wrapping them on auto; tests/lab/test_step_trace.py checks that no
    # module binds a traced function at import)
    from fastverify.glue.auto import _sync_requests, probe_behind

    t0 = state.clock()
    _sync_requests(state, batch)
    erase_departed(worker, batch)
    views = probe_behind(worker, state, batch)
    if before - state.put > put_lead(len(batch.reqs)):
        # no put was made `put_lead` steps before (a lookup due sooner than that, after a join or
        # a probe held): the output since the last put goes to the corpus after the lookup, which
        # would otherwise wait for its insert; the next probe finds it
        _put_upto(worker, batch, state, before)
    ctl = state.controller
    ctl.note_probe(views)
    if state.costs is not None:
        state.costs.record(PATH_PROBE, len(batch.reqs), 1, 1000.0 * (state.clock() - t0))
        if (state.path_synced_at is None
                or ctl.step - state.path_synced_at >= ctl.cfg.cost_sync_steps):
            # (the controller's step count is the same on every rank: they all broadcast here)
            state.path_synced_at = ctl.step
            shared = state.sync_costs(state.costs) if state.sync_costs else state.costs
            ctl.costs = shared.snapshot()
    ctl.counters["plain_path_probes"] += 1
    ctl.counters["plain_path_steps"] += 1
    # this step's period holds the probe (measured apart, above): not a PATH step's cost
    state.path_timing = None
    state.stretch_len = state.stretch + _steps_to_lookup(state, batch)
    _log_stretches(state, None)  # (a stretch may go on for as long as its requests run)


def fill_roots(worker, batch, state) -> None:
    """The first step after a stretch: each request's root (its last token, left in the future
    map's token buffer by the stretch's last step) into the speculative input `leave` made. On the
    forward stream, after that step's forward."""
    info = batch.spec_info
    if not getattr(info, "fv_roots", False):
        return
    bs, k = len(batch.reqs), state.k
    tokens = info.accept_tokens.view(bs, k)
    tokens[:, 0] = state.future_map.output_tokens_buf[batch.req_pool_indices].to(tokens.dtype)
    info.fv_roots = False


def relay(scheduler, future_indices, result) -> None:
    """In an n-gram server's relay of a forward's result: where the result holds one token per
    request (a prefill, or a step without speculation: the worker's or the plain path's), that
    token goes to the future map's token buffer, from which a step on the plain path takes its
    input ids. Verify results (several tokens per request) are not relayed: a stretch starts only
    after a step that gave one token."""
    if _state(scheduler) is None:
        return
    ids = getattr(result, "next_token_ids", None)
    if ids is None or not hasattr(ids, "numel") or ids.numel() != future_indices.numel():
        return
    buf = scheduler.future_map.output_tokens_buf
    buf[future_indices] = ids.to(buf.dtype)
