"""A diagnostic launcher of the patched SGLang server: what auto's gain model learns from, against
what its verified drafts accept, per feature bucket.

    python3 lab/gpu/draftlog.py [sglang.launch_server arguments]   (as SGLANG_LAUNCH)

Every draft the auto glue resolves (`fastverify.gains.ShadowTracker.advance_tagged`: a draft is
scored against what its request then produced, verified or not) is counted in its feature bucket
(`gains.feature_bucket`: matched depth, root branches; sampled apart), split into the drafts that
were verified (their tag holds what the controller expected of them and the tokens verified) and
the others (looked up and scored only: the model's lessons). Every `FV_DRAFTLOG_S` seconds (default
30) each process logs one line per bucket seen since its start:

    draftlog: bucket (3, 1) greedy: scored 412 mean 2.41 | verified 37 expected 2.88 accepted 0.62

If the scored drafts' mean in a bucket is near what its verified drafts accepted, the model's
expectation is off for another reason (forgetting, blending with other buckets, the calibration);
if the verified drafts accept far less than the same bucket's scored drafts, the drafts that get
verified differ from those the model learns from. A diagnosis, never a measurement of speed: the
counting adds host time to every resolved draft.

Installed at import, so the scheduler processes, which the multiprocessing start method "spawn"
starts by importing this file again, count as well.
"""
import logging
import os
import sys
import time

logger = logging.getLogger("fastverify.lab.draftlog")
MARK = "_fastverify_draftlog"


class Tally:
    """Per (bucket, sampled): scored drafts (count, sum of accepted tokens) and verified drafts
    (count, sum of expected, sum of accepted capped at the tokens verified)."""

    def __init__(self, bucket_of, clock=time.monotonic, every_s: float = 30.0, say=None):
        self.bucket_of = bucket_of
        self.clock, self.every_s = clock, every_s
        self.say = say or logger.warning
        self.rows: dict = {}
        self.last = clock()

    def add(self, features, chain_accept: int, tag) -> None:
        key = (self.bucket_of(features), bool(getattr(features, "sampled", False)))
        r = self.rows.setdefault(key, [0, 0.0, 0, 0.0, 0.0])
        if tag is None:
            r[0] += 1
            r[1] += chain_accept
        else:
            expected, verified = float(tag[0]), int(tag[1])
            r[2] += 1
            r[3] += expected
            r[4] += min(chain_accept, verified)

    def lines(self) -> list:
        out = []
        for (bucket, sampled), (n, acc, m, exp, vacc) in sorted(self.rows.items()):
            mode = "sampled" if sampled else "greedy"
            scored = f"scored {n} mean {acc / n:.2f}" if n else "scored 0"
            verified = (f"verified {m} expected {exp / m:.2f} accepted {vacc / m:.2f}" if m
                        else "verified 0")
            out.append(f"draftlog: bucket {bucket} {mode}: {scored} | {verified}")
        return out

    def maybe_log(self) -> None:
        now = self.clock()
        if now - self.last < self.every_s:
            return
        self.last = now
        for line in self.lines():
            self.say(line)


def install(tracker_cls=None, tally: Tally = None) -> Tally:
    """Count every draft that ``tracker_cls.advance_tagged`` (default: fastverify's ShadowTracker)
    resolves into ``tally`` (default: a new one logging every FV_DRAFTLOG_S seconds). Returns the
    tally in use; a second call returns the first one's."""
    from fastverify import gains

    cls = tracker_cls or gains.ShadowTracker
    stock = cls.advance_tagged
    if getattr(stock, MARK, None) is not None:
        return getattr(stock, MARK)
    tally = tally or Tally(gains.feature_bucket,
                           every_s=float(os.environ.get("FV_DRAFTLOG_S", "30")))

    def advance_tagged(self, req_id, tokens, length=None):
        done = stock(self, req_id, tokens, length)
        for features, ca, _ta, tag in done:
            tally.add(features, ca, tag)
        if done:
            tally.maybe_log()
        return done

    setattr(advance_tagged, MARK, tally)
    cls.advance_tagged = advance_tagged
    print("draftlog: counting resolved drafts per feature bucket (lab/gpu/draftlog.py; a "
          "diagnosis, not a measurement)", file=sys.stderr, flush=True)
    return tally


if __name__ in ("__main__", "__mp_main__"):
    install()

if __name__ == "__main__":
    from launcher import serve  # this folder's launcher.py

    serve()
