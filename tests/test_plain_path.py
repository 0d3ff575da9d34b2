"""glue/plain_path.py (auto's stretches on SGLang's own decode path) on stand-in scheduler, batch
and worker objects, the KV books checked against a model of SGLang's bookkeeping (plain and
speculative decode preparation, the worker's plain step, result processing one step late) in
the layout of either pinned version: 0.5.16 keeps a request's committed KV length and pool row on
the request, 0.5.23 on its KV record, and 0.5.23's future map relays an n-gram batch's lengths
(and, where no attention backend needs host lengths, patch 0009, leaves it none)."""
import enum
from types import SimpleNamespace

import pytest
import torch

from fastverify.controller import HELD, LOOKUP, PLAN_PROBE
from fastverify.costs import LEAN, PATH, PATH_PROBE, PROBE, SPEC, SWITCH
from fastverify.gains import DraftFeatures
from fastverify.glue import auto, plain_path
from fastverify.glue.verify_runtime import VerifyRuntime

from test_glue_auto import CHEAP, DEAR, PLAIN, _spec, _worker

K = 4
RESERVE = 2 * K  # the speculative preparation's reservation past the committed length
LAYOUTS = ("0.5.16", "0.5.23")


class Algo(enum.Enum):
    NONE = 0
    NGRAM = 1

    def is_none(self):
        return self is Algo.NONE


class Info:
    """SGLang's NgramVerifyInput, the four fields the step relays."""

    def __init__(self, draft_token_num=None, new_seq_lens=None, accept_tokens=None,
                 accept_lens=None):
        self.draft_token_num, self.new_seq_lens = draft_token_num, new_seq_lens
        self.accept_tokens, self.accept_lens = accept_tokens, accept_lens
        self.future_indices = None


class Allocator:
    def __init__(self, n):
        self.free_slots = list(range(1, n))  # slot 0 is padding

    def alloc(self, n):
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, t):
        self.free_slots.extend(int(x) for x in t.tolist())


class Books:
    """SGLang's KV bookkeeping for a decode batch (the model the plain path's switches are checked
    against): the plain preparation allocates one slot at each request's length and commits it at
    once; the speculative one reserves up to committed + RESERVE; the worker's plain step writes the
    slot at the length; a speculative result commits its accepted token when processed, one step
    late (overlap). A speculative step's lengths come through the future map: the step publishes
    them by row, run_batch gives its next input the batch's rows as future indices, and the next
    step's resolve gathers them by those indices and leaves no host lengths (patch 0009: no
    attention backend needs them). An n-gram server's scheduler publishes no lengths for a plain
    step (patch 0012; a plain server's publishes one more than the next step starts from), so a
    speculative batch's resolve by future indices would find the worker's last, stale ones.

    ``layout``: where a request's committed length and pool row live (0.5.16: on the request;
    0.5.23: on its KV record only), and in 0.5.23 the future map relays an n-gram step's accept
    tokens and lengths as well (stashed from the step's next draft input, gathered into the next
    input by its future indices)."""

    ROWS = 8  # rows of the request-to-token pool and of the future map's buffers

    def __init__(self, prompts, layout="0.5.16", in_flight=False):
        self.layout = layout
        self.alloc = Allocator(4096)
        self.pool = torch.zeros(self.ROWS, 512, dtype=torch.int32)
        self.reqs, self.written = [], {}
        bs = len(prompts)
        lens = torch.tensor([len(p) for p in prompts])
        # the future map's rows (new_seq_lens_buf; 0.5.23's accept_tokens_buf, accept_lens_buf),
        # as the prefill left them
        self.published = torch.zeros(self.ROWS, dtype=torch.int64)
        self.published[:bs] = lens
        self.accept_tokens_buf = torch.zeros(self.ROWS, K, dtype=torch.int32)
        self.accept_tokens_buf[:, 0] = 99
        self.accept_lens_buf = torch.ones(self.ROWS, dtype=torch.int32)
        for i, p in enumerate(prompts):
            # the prefill's result is processed: its token is the first decode step's input
            # (``in_flight``: not yet, the prefill was the last forward launched)
            self.reqs.append(self.prefilled(i, p, [] if in_flight else [99]))
        self.batch = SimpleNamespace(
            reqs=self.reqs, spec_algorithm=Algo.NGRAM, spec_info=None, seq_lens=lens.clone(),
            seq_lens_cpu=lens.clone(), orig_seq_lens=lens.to(torch.int32), seq_lens_sum=None,
            req_pool_indices=torch.arange(bs), has_grammar=False, return_logprob=False,
            return_hidden_states=False, sampling_info=None,
            req_to_token_pool=SimpleNamespace(req_to_token=self.pool),
            token_to_kv_pool_allocator=self.alloc)
        self.speculative_input(Info(K, lens.clone(), self.accept_tokens_buf[:bs].flatten().clone(),
                                    self.accept_lens_buf[:bs].clone()))
        # (kind, tokens[, their requests]) of forwards not processed yet
        self.queue = [("prefill", [99] * bs, list(self.reqs))] if in_flight else []
        self.next_token = 100

    def prefilled(self, i, p, output_ids):
        """Request ``r{i}`` as its prefill leaves it in pool row ``i``: exactly its prompt's slots
        allocated and committed (SGLang's extend allocation reserves nothing past them)."""
        slots = self.alloc.alloc(len(p))
        self.pool[i, :len(p)] = torch.tensor(slots, dtype=torch.int32)
        self.written.update({(i, j): True for j in range(len(p))})
        kv = SimpleNamespace(kv_allocated_len=len(p))
        req = SimpleNamespace(rid=f"r{i}", origin_input_ids=list(p), output_ids=list(output_ids),
                              kv=kv, is_retracted=False, spec_verify_ct=0)
        if self.layout == "0.5.16":
            req.kv_committed_len, req.req_pool_idx = len(p), i
        else:
            kv.kv_committed_len, kv.req_pool_idx = len(p), i
        return req

    def prefill(self, p, token):
        """A new request's prefill launched (its result, ``token``, processed one iteration late):
        the prefill batch, to be merged into the running batch (`merge`) at the next iteration."""
        i = len(self.reqs)  # (a request's row is its place in the batch here)
        assert [self.row(r) for r in self.reqs] == list(range(i))
        req = self.prefilled(i, p, [])
        self.queue.append(("prefill", [token], [req]))
        lens = torch.tensor([len(p)])
        return SimpleNamespace(reqs=[req], req_pool_indices=torch.tensor([i]), seq_lens=lens,
                               seq_lens_cpu=lens.clone(), orig_seq_lens=lens.to(torch.int32),
                               spec_algorithm=Algo.NGRAM, spec_info=None,
                               forward_mode=SimpleNamespace(is_decode=lambda: False))

    def merge(self, other):
        """ScheduleBatch.merge_batch as both pinned versions have it, on the fields modelled here:
        lengths, rows and requests concatenated, host lengths only where both batches have them,
        the running batch's speculative input merged only where it has one (on the plain path it
        has none: the prefill's is dropped)."""
        b = self.batch
        b.req_pool_indices = torch.cat([b.req_pool_indices, other.req_pool_indices])
        b.seq_lens = torch.cat([b.seq_lens, other.seq_lens])
        b.orig_seq_lens = torch.cat([b.orig_seq_lens, other.orig_seq_lens])
        b.seq_lens_sum = None
        b.seq_lens_cpu = (None if b.seq_lens_cpu is None or other.seq_lens_cpu is None
                          else torch.cat([b.seq_lens_cpu, other.seq_lens_cpu]))
        b.reqs = self.reqs = self.reqs + other.reqs
        assert not b.spec_info, "(a speculative running batch's merge is not modelled here)"

    def finish_last(self):
        """The batch's last request finished (its last token processed): ScheduleBatch.filter_batch
        drops it from the running batch (its lengths and row with it) and its KV is released. A
        token of it still in flight is dropped when processed."""
        b = self.batch
        assert b.spec_info is None, "(a speculative batch's filter is not modelled here)"
        r = self.reqs[-1]
        self.alloc.free(self.pool[self.row(r), :r.kv.kv_allocated_len])
        b.reqs = self.reqs = self.reqs[:-1]
        for name in ("req_pool_indices", "seq_lens", "orig_seq_lens", "seq_lens_cpu"):
            value = getattr(b, name)
            if value is not None:
                setattr(b, name, value[:-1])
        b.seq_lens_sum = None
        return r

    def committed(self, r):
        return r.kv_committed_len if self.layout == "0.5.16" else r.kv.kv_committed_len

    def commit(self, r, n):
        if self.layout == "0.5.16":
            r.kv_committed_len += n
        else:
            r.kv.kv_committed_len += n

    def row(self, r):
        return r.req_pool_idx if self.layout == "0.5.16" else r.kv.req_pool_idx

    def speculative_input(self, info):
        """What run_batch leaves on a speculative batch after its forward: the step's next draft
        input with the batch's rows as its future indices (0.5.23: its accept tokens and lengths
        stashed by row)."""
        b = self.batch
        info.future_indices = b.req_pool_indices
        if self.layout == "0.5.23":
            self.accept_tokens_buf[b.req_pool_indices] = info.accept_tokens.view(-1, K)
            self.accept_lens_buf[b.req_pool_indices] = info.accept_lens
        b.spec_info = info

    def resolve(self):
        """run_batch's resolve before the forward, where the batch's input has future indices: its
        lengths from the future map, no host copy (0009); 0.5.23: its accept tokens and lengths."""
        b = self.batch
        fi = getattr(b.spec_info, "future_indices", None)
        if fi is None:
            return
        b.seq_lens = self.published[fi]
        b.seq_lens_cpu = b.seq_lens_sum = None
        if self.layout == "0.5.23" and not b.spec_algorithm.is_none():
            b.spec_info.accept_tokens = self.accept_tokens_buf[fi].flatten()
            b.spec_info.accept_lens = self.accept_lens_buf[fi]

    def prepare_and_run(self):
        """One decode step: preparation by the batch's flag, the resolve, then the forward (the
        worker's plain step or the plain path: one token per request, written at its length)."""
        b = self.batch
        if b.spec_algorithm.is_none():
            for r in self.reqs:  # alloc_for_decode(token_per_req=1) + the committed += 1
                i = self.row(r)
                (slot,) = self.alloc.alloc(1)
                self.pool[i, int(b.seq_lens[i])] = slot
                r.kv.kv_allocated_len += 1
                self.commit(r, 1)
            b.seq_lens = b.seq_lens + 1
            b.seq_lens_cpu = b.seq_lens_cpu + 1
            self.resolve()
            at = b.seq_lens - 1  # (no publish of its lengths: patch 0012's run_batch hunk)
            kind = "plain"
        else:
            for r in self.reqs:  # eagle_prepare_for_decode's reservation
                i, cur = self.row(r), r.kv.kv_allocated_len
                nxt = max(cur, self.committed(r) + RESERVE)
                self.pool[i, cur:nxt] = torch.tensor(self.alloc.alloc(nxt - cur),
                                                     dtype=torch.int32)
                r.kv.kv_allocated_len = nxt
            self.resolve()
            at = b.seq_lens  # the worker's plain step: the first reserved slot, lengths kept
            self.published[b.req_pool_indices] = b.seq_lens + 1  # the worker's publish
            kind = "spec"
        for r in self.reqs:
            i = self.row(r)
            slot = int(self.pool[i, int(at[i])])
            assert slot not in self.alloc.free_slots, "the forward writes a free slot"
            self.written[(i, int(at[i]))] = True
        tokens = list(range(self.next_token, self.next_token + len(self.reqs)))
        self.next_token += len(self.reqs)
        self.queue.append((kind, tokens))

    def process_one(self):
        kind, tokens, *reqs = self.queue.pop(0)
        for r, t in zip(reqs[0] if reqs else self.reqs, tokens):
            r.output_ids.append(t)
            if kind == "spec":
                self.commit(r, 1)

    def check(self):
        """Once every forward is processed: each request's KV is exactly its committed entries
        (distinct slots, none free), what is allocated past them is owned by it alone."""
        assert not self.queue
        owned = []
        for r in self.reqs:
            i = self.row(r)
            assert self.committed(r) == len(r.origin_input_ids) + len(r.output_ids) - 1
            assert all(self.written.get((i, j)) for j in range(self.committed(r)))
            owned += self.pool[i, :r.kv.kv_allocated_len].tolist()
        assert len(set(owned)) == len(owned)
        assert not set(owned) & set(self.alloc.free_slots)
        assert len(owned) + len(self.alloc.free_slots) == 4095  # nothing leaked


class Corpus:
    """SGLang's n-gram corpus as the glue uses it: puts recorded; a lookup (recorded) offers each
    request ``draft(context)`` (a list of up to K - 1 tokens; default none) as its chain, and makes
    the request a match state that only an erase frees (``states``, as `NgramCorpus.batch_get` and
    `erase_match_state` keep theirs)."""

    def __init__(self, draft=lambda ctx: []):
        self.puts, self.gets, self.draft = [], [], draft
        self.events, self.step = [], None  # ("put" or "get", the harness' step)
        self.states = set()

    def batch_put(self, contexts):
        self.puts.append(contexts)
        self.events.append(("put", self.step))

    def synchronize(self):
        pass

    def erase_match_state(self, rids):
        self.states.difference_update(rids)

    def batch_get(self, rids, contexts, totals):
        self.states.update(rids)
        self.gets.append(list(rids))
        self.events.append(("get", self.step))
        tokens = torch.zeros(len(rids), K, dtype=torch.int64)
        for i, ctx in enumerate(contexts):
            d = list(self.draft(ctx))[:K - 1]
            tokens[i, 1:1 + len(d)] = torch.tensor(d, dtype=torch.int64)
        mask = torch.tril(torch.ones(K, K, dtype=torch.int64)).expand(len(rids), K, K)
        return tokens.flatten().numpy(), mask.flatten().numpy()


def _state(tmp_path, stretch_from_now=8, table=DEAR, corpus=None):
    w = _worker()
    w.max_trie_depth = 6
    w.ngram_corpus = corpus if corpus is not None else Corpus()
    w.enable_overlap = True
    w._efficient_concat_last_n = lambda a, c, n: (list(a) + list(c))[-n:]
    w._fv = SimpleNamespace(expect_no_drafts=lambda bs: None, expect=lambda lens: None,
                            config=SimpleNamespace(match_type="BFS"))
    w.model_runner.spec_algorithm = Algo.NGRAM
    w.target_worker = SimpleNamespace(forward_batch_generation=lambda batch: "result")
    state = auto.setup(w, _spec(tmp_path, table), plain=PLAIN)
    state.path_ok = True
    # the controller's next lookup is due in `stretch_from_now` + 1 steps
    state.controller._probe_gap, state.controller._since_lookup = stretch_from_now + 1, 0
    return w, state


def _worker_plain_step(state, batch):
    """What auto.plain_step leaves after a step it ran without speculation."""
    state.last_forward_plain = True
    state.last_batch_rids = frozenset(r.rid for r in batch.reqs)
    state.last_step = (LEAN, len(batch.reqs), 1)
    for r in batch.reqs:
        state.features.setdefault(r.rid, state.controller.no_draft(r.rid))


def _scheduler(w, books):
    w._fv_auto.future_map = None
    return SimpleNamespace(model_worker=w, future_map=SimpleNamespace(
        output_tokens_buf=torch.zeros(8, dtype=torch.int64)), enable_overlap=True,
        server_args=SimpleNamespace(page_size=1, enable_mixed_chunk=False, pp_size=1),
        metrics_reporter=SimpleNamespace(spec_num_forward_ct=0, spec_num_accept_tokens=0))


def _run_steps(w, state, books, n, skip_after_stretch=False) -> list:
    """``n`` scheduler iterations of the books' batch: the path choice, the preparation and the
    forward (a step on the plain path is `plain_path.step`, its forward a stand-in, a worker's
    step as `_worker_plain_step` leaves it), its result processed one iteration late (overlap). With
    ``skip_after_stretch`` the first iteration after a stretch runs no batch (0.5.23's memory check
    skipping the decode step). Returns each iteration's path: plain, spec or skip."""
    sched = _scheduler(w, books)
    b = books.batch
    path = []
    _run_steps.reporter = sched.metrics_reporter
    for i in range(n):
        if isinstance(w.ngram_corpus, Corpus):
            w.ngram_corpus.step = i
        plain_path.choose_path(sched, b)
        if (skip_after_stretch and path[-1:] == ["plain"] and not b.spec_algorithm.is_none()
                and "skip" not in path):
            path.append("skip")  # no batch runs; the step before is processed
            books.process_one()
            continue
        path.append("plain" if b.spec_algorithm.is_none() else "spec")
        books.prepare_and_run()
        if b.spec_algorithm.is_none():
            plain_path.step(w, b, state)  # the plain path's own step (its forward a stand-in)
        else:
            _worker_plain_step(state, b)
            books.speculative_input(Info(K, b.seq_lens + 1, torch.zeros(2 * K, dtype=torch.int32),
                                         torch.ones(2, dtype=torch.int32)))
        if len(books.queue) == 2:  # overlap: the step before is processed after this launch
            books.process_one()
    books.process_one()
    books.check()
    return path


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_stretch_on_the_plain_path_keeps_the_kv_books_of_both_paths(tmp_path, layout):
    w, state = _state(tmp_path, stretch_from_now=5)
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], layout)
    path = _run_steps(w, state, books, 12)
    # one step in the worker, then the 5 steps the controller expects without a lookup, then the
    # step its probe is due at: on the path too (nothing found), and the stretch goes on
    assert path == ["spec"] + ["plain"] * 11
    c = state.controller.counters
    assert c["plain_path_probes"] == 1 and w.ngram_corpus.gets == [["r0", "r1"]]
    assert c["plain_path_steps"] == 6 and state.noted == 6 and state.stretch == 11
    # the corpus got the stretch's output put_lead(2) = 3 steps before the probe, so that the
    # probe's lookup does not wait for that insert; the probe itself puts nothing
    assert plain_path.put_lead(2) == 3
    assert w.ngram_corpus.events == [("put", 3), ("get", 6)]
    # the probe's host time is measured and reaches the controller's costs (the probe credit)
    assert state.controller.costs.samples(PATH_PROBE, 2, 1) == 1
    # each step on the path counts in the scheduler's speculative statistics as a step that
    # verified nothing (SGLang's decode log line divides by the forwards counted in its interval)
    reporter = _run_steps.reporter
    assert reporter.spec_num_forward_ct == reporter.spec_num_accept_tokens == 2 * 11


@pytest.mark.parametrize("every", [plain_path.TIME_EVERY, 1])
def test_the_steps_on_the_plain_path_are_what_no_speculation_costs(tmp_path, monkeypatch, every):
    """One step in TIME_EVERY of a stretch on the plain path is timed from its start to the next
    step's, and recorded as PATH: what the controller's no speculation costs
    (`StepCosts.decode_ms`). A probe's step is not (its host time is measured apart, PATH_PROBE)."""
    monkeypatch.setattr(plain_path, "TIME_EVERY", every)
    w, state = _state(tmp_path, stretch_from_now=5)
    now = [0.0]

    def clock():  # 1.7 ms between two readings
        now[0] += 0.0017
        return now[0]

    state.clock = clock
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], LAYOUTS[0])
    path = _run_steps(w, state, books, 12)
    assert path == ["spec"] + ["plain"] * 11
    assert state.controller.counters["plain_path_probes"] == 1
    periods = state.costs._periods[(PATH, 2, 1)]
    # the stretch's steps 0-10, the 6th (5) probes: every 8th from the 2nd (1, 9), or each one but
    # the probe's (whose own clock readings fall in its period) and the last (no step after it)
    assert periods == pytest.approx([1.7] * (2 if every == 8 else 9))
    if every == 1:  # enough periods at this batch size for their median
        assert state.costs.decode_ms(2) == pytest.approx(1.7)
    # the controller reads them once the costs are shared (at a probe, or at the worker's steps)
    assert state.controller.costs.samples(PATH, 2, 1) >= 1
    # the first step back in the worker knows every request's last step gave one token (its
    # lookup need not wait for the step in flight)
    state.last_start = None
    auto._tick(state)
    assert state.lean_before


def test_an_excursion_for_a_lookup_is_measured_against_its_steps_decided_costs(tmp_path):
    """A batch that leaves the plain path because a lookup is due and comes back at the same batch
    size: the time it took less the costs of its steps in the worker as the controller decided them
    is recorded (SWITCH). A prefill in between, another batch size or more than SWITCH_MAX_STEPS
    steps in the worker void it; a batch that leaves for any other reason starts none."""
    w, state = _state(tmp_path, stretch_from_now=20)
    ctl = state.controller
    now = [0.0]
    state.clock = lambda: now[0]
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], LAYOUTS[0])
    assert _run_steps(w, state, books, 3) == ["spec", "plain", "plain"]
    sched, b = _scheduler(w, books), books.batch

    def excursion(why, *, prefill=False, bs=2, n=2):
        plain_path.leave(sched, b, state, why)
        b.spec_algorithm = Algo.NGRAM  # (what leave sets from the batch the stretch began with)
        steps = [ctl.note_lean(2) for _ in range(n)]  # the worker's steps, as decided
        if prefill:
            auto.not_a_decode_step(state)
        now[0] += 0.030
        plain_path._excursion_ends(state, bs)
        return sum(d.pass_ms for d in steps)

    priced = excursion(plain_path.LOOKUP_DUE)
    assert state.costs._periods[(SWITCH, 2, 1)] == pytest.approx([30.0 - priced])
    for why, kw in (("request joined", {}), (plain_path.LOOKUP_DUE, {"prefill": True}),
                    (plain_path.LOOKUP_DUE, {"bs": 1}),
                    (plain_path.LOOKUP_DUE, {"n": plain_path.SWITCH_MAX_STEPS + 1})):
        excursion(why, **kw)
        assert len(state.costs._periods[(SWITCH, 2, 1)]) == 1, why
        assert ctl._excursion is None
    # once measured, the controller adds it to a spell's first step, not to a spell running
    for _ in range(2):
        excursion(plain_path.LOOKUP_DUE)
    costs = state.costs.snapshot()
    for _ in range(3):
        costs.record(SPEC, 2, K, 12.0)
    ctl.costs = costs
    switch = costs.switch_ms(2)
    assert switch == pytest.approx(30.0 - priced)
    views = [auto.RequestView(r, DraftFeatures(K - 1, 1, False)) for r in ("r0", "r1")]
    # drafts expected to accept 3 tokens each: every option that speculates takes both requests
    ctl.gain.expected = lambda rid, f, step: ([3.0] * ctl.cfg.max_chain, 3.0)
    chain = next(o for o in ctl.options if o.kind == "chain" and o.width == K)
    ctl.current = ctl.options[0]
    _, evals = ctl._evaluate(views, ctl.step + 1)
    e = next(x for x in evals if x.option == chain)
    assert e.rate == pytest.approx(e.tokens / (12.0 + switch)) and e.pass_ms == 12.0
    ctl.current = chain
    _, evals = ctl._evaluate(views, ctl.step + 1)
    assert next(x for x in evals if x.option == chain).rate == pytest.approx(e.tokens / 12.0)


@pytest.mark.sglang
def test_the_schedulers_speculative_statistics_have_the_names_the_plain_path_counts_in():
    import inspect

    from sglang.srt.managers.scheduler_components import metrics_reporter

    source = inspect.getsource(metrics_reporter)
    for name in ("spec_num_forward_ct", "spec_num_accept_tokens"):
        assert f"self.{name} = 0" in source
    # and the decode log line divides by the forwards (what a zero count stopped the server on)
    assert "self.spec_num_accept_tokens / self.spec_num_forward_ct" in source


@pytest.mark.parametrize("layout", LAYOUTS)
def test_entering_frees_the_slots_reserved_past_each_request_and_takes_the_hosts_lengths(
        tmp_path, layout):
    w, state = _state(tmp_path)
    books = Books([[1, 2, 3], [4, 5]], layout)
    b = books.batch
    books.prepare_and_run()  # a step of the worker's without speculation, in flight
    _worker_plain_step(state, b)
    assert b.seq_lens_cpu is None  # the resolve left no host lengths (0009)
    reserved = [books.pool[books.row(r), books.committed(r) + 1:r.kv.kv_allocated_len].tolist()
                for r in books.reqs]
    free_before = len(books.alloc.free_slots)
    plain_path.choose_path(_scheduler(w, books), b)
    assert b.spec_algorithm is Algo.NONE and b.spec_info is None
    # each request: its prompt and the token in flight hold KV; the rest of its reservation is free
    assert [r.kv.kv_allocated_len for r in books.reqs] == [4, 3]
    assert b.seq_lens.tolist() == b.seq_lens_cpu.tolist() == [4, 3] and b.seq_lens_sum == 7
    assert b.orig_seq_lens.tolist() == [4, 3] and b.orig_seq_lens.dtype == torch.int32
    assert set(books.alloc.free_slots[free_before:]) == set(reserved[0] + reserved[1])
    assert state.stretch_len == 8  # the steps before the next lookup is due


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_batch_not_run_after_leaving_does_not_enter_again_off_the_plain_step(tmp_path, layout,
                                                                              monkeypatch, caplog):
    """0.5.23's update_running_batch may skip the decode step after choose_path (its memory check
    fails while requests finish in flight). A batch that left the plain path and was not run meets
    the next choose_path with the plain path's last step processed and nothing in flight: entering
    off that step would take KV lengths one too long. Here a stretch ends at its most steps while
    the controller still expects no lookup, and the step after it is skipped: the batch stays with
    the worker for a step (not for the books' reason), and the next stretch starts from that
    step."""
    must_leave, left = plain_path.must_leave, []

    def leave_once_after_3(state, batch, worker):  # as for a batch that needs the worker for a step
        if state.stretch == 3 and not left:
            left.append(True)
            return "the batch needs the worker"
        return must_leave(state, batch, worker)

    monkeypatch.setattr(plain_path, "must_leave", leave_once_after_3)
    w, state = _state(tmp_path, stretch_from_now=20)
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], layout)
    path = _run_steps(w, state, books, 12, skip_after_stretch=True)
    assert path[:8] == ["spec"] + ["plain"] * 3 + ["skip", "spec", "plain", "plain"]
    # (the first step has no plain forward before it either)
    assert state.path_refusals == {"the last forward verified or prefilled": 2}
    assert "books do not add up" not in caplog.text


@pytest.mark.parametrize("why", ["no plain forward before", "new request", "real lookup due",
                                 "books", "logprobs"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_batch_stays_speculative_where_a_stretch_cannot_start(tmp_path, why, layout, caplog):
    # "real lookup due": the next lookup is due at this step, verifying is cheap, drafts have been
    # accepted in full and the requests' last drafts matched in full: they would be verified (a
    # lookup due one step later would leave room for a stretch of one step, worth its switches)
    w, state = (_state(tmp_path, stretch_from_now=0, table=CHEAP) if why == "real lookup due"
                else _state(tmp_path))
    if why == "real lookup due":
        for _ in range(8):
            for rid in ("r0", "r1"):
                state.controller.observe(rid, DraftFeatures(K - 1, 1, False), K - 1)
    books = Books([[1, 2, 3], [4, 5]], layout)
    b = books.batch
    books.prepare_and_run()
    _worker_plain_step(state, b)
    if why == "real lookup due":
        state.features.update({rid: DraftFeatures(K - 1, 1, False) for rid in ("r0", "r1")})
    if why == "no plain forward before":
        state.last_forward_plain = False  # a prefill or a verify step was launched last
    elif why == "new request":
        state.last_batch_rids = frozenset({"r0"})
    elif why == "books":
        books.reqs[1].output_ids.append(7)  # output the committed KV does not account for
    elif why == "logprobs":
        b.return_logprob = True
    plain_path.choose_path(_scheduler(w, books), b)
    assert b.spec_algorithm is Algo.NGRAM and isinstance(b.spec_info, Info)
    assert ("books do not add up" in caplog.text) == (why == "books")
    assert state.path_refusals == {{
        "no plain forward before": "the last forward verified or prefilled",
        "new request": "a request joined", "real lookup due": "a lookup is due",
        "books": "KV books", "logprobs": "the batch needs the worker"}[why]: 1}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_lookup_due_that_only_full_matches_would_make_real_is_a_probe_on_the_path(tmp_path,
                                                                                   layout):
    """Verifying is cheap and the requests' drafts were accepted in full, but their last lookup
    found nothing: the lookup due now is a probe on the path, not held for credit, instead of a
    lookup step and a plain step in the worker (~3 ms against ~1.6 ms on the path on one H200,
    each time a memorised request's drafts failed at a branch point and the gap doubled). Drafts
    that probe finds worth verifying send the batch to the worker at the next step."""
    w, state = _state(tmp_path, stretch_from_now=0, table=CHEAP)
    ctl = state.controller
    for _ in range(8):
        for rid in ("r0", "r1"):
            ctl.observe(rid, DraftFeatures(K - 1, 1, False), K - 1)
    ctl._probe_credit = -10.0  # (in debt: a probe that could not pay would be held)
    books = Books([[1, 2, 3], [4, 5]], layout)
    b = books.batch
    books.prepare_and_run()
    _worker_plain_step(state, b)
    assert ctl._full_match_wanted(["r0", "r1"]) and not ctl.lookup_is_real(
        [auto.RequestView(rid, state.features[rid]) for rid in ("r0", "r1")])
    sched = _scheduler(w, books)
    plain_path.choose_path(sched, b)
    assert b.spec_algorithm is Algo.NONE and not state.path_refusals
    assert state.probe_now and ctl.planned == PLAN_PROBE
    # the probe found drafts that matched in full: the next step's lookup is a real one
    state.probe_now = False
    views = [auto.RequestView(rid, DraftFeatures(K - 1, 1, False)) for rid in ("r0", "r1")]
    state.features.update({v.req_id: v.features for v in views})
    ctl.note_probe(views)
    state.stretch += 1
    assert plain_path._lookup_due(state, b) == plain_path.LOOKUP_DUE


@pytest.mark.parametrize("due", [0, 1])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_stretch_starts_where_the_lookup_due_can_only_be_a_probe(tmp_path, layout, due):
    """The steps right after a request joined: the probe gap is back to 1, so a lookup is due at
    once or after one step, but with verifying dear it can only be a probe: the stretch starts
    anyway and the probe is made on the path (at once: this step probes)."""
    w, state = _state(tmp_path, stretch_from_now=due)
    books = Books([[1, 2, 3], [4, 5]], layout)
    b = books.batch
    books.prepare_and_run()
    _worker_plain_step(state, b)
    plain_path.choose_path(_scheduler(w, books), b)
    assert b.spec_algorithm is Algo.NONE and b.spec_info is None
    assert state.probe_now == (due == 0) and state.stretch_len == 1 and not state.path_refusals
    assert state.noted == (1 if due == 0 else 0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_probe_whose_early_put_was_missed_looks_up_before_it_puts(tmp_path, layout):
    """The corpus gets a stretch's output `put_lead` steps before its lookup is due; where the
    lookup comes later than that (here: the controller holds it for five steps), the probe finds
    the corpus as that put left it and puts the output since then after its lookup, which would
    otherwise wait for that insert (SGLang's lookup waits for the corpus' pending inserts)."""
    w, state = _state(tmp_path, stretch_from_now=4)
    ctl = state.controller
    asked, real = [], ctl.lookup_on_plain_path

    def held_five_times(views, probe_max, refill=False):
        asked.append(HELD if len(asked) < 5 else real(views, probe_max, refill=refill))
        return asked[-1]

    ctl.lookup_on_plain_path = held_five_times
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], layout)
    path = _run_steps(w, state, books, 14)
    assert path == ["spec"] + ["plain"] * 13 and asked == [HELD] * 5 + [PLAN_PROBE]
    # the lookup was due at the stretch's step 4: its output went to the corpus at step 4 -
    # put_lead(2) = 1 (iteration 2); held through steps 4-8, the probe at step 9 (iteration 10)
    # looked up first, then put the output of the 8 steps since (depth 6 + 8 - 1 tokens each)
    assert w.ngram_corpus.events == [("put", 2), ("get", 10), ("put", 10)]
    assert [len(c) for c in w.ngram_corpus.puts[-1]] == [13, 13] and state.put == 9
    # the next put comes put_lead steps before the next lookup again
    assert state.stretch_len - plain_path.put_lead(2) > state.stretch


@pytest.mark.parametrize("layout", LAYOUTS)
def test_leaving_makes_a_speculative_input_of_one_token_and_counts_the_stretch(tmp_path, layout):
    w, state = _state(tmp_path)
    books = Books([[1, 2, 3], [4, 5]], layout)
    b = books.batch
    sched = _scheduler(w, books)
    books.prepare_and_run()
    _worker_plain_step(state, b)
    plain_path.choose_path(sched, b)
    for _ in range(3):
        books.prepare_and_run()
        state.stretch += 1
        books.process_one()
    steps_before = state.controller.step
    state.features.pop("r1")  # a request the controller has not seen: it is looked up
    plain_path.choose_path(sched, b)
    assert b.spec_algorithm is Algo.NGRAM and state.future_map is sched.future_map
    info = b.spec_info
    assert info.draft_token_num == K and info.fv_roots and info.new_seq_lens is b.seq_lens
    # no future indices: the future map's gathers leave the lengths and the roots alone
    assert info.future_indices is None and not state.last_forward_plain
    assert info.accept_tokens.shape == (2 * K,) and info.accept_lens.tolist() == [1, 1]
    assert state.controller.step == steps_before + 3 and state.stretch == 0
    assert state.last_start is None  # the switch's period is not measured
    # each request's last max_trie_depth + 2 tokens go to the corpus once the worker's step
    # that follows has looked up (none put yet)
    assert w.ngram_corpus.puts == [] and state.pending_put == [
        ([1, 2, 3] + books.reqs[0].output_ids)[-8:], ([4, 5] + books.reqs[1].output_ids)[-8:]]
    # the worker's first step back fills each root from the future map's token buffer
    sched.future_map.output_tokens_buf[:2] = torch.tensor([41, 42])
    plain_path.fill_roots(w, b, state)
    assert info.accept_tokens.view(2, K)[:, 0].tolist() == [41, 42] and not info.fv_roots


def test_note_plain_path_counts_what_lean_steps_without_lookups_count(tmp_path):
    spec = _spec(tmp_path, DEAR)
    a = auto.setup(_worker(), spec, plain=PLAIN).controller
    b = auto.setup(_worker(), spec, plain=PLAIN).controller
    for c in (a, b):
        c._probe_gap, c._since_lookup, c._probe_credit = 32, 3, 0.0
    views = [auto.RequestView("x", a.no_draft("x"))]
    b.no_draft("x")
    n = a.steps_without_lookup(32, 256)
    assert n == 32 - 3 - 1
    for _ in range(n):
        assert not a.plan_lookup(views, 32, behind=True)
        a.note_lean(1)
    b.note_plain_path(1, n)
    assert (a.step, a._since_lookup, a.counters["steps"], a.counters["lean_steps"],
            a.steps_by_mode) == (b.step, b._since_lookup, b.counters["steps"],
                                 b.counters["lean_steps"], b.steps_by_mode)
    assert b._probe_credit == pytest.approx(a._probe_credit)
    assert b.counters["plain_path_steps"] == n and b.counters["plain_path_stretches"] == 1
    # the step after the stretch is the probe's
    assert a.plan_lookup(views, 32, behind=True) and b.plan_lookup(views, 32, behind=True)


def test_relay_leaves_one_token_per_request_in_the_token_buffer(tmp_path):
    w, state = _state(tmp_path)
    sched = _scheduler(w, None)
    buf = sched.future_map.output_tokens_buf
    fi = torch.tensor([3, 5])
    plain_path.relay(sched, fi, SimpleNamespace(next_token_ids=torch.tensor([7, 9],
                                                                            dtype=torch.int32)))
    assert buf.tolist() == [0, 0, 0, 7, 0, 9, 0, 0]
    # a verify result (several tokens per request) is not relayed
    plain_path.relay(sched, fi, SimpleNamespace(next_token_ids=torch.arange(8)))
    assert buf.tolist() == [0, 0, 0, 7, 0, 9, 0, 0]
    # nor anything where the plain path cannot run
    state.path_ok = False
    plain_path.relay(sched, fi, SimpleNamespace(next_token_ids=torch.tensor([1, 1])))
    assert buf.tolist() == [0, 0, 0, 7, 0, 9, 0, 0]


@pytest.mark.parametrize("change,why", [
    ({"enable_overlap": False}, "overlap scheduling is off"),
    ({"page_size": 16}, "page size 16"),
    ({"enable_mixed_chunk": True}, "mixed chunked prefill"),
    ({"pp_size": 2}, "pipeline stages"),
])
def test_settings_that_keep_the_steps_in_the_worker(tmp_path, change, why):
    w, state = _state(tmp_path)
    sched = _scheduler(w, None)
    for key, value in change.items():
        setattr(sched if key == "enable_overlap" else sched.server_args, key, value)
    assert plain_path.path_possible(sched, state) == (False, why)
    assert plain_path.path_possible(_scheduler(w, None), state) == (True, "")


def test_a_step_on_the_plain_path_runs_the_plain_runtime_and_puts_the_runner_back(tmp_path):
    w, state = _state(tmp_path)
    mr = w.model_runner
    mr.spec_algorithm = Algo.NGRAM
    seen = {}

    class Target:
        def forward_batch_generation(self, batch, **kw):
            seen.update(backend=mr.attn_backend, algo=mr.spec_algorithm, kw=kw)
            return "result"

    w.target_worker = Target()
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="a", spec_verify_ct=3)],
                            spec_algorithm=Algo.NONE,
                            forward_mode=SimpleNamespace(is_decode=lambda: True))
    assert plain_path.worker_step(w, batch) == "result"
    # the step counts for SGLang's per-request accept length as one that verified nothing
    assert batch.reqs[0].spec_verify_ct == 4
    assert seen == {"backend": "attn-plain", "algo": Algo.NONE, "kw": {}}
    assert mr.attn_backend == "attn4" and mr.spec_algorithm is Algo.NGRAM
    assert state.stretch == 1 and state.last_forward_plain and state.last_step == (PATH, 1, 1)
    assert state.last_batch_rids == frozenset({"a"})
    # a forward that raises leaves the runner as it found it too

    class Failing:
        def forward_batch_generation(self, batch, **kw):
            seen.update(runner=mr.decode_cuda_graph_runner, algo=mr.spec_algorithm)
            raise RuntimeError("out of memory")

    w.target_worker, mr.decode_cuda_graph_runner = Failing(), "g-base"
    state.plain = VerifyRuntime(1, "attn-plain", "g-plain", {})
    with pytest.raises(RuntimeError):
        plain_path.worker_step(w, batch)
    assert seen["runner"] == "g-plain" and seen["algo"] is Algo.NONE
    assert (mr.attn_backend, mr.decode_cuda_graph_runner, mr.spec_algorithm) == (
        "attn4", "g-base", Algo.NGRAM)
    # any other batch, or a worker without auto, goes on in the worker
    batch.spec_algorithm = Algo.NGRAM
    assert plain_path.worker_step(w, batch) is None
    batch.spec_algorithm = Algo.NONE
    assert plain_path.worker_step(SimpleNamespace(), batch) is None
    assert plain_path.worker_step(w, SimpleNamespace(reqs=[])) is None  # (no algorithm to read)


@pytest.fixture(scope="module")
def hunks(tmp_path_factory):
    from probe_support import patched_sglang, run_probe, tiny_model

    from fastverify import patchtool

    folder, version = patched_sglang(tmp_path_factory)
    if "0012-ngram-auto-plain-path.patch" not in [p.name for p in patchtool.load_series(version)]:
        pytest.skip(f"SGLang {version}'s series has no plain path patch")
    return run_probe("plain_path_probe.py", tiny_model(tmp_path_factory), folder)


@pytest.mark.sglang
def test_patched_scheduler_asks_for_the_path_after_the_filter_and_before_the_memory_check(hunks):
    # the memory check and the preparation see the path the hook chose
    assert hunks["order"] == ["filter", "choose_path", "mem_check:NONE", "decay", "prepare:NONE"]
    assert hunks["returned_batch"]


@pytest.mark.sglang
def test_patched_ngram_relay_and_the_plain_paths_token_gather(hunks):
    # an n-gram server's relay hands each result to plain_path.relay (and relays nothing itself)
    assert hunks["relayed"] == [[[2, 4], "tokens"]]
    # a batch that reads as not speculative takes its input ids from the future map's buffer, in an
    # n-gram server too; a speculative batch does not (its worker takes its roots)
    assert hunks["resolve_none"] == [13, 11] and hunks["resolve_ngram"] is None
    assert hunks["spec_extras"] == ["NGRAM"]  # only a speculative batch has its extras gathered


@pytest.mark.sglang
def test_the_patched_worker_hands_a_batch_on_the_plain_path_over_first(hunks):
    # no stream bookkeeping for a verify pass on the plain path; the worker's own steps keep it
    assert hunks["worker_entry"] == {"NONE": ["path result", ["path_step"]],
                                     "NGRAM": ["worker result", ["record_stream", "plain_step"]]}


@pytest.mark.sglang
def test_the_patched_run_batch_publishes_no_lengths_for_a_step_on_the_plain_path(hunks):
    """SGLang's own run_batch (overlap path): a plain server publishes a decode batch's lengths,
    one more than its step starts from, after the forward; an n-gram server does not for a batch
    that reads as not speculative (auto's plain path: nothing reads them, and the scatter and the
    n-gram future map's event cost the step host time), while its speculative batches still hand
    the worker on_publish. The step's token reaches the token buffer in all three."""
    rb = hunks["run_batch"]
    assert rb["plain server"] == {"published": [[13, 23]], "handed": [[]], "lengths": [13, 23],
                                  "tokens": [41, 42]}
    assert rb["n-gram server, plain path"] == {"published": [], "handed": [[]],
                                               "lengths": [11, 21], "tokens": [41, 42]}
    assert rb["n-gram server, speculative"]["handed"] == [["on_publish"]]
    assert rb["n-gram server, speculative"]["published"] == [[13, 23]]


@pytest.mark.sglang
def test_a_stretch_through_the_servers_own_future_map(hunks):
    fm = hunks["future_map"]
    # the worker's step without speculation: its token reaches the token buffer (plain_path.relay);
    # where the future map is live for n-gram (0.5.23) the n-gram stash keeps its accept tokens too
    assert fm["worker_step"]["tokens"] == [31, 32]
    assert fm["worker_step"]["accept"] in (None, [31, 32])
    # a step on the plain path: input ids from the token buffer, lengths left alone (no input with
    # future indices to resolve them by)
    assert fm["plain_step"] == {"input_ids": [31, 32], "seq_lens": [12, 22],
                                "seq_lens_cpu": [12, 22]}
    # its result: the token buffer only; the n-gram buffers keep the worker's step (stale)
    assert fm["plain_result"] == {"tokens": [41, 42], "accept": fm["worker_step"]["accept"]}
    # a request joins on the path: SGLang's merge of its prefill batch (speculative input and
    # all) into the running batch leaves a batch that reads as not speculative, with both
    # batches' lengths; the patched resolve gathers each request's input from the token buffer,
    # where the relay left the prefill's token (51)
    assert fm["joined"] == {"algorithm": "NONE", "spec_info": None, "reqs": ["r0", "r1", "r2"],
                            "seq_lens": [13, 23, 7], "seq_lens_cpu": [13, 23, 7],
                            "input_ids": [41, 42, 51]}
    # back: leave's input has no future indices, so the next run_batch's resolves change nothing;
    # fill_roots writes each root from the token buffer
    assert fm["back"] == {"algorithm": "NGRAM", "future_indices": None, "seq_lens": [12, 22],
                          "seq_lens_cpu": [12, 22], "roots": [41, 42], "accept_lens": [1, 1],
                          "input_ids": None, "last_forward_plain": False}
    # (with future indices the resolves would have taken the stale lengths the worker's step
    # published, the scheduler publishing none for a step on the path, and in 0.5.23 the stale
    # roots)
    assert fm["with_future_indices"]["seq_lens"] == [11, 21]
    assert fm["with_future_indices"]["roots"] == (
        [41, 42] if fm["worker_step"]["accept"] is None else [31, 32])
    # a prefill's requests merging into that input before it runs (SGLang's own merge)
    assert fm["merged"] == {"roots": [41, 42, 51], "new_seq_lens": [12, 22, 7],
                            "future_indices": None}


def _nxt(t):  # the target's greedy output after token t
    return (t * 7 + 3) % 50 + 100


def _serve(tmp_path, layout, steps, joins=None, draft=lambda ctx: [], in_flight=False,
           observed=False, finishes=(), staggered=False, table=None):
    """The real auto.plain_step and run_plain_decode (a load where verifying never pays: only
    probes), the scheduler's hooks and its KV books and future map as in each pinned version (in
    0.5.23 the worker's roots come through the future map's accept token buffer, which a stretch
    leaves stale), over ``steps`` scheduler iterations of two requests. ``joins``: {iteration:
    (prompt, the prefill's token)}: that iteration runs a new request's prefill through the worker
    instead of a decode step, and the next one merges it into the running batch first, as SGLang's
    scheduler does. ``in_flight``: the two requests' prefill is the forward in flight (else it is
    processed); ``observed``: the gain model has seen drafts of earlier requests; ``finishes``: the
    iterations at whose start the batch's last request has finished (`Books.finish_last`);
    ``staggered`` (with ``in_flight``): the two requests were prefilled one after the other, the
    first one's result processed, the second one's the forward in flight. Returns
    (books, state, corpus, the path of each iteration: plain, worker or prefill); the books are
    checked once every forward is processed. ``table``: the cost table (default: verifying never
    pays)."""
    if table is None:
        table = {"decode_ms": {"1": 1.0, "8": 1.0}, "verify_ms": {"1": 1e5, "64": 1e5}}
    spec = _spec(tmp_path, table)
    books = Books([[1, 2, 3], [4, 5, 6, 7]], layout, in_flight=in_flight)
    b = books.batch
    b.forward_mode = SimpleNamespace(is_decode=lambda: True)

    class Target:
        def forward_batch_generation(self, batch, **kw):
            ids = torch.tensor([_nxt(int(t)) for t in batch.input_ids])
            return SimpleNamespace(next_token_ids=ids)

    corpus = Corpus(draft)
    w = _worker()
    w.model_runner.spec_algorithm = Algo.NGRAM
    w.enable_overlap = True
    w.target_worker, w.ngram_corpus, w.max_trie_depth = Target(), corpus, 6
    w._prev_decode_rids, w.prev_token_ids, w.prev_accept_lens = set(), [], []
    w._efficient_concat_last_n = lambda a, c, n: (list(a) + list(c))[-n:]
    w._fv = SimpleNamespace(expect_no_drafts=lambda bs: None, expect=lambda lens: None,
                            config=SimpleNamespace(match_type="BFS"))
    state = auto.setup(w, spec, plain=VerifyRuntime(1, "attn-plain", "g-plain", {}))
    sched = _scheduler(w, books)
    # the prefill's tokens (99) reached the buffer through the relay
    sched.future_map.output_tokens_buf[:2] = 99
    if observed:
        state.controller.gain.version = 1
    prefills = [list(books.reqs)]
    if staggered:  # the first request's prefill processed, the second one's in flight
        prefills = [[r] for r in books.reqs]
        books.reqs[0].output_ids.append(books.queue[0][1][0])
        books.queue = [("prefill", books.queue[0][1][1:], books.reqs[1:])]
    for reqs in (prefills if in_flight else []):
        assert auto.plain_step(w, SimpleNamespace(
            reqs=reqs, spec_info=None, spec_algorithm=Algo.NGRAM,
            forward_mode=SimpleNamespace(is_decode=lambda: False))) is None
    path, published, merging = [], [], None
    for step in range(steps):
        corpus.step = step
        if merging is not None:  # get_next_batch_to_run: the last prefill joins the batch
            books.merge(merging)
            merging = None
        if step in finishes:
            books.finish_last()
        if joins and step in joins:
            prompt, token = joins[step]
            merging = books.prefill(prompt, token)
            # the patched worker's step for a prefill: neither the plain path's nor auto's
            assert plain_path.worker_step(w, merging) is None
            assert auto.plain_step(w, merging) is None
            plain_path.relay(sched, merging.req_pool_indices,
                             SimpleNamespace(next_token_ids=torch.tensor([token])))
            path.append("prefill")
            books.process_one()
            continue
        plain_path.choose_path(sched, b)
        on_plain = b.spec_algorithm.is_none()
        path.append("plain" if on_plain else "worker")
        # the preparation (plain: one slot, committed at once; speculative: the reservation) and
        # the resolve; the forward's model is replaced by the real step's below
        books.prepare_and_run()
        books.queue.pop()
        if on_plain:
            b.input_ids = sched.future_map.output_tokens_buf[b.req_pool_indices]
            b.out_cache_loc = books.pool[b.req_pool_indices, b.seq_lens - 1].long()
        # the patched worker's step: the plain path's first, then auto's
        result = plain_path.worker_step(w, b)
        if result is None:
            result = auto.plain_step(w, b, on_publish=published.append)
        assert result is not None  # never a verify step
        if not on_plain:  # the worker's plain step writes at seq_lens and publishes one more
            assert published.pop().tolist() == books.published[b.req_pool_indices].tolist()
        plain_path.relay(sched, b.req_pool_indices, result)
        if not on_plain:
            books.speculative_input(result.next_draft_input)
        b.input_ids = b.out_cache_loc = None
        books.queue.append(("plain" if on_plain else "spec", result.next_token_ids.tolist()))
        if len(books.queue) == 2:
            books.process_one()
    books.process_one()
    books.check()
    # the target's greedy output, token after token, whichever path each step took
    for r in books.reqs:
        out = r.output_ids
        assert all(out[i + 1] == _nxt(out[i]) for i in range(len(out) - 1))
    return books, state, corpus, path


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_stretch_left_for_a_real_lookup_puts_its_last_output_after_that_lookup(
        tmp_path, layout, monkeypatch):
    """Where a stretch ends because a lookup due is a real one, the output of its steps since the
    last put goes to the corpus after the worker's step has looked up (`plain_path.put_pending`),
    not before it: SGLang's lookup waits for the corpus' pending inserts (at bs 4 on the CPU host
    0.8-1.5 ms). Here the controller's third ask answers a real lookup; the worker's step after it
    looks drafts up behind its launch, then puts its own step's output, then the stretch's."""
    from fastverify.controller import Controller

    asks, answer = [], Controller.lookup_on_plain_path

    def third_is_real(self, views, probe_max, refill=False):
        asks.append(LOOKUP if len(asks) == 2 else answer(self, views, probe_max, refill=refill))
        return asks[-1]

    monkeypatch.setattr(Controller, "lookup_on_plain_path", third_is_real)
    held = []
    put_pending = plain_path.put_pending

    def recorded(worker, state):
        held.append((worker.ngram_corpus.step, list(state.pending_put)))
        put_pending(worker, state)

    monkeypatch.setattr(plain_path, "put_pending", recorded)
    books, state, corpus, path = _serve(tmp_path, layout, 40)
    back = path.index("worker", 1)  # the iteration whose path choice left for the lookup
    assert LOOKUP in asks and set(path[1:back]) == {"plain"}
    # the worker's lookup, its own step's put, then the stretch's held-back output
    assert [e for e in corpus.events if e[1] == back] == [("get", back), ("put", back),
                                                          ("put", back)]
    ((at, contexts),) = held
    puts = [e[1] for e in corpus.events if e[0] == "put"]  # (one entry of corpus.puts each)
    last_at_back = len(puts) - 1 - puts[::-1].index(back)
    assert at == back and corpus.puts[last_at_back] == contexts
    assert state.pending_put is None and len(contexts) == 2
    for req, ctx in zip(books.reqs, contexts):  # a window of each request's tokens
        tokens = list(req.origin_input_ids) + list(req.output_ids)
        assert any(tokens[i:i + len(ctx)] == ctx for i in range(len(tokens) - len(ctx) + 1))
    # the stretch's steps since the early put: depth 6 + n - 1 tokens each
    assert 6 < len(contexts[0]) <= 6 + plain_path.put_lead(2)


def test_a_held_back_put_not_made_by_the_worker_is_made_by_the_next_step_on_the_path(tmp_path):
    """Output held back for a lookup (`leave`) that the worker's step did not put (its batch
    emptied before that step, say) goes to the corpus at the next step on the path, once."""
    w, state = _state(tmp_path, stretch_from_now=20)
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], LAYOUTS[0])
    assert _run_steps(w, state, books, 3) == ["spec", "plain", "plain"]
    state.pending_put = [[1, 2, 3], [4, 5]]
    puts = len(w.ngram_corpus.puts)
    books2 = Books([[1, 2, 3], [4, 5, 6, 7, 8]], LAYOUTS[0])
    b = books2.batch
    b.spec_algorithm = Algo.NONE
    for _ in range(2):
        plain_path.step(w, b, state)
    assert w.ngram_corpus.puts[puts:] == [[[1, 2, 3], [4, 5]]] and state.pending_put is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_workers_own_steps_lead_into_stretches_and_back(tmp_path, layout):
    """After the worker's first steps every step runs on the plain path, its probes too, the
    output is the target's, and the books add up (`_serve`)."""
    books, state, corpus, path = _serve(tmp_path, layout, 60)
    # the worker's first steps (a request it has not looked up, the steps after the prefill),
    # then one stretch: its probes (every 1, 2, 4, ... steps, at most probe_max apart) run on it
    first = path.index("plain")
    assert first <= 4 and path[first:] == ["plain"] * (60 - first), "".join(p[0] for p in path)
    c = state.controller.counters
    assert c["plain_path_probes"] >= 3 and c["plain_path_stretches"] == 0
    # every lookup was the first lookup of the new requests (in the worker, behind the step in
    # flight) or a probe, one batch_get each
    assert len(corpus.gets) == c["behind_lookups"] + c["probe_lookups"]
    # the corpus was given output once a worker's step and once a probe on the path, never once a
    # step on the plain path (0.08 ms a step in the worker at bs 1 on one H200:
    # auto-floor-smollm2-tp1); one put per request each time
    assert len(corpus.puts) <= path.count("worker") + c["plain_path_probes"] < path.count("plain")
    assert all(len(x) == 2 for x in corpus.puts)
    # the controller saw the stretch's steps between two probes in one call (note_plain_path),
    # each probe as the worker's note_probe; the steps since the last lookup are counted when the
    # next lookup is due or the stretch ends
    assert c["plain_path_steps"] + state.stretch - state.noted == path.count("plain")
    assert c["steps"] == state.controller.step == c["lean_steps"] + c["behind_lookups"]
    # SGLang counts the worker's steps for each request's accept length when it processes them
    # (not modelled here); every step on the plain path is counted by the step itself
    assert [r.spec_verify_ct for r in books.reqs] == [path.count("plain")] * 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_batch_just_prefilled_starts_on_the_plain_path(tmp_path, layout):
    """The running batch was empty, and the prefill of its requests is the forward in flight (as at
    c=1, every request): where their first lookups may wait, the first decode step already runs
    on the plain path, the prefill's tokens written by it as by a plain server's first decode
    step, and they are looked up first by a probe on the path once the steps right after the
    prefill passed. Before, that step ran in the worker (0.5-0.86 ms over a plain server's step on
    one H200 at TP=1)."""
    books, state, corpus, path = _serve(tmp_path, layout, 40, draft=_wrong_drafts, in_flight=True,
                                        observed=True)
    assert path == ["plain"] * 40
    c = state.controller.counters
    assert c["plain_path_stretches"] == 0 and not state.path_refusals
    assert state.path_begun == {plain_path.BEGUN_AFTER_PREFILL: 1}
    assert [r.output_ids[0] for r in books.reqs] == [99, 99]
    assert [r.spec_verify_ct for r in books.reqs] == [40, 40]
    gets = [step for kind, step in corpus.events if kind == "get"]
    assert gets and gets[0] == auto.REFILL_STEPS and c["plain_path_probes"] == len(gets)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_first_probe_of_a_batch_just_prefilled_does_not_wait_for_credit(tmp_path, layout,
                                                                            monkeypatch):
    """A probe dearer than the probe credit: the new requests' first lookup, deferred to the
    path, is still made once the steps right after the prefill passed (a repeated prompt's drafts
    may pay from its first step; held for credit it came only probe_max steps after the last
    lookup: stretches of ~31 steps in a memorised load on one H100). The probes after it wait for
    credit again."""
    from fastverify.controller import Controller

    monkeypatch.setattr(Controller, "_plain_and_probe", lambda self, bs: (1.0, 0.5))
    books, state, corpus, path = _serve(tmp_path, layout, 40, draft=_wrong_drafts, in_flight=True,
                                        observed=True)
    assert path == ["plain"] * 40
    gets = [step for kind, step in corpus.events if kind == "get"]
    # the owed probe, then (its cost in debt, 0.002 ms of credit a step) the next one at probe_max
    probe_max = state.controller.cfg.probe_max
    assert gets == [auto.REFILL_STEPS, auto.REFILL_STEPS + probe_max]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("verify_ms", [1.5, 1e5])
def test_a_new_requests_probe_that_matched_in_full_owes_the_probe_that_scores_it(
        tmp_path, layout, verify_ms, monkeypatch):
    """The owed first probe finds drafts of the longest chain for requests the gain model does not
    trust yet: where such drafts accepted in full would pay (a verify pass of 1.5 ms against a
    1 ms step), the next probe comes once they are decided, whatever the credit (it scores them:
    a repeated prompt's first probe found its full match, and the probe that taught the model so
    came ~32 steps later, on one H200); once per request, then the probes wait for credit again,
    up to `probe_max` steps apart while the request's drafts were never scored and, once they were,
    up to the forced gap that keeps a probe (half a plain step here) within `probe_floor_share` of
    the plain steps' time. Where nothing could pay, no such probe."""
    import math

    from fastverify.controller import PROBE_STRETCH_MAX, Controller

    monkeypatch.setattr(Controller, "_plain_and_probe", lambda self, bs: (1.0, 0.5))
    table = {"decode_ms": {"1": 1.0, "8": 1.0}, "verify_ms": {"1": verify_ms, "64": verify_ms}}
    books, state, corpus, path = _serve(tmp_path, layout, 170, draft=lambda ctx: [1, 2, 3],
                                        in_flight=True, observed=True, table=table)
    assert path == ["plain"] * 170
    gets = [step for kind, step in corpus.events if kind == "get"]
    ctl = state.controller
    first, probe_max = auto.REFILL_STEPS, ctl.cfg.probe_max
    gap = min(math.ceil(0.5 / (ctl.cfg.probe_floor_share * 1.0)), PROBE_STRETCH_MAX * probe_max)
    assert gap == 125
    if verify_ms < 1e5:
        confirm = first + ctl.cfg.max_chain + 2
        assert gets == [first, confirm, confirm + gap]
        assert ctl.counters["confirming_probes"] == 1
    else:
        assert gets == [first, first + probe_max, first + probe_max + gap]
        assert ctl.counters["confirming_probes"] == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_requests_prefilled_one_after_another_start_on_the_plain_path_together(tmp_path, layout):
    """Two requests arrived one after the other: SGLang ran their prefills back to back and merged
    them before the first decode step (as at c=4). That step runs on the plain path as after one
    prefill of both, their outputs are the target's from their prefill's tokens on and the books
    add up; before, it ran in the worker (the last forward was the prefill of only one of them)."""
    books, state, corpus, path = _serve(tmp_path, layout, 40, draft=_wrong_drafts, in_flight=True,
                                        observed=True, staggered=True)
    assert path == ["plain"] * 40
    assert not state.path_refusals and state.prefill_rids == {"r0", "r1"}
    assert [r.output_ids[0] for r in books.reqs] == [99, 99]
    assert [r.spec_verify_ct for r in books.reqs] == [40, 40]


def test_a_prefill_after_a_decode_step_starts_the_prefills_afresh(tmp_path):
    """The requests of back-to-back prefills are gathered only until the next decode step: a
    prefill after one is a join, not part of the batch's first prefills."""
    w, state = _state(tmp_path)

    def forward(reqs, decode):
        # (the prefill's batch: what the worker's step reads before it returns for a prefill)
        return auto.plain_step(w, SimpleNamespace(
            reqs=[SimpleNamespace(rid=r) for r in reqs], spec_info=None,
            spec_algorithm=Algo.NGRAM, forward_mode=SimpleNamespace(is_decode=lambda: decode)))

    forward(["a"], False)
    forward(["b"], False)
    assert state.prefill_rids == {"a", "b"} and state.since_prefill == 0
    state.since_prefill = 1  # a decode step ran (on the path, or in the worker)
    forward(["c"], False)
    assert state.prefill_rids == {"c"}


def test_a_cold_server_looks_its_first_requests_up_in_the_worker(tmp_path):
    """The same, with a gain model that has observed nothing yet: the first lookups are real (they
    teach it), so the step after the prefill runs in the worker."""
    books, state, corpus, path = _serve(tmp_path, LAYOUTS[0], 40, draft=_wrong_drafts,
                                        in_flight=True, observed=False)
    assert path[0] == "worker" and "plain" in path
    assert state.path_refusals == {"the last forward verified or prefilled": 1}
    assert state.controller.counters["behind_lookups"] == 1


def _wrong_drafts(ctx):  # drafts that never match the target's output (`_nxt` is >= 100)
    return [1, 2]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_requests_that_join_a_stretch_stay_on_the_plain_path(tmp_path, layout):
    """A request whose prefill runs between two steps of a stretch joins the batch on the path
    (SGLang's merge, then the plain decode preparation): no step goes to the worker, the joined
    request's output is the target's from its prefill's token on, the KV books add up for all
    three, the stretch's output so far is put for the two requests that ran it, and the new
    request is looked up first by a probe on the path. Before, a join sent the batch to the worker
    for two steps, the first of them a real lookup (3.6-4.1 ms against 1.6 ms on the path, one
    H200 at TP=1)."""
    books, state, corpus, path = _serve(tmp_path, layout, 70, joins={30: ([9, 8, 7, 6, 5], 140)},
                                        draft=_wrong_drafts)
    first = path.index("plain")
    assert path[first:] == ["plain"] * (30 - first) + ["prefill"] + ["plain"] * 39, path
    c = state.controller.counters
    assert c["plain_path_joins"] == 1 and c["plain_path_stretches"] == 0
    joined = books.reqs[2]
    assert joined.output_ids[0] == 140 and len(joined.output_ids) == 1 + 39
    assert joined.spec_verify_ct == 39 and "r2" in state.features
    # at the join, the stretch's output so far went to the corpus for the requests that ran it
    puts = [step for kind, step in corpus.events if kind == "put"]
    assert puts.count(31) == 1 and len(corpus.puts[puts.index(31)]) == 2
    assert all(len(corpus.puts[i]) == 3 for i, step in enumerate(puts) if step > 31)
    # its first lookup: a probe on the path once the steps right after the prefill (31-33) passed
    gets = [step for kind, step in corpus.events if kind == "get"]
    after = [rids for rids, step in zip(corpus.gets, gets) if step > 30]
    assert min(step for step in gets if step > 30) == 31 + auto.REFILL_STEPS
    assert after and all(rids == ["r0", "r1", "r2"] for rids in after)
    assert c["plain_path_probes"] == sum(path[step] == "plain" for step in gets)
    # the steps the controller counted: every step on the path, before and after the join
    assert c["plain_path_steps"] + state.stretch - state.noted == path.count("plain")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_requests_join_one_after_another_and_the_stretch_goes_on(tmp_path, layout):
    """Two joins, the second right after the first one's refill steps: each new request's output is
    the target's from its prefill's token on, the books add up for all four, the second join puts
    the stretch's output for the three requests that ran it, and no step leaves the path."""
    books, state, corpus, path = _serve(tmp_path, layout, 60, joins={
        20: ([9, 8, 7, 6, 5], 140), 25: ([3, 1, 4, 1, 5, 9], 120)}, draft=_wrong_drafts)
    first = path.index("plain")
    assert "worker" not in path[first:] and path.count("prefill") == 2
    c = state.controller.counters
    assert c["plain_path_joins"] == 2 and c["plain_path_stretches"] == 0
    assert [r.output_ids[0] for r in books.reqs[2:]] == [140, 120]
    puts = [step for kind, step in corpus.events if kind == "put"]
    assert len(corpus.puts[puts.index(21)]) == 2 and len(corpus.puts[puts.index(26)]) == 3
    assert c["plain_path_steps"] + state.stretch - state.noted == path.count("plain")


@pytest.mark.parametrize("case", ["join", "after prefill"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_request_that_only_ever_ran_on_the_path_leaves_nothing_behind(tmp_path, layout, case):
    """A request whose every decode step ran on the path (it joined a stretch, or its batch started
    there after its prefill) was looked up only by probes there, each of which makes it a match
    state in the corpus (SGLang's `batch_get`). Once it finished, the next probe erases that state
    (as the worker's own steps erase those of the requests that left them) and the controller
    forgets it: a server whose steps all run on the path keeps nothing per finished request."""
    if case == "join":
        gone = "r2"
        books, state, corpus, path = _serve(tmp_path, layout, 100, finishes={60},
                                            joins={30: ([9, 8, 7, 6, 5], 140)},
                                            draft=_wrong_drafts)
        assert path[31:] == ["plain"] * 69
    else:
        gone = "r1"
        books, state, corpus, path = _serve(tmp_path, layout, 80, finishes={40}, in_flight=True,
                                            observed=True, draft=_wrong_drafts)
        assert path == ["plain"] * 80
    gets = [step for kind, step in corpus.events if kind == "get"]
    assert any(gone in rids for rids in corpus.gets)  # probed on the path: it had a state
    assert max(gets) > (60 if case == "join" else 40)  # and a probe came after it finished
    assert gone not in [r.rid for r in books.reqs]
    assert corpus.states == {r.rid for r in books.reqs}
    assert gone not in state.features and gone not in state.prev_rids


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_request_that_finishes_before_its_first_probe_is_forgotten(tmp_path, layout):
    """A request that joined a stretch and finished within the steps right after its prefill (no
    probe looked it up): the controller forgets it at the next probe all the same."""
    books, state, corpus, path = _serve(tmp_path, layout, 70, finishes={33},
                                        joins={30: ([9, 8, 7, 6, 5], 140)}, draft=_wrong_drafts)
    assert path[31:] == ["plain"] * 39 and state.controller.counters["plain_path_joins"] == 1
    assert all("r2" not in rids for rids in corpus.gets)
    assert max(step for kind, step in corpus.events if kind == "get") > 33
    assert "r2" not in state.features and "r2" not in state.prev_rids


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_step_counted_ahead_and_skipped_is_counted_once_across_a_join(tmp_path, layout):
    """0.5.23 may skip a decode step after `choose_path` (its memory check fails while requests
    finish in flight). Where that step was counted ahead (a lookup due: the probe it plans, or
    holds, counts it) and a prefill then joins the batch, the step that runs next is still counted
    once: the controller's step count, probe credit and steps since its last lookup stay exact."""
    w, state = _state(tmp_path, stretch_from_now=20, table=NEVER)
    state.controller.gain.version = 1
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], layout)
    assert _run_steps(w, state, books, 4) == ["spec", "plain", "plain", "plain"]
    ctl, b, sched = state.controller, books.batch, _scheduler(w, books)
    state.stretch_len = state.stretch  # the next lookup is due at this step
    ctl._probe_gap = 1
    plain_path.choose_path(sched, b)
    assert b.spec_algorithm.is_none() and state.noted == state.stretch + 1  # counted ahead
    # no decode step runs; a waiting request's prefill does, and joins the batch
    pb = books.prefill([9, 8, 7], 140)
    assert auto.plain_step(w, pb) is None
    books.process_one()
    books.merge(pb)
    plain_path.choose_path(sched, b)
    assert b.spec_algorithm.is_none() and ctl.counters["plain_path_joins"] == 1
    books.prepare_and_run()
    plain_path.step(w, b, state)
    books.process_one()
    # 3 steps on the path before, 1 after: 4 counted, or due to be (`_note`)
    assert ctl.counters["plain_path_steps"] + state.stretch - state.noted == 4


NEVER = {"decode_ms": {"1": 1.0, "8": 1.0}, "verify_ms": {"1": 1e5, "64": 1e5}}


def _joining(tmp_path, layout, table=NEVER, observed=True, top_k=None):
    """A stretch of two requests four steps long, every result processed, then a third request's
    prefill (through the worker's step, as `_serve` runs it) merged into the batch: the state and
    the scheduler as `choose_path` meets them."""
    w, state = _state(tmp_path, stretch_from_now=20, table=table)
    if observed:  # the gain model has seen drafts (before it has, first lookups are real)
        state.controller.gain.version = 1
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], layout)
    assert _run_steps(w, state, books, 4) == ["spec", "plain", "plain", "plain"]
    books.queue.append(("plain", [0, 0]))  # (_run_steps processed its last step: one in flight)
    pb = books.prefill([9, 8, 7], 140)
    if top_k is not None:
        pb.reqs[0].sampling_params = SimpleNamespace(top_k=top_k)
    assert auto.plain_step(w, pb) is None  # the prefill: no decode step
    books.process_one()
    books.merge(pb)
    return w, state, books, _scheduler(w, books)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_join_keeps_the_stretch_and_counts_its_steps_at_the_size_they_ran(tmp_path, layout,
                                                                             monkeypatch):
    w, state, books, sched = _joining(tmp_path, layout)
    ctl = state.controller
    steps, requests = ctl.counters["plain_path_steps"], ctl.counters["requests"]
    uncounted = state.stretch - state.noted
    asked_at = []  # the controller's step count where it is asked about the new request
    defer = ctl.defer_first_lookup
    monkeypatch.setattr(ctl, "defer_first_lookup", lambda rids: asked_at.append(ctl.step)
                        or defer(rids))
    step_before = ctl.step
    plain_path.choose_path(sched, books.batch)
    assert books.batch.spec_algorithm.is_none() and ctl.counters["plain_path_joins"] == 1
    assert ctl.counters["plain_path_stretches"] == 0
    # asked with the stretch's steps counted, as at any lookup
    assert asked_at == [step_before + uncounted]
    # the stretch's 3 steps so far reach the controller's books at batch size 2; the probe gap is
    # back to 1, but the lookup it makes due is a probe held through the steps right after the
    # prefill: the stretch runs them without asking; the new request has no draft yet
    assert state.stretch == state.noted == 3 and uncounted > 0
    assert ctl.counters["plain_path_steps"] == steps + uncounted
    assert ctl.counters["requests"] == requests + 2 * uncounted
    assert ctl._probe_gap == 1 and state.stretch_len == 3 + auto.REFILL_STEPS
    assert state.features["r2"] == ctl.no_draft("r2")
    # the stretch's output so far, put for the two requests that ran it (its last
    # max_trie_depth + 3 - 1 tokens each)
    assert state.put == 3
    assert w.ngram_corpus.puts[-1] == [(r.origin_input_ids + r.output_ids)[-8:]
                                       for r in books.reqs[:2]]
    assert state.path_timing is None  # no period holds the prefill


@pytest.mark.parametrize("top_k", [1, 20])
def test_a_joining_request_is_noted_as_sampling_or_greedy_before_its_first_lookup(tmp_path, top_k,
                                                                                 monkeypatch):
    """As the worker's step tells the controller whether a new request samples before its first
    lookup is decided, so does a join on the path: the full match is judged, and the features of
    no draft are made, as the request decodes."""
    w, state, books, sched = _joining(tmp_path, LAYOUTS[0], top_k=top_k)
    ctl = state.controller
    asked = []
    real = ctl.defer_first_lookup
    monkeypatch.setattr(ctl, "defer_first_lookup",
                        lambda rids: (asked.append(ctl.samples("r2")), real(rids))[1])
    plain_path.choose_path(sched, books.batch)
    assert books.batch.spec_algorithm.is_none()
    assert asked == [top_k > 1] and state.features["r2"].sampled is (top_k > 1)


def test_a_sampling_request_the_path_sent_to_the_worker_is_forgotten_if_it_leaves_first(tmp_path):
    """A join the path does not take (here: the gain model has seen no draft yet) has already told
    the controller that the new request samples. Where that request leaves the batch before the
    worker's step ever sees it (SGLang's memory check retracts it after `choose_path`, and it is
    aborted while it waits), the next sync forgets it all the same."""
    w, state, books, sched = _joining(tmp_path, LAYOUTS[0], observed=False, top_k=20)
    ctl = state.controller
    plain_path.choose_path(sched, books.batch)
    assert not books.batch.spec_algorithm.is_none() and ctl.samples("r2")
    auto._sync_requests(state, SimpleNamespace(reqs=books.reqs[:2]))  # r2 gone
    assert not ctl.samples("r2")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_batch_whose_host_lengths_the_merge_dropped_gets_the_committed_ones(tmp_path, layout):
    w, state, books, sched = _joining(tmp_path, layout)
    books.batch.seq_lens_cpu = None  # (SGLang's merge keeps host lengths only where both have them)
    plain_path.choose_path(sched, books.batch)
    assert books.batch.spec_algorithm.is_none()
    assert books.batch.seq_lens_cpu.tolist() == [books.committed(r) for r in books.reqs]


@pytest.mark.parametrize("case", ["reserved", "host lengths", "cold start", "full match pays"])
def test_a_join_the_path_cannot_take_ends_the_stretch_untouched(tmp_path, monkeypatch, case):
    """Where the new request's KV is not laid out as a plain server's (slots reserved past its
    length, or host lengths that are not the committed ones), where the gain model has seen no
    draft yet (its first drafts teach it), or where drafts that matched in full would be verified:
    the batch goes back to the worker as before, the controller's state and
    the corpus as they were (no join counted, no features, no probe gap changed)."""
    w, state, books, sched = _joining(tmp_path, LAYOUTS[0], observed=case != "cold start")
    b, ctl = books.batch, state.controller
    if case == "full match pays":  # (what the gain model says of full matches: test_controller)
        monkeypatch.setattr(ctl, "_full_match_wanted", lambda rids: True)
    if case == "reserved":
        books.reqs[2].kv.kv_allocated_len += 2
    if case == "host lengths":
        b.seq_lens_cpu = b.seq_lens_cpu + 1
    gap, puts = ctl._probe_gap, len(w.ngram_corpus.puts)
    requests, uncounted = ctl.counters["requests"], state.stretch - state.noted
    plain_path.choose_path(sched, b)
    assert not b.spec_algorithm.is_none()
    assert ctl.counters["plain_path_joins"] == 0 and ctl.counters["plain_path_stretches"] == 1
    # the stretch's steps counted at the batch size they ran at (2), not the merged one
    assert uncounted > 0 and ctl.counters["requests"] == requests + 2 * uncounted
    assert "r2" not in state.features and ctl._probe_gap == gap
    # (leaving holds the stretch's output back for every request of the batch, as before, to be
    # put after the worker's step has looked up)
    assert len(w.ngram_corpus.puts) == puts and len(state.pending_put) == 3


def test_a_prefill_between_two_steps_of_a_stretch_ends_the_timed_period(tmp_path):
    """A chunk of a long prompt's prefill may run between two steps of a stretch without changing
    its batch: the step timed before it is not recorded as a step on the path."""
    w, state = _state(tmp_path, stretch_from_now=20)
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], LAYOUTS[0])
    assert _run_steps(w, state, books, 2) == ["spec", "plain"]  # the stretch's step 0
    plain_path._time(state, 1, 2)  # step 1 starts: timed (`TIME_EVERY`)
    assert state.path_timing is not None
    auto.not_a_decode_step(state)
    plain_path._time(state, 2, 2)
    assert state.costs.samples(PATH, 2, 1) == 0


def test_the_probe_owed_to_deferred_first_lookups_waits_for_the_refill_alone(tmp_path):
    """`defer_first_lookup` owes the new requests a probe: in the worker (plan_lookup) and for a
    stretch (steps_without_lookup) it waits for the steps right after the prefill and the probe
    gap, not for credit; once made (or once any lookup is), probes wait for credit again."""
    c = auto.setup(_worker(), _spec(tmp_path, DEAR), plain=PLAIN).controller
    c._plain_and_probe = lambda bs: (1.0, 0.5)  # a probe far dearer than the credit
    c.gain.version = 1  # (the gain model has observed drafts: first lookups may wait)
    c._probe_gap, c._since_lookup, c._probe_credit = 8, 5, 0.0
    assert c.defer_first_lookup(["x"])
    views = [auto.RequestView("x", c.no_draft("x"))]
    assert c.steps_without_lookup(32, 256, ["x"], 1, refill_steps=3) == 3
    for j in range(3):
        assert not c.plan_lookup(views, 32, behind=True, refill=True)
        c.note_lean(1)
    assert c.plan_lookup(views, 32, behind=True) and c.planned == PLAN_PROBE
    assert c._probe_credit < 0  # in debt: the next probe waits for credit, up to probe_max
    c.note_probe(views)  # (found nothing: the gap doubles to 2)
    assert c.steps_without_lookup(32, 256, ["x"], 1) == 1
    assert not c.plan_lookup(views, 32, behind=True)
    c.note_lean(1)
    assert c.steps_without_lookup(32, 256, ["x"], 1) == 30
    assert not c.plan_lookup(views, 32, behind=True)
    # a real lookup pays the owed probe too
    assert c.defer_first_lookup(["y"])
    c._wanted = lambda requests: True
    assert c.plan_lookup(views, 32, behind=True) and c.planned != PLAN_PROBE
    del c._wanted
    c._probe_gap, c._since_lookup = 1, 5
    assert c.steps_without_lookup(32, 256, ["x"], 1) == 26


@pytest.mark.parametrize("credit", [1.0, 0.0])
def test_a_probe_held_right_after_a_prefill_leaves_room_for_a_stretch(tmp_path, credit):
    """plan_lookup holds a probe that could not pay in the steps right after a prefill (its
    ``refill``) as it holds one for want of credit: steps_without_lookup counts those steps too,
    so that a stretch does not ask the controller again at each of them (each ask is a gain
    evaluation or two on the host); the longer of the two holds counts. A lookup that would be a
    real one is not held."""
    c = auto.setup(_worker(), _spec(tmp_path, DEAR), plain=PLAIN).controller
    c._plain_and_probe = lambda bs: (1.0, 0.01)  # a plain step 1 ms, a probe adds 0.01 ms
    c._probe_gap, c._since_lookup, c._probe_credit = 1, 0, credit  # the probe is due now
    views = [auto.RequestView("x", c.no_draft("x"))]
    n = c.steps_without_lookup(32, 256, ["x"], 1, refill_steps=3)
    assert n == (3 if credit else 5)  # (without credit it grows by 0.002 ms a step)
    for j in range(n):
        assert not c.plan_lookup(views, 32, behind=True, refill=j < 3)
        c.note_lean(1)
    assert c.plan_lookup(views, 32, behind=True)
    assert c.planned == PLAN_PROBE
    # a probe not due yet: held past its gap by the steps right after the prefill
    c._probe_gap, c._since_lookup, c._probe_credit = 3, 0, 1.0
    assert c.steps_without_lookup(32, 256, ["x"], 1, refill_steps=4) == 4
    assert c.steps_without_lookup(32, 256, ["x"], 1, refill_steps=1) == 2
    # a real lookup due: not held
    c._full_match_wanted = lambda rids: True
    assert c.steps_without_lookup(32, 256, ["x"], 1, refill_steps=3) == 2
    c._since_lookup = 2
    assert c.steps_without_lookup(32, 256, ["x"], 1, refill_steps=3) == 0


def test_a_probe_held_for_want_of_credit_leaves_room_for_a_stretch(tmp_path):
    """Past the probe gap a probe that could not pay waits until the probe credit covers it: those
    steps make no lookup either, and steps_without_lookup counts them as plan_lookup holds them."""
    c = auto.setup(_worker(), _spec(tmp_path, DEAR), plain=PLAIN).controller
    c._plain_and_probe = lambda bs: (1.0, 0.01)  # a plain step 1 ms, a probe adds 0.01 ms
    c._probe_gap, c._since_lookup, c._probe_credit = 4, 3, 0.0  # the probe is due now
    views = [auto.RequestView("x", c.no_draft("x"))]
    n = c.steps_without_lookup(32, 256, ["x"], 1)
    assert n == 5  # the credit grows by 0.002 ms a step
    for _ in range(n):
        assert not c.plan_lookup(views, 32, behind=True)
        c.note_lean(1)
    assert c.plan_lookup(views, 32, behind=True)
    # never past probe_max steps since the last lookup
    c._since_lookup, c._probe_credit = 29, -1.0
    assert c.steps_without_lookup(32, 256, ["x"], 1) == 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_probes_on_the_path_that_find_paying_drafts_send_the_batch_back_to_the_worker(
        tmp_path, layout, caplog, monkeypatch):
    """The output starts to repeat itself: the corpus' drafts are what the requests go on to
    write (an oracle: the books hand each of the two requests every other token). The probes on
    the path are scored as they would have been in the worker; once the gain model expects a
    verify to pay, the next lookup is a real one and the batch goes back to the worker for it."""
    # a verify of 8 tokens 2.5x a decode step: it pays only where drafts are mostly accepted,
    # which the gain model does not expect before it has seen any
    table = {"decode_ms": {"1": 10, "64": 12}, "verify_ms": {"1": 10, "8": 25, "256": 900}}
    w, state = _state(tmp_path, stretch_from_now=2, table=table,
                      corpus=Corpus(draft=lambda ctx: [ctx[-1] + 2 * j for j in range(1, K)]))
    assert not state.controller._full_match_wanted(["r0", "r1"])
    now = [0.0]

    def clock():  # a step on the path costs what the table's decode step does (10 ms)
        now[0] += 0.010
        return now[0]

    state.clock = clock
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], layout)
    caplog.set_level("INFO", logger="fastverify.plain_path")
    monkeypatch.setattr(plain_path, "LOG_EVERY_S", 0.0)  # a line at every stretch's end
    path = _run_steps(w, state, books, 40)
    c = state.controller.counters
    back = path.index("spec", 1)
    assert path[1:back] == ["plain"] * (back - 1) and c["plain_path_probes"] >= 1
    assert c["plain_path_stretches"] == 1
    assert "the last one ended: a lookup is due" in caplog.text
    # with the probes' host time on the path, median by batch size (the fake clock: 10 ms a call)
    probes = state.costs.medians_by_bs(PATH_PROBE)
    assert list(probes) == [2] and probes[2] > 0
    assert f"a probe on it, ms by batch size: {{2: {round(probes[2], 3)}}}" in caplog.text
    # what came before the stretch, why it ended, and the probes held for want of credit
    assert state.path_begun == {plain_path.BEGUN_AFTER_PLAIN: 1}
    assert state.path_ended == {"a lookup is due": 1}
    assert (f"begun: {{\"after a worker's plain step\": 1}}; ended: {{'a lookup is due': 1}}; "
            f"probes held: {c['probes_held']}; a probe on it") in caplog.text
    # the requests' drafts were scored: the gain model expects drafts that match in full to pay
    assert state.controller._full_match_wanted(["r0", "r1"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_stretch_whose_batch_emptied_is_counted_when_the_next_batch_comes(tmp_path, layout):
    """SGLang drops a running batch whose requests all finished before it asks choose_path: a
    stretch that ends so is closed by the next batch's first choice (its steps counted)."""
    w, state = _state(tmp_path, stretch_from_now=20)
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], layout)
    path = _run_steps(w, state, books, 6)
    assert path == ["spec"] + ["plain"] * 5 and state.stretch == 5 and state.path_bs == 2
    steps = state.controller.step
    # the next requests' batch, after their prefill (speculative, not looked up yet)
    nxt = Books([[9, 9, 9]], layout)
    plain_path.choose_path(_scheduler(w, nxt), nxt.batch)
    c = state.controller.counters
    assert state.controller.step == steps + 5 and c["plain_path_steps"] == 5
    assert c["plain_path_stretches"] == 1 and state.stretch == state.noted == 0
    assert state.path_ended == {plain_path.FINISHED: 1}
    assert nxt.batch.spec_algorithm is Algo.NGRAM  # (its request is looked up in the worker first)


@pytest.mark.parametrize("ranks", [1, 2])
def test_probes_on_the_path_share_the_costs_at_the_workers_cadence(tmp_path, ranks, monkeypatch):
    """The controller's copy of the costs is refreshed at a probe on the path only once
    cost_sync_steps of the controller's steps passed since the last refresh, not at every probe
    (a new copy makes the controller's kept answers miss); with TP > 1 from rank 0's, broadcast
    at the same steps on every rank."""
    w, state = _state(tmp_path, stretch_from_now=0)
    ctl = state.controller
    synced, snapshots = [], []
    if ranks > 1:
        state.sync_costs = lambda costs: (synced.append(ctl.step), costs)[1]
    real_probe = plain_path._probe

    def probe(*a):
        before = ctl.costs
        real_probe(*a)
        if ctl.costs is not before:
            snapshots.append(ctl.step)

    monkeypatch.setattr(plain_path, "_probe", probe)
    books = Books([[1, 2, 3], [4, 5, 6, 7, 8]], LAYOUTS[0])
    _run_steps(w, state, books, 300)
    probes = ctl.counters["plain_path_probes"]
    assert probes >= 10
    every = ctl.cfg.cost_sync_steps
    assert 2 <= len(snapshots) <= 300 // every + 1 < probes
    assert all(b - a >= every for a, b in zip(snapshots, snapshots[1:]))
    assert synced == ([] if ranks == 1 else snapshots)


def test_the_probe_cost_is_the_larger_of_the_workers_and_the_plain_paths(tmp_path):
    """A probe on the plain path adds its host time to its step (where the host sets the pace):
    measured there (PATH_PROBE), it is what the probe credit weighs, unless the worker's probe steps
    measure more over plain ones."""
    c = auto.setup(_worker(), _spec(tmp_path, DEAR), plain=PLAIN).controller
    assert c.probe_cost(1) == 0.0  # nothing measured yet
    costs = c.costs
    for _ in range(3):
        costs.record(PATH_PROBE, 1, 1, 0.6)
    assert c.probe_cost(1) == pytest.approx(0.6) and c.probe_cost(2) == 0.0
    for ms in (10.0, 10.0, 10.0):
        costs.record(LEAN, 1, 1, ms)
        costs.record(PROBE, 1, 1, ms + 0.9)
    assert c.probe_cost(1) == pytest.approx(0.9)


def test_the_steps_in_the_middle_of_a_stretch_run_no_import_and_no_generator(tmp_path):
    """The host work every step on the path pays, pinned: the functions that run for a step in the
    middle of a stretch (found by profiling one: the path choice and the step around the forward)
    hold no import statement (0.65 us each on the CPU host, against 0.03 for a module-level name)
    and enter no generator context manager (the runtime swap through `plain_algorithm` cost 1.1 us
    against 0.17 for one try/finally; `lab/path_host_time.py` measures both)."""
    import dis
    import sys

    w, state = _state(tmp_path, stretch_from_now=10 ** 6)
    books = Books([[1, 2, 3]] * 4, "0.5.16")
    _run_steps(w, state, books, 3)
    sched, batch = _scheduler(w, books), books.batch
    assert batch.spec_algorithm.is_none()  # in the middle of a stretch
    state.stretch_len = 10 ** 12
    called = []

    def profile(frame, event, arg):
        if event == "call":
            called.append(frame.f_code)

    sys.setprofile(profile)
    try:
        plain_path.choose_path(sched, batch)
        plain_path.worker_step(w, batch)
    finally:
        sys.setprofile(None)
    ours = {c for c in called if c.co_filename == plain_path.__file__}
    assert {c.co_name for c in ours} >= {"choose_path", "worker_step", "step", "_time"}
    importing = {c.co_name for c in ours
                 if any(i.opname == "IMPORT_NAME" for i in dis.get_instructions(c))}
    assert not importing, f"per-step functions with an import statement: {sorted(importing)}"
    generators = {c.co_name for c in called if c.co_filename.endswith("contextlib.py")}
    assert not generators, f"a context manager entered per step: {sorted(generators)}"


@pytest.mark.parametrize("case", ["finish mid-stretch", "join after a finish"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_request_that_finishes_on_the_path_gives_the_corpus_its_last_output(tmp_path, layout,
                                                                              case, monkeypatch):
    """A request that finished on the path: the corpus gets its output since the stretch's last
    put, as it gets the running requests' at the next put (without it the last up to probe_max
    tokens of every reply that ended on the path stayed out of the corpus, and a repeated prompt
    decoded them without drafts again). Its puts cover its output to the end, without a gap."""
    puts = []  # (request, its output length at the put, tokens given)
    put_stretch = plain_path._put_stretch

    def recorded(worker, reqs, n):
        for r in reqs:
            puts.append((r, len(r.output_ids), worker.max_trie_depth + n - 1 if n > 0 else 0))
        put_stretch(worker, reqs, n)

    monkeypatch.setattr(plain_path, "_put_stretch", recorded)
    finished = []
    finish_last = Books.finish_last
    monkeypatch.setattr(Books, "finish_last",
                        lambda self: finished.append(finish_last(self)) or finished[-1])
    joins = {47: ([9, 8, 7, 6, 5], 140)} if case == "join after a finish" else None
    books, state, corpus, path = _serve(tmp_path, layout, 80, finishes={45}, joins=joins,
                                        in_flight=True, observed=True, draft=_wrong_drafts)
    assert "worker" not in path
    (gone,) = finished
    mine = [(at, given) for r, at, given in puts if r is gone]
    assert mine and mine[-1][0] == len(gone.output_ids), mine  # its last put reaches its end
    covered = 0  # output positions given so far (a put gives the last `given` tokens)
    for at, given in mine:
        assert at - given <= covered, (mine, covered)
        covered = at
    assert covered == len(gone.output_ids) > 40


def test_a_batch_that_emptied_on_the_path_gives_the_corpus_its_last_output(tmp_path):
    """The stretch's batch emptied (every request finished on the path): the corpus gets their
    output since the stretch's last put when the next batch comes (`_emptied`)."""
    w, state = _state(tmp_path)
    reqs = [SimpleNamespace(rid=f"r{i}", origin_input_ids=[1, 2, 3], output_ids=list(range(10, 30)))
            for i in range(2)]
    state.path_reqs, state.stretch, state.put, state.path_bs = reqs, 12, 5, 2
    plain_path._emptied(state, w)
    depth = w.max_trie_depth
    assert w.ngram_corpus.puts == [[list(range(10, 30))[-(depth + 7 - 1):]] * 2]
    assert state.stretch == 0 and state.path_reqs is None
