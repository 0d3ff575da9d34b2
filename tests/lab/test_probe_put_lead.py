"""lab/probe_put_lead.py drives SGLang's corpus as the plain path does: each cycle puts the output
since the last put `lead` steps before its probe (the last depth + n - 1 tokens a request), the
probe waits for the pending inserts and then looks up; the baseline (lead 1) and `put_lead` cycles
alternate, and the JSON carries both with the environment and the repro command."""
import json

import probe_put_lead

from fastverify.glue.plain_path import put_lead


class Recorder:
    """The corpus' calls, with the step count the benchmark's busy wait advanced."""

    def __init__(self, *a, **k):
        self.calls = []
        Recorder.last = self

    def batch_put(self, contexts):
        self.calls.append(("put", [len(c) for c in contexts], [c[-1] for c in contexts]))

    def synchronize(self):
        self.calls.append(("sync",))

    def batch_get(self, rids, contexts, totals):
        self.calls.append(("get", list(rids), [len(c) for c in contexts], list(totals)))

    def erase_match_state(self, rids):
        self.calls.append(("erase", list(rids)))


def test_each_cycle_puts_lead_steps_before_its_probe(monkeypatch, tmp_path):
    import sglang.srt.speculative.cpp_ngram.ngram_corpus as nc

    steps = []
    monkeypatch.setattr(nc, "NgramCorpus", Recorder)
    monkeypatch.setattr(probe_put_lead, "spin", lambda ms: steps.append(ms))
    out = tmp_path / "r.json"
    assert probe_put_lead.main(["--bs", "4", "--interval", "8", "--cycles", "4", "--depth", "5",
                                "--prompt", "10", "--warm", "0", "--step-ms", "0.5",
                                "--json", str(out)]) == 0
    calls = Recorder.last.calls
    assert calls[0] == ("sync",)  # after the warm-up puts (none here)
    calls = calls[1:]
    # the prompts' put, then the insert alone timed twice (cycles // 4 + 1): a put of 8 steps'
    # output (depth 5 + 8 - 1 tokens a request), each waited for at once
    assert calls[0][0] == "put" and calls[0][1] == [10] * 4 and calls[1] == ("sync",)
    assert [c[0] for c in calls[2:6]] == ["put", "sync", "put", "sync"]
    assert calls[2][1] == calls[4][1] == [12] * 4
    end = calls.index(("erase", [f"bs4-{i}" for i in range(4)]))
    cycles, leave = calls[6:end], calls[end + 1:]
    assert put_lead(4) == 4
    # A B B A: leads 1, 4, 4, 1; every cycle is a put, then the probe's wait and lookup
    assert [c[0] for c in cycles] == ["put", "sync", "get"] * 4
    # each put covers the steps since the last one: 8 (lead 1: at step 7 of 8), 0 + 5 (lead 4: at
    # step 4), 3 + 5, 3 + 8 (depth 5 + n - 1 tokens a request)
    assert [c[1] for c in cycles[0::3]] == [[5 + n - 1] * 4 for n in (8, 5, 8, 11)]
    # each probe looks up every request's last depth tokens, at its total length
    assert all(c[1] == [f"bs4-{i}" for i in range(4)] and c[2] == [5] * 4 for c in cycles[2::3])
    totals = [c[3][0] for c in cycles[2::3]]
    assert totals == [10 + 2 * 8 + 8 * k for k in (1, 2, 3, 4)]
    # then the cycles that end in a real lookup (after the prompts' put): the early put 4 steps
    # before, then A B B A: the rest put before the lookup, or after it; each lookup's match
    # state erased
    assert leave[:2] == [("put", [10] * 4, leave[0][2]), ("sync",)]
    kinds = [c[0] for c in leave[2:]]
    assert kinds == (["put", "put", "sync", "get", "erase"] + ["put", "sync", "get", "put", "erase"]
                     * 2 + ["put", "put", "sync", "get", "erase"])
    # each cycle's early put (at step 4 of 8: 5 steps, depth 5 + 5 - 1 tokens a request), then
    # the rest (the 3 steps after it: 5 + 3 - 1)
    assert [c[1] for c in leave[2:] if c[0] == "put"] == [[9] * 4, [7] * 4] * 4
    assert len(steps) == 2 * 4 * 8 and set(steps) == {0.5}
    data = json.loads(out.read_text())
    assert [(r["bs"], r["lead"], r["baseline"], r["probes"]) for r in data["rows"]] == [
        (4, 1, True, 2), (4, 4, False, 2)]
    assert [(r["bs"], r["order"], r["lookups"]) for r in data["real_lookups"]] == [
        (4, "put first", 2), (4, "look up first", 2)]
    assert data["environment"]["capacity"] == 10_000_000
    assert data["repro_command"].startswith("python lab/probe_put_lead.py --bs 4")


def test_a_real_corpus_run_times_both_leads(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert probe_put_lead.main(["--capacity", "20000", "--bs", "1,4", "--interval", "6",
                                "--cycles", "4", "--step-ms", "0.05", "--warm", "2",
                                "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["bs"], r["lead"]) for r in rows] == [(1, 1), (1, put_lead(1)), (4, 1), (4, 4)]
    assert all(r["wait_median_us"] > 0 and r["insert_alone_us"] > 0 for r in rows)
    assert "(baseline: the put one step before)" in capsys.readouterr().out


def test_bad_batch_sizes_are_refused(capsys):
    for bad in ("x", "0", ""):
        try:
            probe_put_lead.main(["--bs", bad])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"--bs {bad!r} was accepted")
    assert "--bs" in capsys.readouterr().err

