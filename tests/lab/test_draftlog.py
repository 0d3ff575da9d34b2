"""lab/gpu/draftlog.py: every resolved draft counted in its feature bucket, verified drafts apart
with what was expected of them, and one log line per bucket at most every FV_DRAFTLOG_S."""
import draftlog
from fastverify.gains import DraftFeatures, ShadowTracker, feature_bucket


class Tracker(ShadowTracker):  # a subclass: the real class stays as it is for the other tests
    pass


def test_scored_and_verified_drafts_are_counted_apart_per_bucket():
    now = [0.0]
    said = []
    tally = draftlog.Tally(feature_bucket, clock=lambda: now[0], every_s=30.0, say=said.append)
    assert draftlog.install(Tracker, tally) is tally
    assert draftlog.install(Tracker) is tally  # once
    t = Tracker()
    long, short = DraftFeatures(3, 1), DraftFeatures(1, 2, sampled=True)
    t.record("a", 0, long, [5, 6, 7])      # scored only: accepts 2 (5, 6; then 9 != 7)
    t.record("a", 1, long, [6, 7, 8])      # verified 2 tokens, expected 2.5: accepts 1 (6)
    t.tag_last("a", (2.5, 2))
    t.record("b", 0, short, [4])           # sampled, scored only: accepts 1
    assert len(t.advance_tagged("a", [5, 6, 9])) == 2
    assert t.advance("b", [4]) == [(short, 1, None)]  # advance() goes through the count too
    rows = tally.rows
    assert rows[(feature_bucket(long), False)] == [1, 2.0, 1, 2.5, 1.0]
    assert rows[(feature_bucket(short), True)] == [1, 1.0, 0, 0.0, 0.0]
    assert said == []  # not 30 s yet
    now[0] = 31.0
    t.record("a", 3, long, [1, 2, 3])
    t.tag_last("a", (4.0, 1))              # verified 1 token: its 3 capped at 1
    t.advance_tagged("a", [5, 6, 9, 1, 2, 3])
    assert rows[(feature_bucket(long), False)] == [1, 2.0, 2, 6.5, 2.0]
    assert sorted(said) == sorted([  # one line per bucket (in the buckets' order)
        f"draftlog: bucket {feature_bucket(long)} greedy: scored 1 mean 2.00 | verified 2 "
        "expected 3.25 accepted 1.00",
        f"draftlog: bucket {feature_bucket(short)} sampled: scored 1 mean 1.00 | verified 0"])
    now[0] = 40.0
    t.record("b", 1, short, [9])
    t.advance("b", [4, 9])
    assert len(said) == 2  # the next lines come 30 s after these
