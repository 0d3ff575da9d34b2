"""What a verify pass and a whole decode step cost: the inputs of the auto
controller's rate (controller.py).

- `CostTable`: measured GPU pass times, t_decode(bs) for a plain decode step of bs requests and
  t_verify(tokens) for a target-verify pass of that many tokens (all requests together),
  piecewise-linear between the measured points. Calibrated at server start (`calibrate`,
  glue/auto.py) or read from a JSON file (`load_cost_table`, `parse_cost_table`: the flag's own
  form, a result carrying it, or the all-reduce microbenchmark's --json). The replay tool's
  one-stream view of the same table: `CostTable.single_stream`.
- `StepCosts`: the whole step as the server's host clock sees it (graph replay plus the
  host's part around it), per kind of step (LEAN: no lookup, SPEC: drafts looked up, PROBE:
  looked up behind a plain step, PATH: a step on the server's own decode path).
"""
from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence


class CostTableError(ValueError):
    """A cost table (flag or file) that cannot be used; the message names its source and the key."""


# -------------------------------------------------------------------------------------------- costs
def _positive(value, where: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value <= 0):
        raise CostTableError(f"{where} must be a positive number of milliseconds, got {value!r}")
    return float(value)


def _points(obj, key: str, source: str) -> tuple:
    if not isinstance(obj, Mapping) or not obj:
        raise CostTableError(f"{source}: '{key}' must be a non-empty object mapping a count to "
                             "milliseconds")
    pts = []
    for k, v in obj.items():
        try:
            n = int(k)
        except (TypeError, ValueError):
            raise CostTableError(f"{source}: '{key}' key {k!r} is not an integer count") from None
        if n < 1 or str(n) != str(k).strip():
            raise CostTableError(f"{source}: '{key}' key {k!r} must be an integer >= 1")
        pts.append((n, _positive(v, f"{source}: '{key}'[{k!r}]")))
    return tuple(sorted(pts))


def interp(pts: tuple, x: float) -> float:
    """Piecewise-linear in x; flat below the first point; linear extrapolation from the last two
    points above the last one (never below the last value)."""
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if len(pts) == 1:
        return pts[0][1]
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return max(y1, y1 + (y1 - y0) * (x - x1) / (x1 - x0))


@dataclass(frozen=True)
class CostTable:
    """Measured pass times. decode: ((bs, ms), ...) for a plain decode step of bs requests; verify:
    ((tokens, ms), ...) for a target-verify pass of that many tokens (all requests together)."""

    decode: tuple
    verify: tuple
    source: str = "<cost table>"

    def decode_ms(self, bs: int) -> float:
        return interp(self.decode, bs)

    def verify_ms(self, tokens: int) -> float:
        return interp(self.verify, tokens)

    def verify_step_ms(self, bs: int, width: int, tokens: int) -> float:
        """A verify step of bs requests at `width` tokens each, `tokens` in the pass (a
        table knows only tokens)."""
        return self.verify_ms(tokens)

    # the replay tool's one-stream view: decode_ms(1) is a step without speculation,
    # measured_pass_ms(n) one with a pass of n tokens
    def single_stream(self) -> "CostTable":
        """This table, where it can model one stream (it has a decode time for one request)."""
        if self.decode[0][0] != 1:
            raise CostTableError(f"{self.source}: no decode time for one request (the smallest "
                                 f"decode entry is {self.decode[0][0]}); add bs 1 (or, from the "
                                 f"microbenchmark, a 1-token pass)")
        return self

    def measured_pass_ms(self, tokens: int) -> float:
        """A pass of `tokens` that never leaves the measured range (a prediction, where `verify_ms`
        must answer for any batch and extrapolates): a verify entry as given, 1 token a decode of
        one request, linear between two verify entries, and an error outside them."""
        for n, ms in self.verify:
            if n == tokens:
                return ms
        if tokens == 1:
            return self.decode_ms(1)
        lo, hi = self.verify[0][0], self.verify[-1][0]
        if tokens < lo or tokens > hi:
            raise CostTableError(f"{self.source}: no verify time for {tokens} tokens (table covers "
                                 f"{lo}..{hi} tokens); add an entry for {tokens}")
        return self.verify_ms(tokens)

    def scaled(self, verify: float = 1.0, decode: float = 1.0) -> "CostTable":
        return CostTable(tuple((n, ms * decode) for n, ms in self.decode),
                         tuple((n, ms * verify) for n, ms in self.verify), self.source)

    def to_json(self) -> dict:
        return {"decode_ms": {str(n): ms for n, ms in self.decode},
                "verify_ms": {str(n): ms for n, ms in self.verify}, "source": self.source}


def parse_cost_table(obj, source: str = "<cost table>", backend: Optional[str] = None,
                     pick_backend: str = "PATH#backend") -> CostTable:
    """Accepted JSON forms (keys are counts; values milliseconds):

    1. {"decode_ms": {"<bs>": ms, ...}, "verify_ms": {"<tokens in the pass>": ms, ...}}
    2. the same with a scalar "decode_ms" (one stream: decode of bs=1, the replay tool's form);
    3. a result that carries form 1 under the key "cost_table";
    4. benchmark/allreduce_vs_compute.py's --json: summary.rows of {backend, tokens, pass_us} (a
       CUDA-graph median of one modeled pass of that many tokens; it stands for decode of bs =
       tokens as well). With several backends in the file, name one: `PATH#backend`
       (load_cost_table) or `backend=`; `pick_backend` is how the error message tells the user to
       name one (the replay tool has its own flag for it).
    """
    if isinstance(obj, Mapping) and "cost_table" in obj and "verify_ms" not in obj:
        return parse_cost_table(obj["cost_table"], f"{source} ['cost_table']")
    if (isinstance(obj, Mapping) and isinstance(obj.get("summary"), Mapping)
            and "rows" in obj["summary"]):
        return _from_microbenchmark(obj["summary"]["rows"], source, backend, pick_backend)
    if not isinstance(obj, Mapping):
        raise CostTableError(f"{source}: expected a JSON object with 'decode_ms' and 'verify_ms'")
    for key in ("decode_ms", "verify_ms"):
        if key not in obj:
            raise CostTableError(
                f"{source}: missing key '{key}' (format: {{\"decode_ms\": {{\"1\": 12.2, \"8\": "
                f"12.9}}, \"verify_ms\": {{\"2\": 14.8, \"8\": 30.0}}}})")
    dec = obj["decode_ms"]
    decode = ((1, _positive(dec, f"{source}: 'decode_ms'")),) if not isinstance(dec, Mapping) else \
        _points(dec, "decode_ms", source)
    return CostTable(decode, _points(obj["verify_ms"], "verify_ms", source), source)


def _from_microbenchmark(rows, source: str, backend: Optional[str], pick_backend: str) -> CostTable:
    usable = [r for r in rows if isinstance(r, Mapping) and not r.get("error") and r.get("pass_us")]
    backends = sorted({str(r.get("backend")) for r in usable if r.get("backend")})
    if not backends:
        raise CostTableError(f"{source}: the microbenchmark result has no rows with a pass time "
                             "(pass_us)")
    if backend is None and len(backends) > 1:
        raise CostTableError(f"{source}: several all-reduce backends; name one as {pick_backend} "
                             f"({', '.join(backends)})")
    backend = backend or backends[0]
    if backend not in backends:
        raise CostTableError(f"{source}: backend {backend!r} not in the file; allowed: "
                             f"{', '.join(backends)}")
    pts = tuple(sorted((int(r["tokens"]),
                        _positive(float(r["pass_us"]) / 1000.0, f"{source}: pass_us"))
                       for r in usable if r.get("backend") == backend))
    return CostTable(pts, pts, f"{source} [{backend}]")


def load_cost_table(path, flag: str = "--speculative-ngram-auto-cost-table",
                    backend: Optional[str] = None, pick_backend: str = "PATH#backend") -> CostTable:
    """A cost table from a JSON file (`parse_cost_table`'s forms). `PATH#backend` names
    the microbenchmark backend, or `backend=`; `flag` names the option the path came from
    in every error message."""
    path, _, named = str(path).partition("#")
    backend = backend or named or None
    p = Path(path)
    if not p.is_file():
        raise CostTableError(f"{flag} {path}: file not found")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CostTableError(f"{flag} {path}: not valid JSON ({e.msg} at line "
                             f"{e.lineno})") from None
    return parse_cost_table(obj, f"{flag} {path}", backend, pick_backend)


def calibrate(time_pass: Callable[[str, int], float], decode_bs: Sequence[int],
              verify_tokens: Sequence[int],
              repeats: int = 5, budget_s: float = 20.0, clock: Callable[[], float] = time.monotonic,
              log: Optional[Callable[[str], None]] = None,
              source: str = "calibration") -> CostTable:
    """Build a cost table from `time_pass(kind, n) -> ms` ("decode", bs) / ("verify", tokens), e.g.
    a replay of the server's captured CUDA graph timed with CUDA events. Median of `repeats` per
    point; points are measured small to large and measurement stops at `budget_s` (the points taken
    so far are kept; at least one of each kind must fit or this raises)."""
    if repeats < 1:
        raise ValueError(f"calibration repeats must be >= 1, got {repeats}")
    t0 = clock()
    tables = {"decode": [], "verify": []}
    plan = ([("decode", n) for n in sorted(set(decode_bs))]
            + [("verify", n) for n in sorted(set(verify_tokens))])
    # interleave kinds so that a budget cut keeps both ends of the table
    plan.sort(key=lambda kn: (kn[1], kn[0]))
    skipped = []
    for kind, n in plan:
        if clock() - t0 > budget_s:
            skipped.append((kind, n))
            continue
        samples = sorted(float(time_pass(kind, n)) for _ in range(repeats))
        med = (samples[len(samples) // 2] if repeats % 2
               else 0.5 * (samples[repeats // 2 - 1] + samples[repeats // 2]))
        tables[kind].append((n, _positive(med, f"{source}: {kind}[{n}]")))
    if not tables["decode"] or not tables["verify"]:
        raise CostTableError(f"{source}: the time budget of {budget_s} s ran out before one decode "
                             "and one verify point were measured; pass "
                             "--speculative-ngram-auto-cost-table instead")
    table = CostTable(tuple(tables["decode"]), tuple(tables["verify"]), source)
    if log is not None:
        log(f"{source}: {len(tables['decode'])} decode + {len(tables['verify'])} verify points in "
            f"{clock() - t0:.2f} s ({repeats} repeats each, median); skipped {len(skipped)} past "
            f"the {budget_s} s budget; table {json.dumps(table.to_json())}")
    return table


# --------------------------------------------------------------------------------- whole-step costs
# a step that skipped the draft lookup (no speculation) / one that looked drafts up
LEAN, SPEC = "lean", "spec"
# a step without speculation that looked drafts up behind its launch, only to score them
PROBE = "probe"
# not a period: the host time of a probe made beside a step on the server's own decode path
# (glue.plain_path), all of which the step waits for where the host sets the pace
PATH_PROBE = "path_probe"
# a step on the server's own decode path (glue.plain_path): no speculation, no lookup, none of the
# n-gram worker's step around the forward
PATH = "path"
# not a period: what a batch's excursion from that path for a lookup took beyond the costs of its
# steps in the worker as they were decided (`StepCosts.switch_ms`)
SWITCH = "switch"
STEP_KINDS = (LEAN, SPEC, PROBE, PATH_PROBE, PATH, SWITCH)


def _median(xs) -> float:
    v = sorted(xs)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def step_class(step) -> Optional[tuple]:
    """What a measured step period is attributed to, for `steady_period`: (speculated, bs, width);
    a probe counts as the plain step it is (its lookup is host work beside a plain pass)."""
    if step is None:
        return None
    kind, bs, width = step
    return (kind == SPEC, int(bs), int(width) if kind == SPEC else 1)


def steady_period(before, step) -> bool:
    """May the period of decode step ``step`` ((kind, bs, width)), measured on the host clock from
    its start to the next step's, be recorded as its cost? Only where the step before it
    (``before``) was of the same class (`step_class`). Under SGLang's overlap scheduling the host
    launches a step before it waits for the previous one's result, so where the GPU is the
    bottleneck a step's period is the device time of the step before it; where the host is, it is
    its own host time. Between two steps of one class the two are the same; at a change of class
    the period may belong to either. Under the reference box's pass costs on one H200, auto's
    chain7 trials among plain steps were measured at 16.9 ms (a plain step's 13.3 ms plus host
    time) against their 34.4 ms pass, so they looked cheap, and each one cost ~21 ms for ~1
    token."""
    a, b = step_class(before), step_class(step)
    return a is not None and a == b


class StepCosts:
    """What a whole decode step costs, measured on the host clock while the server runs.

    A cost table of graph replays (`CostTable`, from the start-up calibration or a file) holds only
    the GPU pass. A server step also spends host time outside it (scheduling, the draft lookup,
    sampling and acceptance, result processing), and that part differs between a step that looked
    drafts up (SPEC, at a verify width) and one that did not (LEAN: no speculation, no lookup).
    Measured on the 2x H200 with SmolLM2-135M TP=2: graph replays ~1.0-1.2 ms, a plain decode step
    3.7 ms, an n-gram step 6.7 ms.

    `record(kind, bs, width, ms)` adds one measured step period. An estimate for (kind, bs, width)
    is the median of its last `window` periods once it has `min_samples`; otherwise the table's GPU
    time plus the kind's host part, the median of (measured - table) over the kind's recent steps at
    any size (0 before the first measurement). Medians, so the occasional period that contains a
    prefill or an idle gap does not move the estimate. LEAN is width 1 by definition, and so are
    PROBE (a LEAN step that also looked drafts up behind its launch: what a probe adds to a plain
    step, `Controller.probe_cost`) and PATH (a step on the server's own decode path: what no
    speculation costs once measured, `decode_ms`).
    """

    def __init__(self, table: CostTable, window: int = 32, min_samples: int = 3):
        if window < 1 or min_samples < 1:
            raise ValueError("window and min_samples must be >= 1")
        self.table = table
        self.source = f"{table.source} + measured whole steps"
        self.window = window
        self.min_samples = min_samples
        self._periods: dict = {}  # (kind, bs, width) -> recent ms
        self._host: dict = {k: [] for k in STEP_KINDS}  # kind -> recent (measured - table) ms
        self._estimates: dict = {}  # (kind, bs, width) -> step_ms, until the next record
        self._graph: dict = {}  # (bs, width) -> the table's pass (fixed: the table never changes)
        self.version = 0  # counts records: the estimates change only with it

    @staticmethod
    def _key(kind: str, bs: int, width: int) -> tuple:
        """(kind, bs, width) as kept: only SPEC steps have a width other than 1."""
        return kind, int(bs), 1 if kind != SPEC else int(width)

    def graph_ms(self, kind: str, bs: int, width: int) -> float:
        """The table's pass for a step of this kind (asked at every record: kept per size)."""
        _, bs, width = self._key(kind, bs, width)  # (width 1 but for SPEC)
        ms = self._graph.get((bs, width))
        if ms is None:
            ms = self._graph[(bs, width)] = (self.table.decode_ms(bs) if width == 1
                                             else self.table.verify_ms(bs * width))
        return ms

    def record(self, kind: str, bs: int, width: int, ms: float) -> None:
        if kind not in STEP_KINDS:
            raise ValueError(f"step kind must be one of {', '.join(map(repr, STEP_KINDS))}, got "
                             f"{kind!r}")
        if not (bs >= 1 and width >= 1 and math.isfinite(ms) and (ms > 0 or kind == SWITCH)):
            return
        key = self._key(kind, bs, width)
        q = self._periods.setdefault(key, [])
        q.append(float(ms))
        del q[:-self.window]
        h = self._host[kind]
        h.append(float(ms) - self.graph_ms(*key))
        del h[:-self.window]
        self._estimates.clear()
        self.version += 1

    def snapshot(self) -> "StepCosts":
        """A frozen copy: the same table (never changed after it is built), copies of the recent
        periods; what later records add to this one does not reach it. A deep copy also copied the
        table, ~0.7 ms every `AutoConfig.cost_sync_steps` decode steps on the CPU host."""
        out = copy.copy(self)
        out._periods = {key: list(q) for key, q in self._periods.items()}
        out._host = {kind: list(h) for kind, h in self._host.items()}
        out._estimates = {}
        return out

    def _measured(self, kind: str, bs: int, width: int) -> Optional[list]:
        """(kind, bs, width)'s recent periods once there are `min_samples`, else None."""
        q = self._periods.get(self._key(kind, bs, width))
        return q if q is not None and len(q) >= self.min_samples else None

    def samples(self, kind: str, bs: int, width: int) -> int:
        return len(self._periods.get(self._key(kind, bs, width), ()))

    def mean_ms(self, kind: str, bs: int, width: int) -> Optional[float]:
        """The mean of (kind, bs, width)'s recent periods, those over twice their median left
        out (a period that held a prefill or an idle wait); None before `min_samples`. Where a
        kind's periods have a tail (a step that now and then comes late), the mean counts it
        and the median does not."""
        q = self._measured(kind, bs, width)
        if q is None:
            return None
        cut = 2.0 * _median(q)
        kept = [x for x in q if x <= cut]
        return sum(kept) / len(kept)

    def medians_by_bs(self, kind: str) -> dict:
        """{batch size: the median of kind's recent periods (ms)} at every batch size it was
        recorded at (width 1: the kinds that have no other)."""
        return {bs: _median(q) for (k, bs, w), q in sorted(self._periods.items())
                if k == kind and w == 1 and q}

    def host_ms(self, kind: str) -> float:
        h = self._host[kind]
        return max(_median(h), 0.0) if h else 0.0

    def step_ms(self, kind: str, bs: int, width: int) -> float:
        key = self._key(kind, bs, width)
        ms = self._estimates.get(key)
        if ms is None:  # a decision asks for a few estimates many times between two records
            q = self._measured(*key)
            ms = _median(q) if q is not None else self.graph_ms(*key) + self.host_ms(kind)
            self._estimates[key] = ms
        return ms

    # the cost interface of evaluate(): no speculation = a step on the server's own decode path
    # once one has been measured, else a LEAN step; a chain of width w = a SPEC step
    def decode_ms(self, bs: int) -> float:
        """What a step without speculation costs: where auto runs its stretches without speculation
        on the server's own decode path (glue.plain_path), that is the step choosing no speculation
        buys, and its period (PATH) is the cost once one has been measured (at another batch size:
        the table's pass plus PATH's host part); before, a LEAN step in the n-gram worker. On one
        H200 at TP=1 (SmolLM2-135M, real weights), auto's LEAN estimate was 2.2 ms at bs 1 and
        3.1 ms at bs 4 while a plain server's step took 1.8 and 1.9 ms: a verify looked
        worthwhile at accept lengths of 1.1-1.2, where every fixed mode lost 25-35 %."""
        return self.step_ms(PATH if self._host[PATH] else LEAN, bs, 1)

    def verify_step_ms(self, bs: int, width: int, tokens: int) -> float:
        return self.step_ms(SPEC, bs, width)

    def switch_ms(self, bs: int) -> float:
        """What starting a spell of speculation costs beyond its steps' own costs, where stretches
        without speculation run on the server's own decode path: the batch leaves the path for the
        lookup and comes back to it through the n-gram worker's steps, and an excursion's time
        less the summed step costs the controller had decided on is recorded (SWITCH, by the
        glue). The median of the recent ones at batch size ``bs`` once there are `min_samples`,
        never below 0; 0 before (and where no stretch runs on the path). On one H200 at TP=1
        (SmolLM2-135M, real weights), where the host sets the pace, a spell of one verify at bs 3
        took 3.3-3.8 ms and the worker's plain step after it 1.9-2.1 ms, against 1.3-1.5 ms a step
        on the path, and in one launch the requests that verified at c=4 ran at 0.79x plain, the
        others at 0.92x."""
        q = self._measured(SWITCH, bs, 1)
        return max(_median(q), 0.0) if q is not None else 0.0

    def verify_ms(self, tokens: int) -> float:
        return self.table.verify_ms(tokens)

    def to_json(self) -> dict:
        return {"table": self.table.to_json(), "host_ms": {k: self.host_ms(k) for k in STEP_KINDS},
                "measured": {f"{k}/bs{bs}/w{w}": round(_median(q), 4)
                             for (k, bs, w), q in sorted(self._periods.items())}}


