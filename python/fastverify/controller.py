"""Cost-aware verify control for n-gram speculation (`--speculative-ngram-verify-mode auto`).

Each decode step the controller picks, for the whole batch, the option with the highest expected
tokens per second among: no speculation, a chain of k draft tokens (k = 1..K), and the corpus tree:

    rate(option) = E[tokens emitted by the batch] / t(pass)
                 = (bs + sum_i E[accepted_i | option]) / t_verify(tokens in the pass)   speculating
    rate(none)   = bs / t_decode(bs)

Two inputs, both measured, neither taken from a paper:
- cost (costs.py): `CostTable`, a verify-cost table t_verify(tokens in the pass) and the plain
  decode cost t_decode(bs), calibrated at server start (glue/auto.py) or loaded from the
  microbenchmark's JSON; or `StepCosts`, the whole step as measured while serving;
- gain (gains.py): `GainModel`, per request, the observed distribution of accepted draft tokens as a
  function of the n-gram match (matched depth, root branch count), updated online and forgetting
  with a half-life in steps.

Per-request gating: request i speculates under an option only if its own expected
speedup is at least one,

    gain_i(option) = E[1 + accepted_i | option] * t_decode(bs) / t_verify(bs * width(option)) >= 1,

otherwise it verifies nothing that step (one token: the plain decode token). Hysteresis: the
current option is kept unless another one is expected to be more than `hysteresis` (relative)
faster; so the option kept is never expected to be slower than the best, and in particular than no
speculation, by more than that margin.

The gain model learns from *resolved drafts*: a draft made at position p resolves once the request's
real continuation shows where it first diverges (`gains.ShadowTracker`). This needs no verify at
all, so the controller keeps learning while it does not speculate and never has to gamble to
explore: with acceptance 0 it stays at no speculation after the first steps. Greedy output does not
depend on the option chosen (verification is exact).

Calibration: the gain model's estimates are checked against what the drafts it had verified
really accepted. Each verified draft adds its expected accepted tokens (under the option chosen)
and, once it resolves, what it accepted (capped at the tokens verified) to two sums that forget
with `AutoConfig.calibration_half_life` steps; every estimate is scaled by
min(1, (accepted + prior) / (expected + prior) / band) (`Controller.calibration`, prior
`AutoConfig.calibration_prior` tokens on both sides, band `AutoConfig.calibration_band`: drafts
verified because their estimate was high accept a little less than estimated even where the model
is right, and that alone must not cut speculation). Where the estimates hold, the factor stays
1; where the verified drafts accept less than they were expected to (the chain server's
matched drafts on one H200 under the reference box's pass costs accepted 0.54 tokens each where
auto expected 2.3-3.2 of its own), speculation stops after a few verifies, and comes back on trial
once the sums are forgotten. Trials at a loss back off: when speculation starts again, the spell
before it is judged by its own verified drafts, and one that accepted less than the band of what
was expected doubles the sums' half-life (up to `AutoConfig.calibration_backoff_max` times the
base), one that held sets it back to the base (`Controller._spell_begins`). On one H200 under the
reference box's pass costs, auto tried chain7 every 100-300 steps at bs 1 (58 switches in 2,487
decisions) for ~1 token a trial, 1-3 % below plain (measured at 16.9 ms, the plain step before
each trial, against their 34.4 ms pass: `costs.steady_period` now keeps such periods out of the
costs); in the simulator's biased-scorer load (bs 1, 4 x 3,000 steps) the backoff cuts the loss
from 0.9 % to 0.5 %, and costs 1.6 % where failing drafts turn into full matches (1.389 against
1.411x no speculation: the return comes later). The factor never raises an estimate.

Follow bound (stated and tested in tests/test_sim.py): after acceptance changes, the
estimate's weight on the old regime after n steps is at most 2**(-n / half_life); a draft
resolves at most K + 1 steps after it is made. `follow_bound_steps` returns K + 1 +
ceil(half_life * log2(1 / eps)) with eps = 0.1.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from fastverify.costs import LEAN, PATH_PROBE, PROBE, SPEC, CostTable
from fastverify.gains import DraftFeatures, GainModel, estimate_key

SHAPES = ("ragged", "uniform")
NONE, CHAIN, TREE = "none", "chain", "tree"
PLAN_PROBE, PLAN_WANTED = "probe", "wanted"  # why Controller.plan_lookup looked drafts up
# Controller.lookup_on_plain_path's other answers: a real lookup is due (the batch goes back to the
# worker), or the probe due waits (the step stays on the plain path without one)
LOOKUP, HELD = "lookup", "held"
# Controller._wanted: an unchanged question is answered again after this many steps
WANTED_REFRESH_STEPS = 4
# Controller._still_verifying: a decision whose every request verified and whose expected rate beat
# no speculation's by this much (relative) is not asked again on the same features at the next step;
# it stands until the drafts verified since its evaluation accept less than 1 - this share of their
# expectation (Controller.note_verified)
CLEAR_MARGIN = 0.25
# Controller._clear_reuse: a clear decision's evaluation answers the same question for the steps
# before this many have passed since it was made (4 before: on the CPU stand-ins of
# lab/verify_host_time.py, 8 took auto's mean host work a steady verify step 3 us lower at bs 1 and
# 6 us at bs 4; the simulator's switching and load-switch runs came out the same to the fourth
# digit)
EVAL_REUSE_STEPS = 8
# Controller.forced_probe_gap: probes that could not pay are never held past this many times
# probe_max steps since the last lookup, however dear they are (a bound on following, whatever a
# probe was measured to cost)
PROBE_STRETCH_MAX = 4


# ----------------------------------------------------------------------------------------- the rule
@dataclass(frozen=True)
class Option:
    kind: str  # "none" | "chain" | "tree"
    k: int = 0  # chain length (draft tokens); for the tree, its draft nodes
    width: int = 1  # tokens per speculating request in the pass (root included)

    @functools.cached_property  # (asked for every option at every decision)
    def label(self) -> str:
        return NONE if self.kind == NONE else (f"chain{self.k}" if self.kind == CHAIN
                                               else f"tree{self.width}")


@dataclass(frozen=True)
class Evaluation:
    option: Option
    rate: float  # expected tokens per ms for the batch
    pass_ms: float
    tokens: float  # expected tokens emitted by the batch
    speculate: tuple  # per request: takes part (True) or verifies nothing (False)


class OptionCosts:
    """What `evaluate` reads from the costs for one option at one batch size: a plain step's cost,
    the full pass's, and the pass with n requests taking part (asked for as n occurs). They change
    only with the costs, so the controller keeps them until then (`Controller._per_bs`) and a
    decision is arithmetic on the gains alone, where each evaluation had asked the costs 2-3 times
    an option (SmolLM2 at TP=1, one H100: auto's verify steps took 0.15-0.28 ms longer than chain +
    widths' at equal batch size, py-spy putting about half of auto's own host work in its
    controller)."""

    __slots__ = ("option", "bs", "shape", "costs", "t_dec", "t_full", "_t_by_n", "_plain")

    def __init__(self, option: Option, costs: CostTable, bs: int, shape: str = "ragged"):
        self.option, self.bs, self.shape, self.costs = option, bs, shape, costs
        self.t_dec = costs.decode_ms(bs)
        self.t_full = (costs.verify_step_ms(bs, option.width, bs * option.width)
                       if option.kind != NONE and bs else self.t_dec)
        self._t_by_n: dict = {}
        self._plain = Evaluation(option, bs / self.t_dec, self.t_dec, float(bs), (False,) * bs)

    def pass_ms(self, n: int) -> float:
        """The pass with `n` of the batch's requests taking part."""
        t = self._t_by_n.get(n)
        if t is None:
            o, bs = self.option, self.bs
            tokens = bs * o.width if self.shape == "uniform" else n * o.width + (bs - n)
            t = self._t_by_n[n] = self.costs.verify_step_ms(bs, o.width, tokens)
        return t

    def evaluate(self, gains: Sequence[float], switch_ms: float = 0.0) -> "Evaluation":
        if self.option.kind == NONE or not self.bs:
            return self._plain
        t_dec, t_full = self.t_dec, self.t_full
        spec = tuple((1.0 + g) * t_dec >= t_full for g in gains)  # gain_i >= 1
        n = sum(spec)
        if n == 0:  # nobody speculates: the step is a plain decode step
            return Evaluation(self.option, self.bs / t_dec, t_dec, float(self.bs), spec)
        t = self.pass_ms(n)
        emitted = self.bs + sum(g for g, s in zip(gains, spec) if s)
        return Evaluation(self.option, emitted / (t + max(switch_ms, 0.0)), t, emitted, spec)


def evaluate(option: Option, costs: CostTable, gains: Sequence[float],
             shape: str = "ragged", switch_ms: float = 0.0) -> Evaluation:
    """Expected batch rate of `option` given per-request E[accepted | option] (`gains`).
    ``switch_ms``: what starting a spell of speculation adds to its first step (from no
    speculation: `StepCosts.switch_ms`), in the rate of an option that speculates; not in its
    ``pass_ms`` (the step's own cost) nor in who takes part (a per-request gate on the step).
    A request takes part where its gain pays for its share of the pass: (1 + gain) plain steps'
    worth of tokens at least the full pass's cost."""
    return OptionCosts(option, costs, len(gains), shape).evaluate(gains, switch_ms)


def choose(evals: Sequence[Evaluation], current: Optional[Option], hysteresis: float) -> Evaluation:
    """Best expected rate, but keep `current` unless the best beats it by more than `hysteresis`
    (relative). Ties go to the cheaper option (the order of `evals`)."""
    best = max(evals, key=lambda e: e.rate)  # max keeps the first of equals
    if current is not None:
        for e in evals:
            if e.option == current and best.rate <= e.rate * (1.0 + hysteresis):
                return e
    return best


def options_for(max_chain: int, tree_width: int, chain_widths: Sequence[int] = ()) -> tuple:
    """The option list: none, chain k for k = 1..max_chain (or only the widths a
    server captured), the tree."""
    ks = (range(1, max_chain + 1) if not chain_widths
          else sorted({w - 1 for w in chain_widths if 2 <= w}))
    opts = [Option(NONE)] + [Option(CHAIN, k, k + 1) for k in ks if k <= max_chain]
    if tree_width >= 2:
        opts.append(Option(TREE, tree_width - 1, tree_width))
    return tuple(opts)


# --------------------------------------------------------------------------------------- controller
@dataclass(frozen=True)
class AutoConfig:
    """Built once from the server flags by glue/auto.py."""

    max_chain: int = 7  # K: longest chain considered (--speculative-num-draft-tokens - 1)
    tree_width: int = 8  # tokens of a tree verify per request (root included); 0: no tree option
    # verify widths the server can run for chains (root included); () = 2..K+1
    chain_widths: tuple = ()
    hysteresis: float = 0.03  # --speculative-ngram-auto-hysteresis
    # forgetting of the gain model; sets the follow bound (follow_bound_steps)
    half_life_steps: float = 16.0
    prior_strength: float = 4.0
    # pseudo-observations of 0 accepted the gain model never forgets (GainModel)
    prior_floor: float = 1.0
    shape: str = "ragged"  # "uniform": every request in a verify pass occupies `width` slots
    log_interval_s: float = 30.0
    # probes (drafts looked up only to learn from) may add at most this share to the time of the
    # steps without speculation, by their measured cost (Controller.probe_cost), though one still
    # comes every probe_max steps, or every forced_probe_gap steps (plan_lookup); 1.0: no limit
    probe_budget: float = 0.002
    # without speculation, drafts are still looked up after 1, 2, 4, ... up to this many steps
    probe_max: int = 32
    # the probes that probe_max forces (past the probe credit) for requests whose own matched drafts
    # were scored may add at most this share to the time of the steps without speculation, by their
    # measured cost: where a probe costs more than probe_floor_share * probe_max plain steps they
    # come further apart, up to PROBE_STRETCH_MAX * probe_max steps (Controller.forced_probe_gap)
    probe_floor_share: float = 0.004
    # with TP > 1, rank 0's measured step costs reach every rank this often (steps; glue/auto.py)
    cost_sync_steps: int = 64
    # calibration of the estimates by the verified drafts' outcomes (module docstring): the
    # forgetting of its sums (steps) and the pseudo-tokens added to both
    calibration_half_life: float = 128.0
    calibration_prior: float = 2.0
    calibration_band: float = 0.75
    # a spell of speculation whose verified drafts accepted less than the band doubles that
    # forgetting, up to this many times the base; one that held sets it back to the base
    calibration_backoff_max: float = 16.0

    def __post_init__(self):
        if not isinstance(self.max_chain, int) or self.max_chain < 1:
            raise ValueError("--speculative-num-draft-tokens must be >= 2 for auto verify (max "
                             f"chain {self.max_chain!r})")
        if not isinstance(self.tree_width, int) or self.tree_width < 0 or self.tree_width == 1:
            raise ValueError(f"tree width must be 0 (no tree) or >= 2, got {self.tree_width!r}")
        if not (isinstance(self.hysteresis, (int, float)) and 0.0 <= self.hysteresis < 0.5):
            raise ValueError("--speculative-ngram-auto-hysteresis must be in [0, 0.5), got "
                             f"{self.hysteresis!r}")
        if not self.half_life_steps > 0:
            raise ValueError(f"half_life_steps must be > 0, got {self.half_life_steps!r}")
        if not self.calibration_half_life > 0 or not self.calibration_prior > 0:
            raise ValueError("calibration_half_life and calibration_prior must be > 0, got "
                             f"{self.calibration_half_life!r}, {self.calibration_prior!r}")
        if not 0.0 < self.calibration_band <= 1.0:
            raise ValueError(f"calibration_band must be in (0, 1], got {self.calibration_band!r}")
        if not self.calibration_backoff_max >= 1.0:
            raise ValueError("calibration_backoff_max must be >= 1, got "
                             f"{self.calibration_backoff_max!r}")
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        if not (isinstance(self.probe_budget, (int, float)) and 0.0 < self.probe_budget <= 1.0):
            raise ValueError(f"probe_budget must be in (0, 1], got {self.probe_budget!r}")
        if not (isinstance(self.probe_floor_share, (int, float))
                and 0.0 < self.probe_floor_share <= 1.0):
            raise ValueError(f"probe_floor_share must be in (0, 1], got {self.probe_floor_share!r}")
        for name in ("probe_max", "cost_sync_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def follow_bound_steps(cfg: AutoConfig, eps: float = 0.1, probe_max: int = 0) -> int:
    """Steps after an acceptance change within which the controller acts on the new regime: the next
    draft is looked up within `probe_max` steps (0: every step has drafts; for requests whose drafts
    were scored and whose probes are dear, `Controller.forced_probe_gap`'s gap), it resolves within
    K + 1 steps, and after n more steps the old regime's weight is <= 2**(-n / half_life) <= eps."""
    return probe_max + cfg.max_chain + 1 + math.ceil(cfg.half_life_steps * math.log2(1.0 / eps))


@dataclass(frozen=True)
class RequestView:
    req_id: object
    features: DraftFeatures


@dataclass(frozen=True)
class Decision:
    option: Option
    speculate: tuple  # per request in the order given
    rates: dict  # option label -> expected tokens per ms
    pass_ms: float
    step: int
    # per request in the order given: its expected accepted draft tokens under `option`
    # (calibrated; 0 where it does not take part)
    gains: tuple = ()

    @property
    def speedup(self) -> float:
        return self.rates[self.option.label] / self.rates[NONE]


class Controller:
    """The per-step decision: `decide(requests)` then, when drafts resolve, `observe(...)`."""

    def __init__(self, cfg: AutoConfig, costs: CostTable,
                 log: Optional[Callable[[dict], None]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self._costs_version = 0
        self.costs = costs
        self._wanted_epoch, self._wanted_cache = None, {}
        self._evaluated = (None, None)  # (question, answer) of the last _evaluate
        self._evaluated_at = 0  # the step it was asked for
        # (the answer, the option current then, what decide made of them: (chosen, rates, gains))
        # of the last decision (`_choice`)
        self._chosen = (None, None, None)
        # answers kept per batch size until the costs change: (costs key, {(name, bs): answer})
        # (`_per_bs`: `_plain_and_probe`, `_full_acceptance_pays`)
        self._by_bs = (None, {})
        # (the decision, its requests) of the last step, where it verified drafts
        # (`_still_verifying`)
        self._verified_for: Optional[tuple] = None
        # the draft tokens the verified drafts were expected to have accepted, and had, since the
        # last fresh evaluation (`note_verified`)
        self._since_evaluated = [0.0, 0.0]
        self.options = options_for(cfg.max_chain, cfg.tree_width, cfg.chain_widths)
        self.gain = GainModel(cfg.max_chain, max(cfg.tree_width - 1, 0), cfg.half_life_steps,
                              cfg.prior_strength, prior_floor=cfg.prior_floor)
        self.current: Optional[Option] = None
        self.step = 0
        # [host clock at its start, batch size, the steps' own costs as decided (Decision.pass_ms),
        # the steps] of the batch's excursion from the server's own decode path for a lookup, None
        # outside one (`excursion_begins`)
        self._excursion: Optional[list] = None
        self._log = log
        self._clock = clock
        self._last_log = -math.inf
        self._suppressed = 0
        self.counters = {"steps": 0, "switches": 0, "gated_requests": 0, "requests": 0,
                         "lean_steps": 0, "probe_lookups": 0, "behind_lookups": 0, "probes_held": 0,
                         "plain_path_steps": 0, "plain_path_stretches": 0,
                         "plain_path_probes": 0, "plain_path_joins": 0,
                         "confirming_probes": 0}
        # why the last plan_lookup looked up: PLAN_PROBE or PLAN_WANTED
        self.planned: Optional[str] = None
        self._since_lookup = 0
        # steps between lookups while none is expected to pay (doubles up to probe_max)
        self._probe_gap = 1
        # ms that probes may still add (`probe_cost`; grows with each step's cost)
        self._probe_credit = 0.0
        # new requests' first lookups were deferred (`defer_first_lookup`): the probe that makes
        # them does not wait for credit, only for the steps right after the prefill
        self._probe_owed = False
        # requests still running that were owed a confirming probe (`note_probe`), and the step
        # from which that probe is owed (None: none owed)
        self._confirmed: set = set()
        self._confirm_step: Optional[int] = None
        self.steps_by_mode = {o.label: 0 for o in self.options}
        self.last: Optional[Decision] = None
        # requests that sample (note_sampling); the others decode greedily
        self._sampled: set = set()
        # verified drafts: forgetting sums of expected and accepted draft tokens, as of a step
        self._verified = [0.0, 0.0, 0]  # [expected, accepted, step]
        # the forgetting half-life of those sums now (steps; backs off after failed spells) and the
        # expected / accepted tokens of the drafts verified since the last spell began
        self._cal_half_life = cfg.calibration_half_life
        self._spell = [0.0, 0.0]
        # per request still running whose drafts were verified: [drafts, expected, accepted] draft
        # tokens (`note_verified`), logged as it finishes (`finish`)
        self._verified_by_request: dict = {}

    @property
    def costs(self):
        return self._costs

    # a new table (the server shares rank 0's measurements every few steps)
    @costs.setter
    def costs(self, value) -> None:
        self._costs = value
        self._costs_version += 1

    def _costs_key(self) -> tuple:
        """Changes whenever the costs the controller reads may have: a new table, or
        a record into its own."""
        return self._costs_version, getattr(self._costs, "version", 0)

    def _evaluate(self, requests: Sequence[RequestView], step: int) -> tuple:
        """(per-request (chain, tree) expectations, an Evaluation per option
        in `self.options` order).

        The last answer is kept: a step that speculated asks the same question twice
        (`plan_lookup` with each request's last features, then `decide` with the new drafts', the
        same on a steady load), and a clear decision's answer serves the next steps' same question
        (`_clear_reuse`)."""
        key = (step, self.gain.version, self._costs_key(), self._calibration_key(),
               self._switching(), tuple((r.req_id, estimate_key(r.features)) for r in requests))
        if key == self._evaluated[0] or self._clear_reuse(key):
            return self._evaluated[1]
        out = self._evaluate_now(requests, step)
        self._evaluated, self._evaluated_at = (key, out), step
        self._since_evaluated = [0.0, 0.0]
        return out

    def _clear_reuse(self, key: tuple) -> bool:
        """May the last evaluation answer `key`'s question? Where the last decision verified drafts
        for these requests clearly (`_still_verifying`'s test), and the question is the same (the
        requests, their drafts' features, the costs, the calibration, speculating or not), only
        the gain model's observations and its forgetting moved since; they are not read again for
        `EVAL_REUSE_STEPS` - 1 steps after an evaluation, and not once the drafts verified since
        fell short of what they were expected to accept by `CLEAR_MARGIN` (`note_verified`). The
        drafts' features count as the gain model reads them (`gains.estimate_key`). On a steady
        memorised load this spares the decision's evaluation seven steps in eight, the largest
        piece of auto's host work a verify step (`lab/verify_host_time.py`)."""
        last = self._evaluated[0]
        return (last is not None and key[2:] == last[2:]
                and self._clear_for(tuple(r for r, _ in key[5]))
                and 0 <= key[0] - self._evaluated_at < EVAL_REUSE_STEPS)

    def _clear_for(self, req_ids: tuple) -> bool:
        """Was the last decision a clear one (`CLEAR_MARGIN`, every request verifying), made for
        these requests, and not undone since by verified drafts that fell short of what they were
        expected to accept by that margin (`note_verified`)?"""
        mine = self._verified_for
        return mine is not None and mine[0] is self.last and mine[1] == req_ids

    def _switching(self) -> bool:
        """Would speculating now start a spell (no speculation before it)?"""
        return self.current is None or self.current.kind == NONE

    def _evaluate_now(self, requests: Sequence[RequestView], step: int) -> tuple:
        per_req = [self.gain.expected(r.req_id, r.features, step) for r in requests]
        f = self._calibration_key()
        if f < 1.0:
            per_req = [([x * f for x in c], t * f) for c, t in per_req]
        bs = len(requests)
        switch_ms = getattr(self.costs, "switch_ms", None)
        switch = (self._per_bs("switch_ms", bs, lambda: switch_ms(bs))
                  if switch_ms is not None and self._switching() else 0.0)
        priced = self._per_bs("option_costs", bs, lambda: tuple(
            OptionCosts(o, self.costs, bs, self.cfg.shape) for o in self.options))
        evals = []
        for pc in priced:
            o = pc.option
            if o.kind == NONE:
                g = ()
            elif o.kind == CHAIN:
                g = [c[o.k - 1] for c, _ in per_req]
            else:
                g = [t for _, t in per_req]
            evals.append(pc.evaluate(g, switch))
        return per_req, evals

    def decide(self, requests: Sequence[RequestView], behind: bool = False) -> Decision:
        """A step whose drafts were looked up: the option and who takes part. ``behind``: the drafts
        were looked up without waiting for the step in flight (counted apart)."""
        self.step += 1
        self.counters["behind_lookups"] += int(behind)
        self._looked_up()
        self._accrue_probe_credit(len(requests))
        answer = self._evaluate(requests, self.step)
        per_req, evals = answer
        chosen, rates, gains = self._choice(answer)
        if self.current is not None and chosen.option != self.current:
            self.counters["switches"] += 1
        if chosen.option.kind != NONE and (self.current is None or self.current.kind == NONE):
            self._spell_begins()
        self.current = chosen.option
        o = chosen.option
        d = Decision(o, chosen.speculate, rates, chosen.pass_ms, self.step, gains)
        self._back_off(chosen.option.kind != NONE)
        self._priced(d)
        clear = (o.kind != NONE and all(chosen.speculate)
                 and chosen.rate >= evals[0].rate * (1.0 + CLEAR_MARGIN))
        self._verified_for = (d, tuple(r.req_id for r in requests)) if clear else None
        self.counters["steps"] += 1
        self.counters["requests"] += len(requests)
        self.counters["gated_requests"] += (sum(1 for s in chosen.speculate if not s)
                                            if chosen.option.kind != NONE else 0)
        self.steps_by_mode[chosen.option.label] += 1
        self._maybe_log(d, requests, per_req)
        return d

    def _choice(self, answer: tuple) -> tuple:
        """(chosen evaluation, rates by option label, expected gain per request) for `_evaluate`'s
        answer (per-request expectations, evaluations): the best option under the hysteresis
        (`choose`), no speculation where nobody would take part. These follow from the answer and
        the current option only, so where both are the ones of the last decision (a steady load
        whose evaluation is kept, `_clear_reuse`) the last result is returned."""
        last, current, made = self._chosen
        if answer is last and self.current is current:
            return made
        per_req, evals = answer
        chosen = choose(evals, self.current, self.cfg.hysteresis)
        if not any(chosen.speculate):  # an option nobody takes part in is a plain decode step
            chosen = evals[0]
        o = chosen.option
        gains = tuple((c[o.k - 1] if o.kind == CHAIN else t) if s and o.kind != NONE else 0.0
                      for (c, t), s in zip(per_req, chosen.speculate))
        made = (chosen, {e.option.label: e.rate for e in evals}, gains)
        self._chosen = (answer, self.current, made)
        return made

    def plan_lookup(self, requests: Sequence[RequestView], probe_max: int = 0, behind: bool = False,
                    refill: bool = False) -> bool:
        """Before a step's drafts exist: is the draft lookup worth making? `requests` carry each
        request's last known features (the glue looks a request it has not seen up without asking).
        True when an option that speculates is expected to beat no speculation by more than the
        hysteresis, or when the probe gap has passed since the last lookup: the gain model learns
        only from drafts that were made, and a request whose last lookup found nothing may match a
        few tokens later (output that starts to repeat itself). The gap is 1 step after a lookup
        that chose to speculate (or `reset_probe`: a new request) and doubles after each lookup that
        chose not to, up to `probe_max` (0: no probes).
        False: the step runs without speculation and without a lookup (`note_lean`). Always True
        unless skipping the lookup is measured to pay (`lean_pays`). `planned` says how to look
        up: PLAN_WANTED (for real: the drafts may be verified this step) or PLAN_PROBE (the gap
        passed and even drafts that matched in full are not expected to pay: drafts only to learn
        from, see `note_probe`).
        ``behind``: the lookup would not wait for the step in flight (its drafts are looked up on
        the host's tokens and verified at once if `decide` says so): it costs host time only, so
        it is made when wanted or when the probe gap passed, and never just because a lookup step
        was not measured dearer.
        ``refill``: one of the steps right after a prefill, whose host work is not hidden behind
        the GPU's (the forward before was the prefill, and the host still has the prefill's result
        to process): a probe that could not pay waits, as it waits for the probe credit (never
        past `forced_probe_gap` steps: `probe_max`, or more for requests scored already whose
        probes are dear)."""
        self.planned = None
        if not requests:
            return False
        if not behind and not self.lean_pays(len(requests)):
            self.planned = PLAN_WANTED
            return True
        if self._still_verifying(requests) or self._wanted(requests):
            self._looked_up()
            self.planned = PLAN_WANTED
            return True
        if probe_max > 0 and (self._since_lookup + 1 >= min(self._probe_gap, probe_max)
                              or self._confirming()):
            # a probe that may find drafts worth verifying at once is a real lookup; one whose
            # drafts would not pay even if they matched in full (the requests' own acceptance of
            # matching drafts is low) is for learning only, and cheaper (PLAN_PROBE: looked up
            # behind, scored, the step stays plain), but not free where the host has little time to
            # spare: it waits until the probe credit covers its measured cost (the next step asks
            # again), though never past `forced_probe_gap` steps since the last lookup (so that a
            # change in acceptance is still noticed within follow_bound_steps with that gap); the
            # probe owed to new requests whose first lookups were deferred waits for the refill
            # alone (one per join: their drafts may pay at once, as a repeated prompt's do)
            rids = [r.req_id for r in requests]
            promising = self._full_match_wanted(rids)
            if not promising:
                cost = self._plain_and_probe(len(requests))[1]
                owed = self._probe_owed or self._confirming()
                short = cost > self._probe_credit and not owed
                if (refill or short) and self._since_lookup + 1 < self.forced_probe_gap(probe_max,
                                                                                        rids):
                    self.counters["probes_held"] += 1
                    self._since_lookup += 1
                    return False
                # below 0 after a probe the credit did not cover: paid back first
                self._probe_credit -= cost
            self._looked_up()
            self.planned = PLAN_WANTED if promising else PLAN_PROBE
            return True
        self._since_lookup += 1
        return False

    def probe_cost(self, bs: int) -> float:
        """What a probe adds to a plain step at batch size `bs` (ms): the mean period of steps that
        probed (PROBE) less that of plain steps (LEAN), both measured (`StepCosts.mean_ms`,
        `min_samples` each), or the mean host time of the probes made on the plain path
        (PATH_PROBE), the larger where both are measured; 0 until then (the first probes measure
        it) and with a cost table that measures no whole steps. A probe's lookup runs on the host
        while the GPU decodes, so it costs nothing until the host's share of the step outgrows the
        GPU's, and then first in the steps where the host had little to spare: the mean, not the
        median (2x H200, 24-layer dummy model: at batch size 4 0-0.8 ms of a 4.6 ms step by the
        host the machine came with; at batch size 1 the median probe step was 0.06 ms longer, the
        mean 0.25 ms)."""
        mean_ms = getattr(self.costs, "mean_ms", None)
        if mean_ms is None:
            return 0.0
        probe, plain = mean_ms(PROBE, bs, 1), mean_ms(LEAN, bs, 1)
        worker = probe - plain if probe is not None and plain is not None else 0.0
        return max(worker, mean_ms(PATH_PROBE, bs, 1) or 0.0, 0.0)

    def forced_probe_gap(self, probe_max: int, req_ids: Sequence, bs: int = 0) -> int:
        """The most steps since the last lookup that a probe which could not pay is held for (want
        of probe credit, or the steps right after a prefill): ``probe_max``; or, where every request
        of ``req_ids`` had matched drafts of its own scored (`GainModel.scored`) and a probe costs
        more than `AutoConfig.probe_floor_share` of ``probe_max`` plain steps (`probe_cost`
        against the plain step's cost at batch size ``bs``, default len(req_ids)), the steps over
        which its cost is that share of theirs, at most PROBE_STRETCH_MAX * ``probe_max``.
        Probes held to ``probe_max`` cost 1/``probe_max`` of the probe's share of a plain step,
        large where the host sets the pace (one H100, SmolLM2 at TP=1: a probe 0.31 ms on a
        1.16 ms step, ~0.8 % of the decode time where nothing pays; ``probe_max`` 64 there took
        auto from 0.988x to 1.000x plain in one launch). A request not scored yet keeps
        ``probe_max``: its drafts are unknown, and a new request whose first probe matched only
        part of a memorised reply learns from the next probe (stretched for new requests too, the
        simulator's novel-then-memorised load at bs 1 fell from 0.942x to 0.904x the best fixed
        mode). What it costs: a request whose drafts did not pay and then start to is noticed up to
        that many steps later (`follow_bound_steps` with this gap)."""
        if not req_ids or not all(self.gain.scored(r) for r in req_ids):
            return probe_max
        plain, cost = self._plain_and_probe(bs or len(req_ids))
        if cost <= 0.0 or plain <= 0.0:
            return probe_max
        return min(max(probe_max, math.ceil(cost / (self.cfg.probe_floor_share * plain))),
                   PROBE_STRETCH_MAX * probe_max)

    def _per_bs(self, name: str, bs: int, compute: Callable[[], object]):
        """``compute()``'s answer for ``name`` at batch size ``bs``, kept until the costs change."""
        key = self._costs_key()
        if key != self._by_bs[0]:
            self._by_bs = (key, {})
        kept = self._by_bs[1]
        hit = kept.get((name, bs))
        if hit is None:
            hit = kept[(name, bs)] = compute()
        return hit

    def _plain_and_probe(self, bs: int) -> tuple:
        """(a plain step's cost, `probe_cost`) at batch size `bs`, kept until the costs
        change (every step asks)."""
        return self._per_bs("plain_and_probe", bs,
                            lambda: (self.costs.decode_ms(bs), self.probe_cost(bs)))

    def _accrue_probe_credit(self, bs: int) -> None:
        """Each step adds `probe_budget` of a plain step's cost to the probe credit, kept to at most
        one probe's cost (a long stretch without probes does not buy a burst of them)."""
        plain, cap = self._plain_and_probe(bs)
        gain = self.cfg.probe_budget * plain
        # a debt is paid back step by step
        self._probe_credit = min(self._probe_credit + gain, max(cap, gain))

    def _wanted(self, requests: Sequence[RequestView]) -> bool:
        """Is an option that speculates expected to beat no speculation (by the
        hysteresis) for `requests`?

        Asked on most steps without speculation with the same requests and features, so the
        answer is kept until the gain model observes something, the costs or the current option
        change, or WANTED_REFRESH_STEPS steps pass (the model's forgetting moves its estimates
        a little every step)."""
        epoch = (self.gain.version, self._costs_key(), self._calibration_key(), self.current,
                 (self.step + 1) // WANTED_REFRESH_STEPS)
        if epoch != self._wanted_epoch:
            self._wanted_epoch, self._wanted_cache = epoch, {}
        key = tuple((r.req_id, estimate_key(r.features)) for r in requests)
        hit = self._wanted_cache.get(key)
        if hit is not None:
            return hit
        _, evals = self._evaluate(requests, self.step + 1)
        best = choose(evals, self.current if self.current is not None else evals[0].option,
                      self.cfg.hysteresis)
        wanted = best.option.kind != NONE and any(best.speculate)
        if len(self._wanted_cache) < 64:
            self._wanted_cache[key] = wanted
        return wanted

    def _still_verifying(self, requests: Sequence[RequestView]) -> bool:
        """Did the last step verify drafts for these same requests, every one of them, at an
        expected rate that beat no speculation's by `CLEAR_MARGIN`? Then their last features are
        the ones that decision was made on one step before, by a margin one step's observations do
        not undo, and the lookup is made without asking `_wanted` again. Where the drafts' features
        change from step to step, that question was a second evaluation of the options a step (on
        the CPU, the simulator's memorised load: ~60 to ~35 us of controller time a step at batch
        size 1); where they stay the same, the decision shared its evaluation and the saving is the
        question's own bookkeeping (~34 to ~26 us, with `OptionCosts`). The step's own decision
        (`decide`, on the drafts this lookup finds) still ends the spell where speculation stops
        paying, at the cost of at most that one lookup. Closer decisions, and those that left a
        request out, are asked again (in the simulator's switching loads, asking only where the last
        step verified cost auto 0.3-1.3 % of its rate, lookups paid where the last features no
        longer made one worth it)."""
        return self._clear_for(tuple(r.req_id for r in requests))

    def _full_match_wanted(self, req_ids: Sequence) -> bool:
        """Would drafts that matched in full (the longest chain) be worth verifying for these
        requests, with what the gain model knows of each (a request without history: all
        requests' recent acceptance)?"""
        k = self.cfg.max_chain
        return self._wanted([RequestView(r, DraftFeatures(k, 1, self.samples(r))) for r in req_ids])

    def note_probe(self, requests: Sequence[RequestView]) -> Decision:
        """A probe step (`plan_lookup` gave PLAN_PROBE) whose drafts were looked up only to be
        scored, and which ran without speculation: `requests` carry the features of those drafts.
        The probe gap goes back to 1 when they make speculation look worthwhile (the next step then
        looks up for real) and doubles otherwise; the step counts as a step without a lookup's
        drafts verified (`note_lean`).
        A probe whose drafts are not trusted but reach (nearly) the longest chain, for a new request
        (none of its matched drafts scored yet, none owed before), where drafts matched and
        accepted in full would pay: the next probe is owed as soon as those drafts are decided
        (`max_chain` + 2 steps, whatever the probe credit), since a probe's drafts are scored only
        at the next lookup; not where the next probe comes by then anyway. Without it a request
        whose output repeats earlier output learns so only ~`probe_max` steps later, since a new
        request's drafts are judged by all requests' recent acceptance, which a novel load leaves
        at the pessimistic floor (one H200, SmolLM2 memorised: 100 steps on the plain path before
        chain 8, where the first probe came at step 3). Once per request: a running request's own
        drafts already speak for it, and a spell begun on one scored draft of a request that was
        not new failed more often than it held (the simulator's switching loads)."""
        wanted = self._wanted(requests)
        self._back_off(wanted)
        if not wanted:
            self._owe_confirmation(requests)
        self.counters["probe_lookups"] += 1
        return self.note_lean(len(requests))

    def _owe_confirmation(self, requests: Sequence[RequestView]) -> None:
        """`note_probe`'s confirming probe: owed where a request of `requests` qualifies."""
        new = [r.req_id for r in requests
               if r.features.match_len >= self.cfg.max_chain - 1 and r.req_id not in self._confirmed
               and not self.gain.scored(r.req_id)]
        if not new or not self._full_acceptance_pays(len(requests)):
            return
        soon = min(self._probe_gap, self.cfg.probe_max) <= self.cfg.max_chain + 2
        if soon and self._plain_and_probe(len(requests))[1] <= self._probe_credit:
            return  # the next probe comes by then anyway, and is not held for credit
        self._confirmed.update(new)
        # (the probe step is not counted yet: its drafts are decided K + 1 tokens on, the host a
        # step behind)
        self._confirm_step = self.step + self.cfg.max_chain + 2
        self.counters["confirming_probes"] += 1

    def _full_acceptance_pays(self, bs: int) -> bool:
        """Would chains that matched in full and were accepted in full beat no speculation (by the
        hysteresis) at batch size `bs`, by the costs alone? Kept until the costs change."""
        def pays() -> bool:
            evals = [evaluate(o, self.costs, [float(o.k if o.kind == CHAIN else 0)] * bs,
                              self.cfg.shape) for o in self.options if o.kind != TREE]
            return choose(evals, self.options[0], self.cfg.hysteresis).option.kind != NONE

        return self._per_bs("full_acceptance_pays", bs, pays)

    def lean_pays(self, bs: int, margin: float = 0.02) -> bool:
        """Is a step without a lookup measured to be cheaper than a lookup step that verifies
        nothing? A lean step saves the lookup's host time but its drafts are never scored, so the
        gain model learns less; it is taken only where the whole-step costs (StepCosts) show it at
        least `margin` cheaper, and, to measure it, until it has `min_samples` periods. A plain cost
        table has no such difference: always False. Kept until the costs change (`_per_bs`: a
        verify spell's every lookup asks)."""
        return self._per_bs(("lean_pays", margin), bs, lambda: self._lean_pays(bs, margin))

    def _lean_pays(self, bs: int, margin: float) -> bool:
        step_ms = getattr(self.costs, "step_ms", None)
        if step_ms is None:
            return False
        if self.costs.samples(LEAN, bs, 1) < self.costs.min_samples:
            return True  # not measured yet: take lean steps to measure them
        return step_ms(LEAN, bs, 1) * (1.0 + margin) < step_ms(SPEC, bs, 1)

    def first_lookup_behind(self, req_ids: Sequence) -> bool:
        """A batch with requests not looked up yet: may their first lookup be a probe (made behind,
        the step a plain one) instead of a lookup step that waits for the step in flight? Only when
        (a) a lookup step at this batch size has been measured (`min_samples` SPEC periods of width
        1: until then these first lookups are what measures it) and measured dearer than a plain
        step (`lean_pays`), and (b) not even drafts that matched in full would be worth verifying
        for any of the requests (the gain model: a request without history gets the recent
        acceptance of all requests, none once it has been forgotten). A load whose drafts have been
        paying keeps its first lookups real. Sets `planned` to PLAN_PROBE when True (then
        `note_probe` with the probe's features)."""
        self.planned = None
        bs = len(req_ids)
        samples = getattr(self.costs, "samples", None)
        if not bs or samples is None or samples(SPEC, bs, 1) < self.costs.min_samples:
            return False
        if not self.lean_pays(bs):
            return False
        if self._full_match_wanted(req_ids):
            return False
        self.planned = PLAN_PROBE
        # a probe like plan_lookup's: the next one after the backed-off gap
        self._looked_up()
        return True

    def defer_first_lookup(self, req_ids: Sequence) -> bool:
        """A step right after new requests' prefill, whose drafts would be looked up behind the
        token in flight: may that lookup wait? True when not even drafts that matched in full would
        be verified for any request of the batch (`_full_match_wanted`): the lookup can then only be
        a probe, and made in this step it delays the new requests' first token (the scheduler
        processes the prefill's result after launching this step), while made later it runs on the
        host as the GPU decodes. The probe gap goes to 1, and that probe is owed: the first
        `plan_lookup` not in the steps right after the prefill (``refill``) looks up, whatever the
        probe credit (a repeated prompt's drafts may pay from its first step; held for credit, its
        probe came only `probe_max` steps after the last lookup). Asked too where new requests join
        a batch on the server's own decode path (``glue.plain_path``): True keeps them there, their
        first lookup a probe on the path. False: look up now; always before the gain model observed
        anything (a cold start learns from these first drafts)."""
        if not req_ids or self.gain.version == 0 or self._full_match_wanted(req_ids):
            return False
        self._probe_gap, self._probe_owed = 1, True
        return True

    def _looked_up(self) -> None:
        """A lookup was made (real, or a probe): the steps since the last one start again, and a
        probe owed to deferred first lookups is paid, as is a confirming probe once its step came
        (a probe before it cannot score the drafts it is owed for)."""
        self._since_lookup, self._probe_owed = 0, False
        if self._confirming():
            self._confirm_step = None

    def _confirming(self) -> bool:
        """Is the confirming probe (`note_probe`) owed at this step?"""
        return self._confirm_step is not None and self.step >= self._confirm_step

    def _back_off(self, speculating: bool) -> None:
        """Lookups back off while they buy nothing: after a lookup (or probe) the gap goes back to 1
        if it chose (or would choose) to speculate, and doubles otherwise."""
        self._probe_gap = 1 if speculating else min(self._probe_gap * 2, 1 << 16)

    def reset_probe(self) -> None:
        """A new request joined: look up again soon (its output may start repeating at once)."""
        self._probe_gap = 1

    def note_lean(self, bs: int) -> Decision:
        """A step that ran without a lookup: a decision for no speculation, counted like one."""
        self.step += 1
        self._accrue_probe_credit(bs)
        if self.current is not None and self.current.kind != NONE:
            self.counters["switches"] += 1
        self.current = self.options[0]
        t = self._plain_and_probe(bs)[0]
        d = Decision(self.current, (False,) * bs, {NONE: bs / t}, t, self.step)
        self._priced(d)
        self.counters["steps"] += 1
        self.counters["requests"] += bs
        self.counters["lean_steps"] += 1
        self.steps_by_mode[NONE] += 1
        return d

    def _priced(self, d: Decision) -> None:
        """The step's decision is the last one, and its own cost counts in an excursion's."""
        self.last = d
        if self._excursion is not None:
            self._excursion[2] += d.pass_ms
            self._excursion[3] += 1

    def excursion_begins(self, now_s: float, bs: int) -> None:
        """A batch of ``bs`` requests on the server's own decode path leaves it because a lookup is
        due (`lookup_on_plain_path` answered LOOKUP), at host clock ``now_s``: the costs of its
        steps in the worker, as decided, are summed until it comes back (`excursion_ends`)."""
        self._excursion = [now_s, bs, 0.0, 0]

    def excursion_void(self) -> None:
        """Whatever happens before the batch comes back measures no switch (a prefill came in
        between)."""
        self._excursion = None

    def excursion_ends(self, now_s: float, bs: int, max_steps: int) -> Optional[float]:
        """The batch is back on the path at host clock ``now_s`` with ``bs`` requests: what its
        excursion took beyond the costs of its steps in the worker as decided (ms; what starting a
        spell costs, `StepCosts.switch_ms`). None where no excursion was open, the batch size
        changed, or it ran more than ``max_steps`` steps (a longer spell would add its estimates'
        errors over every step)."""
        e, self._excursion = self._excursion, None
        if e is None or e[1] != bs or e[3] > max_steps:
            return None
        return 1000.0 * (now_s - e[0]) - e[2]

    def steps_without_lookup(self, probe_max: int, cap: int, req_ids: Sequence = (),
                             bs: int = 1, refill_steps: int = 0) -> int:
        """How many of the next steps `plan_lookup` would run without a lookup, the requests and
        what is known of their drafts staying as they are: the steps until the probe gap passes,
        and past it the steps a probe that could not pay is held for want of probe credit or
        because they are among the ``refill_steps`` next steps right after a prefill (its
        ``refill``; never past ``probe_max`` steps since the last lookup; ``probe_max`` 0: no
        probes, so ``cap``); a confirming probe (`note_probe`) waits for its step alone. A lookup
        that would be a real one is held by neither. Asked after a step that ran without a lookup,
        before a stretch of steps that make none (`note_plain_path`)."""
        if probe_max <= 0:
            return cap
        due = min(self._probe_gap, probe_max) - self._since_lookup - 1
        if self._confirm_step is not None:  # a confirming probe is due at its step
            due = min(due, max(self._confirm_step - self.step, 0))
        if due > 0 and due >= refill_steps:
            return min(due, cap)
        if self._full_match_wanted(list(req_ids)):
            return min(max(due, 0), cap)  # the lookup due is wanted: never held for credit
        plain, cost = self._plain_and_probe(bs)
        gain = self.cfg.probe_budget * plain
        # held at most until then
        forced = self.forced_probe_gap(probe_max, req_ids, bs) - self._since_lookup - 1
        if self._probe_owed:  # held by the steps right after the prefill alone
            forced = min(forced, max(refill_steps, due))
        elif gain > 0:
            # the j-th step from now sees the credit of j - 1 more steps and is held while it
            # does not cover the probe
            short = cost - self._probe_credit
            wait = max(math.ceil(short / gain), 0) if short > 0 else 0
            forced = min(forced, max(wait, refill_steps, due))
        if self._confirm_step is not None:  # a confirming probe is owed from its step on
            forced = min(forced, max(refill_steps, self._confirm_step - self.step))
        return max(min(forced, cap), 0)

    def note_plain_path(self, bs: int, n: int, ends: bool = True) -> None:
        """``n`` steps ran without speculation and without a lookup, none of them seen by the
        controller (the server's own decode path, ``glue.plain_path``): counted as ``n`` calls of
        `note_lean` and of `plan_lookup` answering False would count them (steps, probe credit, the
        steps since the last lookup), in one call. ``ends``: the stretch on that path ends here (it
        also goes on past a probe or a held one, `lookup_on_plain_path`, whose steps are counted
        there)."""
        if ends:
            self.counters["plain_path_stretches"] += 1
        if n <= 0:
            return
        self.step += n
        plain, cap = self._plain_and_probe(bs)
        gain = self.cfg.probe_budget * plain
        self._probe_credit = min(self._probe_credit + n * gain, max(cap, gain))
        self._since_lookup += n
        if self.current is not None and self.current.kind != NONE:
            self.counters["switches"] += 1
        self.current = self.options[0]
        self.counters["steps"] += n
        self.counters["requests"] += n * bs
        self.counters["lean_steps"] += n
        self.counters["plain_path_steps"] += n
        self.steps_by_mode[NONE] += n

    def lookup_is_real(self, requests: Sequence[RequestView]) -> bool:
        """Would a lookup made now for `requests` on the server's own decode path be a real one: are
        their drafts (their last known features) expected to be worth verifying? False: the next
        lookup there is a probe (`lookup_on_plain_path`), or held. Drafts that would be worth it
        only if they matched in full are looked for by a probe on the path first: left for the
        worker's lookup, each that found nothing there cost a lookup step and a plain step in the
        worker (~3 ms on one H200 at TP=1, against ~1.6 ms for two steps on the path) and the
        gap between them doubled up to `probe_max`, where a memorised request's drafts failed at
        a branch point mid-request (one H100, SmolLM2: open prompts at 0.81-0.88x chain +
        widths)."""
        return self._wanted(requests)

    def lookup_on_plain_path(self, requests: Sequence[RequestView], probe_max: int,
                             refill: bool = False) -> str:
        """A stretch on the server's own decode path (``glue.plain_path``) has reached the step its
        next lookup is due at (`steps_without_lookup` gave 0, the stretch's steps counted by
        `note_plain_path`). LOOKUP where that lookup is a real one (the requests' last drafts would
        be verified: `lookup_is_real`): the batch goes back to the worker, whose `plan_lookup` makes
        it, nothing is counted here. Otherwise what `plan_lookup` answers for this step, and the
        step stays on the path: PLAN_PROBE (a probe: the caller looks drafts up behind the step and
        reports them with `note_probe`, which counts the step; where drafts that matched in full
        would be verified, the lookup `plan_lookup` wants is this probe, never held for credit, and
        drafts it finds worth verifying send the batch to the worker at the next step) or HELD (the
        probe waits for credit, or for the steps after a prefill to pass: the step is counted here
        as `note_lean` counts it)."""
        if self.lookup_is_real(requests):
            return LOOKUP
        if self.plan_lookup(requests, probe_max, behind=True, refill=refill):
            self.planned = PLAN_PROBE  # (a wanted lookup: drafts that matched in full would pay)
            return PLAN_PROBE
        self.note_lean(len(requests))
        return HELD

    def observe(self, req_id, features: DraftFeatures, chain_accept: int,
                tree_accept: Optional[int] = None) -> None:
        self.gain.observe(req_id, features, self.step, chain_accept, tree_accept)

    def _age_verified(self) -> list:
        v = self._verified
        if self.step > v[2]:
            f = 0.5 ** ((self.step - v[2]) / self._cal_half_life)
            v[0], v[1], v[2] = v[0] * f, v[1] * f, self.step
        return v

    def _spell_begins(self) -> None:
        """Speculation starts again after steps without it: the last spell is judged by its
        verified drafts (those resolved by now; a draft resolves within K + 1 steps, and one still
        open counts towards the next spell). Where they accepted less than the band of what they
        were expected to (with the prior), the calibration forgets twice as slowly from here, up to
        `AutoConfig.calibration_backoff_max` times its base, so a load whose drafts keep failing
        pays for fewer and fewer trials (each one a verify pass for about one token); where they
        held, forgetting is back at its base. A spell with no draft resolved leaves it as it is."""
        exp, acc = self._spell
        if exp > 0.0:
            prior, base = self.cfg.calibration_prior, self.cfg.calibration_half_life
            if (acc + prior) / (exp + prior) < self.cfg.calibration_band:
                self._cal_half_life = min(2.0 * self._cal_half_life,
                                          base * self.cfg.calibration_backoff_max)
            else:
                self._cal_half_life = base
        self._spell = [0.0, 0.0]

    def note_verified(self, expected: float, accepted: float, req_id=None) -> None:
        """A verified draft resolved: it was expected to have `expected` draft tokens accepted
        (`Decision.gains`) and had `accepted` (at most the tokens verified). With ``req_id`` it is
        also summed for that request, whose sums are logged when it finishes (`finish`). Where the
        drafts verified since the last fresh evaluation accepted less than 1 - `CLEAR_MARGIN` of
        what they were expected to (all requests' together: the margin is the batch's), the last
        decision's standing as a clear one ends: the next lookup asks again and the next decision
        evaluates (`_still_verifying`, `_clear_reuse`). Drafts that start to fail end it within
        one to three steps. (Before, any one draft that accepted less than its expected mean ended
        it; where drafts diverge at a varying token, as memorised text does wherever the corpus
        holds two continuations, that undid it on most steps: with three drafts in ten diverging
        at a uniformly drawn token, `lab/verify_host_time.py --miss 0.3` evaluated afresh on 195
        and 431 of 600 steps at batch size 1 and 4.)"""
        expected, accepted = max(float(expected), 0.0), max(float(accepted), 0.0)
        if self._verified_for is not None:
            r = self._since_evaluated
            r[0] += expected
            r[1] += accepted
            if r[1] < (1.0 - CLEAR_MARGIN) * r[0]:
                self._verified_for = None
        if req_id is not None:
            r = self._verified_by_request.get(req_id)
            if r is None:
                r = self._verified_by_request[req_id] = [0, 0.0, 0.0]
            r[0] += 1
            r[1] += expected
            r[2] += accepted
        v = self._age_verified()
        v[0] += expected
        v[1] += accepted
        self._spell[0] += expected
        self._spell[1] += accepted

    def _calibration_key(self) -> float:
        """`calibration` to 3 decimals: what the estimates are scaled by (its forgetting moves it a
        little every step; the kept answers change only when that shows)."""
        return round(self.calibration(), 3)

    def calibration(self) -> float:
        """The factor on every estimate: min(1, (accepted + prior) / (expected + prior) / band) over
        the verified drafts' forgetting sums (module docstring)."""
        v = self._age_verified()
        prior = self.cfg.calibration_prior
        return min(1.0, (v[1] + prior) / (v[0] + prior) / self.cfg.calibration_band)

    def finish(self, req_id) -> None:
        """A request left the batch. Where its drafts were verified, one log record of what they
        were expected to accept and what they did (whether the gain model held for the requests it
        chose to speculate for: the decision log samples one step in 30 s)."""
        self.gain.drop(req_id)
        self._sampled.discard(req_id)
        self._confirmed.discard(req_id)
        r = self._verified_by_request.pop(req_id, None)
        if r is not None and self._log is not None:
            self._log({"request": str(req_id), "verified_drafts": r[0],
                       "expected_tokens": round(r[1], 2), "accepted_tokens": round(r[2], 2)})

    def note_sampling(self, req_id, sampled: bool) -> None:
        """Whether a request samples (temperature > 0) or decodes greedily, told once when it joins:
        a full match wanted for it (`_full_match_wanted`) is judged by the drafts of requests that
        decode as it does. Its drafts carry the same in their features (`DraftFeatures.sampled`)."""
        if sampled:
            self._sampled.add(req_id)
        else:
            self._sampled.discard(req_id)

    def samples(self, req_id) -> bool:
        """What `note_sampling` was told for this request (False: greedy, or not told)."""
        return req_id in self._sampled

    def no_draft(self, req_id) -> DraftFeatures:
        """A request's features before its first lookup, where that lookup was deferred
        (`defer_first_lookup`): no draft, sampling as the request does."""
        return DraftFeatures(0, 0, self.samples(req_id))

    def _maybe_log(self, d: Decision, requests, per_req) -> None:
        if self._log is None:
            return
        now = self._clock()
        if now - self._last_log < self.cfg.log_interval_s:
            self._suppressed += 1
            return
        self._last_log = now
        k = self.cfg.max_chain
        self._log({
            "step": d.step, "bs": len(requests), "option": d.option.label,
            "speedup_vs_none": round(d.speedup, 4),
            "rates_tok_per_ms": {lbl: round(r, 5) for lbl, r in d.rates.items()},
            "pass_ms": round(d.pass_ms, 4),
            "decode_ms": round(self.costs.decode_ms(len(requests)), 4),
            # what a step at each speculating option's width costs, as the rates above read it
            "step_ms": {o.label: round(self.costs.verify_step_ms(len(requests), o.width,
                                                                 len(requests) * o.width), 4)
                        for o in self.options if o.kind != NONE},
            # what starting a spell adds to its first step (none while one runs)
            "switch_ms": round(getattr(self.costs, "switch_ms", lambda bs: 0.0)(len(requests)), 4),
            "speculating": sum(d.speculate) if d.option.kind != NONE else 0,
            "mean_expected_chain_accept":
                round(sum(c[k - 1] for c, _ in per_req) / max(len(per_req), 1), 4),
            "mean_expected_tree_accept":
                round(sum(t for _, t in per_req) / max(len(per_req), 1), 4),
            "switches": self.counters["switches"], "decisions_since_last_log": self._suppressed + 1,
            "calibration": round(self.calibration(), 4),
            "calibration_half_life": self._cal_half_life,
        })
        self._suppressed = 0

    def metrics(self) -> dict:
        """Values for the server's metrics exporter (gauges and counters, all numbers)."""
        d = self.last
        out = {
            "auto_steps_total": float(self.counters["steps"]),
            "auto_switches_total": float(self.counters["switches"]),
            "auto_gated_requests_total": float(self.counters["gated_requests"]),
            "auto_requests_total": float(self.counters["requests"]),
            "auto_lean_steps_total": float(self.counters["lean_steps"]),
            "auto_probe_lookups_total": float(self.counters["probe_lookups"]),
            "auto_behind_lookups_total": float(self.counters["behind_lookups"]),
            "auto_probes_held_total": float(self.counters["probes_held"]),
            "auto_plain_path_steps_total": float(self.counters["plain_path_steps"]),
            "auto_plain_path_stretches_total": float(self.counters["plain_path_stretches"]),
            "auto_plain_path_joins_total": float(self.counters["plain_path_joins"]),
            "auto_calibration": self.calibration(),
            "auto_calibration_half_life_steps": float(self._cal_half_life),
        }
        for lbl, n in self.steps_by_mode.items():
            out[f"auto_steps_{lbl}_total"] = float(n)
        if d is not None:
            out.update({
                "auto_chain_k": float(d.option.k if d.option.kind == CHAIN else 0),
                "auto_tree": float(d.option.kind == TREE),
                "auto_expected_speedup": d.speedup,
                "auto_pass_ms": d.pass_ms,
            })
        return out
