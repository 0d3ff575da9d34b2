"""`fastverify advise`: will speculation pay on this box, and with which shape, before the load.

Costs (one of):
- `--profile NAME|PATH`: a pass-cost profile (fastverify.passcost; `passcost.builtin_names()`);
- `--bench PATH[#backend]`: a `fastverify bench allreduce --json` run on the user's own GPUs;
- numbers: `--allreduces 122 --allreduce-us 1:59,4:205,8:230 --compute-ms 5` (and `--plain-ms 12.2`
  in place of the 1-token point).
`--compute-ms` also replaces the compute of a profile or bench result (a number, TOKENS:MS pairs, or
a bench json whose compute column is taken).

Acceptance (n-gram shapes, one of): `--trace FILE` (replayed through SGLang's own n-gram corpus, as
`fastverify replay` does), `--accept tree8=1.3-1.5,chain3=1.6,chain3+widths=1.6@0.7` (accept
length = tokens per step, bonus included, as SGLang logs it; A-B: a range; @M: the share of steps
whose lookup matched, the rest run as plain decode steps), the embedded default trace when
neither is given, `--trace none` for no n-gram shapes. Model drafters:
`--drafter eagle3:k=3,accept=2.0,step_ms=1.0` (repeatable; `draft_ms=` for the whole draft of a
step instead of per draft step).

One stream (batch size 1). A shape's step costs its verify pass plus its extra host or drafter time:

    tok/s(shape)    = tokens / (fixed_ms + allreduces * x * verify_passes / 1000) * 1000
    pays below x*   = (tokens * plain_ms - fixed_ms) * 1000 / (allreduces * verify_passes)

over the steps of the replay (or one mean step for typed-in acceptance); x is the per-call cost of
the verify passes' all-reduces (now: the profile's at their token counts), fixed_ms everything else
(compute of the verify passes, steps run as plain decodes, lookups, drafting). x* is the cost below
which the shape beats plain decoding with plain decode, compute and drafting held as they are: what
the all-reduce path of the verify passes must reach. A shape that loses is reported at its own rate
(controller.evaluate would gate it to plain's); `auto` is the controller's pick (the simulator with
the real controller on a trace; for typed-in acceptance the best of plain and the typed chains as
the controller rates them).
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from fastverify import passcost
from fastverify.argtypes import int_list
from fastverify.passcost import PassCostError, PassCostProfile

DRAFTER_KINDS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "standalone": "STANDALONE"}
AUTO_WIDTHS = (1, 2, 4, 8)  # the chain widths auto is launched with (README flags)
DEFAULT_MARGIN = 0.03  # a shape is recommended over plain only above 1 + margin (auto's hysteresis)


class AdviseError(ValueError):
    """A bad flag or file for `fastverify advise`; the message names the flag and the value."""


# ------------------------------------------------------------------------------------- the math
@dataclass(frozen=True)
class StepForm:
    """What a shape's steps cost as a function of the verify passes' per-call all-reduce cost x:
    time(x) = fixed_ms + allreduces * x * verify_passes / 1000 over `steps` steps emitting
    `tokens` tokens. `ar_now_us`: the mean per-call cost of those passes in the profile."""

    tokens: float
    steps: int
    verify_passes: float  # a count over replayed steps; a share of one typed-in mean step
    fixed_ms: float
    ar_now_us: float

    def time_ms(self, allreduces: int, x_us: Optional[float] = None) -> float:
        x = self.ar_now_us if x_us is None else x_us
        return self.fixed_ms + allreduces * x * self.verify_passes / 1000.0

    def tok_s(self, allreduces: int, x_us: Optional[float] = None) -> float:
        return self.tokens / self.time_ms(allreduces, x_us) * 1000.0

    def accept_length(self) -> float:
        return self.tokens / self.steps

    def pays_below_us(self, allreduces: int, plain_ms: float) -> Optional[float]:
        """x* (us), 0.0 when even free all-reduces do not pay; None without all-reduces in its
        verify passes (then x does not decide)."""
        if allreduces == 0 or self.verify_passes == 0:
            return None
        return max(0.0, (self.tokens * plain_ms - self.fixed_ms) * 1000.0
                   / (allreduces * self.verify_passes))


def typed_form(profile: PassCostProfile, width: int, accept: float, extra_ms: float) -> StepForm:
    """One mean step: a verify pass of `width` tokens emitting `accept` tokens, `extra_ms` more."""
    return StepForm(accept, 1, 1, profile.compute_pass_ms(width) + extra_ms, profile.ar_us(width))


def replay_form(profile: PassCostProfile, accept_lens: Sequence[int], pass_tokens: Sequence[int],
                extra_ms: float) -> StepForm:
    """The replayed steps: step s emits accept_lens[s] tokens in a pass of pass_tokens[s] tokens
    (1: a plain decode step, whose cost stays the profile's), each step `extra_ms` more."""
    fixed, ar_sum, verify = 0.0, 0.0, 0
    for n in pass_tokens:
        if n <= 1:
            fixed += profile.pass_ms(1)
        else:
            fixed += profile.compute_pass_ms(n)
            ar_sum += profile.ar_us(n)
            verify += 1
    fixed += extra_ms * len(pass_tokens)
    return StepForm(float(sum(accept_lens)), len(pass_tokens), verify, fixed,
                    ar_sum / verify if verify else 0.0)


# ------------------------------------------------------------------------------------- shapes
@dataclass
class Row:
    label: str
    kind: str  # plain | tree | chain | chain+widths | auto | drafter
    width: int  # tokens of its verify pass (the widest, with widths)
    forms: tuple  # (StepForm,) or (low, high) for an accept-length range; () for auto
    acceptance: str  # where its acceptance came from
    flags: str  # the launch flags that run it
    extra_ms: float = 0.0
    auto_tok_s: Optional[float] = None  # auto only: its simulated (or rated) tok/s
    note: str = ""

    def tok_s(self, n: int) -> tuple:
        return (self.auto_tok_s,) if self.auto_tok_s is not None else \
            tuple(f.tok_s(n) for f in self.forms)

    def accept(self) -> tuple:
        return tuple(f.accept_length() for f in self.forms)

    def pays_below(self, n: int, plain_ms: float) -> tuple:
        return tuple(f.pays_below_us(n, plain_ms) for f in self.forms)


def ngram_flags(kind: str, k: int) -> str:
    base = "--speculative-algorithm NGRAM"
    if kind == "tree":
        return f"{base} --speculative-num-draft-tokens {k}"
    flags = f"{base} --speculative-ngram-verify-mode chain --speculative-num-draft-tokens {k + 1}"
    if kind == "chain+widths":
        flags += f" --speculative-ngram-verify-widths {','.join(map(str, _widths(k + 1)))}"
    return flags


def auto_flags(max_chain: int) -> str:
    return (f"--speculative-algorithm NGRAM --speculative-num-draft-tokens {max_chain + 1} "
            f"--speculative-ngram-verify-mode auto --speculative-ngram-verify-widths "
            f"{','.join(map(str, _widths(max_chain + 1)))}")


def drafter_flags(kind: str, k: int) -> str:
    return (f"--speculative-algorithm {DRAFTER_KINDS[kind]} --speculative-draft-model-path DRAFT "
            f"--speculative-num-steps {k} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {k + 1}")


def _widths(top: int) -> tuple:
    """Verify widths a chain + widths server captures: powers of two below `top`, and `top`."""
    w, out = 1, []
    while w < top:
        out.append(w)
        w *= 2
    return tuple(out) + (top,)


# ------------------------------------------------------------------------------ flag parsing
def _range(text: str, flag: str, what: str) -> tuple:
    """'1.4' -> (1.4,); '1.3-1.5' -> (1.3, 1.5)."""
    lo, sep, hi = text.strip().partition("-")
    try:
        vals = (float(lo),) if not sep else (float(lo), float(hi))
    except ValueError:
        raise AdviseError(f"{flag}: {what} {text!r} is not a number or a range A-B "
                          f"(e.g. 1.4 or 1.3-1.5)") from None
    if any(not math.isfinite(v) for v in vals) or (sep and vals[0] > vals[1]):
        raise AdviseError(f"{flag}: {what} {text!r}: expected finite numbers, low-high")
    return vals if sep and vals[0] != vals[1] else vals[:1]


def _check_accept(flag: str, label: str, vals: tuple, width: int) -> None:
    for a in vals:
        if not 1.0 <= a <= width:
            raise AdviseError(f"{flag}: {label} accept length {a:g} is outside 1..{width} (tokens "
                              f"per step, bonus included: at least 1, at most the {width} tokens "
                              f"its verify pass holds)")


def parse_accept(text: str, flag: str = "--accept") -> list:
    """'tree8=1.3-1.5,chain3=1.6,chain3+widths=1.6@0.7' -> [("tree", 8, (1.3, 1.5), None),
    ("chain", 3, (1.6,), None), ("chain+widths", 3, (1.6,), 0.7)]. tree D: a tree of D tokens (root
    included, SGLang's --speculative-num-draft-tokens D); chain K: K draft tokens (a verify pass of
    K + 1); chainK+widths=A@M: the same with verify widths, where the M of the steps whose lookup
    matched verify (at most K + 1 tokens) and the others run as plain decode steps."""
    out, seen = [], set()
    for part in [p for p in text.split(",") if p.strip()]:
        name, sep, val = part.partition("=")
        name = name.strip()
        if not sep:
            raise AdviseError(f"{flag}: {part!r} is not SHAPE=ACCEPT (e.g. tree8=1.4, chain3=1.6)")
        base, widths = (name[:-len("+widths")], True) if name.endswith("+widths") else (name, False)
        for kind in ("tree", "chain"):
            if base.startswith(kind) and base[len(kind):].isdigit() and (kind == "chain"
                                                                         or not widths):
                k = int(base[len(kind):])
                break
        else:
            raise AdviseError(f"{flag}: unknown shape {name!r}; allowed: treeD (D >= 2 tokens, "
                              f"root included), chainK (K >= 1 draft tokens), "
                              f"chainK+widths=ACCEPT@MATCHED")
        match = None
        if widths:
            val, at, m = val.partition("@")
            try:
                match = float(m) if at else None
            except ValueError:
                match = None
            if match is None or not 0 < match <= 1:
                raise AdviseError(f"{flag}: {name} needs =ACCEPT@MATCHED, MATCHED the share of "
                                  f"steps whose lookup found a draft, in (0, 1] (e.g. "
                                  f"{name}=1.4@0.7)")
            kind = "chain+widths"
        if (kind == "tree" and k < 2) or (kind == "chain" and k < 1):
            raise AdviseError(f"{flag}: {name}: a tree needs >= 2 tokens, a chain >= 1 draft")
        if name in seen:
            raise AdviseError(f"{flag}: {name} given twice")
        seen.add(name)
        vals = _range(val, flag, f"{name}'s accept length")
        _check_accept(flag, name, vals, k if kind == "tree" else k + 1)
        out.append((kind, k, vals, match))
    if not out:
        raise AdviseError(f"{flag}: no shapes (e.g. tree8=1.3-1.5,chain3=1.6)")
    return out


@dataclass(frozen=True)
class Drafter:
    kind: str
    k: int
    accept: tuple
    draft_ms: float  # drafting time of one step (all k draft steps)
    label: str
    spec: str  # as typed


def parse_drafter(text: str, flag: str = "--drafter") -> Drafter:
    kind, sep, rest = text.partition(":")
    kind = kind.strip().lower()
    if kind not in DRAFTER_KINDS:
        raise AdviseError(f"{flag} {text!r}: drafter kind {kind!r} unknown; allowed: "
                          f"{', '.join(DRAFTER_KINDS)} (e.g. eagle3:k=3,accept=2.0,step_ms=1.0)")
    kv = {}
    for part in [p for p in rest.split(",") if p.strip()]:
        key, eq, val = part.partition("=")
        if not eq or key.strip() not in ("k", "accept", "step_ms", "draft_ms", "name"):
            raise AdviseError(f"{flag} {text!r}: {part!r}; keys are k, accept, step_ms or "
                              f"draft_ms, name (e.g. eagle3:k=3,accept=2.0,step_ms=1.0)")
        kv[key.strip()] = val.strip()
    for key in ("k", "accept"):
        if key not in kv:
            raise AdviseError(f"{flag} {text!r}: missing {key}= (e.g. eagle3:k=3,accept=2.0,"
                              f"step_ms=1.0)")
    if ("step_ms" in kv) == ("draft_ms" in kv):
        raise AdviseError(f"{flag} {text!r}: give the drafter's time as step_ms= (per draft step) "
                          f"or draft_ms= (per decode step), one of them")
    try:
        k = int(kv["k"])
        ms = float(kv.get("step_ms") or kv["draft_ms"])
    except ValueError:
        raise AdviseError(f"{flag} {text!r}: k is an integer and step_ms/draft_ms a number") \
            from None
    if k < 1 or not math.isfinite(ms) or ms < 0:
        raise AdviseError(f"{flag} {text!r}: k must be >= 1 and the drafter's ms >= 0")
    accept = _range(kv["accept"], flag, "accept length")
    label = kv.get("name") or f"{kind} chain{k}"
    _check_accept(flag, label, accept, k + 1)
    draft_ms = ms * k if "step_ms" in kv else ms
    return Drafter(kind, k, accept, draft_ms, label, text)


# ------------------------------------------------------------------------------------- costs
def _compute_override(text: str) -> tuple:
    """--compute-ms: a number, TOKENS:MS pairs, or a bench json (its compute column)."""
    p = Path(text.partition("#")[0])
    if p.suffix == ".json" or p.is_file():
        if not p.is_file():
            raise AdviseError(f"--compute-ms {text}: file not found")
        obj = passcost._read_json(p, "--compute-ms")
        pts = passcost.microbenchmark_compute(obj, f"--compute-ms {p}")
        if not pts:
            raise AdviseError(f"--compute-ms {p}: the result has no compute column (compute_us)")
        return pts, passcost.compute_note(obj, str(p))
    pts = passcost.parse_points(text, "--compute-ms", "MS")
    return tuple(sorted(pts.items())), f"compute typed in: --compute-ms {text}"


def load_costs(args) -> tuple:
    """(profile, route text) from the flags; exactly one route."""
    routes = [r for r, v in (("--profile", args.profile), ("--bench", args.bench),
                             ("--allreduce-us", args.allreduce_us)) if v]
    if len(routes) != 1:
        raise AdviseError(
            ("costs from more than one route: " + ", ".join(routes) + "; give one") if routes else
            "no costs: give --profile NAME|PATH (built in: " + ", ".join(passcost.builtin_names())
            + "), --bench RESULT.json[#backend] (fastverify bench allreduce --json), or numbers: "
            "--allreduces 122 --allreduce-us 1:59,4:205,8:230 --compute-ms 5")
    if args.plain_ms is not None and not args.allreduce_us:
        raise AdviseError("--plain-ms goes with typed-in numbers (--allreduce-us); a profile's "
                          "plain decode step is its 1-token pass")
    if args.allreduces is not None and not args.allreduce_us:
        raise AdviseError("--allreduces goes with --allreduce-us; a profile or bench result "
                          "says how many all-reduces a pass makes")
    if args.profile:
        prof = passcost.load_profile(args.profile, "--profile")
        where = f"profile {prof.name} ({_short(prof.path)})"
    elif args.bench:
        path = Path(args.bench.partition("#")[0])
        if not path.is_file():
            raise AdviseError(f"--bench {args.bench}: file not found")
        if not passcost.is_microbenchmark(passcost._read_json(path, "--bench")):
            raise AdviseError(f"--bench {args.bench}: not a `fastverify bench allreduce --json` "
                              f"result (no summary.rows); a profile file goes to --profile")
        prof = passcost.load_profile(args.bench, "--bench")
        where = f"microbenchmark {prof.name} ({_short(prof.path)})"
    else:
        if args.allreduces is None:
            raise AdviseError("--allreduce-us needs --allreduces N (all-reduces per pass, e.g. "
                              "122 = 2 per layer x 61 layers)")
        ar = passcost.parse_points(args.allreduce_us, "--allreduce-us", "US")
        compute = None
        if args.compute_ms is not None:
            pts, _ = _compute_override(args.compute_ms)
            compute = dict(pts)
        prof = passcost.from_numbers(args.allreduces, ar, compute, args.plain_ms,
                                     source=("typed in on the command line",))
        return prof, "numbers typed in (--allreduces, --allreduce-us, --compute-ms, --plain-ms)"
    if args.compute_ms is not None:
        pts, note = _compute_override(args.compute_ms)
        prof = prof.with_compute(pts, note)
        where += f", compute replaced (--compute-ms {args.compute_ms})"
    return prof, where


def _short(path: str) -> str:
    text = str(path).split()[-1] if path else "built in code"
    try:
        root = Path(passcost.__file__).resolve().parent.parent
        return str(Path(text).resolve().relative_to(root))
    except ValueError:
        return text


# -------------------------------------------------------------------------------- acceptance
def _progress(msg: str) -> None:
    print(f"[advise] {msg}", file=sys.stderr, flush=True)


def trace_rows(profile: PassCostProfile, trace_path, tree_widths: Sequence[int],
               chain_lengths: Sequence[int], lookup_ms: float, max_chain: int,
               corpus_factory=None, say=_progress) -> tuple:
    """Rows from a trace replayed through SGLang's corpus (fastverify.replay, one stream), and
    auto from the simulator with the real controller (fastverify.sim) on the same trace."""
    from fastverify import replay as rp
    from fastverify import sim
    from fastverify.controller import AutoConfig

    trace = rp.load_trace(trace_path)
    factory = corpus_factory or rp.sglang_corpus_factory
    cfgs = [rp.ReplayConfig("tree", d) for d in tree_widths] + \
           [rp.ReplayConfig("chain", k) for k in chain_lengths]
    if cfgs:
        rp.warm_up(factory, cfgs[0], say)
    src = f"replayed: {Path(trace.path).name}"
    rows = []
    for i, cfg in enumerate(cfgs, 1):
        say(f"replaying {cfg.label} ({i}/{len(cfgs)})")
        d = cfg.corpus_draft_tokens
        res = rp.replay(trace, cfg, factory, buckets=_widths(d) if cfg.mode == "chain" else ())
        static = replay_form(profile, res.accept_lens, res.step_static, lookup_ms)
        if cfg.mode == "tree":
            rows.append(Row(f"tree{d}", "tree", d, (static,), src, ngram_flags("tree", d),
                            lookup_ms))
            continue
        k = cfg.size
        rows.append(Row(f"chain{k}", "chain", k + 1, (static,), src, ngram_flags("chain", k),
                        lookup_ms))
        gated = replay_form(profile, res.accept_lens, res.step_planned, lookup_ms)
        rows.append(Row(f"chain{k}+widths", "chain+widths", k + 1, (gated,), src,
                        ngram_flags("chain+widths", k), lookup_ms,
                        note=f"{sum(res.matched) / max(1, res.steps):.0%} of steps matched"))
    say("auto: the simulator with the real controller on the same trace")
    reqs = sim.replay_requests(trace_path, max_chain=max_chain, tree_width=8,
                               corpus_factory=factory)
    acfg = AutoConfig(max_chain=max_chain, tree_width=0, chain_widths=_widths(max_chain + 1))
    table = profile.cost_table(sim.TABLE_POINTS)
    res = sim.run_all(reqs, table, 1, acfg, lookup_ms=lookup_ms)["auto"]
    rows.append(Row("auto", "auto", max_chain + 1, (), f"simulated on {Path(trace.path).name}",
                    auto_flags(max_chain), lookup_ms, auto_tok_s=res.tokens_per_s,
                    note=_mix(res.options)))
    return rows, f"{src} ({len(trace.requests)} requests, {trace.decode_tokens} decode tokens" + \
        (f"; {trace.meta['model']}" if trace.meta.get("model") else "") + ")"


def _mix(options: Sequence[str]) -> str:
    counts: dict = {}
    for o in options:
        counts[o] = counts.get(o, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
    return "steps: " + ", ".join(f"{k} {v}" for k, v in top)


def typed_rows(profile: PassCostProfile, accepts: list, lookup_ms: float, spec: str) -> list:
    from fastverify.controller import CHAIN, Option, evaluate

    rows = []
    for kind, k, vals, match in accepts:
        width = k if kind == "tree" else k + 1
        if match is None:
            forms = tuple(typed_form(profile, width, a, lookup_ms) for a in vals)
        else:  # a mean step: `match` of a verify pass of at most `width`, the rest plain decode
            forms = tuple(StepForm(a, 1, match, match * profile.compute_pass_ms(width)
                                   + (1 - match) * profile.pass_ms(1) + lookup_ms,
                                   profile.ar_us(width)) for a in vals)
        label = f"chain{k}+widths" if kind == "chain+widths" else f"{kind}{k}"
        rows.append(Row(label, kind, width, forms, f"typed in (--accept {spec})",
                        ngram_flags(kind, k), lookup_ms,
                        note="" if match is None else f"{match:.0%} of steps matched (typed)"))
    chains = [(k, vals) for kind, k, vals, _ in accepts if kind == "chain"]
    table = profile.cost_table(sorted({1} | {k + 1 for k, _ in chains}))
    best = 1000.0 / profile.pass_ms(1)
    for k, vals in chains:  # the controller's rate (plain's where it would gate the chain off)
        rate = evaluate(Option(CHAIN, k, k + 1), table, [min(vals) - 1.0]).rate * 1000.0
        best = max(best, rate)
    top = max([k for k, _ in chains], default=7)
    rows.append(Row("auto", "auto", top + 1, (), "the controller's rate on the typed chains",
                    auto_flags(top), lookup_ms, auto_tok_s=best,
                    note="no chain typed: auto stays at plain" if not chains else
                    "best of plain and the typed chains (low accept), steady acceptance"))
    return rows


def drafter_rows(profile: PassCostProfile, drafters: Sequence[Drafter]) -> list:
    return [Row(d.label, "drafter", d.k + 1,
                tuple(typed_form(profile, d.k + 1, a, d.draft_ms) for a in d.accept),
                f"typed in (--drafter {d.spec})", drafter_flags(d.kind, d.k), d.draft_ms,
                note=f"drafting {d.draft_ms:g} ms per step") for d in drafters]


# ------------------------------------------------------------------------------------ report
@dataclass
class Advice:
    profile: PassCostProfile
    cost_route: str
    acceptance: list  # lines: where acceptance came from
    rows: list
    lookup_ms: float
    margin: float
    repro_command: str = ""
    preamble: list = field(default_factory=list)

    @property
    def plain_ms(self) -> float:
        return self.profile.pass_ms(1)

    @property
    def plain_tok_s(self) -> float:
        return 1000.0 / self.plain_ms

    def recommendation(self) -> dict:
        n = self.profile.allreduces_per_pass
        scored = [(min(r.tok_s(n)), r) for r in self.rows]
        if not scored:
            return {"shape": "plain", "flags": "", "why": "no shape to compare"}
        rate, best = max(scored, key=lambda s: s[0])
        ratio = rate / self.plain_tok_s
        if ratio >= 1.0 + self.margin:
            why = (f"{best.label}: {rate:.1f} tok/s, {ratio:.2f}x plain at its lowest accept "
                   f"length")
            out = {"shape": best.label, "flags": best.flags, "why": why, "ratio": ratio}
            if best.kind in ("tree", "chain", "chain+widths"):
                auto = [r for r in self.rows if r.kind == "auto"]
                if auto:
                    out["also"] = ("auto picks the width per step and falls back to plain where "
                                   "drafts stop paying: " + auto[0].flags)
            return out
        spec = [(r, s) for s, r in scored if r.kind != "auto"]
        closest = max(spec, key=lambda rs: rs[1], default=None)
        why = (f"no shape beats plain by more than {self.margin:.0%} at these costs" +
               (f"; the closest, {closest[0].label}, {closest[1] / self.plain_tok_s:.2f}x plain"
                if closest else ""))
        out = {"shape": "plain", "flags": "", "why": why, "ratio": 1.0}
        if closest:
            pb = [p for p in closest[0].pays_below(n, self.plain_ms) if p is not None]
            if pb:
                out["pays_when"] = (
                    f"{closest[0].label} starts to pay once one all-reduce of its "
                    f"{closest[0].width}-token verify pass costs less than {min(pb):.0f} us "
                    f"(now {closest[0].forms[0].ar_now_us:.0f} us)")
        return out

    def to_json(self) -> dict:
        n = self.profile.allreduces_per_pass
        rows = []
        for r in self.rows:
            rows.append({
                "shape": r.label, "kind": r.kind, "verify_tokens": r.width,
                "accept_length": list(r.accept()), "tok_s": list(r.tok_s(n)),
                "vs_plain": [t / self.plain_tok_s for t in r.tok_s(n)],
                "step_ms": [f.time_ms(n) / f.steps for f in r.forms],
                "allreduce_us_now": r.forms[0].ar_now_us if r.forms else None,
                "pays_below_allreduce_us": list(r.pays_below(n, self.plain_ms)),
                "extra_ms_per_step": r.extra_ms, "acceptance": r.acceptance, "flags": r.flags,
                "note": r.note})
        return {"repro_command": self.repro_command, "preamble": self.preamble,
                "costs": {"route": self.cost_route, "profile": self.profile.to_json()},
                "plain": {"ms_per_token": self.plain_ms, "tok_s": self.plain_tok_s},
                "acceptance": self.acceptance, "lookup_ms": self.lookup_ms,
                "margin": self.margin, "rows": rows, "recommendation": self.recommendation()}


def _fmt(vals: tuple, spec: str, none: str = "-") -> str:
    vals = tuple(v for v in vals if v is not None)
    if not vals:
        return none
    texts = [format(v, spec) for v in vals]
    return texts[0] if len(set(texts)) == 1 else f"{texts[0]}-{texts[-1]}"


def make_preamble(adv: Advice) -> list:
    p = adv.profile
    pts = ", ".join(f"{p.ar_us(t):.1f} ({t})" for t in (1, 2, 4, 8, 16, 64))
    per = "" if p.batch == 1 else f" per request, the pass {p.batch} x as many"
    streams = "one stream" if p.batch == 1 else f"each of {p.batch} streams decoded together"
    lines = [f"fastverify advise: predicted tok/s of {streams} per speculative shape (a model "
             "of the costs below, not a measurement)",
             f"costs: {adv.cost_route}",
             f"  {p.allreduces_per_pass} all-reduces per pass; us per all-reduce (tokens{per}): "
             f"{pts}",
             "  compute ms per pass (tokens): " + (", ".join(
                 f"{p.compute_pass_ms(t):.2f} ({t})" for t in (1, 4, 8, 64)) if p.has_compute
                 else "none (communication only)")]
    lines += [f"  source: {s}" for s in p.source]
    if p.derivation:
        lines.append(f"  derivation: {p.derivation}")
    lines.append(f"plain decode: a pass of 1 token, {adv.plain_ms:.2f} ms = "
                 f"{adv.plain_tok_s:.1f} tok/s")
    lines += [f"acceptance: {a}" for a in adv.acceptance]
    lines.append(f"n-gram lookup: +{adv.lookup_ms:g} ms per n-gram step (--lookup-ms)")
    lines.append("pays below: the per-call all-reduce cost of the verify passes under which the "
                 "shape beats plain (plain, compute and drafting held); 0 = not even free ones")
    return lines


def format_table(adv: Advice) -> str:
    n = adv.profile.allreduces_per_pass
    head = (f"{'shape':<18} {'accept len':>10} {'verify tok':>10} {'step ms':>12} "
            f"{'tok/s':>12} {'x plain':>10} {'AR us now':>9} {'pays below':>12}  note")
    lines = [head, "-" * len(head)]
    lines.append(f"{'plain':<18} {1.0:>10.2f} {1:>10} {adv.plain_ms:>12.2f} "
                 f"{adv.plain_tok_s:>12.1f} {1.0:>10.2f} {adv.profile.ar_us(1):>9.1f} "
                 f"{'-':>12}  no speculation")
    for r in adv.rows:
        tok = r.tok_s(n)
        step = tuple(f.time_ms(n) / f.steps for f in r.forms)
        lines.append(
            f"{r.label:<18} {_fmt(r.accept(), '.2f'):>10} {r.width:>10} {_fmt(step, '.2f'):>12} "
            f"{_fmt(tok, '.1f'):>12} {_fmt(tuple(t / adv.plain_tok_s for t in tok), '.2f'):>10} "
            f"{(format(r.forms[0].ar_now_us, '.1f') if r.forms else '-'):>9} "
            f"{_fmt(r.pays_below(n, adv.plain_ms), '.0f'):>12}  {r.note}")
    return "\n".join(lines)


def format_report(adv: Advice) -> str:
    out = [f"# {line}" for line in adv.preamble]
    out.append(format_table(adv))
    rec = adv.recommendation()
    if rec["shape"] == "plain":
        out.append(f"# recommended: plain decoding (no speculative flags): {rec['why']}")
        if rec.get("pays_when"):
            out.append(f"#   {rec['pays_when']}")
    else:
        out.append(f"# recommended: {rec['flags']}")
        out.append(f"#   {rec['why']}")
        if rec.get("also"):
            out.append(f"#   or {rec['also']}")
    return "\n".join(out)


def plot(adv: Advice, out: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise AdviseError(f"--png {out}: matplotlib is not installed (pip install matplotlib)") \
            from None
    n = adv.profile.allreduces_per_pass
    rows = [r for r in adv.rows if r.forms]
    nows = [r.forms[0].ar_now_us for r in rows] + [adv.profile.ar_us(1)]
    pbs = [p for r in rows for p in r.pays_below(n, adv.plain_ms) if p]
    xmax = max([1.0] + [1.25 * v for v in nows] + [1.25 * v for v in pbs])
    xs = [xmax * i / 200 for i in range(201)]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ax.axhline(adv.plain_tok_s, color="k", ls="--", label=f"plain {adv.plain_tok_s:.1f} tok/s")
    bases = list(dict.fromkeys(r.label.replace("+widths", "") for r in rows))
    cmap = plt.get_cmap("tab10" if len(bases) <= 10 else "tab20")
    for r in rows:  # a range of accept lengths: its middle drawn, its ends shaded
        def mid(x=None):
            return sum(f.tok_s(n, x) for f in r.forms) / len(r.forms)
        color = cmap(bases.index(r.label.replace("+widths", "")) % cmap.N)
        line, = ax.plot(xs, [mid(x) for x in xs], label=r.label, color=color,
                        ls="--" if r.kind == "chain+widths" else "-")
        ax.plot([r.forms[0].ar_now_us], [mid()], "o", color=color, ms=7)
        if len(r.forms) > 1:
            ax.fill_between(xs, [r.forms[0].tok_s(n, x) for x in xs],
                            [r.forms[-1].tok_s(n, x) for x in xs], color=line.get_color(),
                            alpha=0.12)
    for r in adv.rows:
        if r.kind == "auto" and r.auto_tok_s:
            ax.plot([adv.profile.ar_us(r.width)], [r.auto_tok_s], "*", color="k", ms=12,
                    label=f"auto {r.auto_tok_s:.1f} tok/s (at these costs)")
    ax.set_xlabel("per-call all-reduce cost of the verify passes (us); plain decode held")
    ax.set_ylabel("predicted tok/s (one stream)")
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, None)
    ax.set_title(f"will it pay? {adv.profile.name}: dots = this box's costs", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------- CLI
def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("advise", help="will speculation pay on this box, and how? "
                              "(costs + acceptance -> predicted tok/s per shape, launch flags)",
                              description=__doc__.split("\n\n")[0])
    _fill_parser(p)
    p.set_defaults(func=run_cli)
    return p


def _fill_parser(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("costs (one route)")
    g.add_argument("--profile", help="a pass-cost profile: built-in name ("
                   + ", ".join(passcost.builtin_names()) + ") or a profile file")
    g.add_argument("--bench", help="a `fastverify bench allreduce --json` result [#backend]")
    g.add_argument("--allreduces", type=int, help="all-reduces per forward pass (e.g. 122)")
    g.add_argument("--allreduce-us", help="us per all-reduce at token counts, e.g. 1:59,4:205,8:230"
                   " (one number: the same at every count)")
    g.add_argument("--compute-ms", help="compute ms per pass: a number, TOKENS:MS pairs, or a "
                   "bench json (its compute column); replaces a profile's compute")
    g.add_argument("--plain-ms", type=float, help="with --allreduce-us: the plain decode step (ms),"
                   " which sets the 1-token all-reduce cost")
    g = p.add_argument_group("acceptance")
    g.add_argument("--trace", help="JSONL trace of greedy outputs to replay through SGLang's "
                   "n-gram corpus (default: the embedded trace); 'none': no n-gram shapes")
    g.add_argument("--accept", help="accept lengths per n-gram shape, e.g. "
                   "tree8=1.3-1.5,chain3=1.6,chain3+widths=1.6@0.7 (@: share of steps matched)")
    g.add_argument("--drafter", action="append", default=[],
                   help="a model drafter, e.g. eagle3:k=3,accept=2.0,step_ms=1.0 (kinds: "
                        + ", ".join(DRAFTER_KINDS) + "; draft_ms= for a whole step; repeatable)")
    g.add_argument("--tree-widths", type=int_list("--tree-widths"), default=[8],
                   help="trees replayed from a trace (tokens, root included; default 8)")
    g.add_argument("--chain-lengths", type=int_list("--chain-lengths"), default=[1, 2, 3, 4, 7],
                   help="chains replayed from a trace (draft tokens; default 1,2,3,4,7)")
    g.add_argument("--max-chain", type=int, default=7, help="auto's longest chain (default 7)")
    p.add_argument("--concurrency", type=int, default=1,
                   help="requests decoded together, in steady state and each in the same shape "
                        "(a pass holds that many times the tokens; tok/s per request; default 1)")
    p.add_argument("--lookup-ms", type=float, default=0.0,
                   help="host time an n-gram step adds to its pass (ms, default 0)")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"recommend a shape only above (1 + margin) x plain (default "
                        f"{DEFAULT_MARGIN})")
    p.add_argument("--json", dest="json_out", help="write the answer as JSON here")
    p.add_argument("--png", help="write tok/s per shape against the all-reduce cost here")


def build(args, corpus_factory=None, say=_progress) -> Advice:
    """The whole answer from parsed flags; every flag is checked before any replay starts."""
    if args.lookup_ms < 0 or not math.isfinite(args.lookup_ms):
        raise AdviseError(f"--lookup-ms {args.lookup_ms}: expected a number of ms >= 0")
    if not 0 <= args.margin < 1:
        raise AdviseError(f"--margin {args.margin}: expected a fraction in [0, 1)")
    if args.max_chain < 1:
        raise AdviseError(f"--max-chain {args.max_chain}: expected an integer >= 1")
    if any(w < 2 for w in args.tree_widths) or any(k < 1 for k in args.chain_lengths):
        raise AdviseError("--tree-widths must be >= 2 and --chain-lengths >= 1")
    if args.trace and args.accept:
        raise AdviseError("--trace and --accept both give n-gram acceptance; give one")
    for path in (args.json_out, args.png):
        if path and not Path(path).resolve().parent.exists():
            raise AdviseError(f"{path}: its folder {Path(path).resolve().parent} does not exist")
    if isinstance(args.concurrency, bool) or not isinstance(args.concurrency, int) \
            or args.concurrency < 1:
        raise AdviseError(f"--concurrency {args.concurrency}: expected an integer >= 1")
    profile, route = load_costs(args)
    if args.concurrency > 1:
        profile = profile.batched(args.concurrency)
        route += (f"; {args.concurrency} requests per pass (--concurrency: steady state, each "
                  f"request in the same shape, a pass of n tokens per request is one of "
                  f"{args.concurrency} x n)")
    drafters = [parse_drafter(d) for d in args.drafter]
    accepts = parse_accept(args.accept) if args.accept else None
    rows, acceptance = [], []
    if accepts is not None:
        rows += typed_rows(profile, accepts, args.lookup_ms, args.accept)
        acceptance.append(f"n-gram: typed in (--accept {args.accept})")
    elif (args.trace or "").lower() != "none":
        from fastverify import replay as rp
        path = args.trace or rp.DEFAULT_TRACE
        try:
            rp.load_trace(path)  # named and checked before the corpus starts
        except rp.TraceError as e:
            raise AdviseError(f"--trace: {e}") from None
        got, src = trace_rows(profile, path, args.tree_widths, args.chain_lengths,
                              args.lookup_ms, args.max_chain, corpus_factory, say)
        rows += got
        acceptance.append(f"n-gram: {src}" + ("" if args.trace else " (the embedded default "
                                                                    "trace; --trace FILE: yours)"))
    else:
        acceptance.append("n-gram: none (--trace none)")
    rows += drafter_rows(profile, drafters)
    if drafters:
        acceptance += [f"drafter {d.label}: typed in (--drafter {d.spec})" for d in drafters]
    adv = Advice(profile, route, acceptance, rows, args.lookup_ms, args.margin)
    adv.preamble = make_preamble(adv)
    return adv


def run_cli(args, corpus_factory=None) -> int:
    try:
        adv = build(args, corpus_factory)
    except (AdviseError, PassCostError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # trace or replay configuration errors
        print(f"error: {e}", file=sys.stderr)
        return 2
    adv.repro_command = repro_command(args)
    print(format_report(adv))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(adv.to_json(), indent=1) + "\n")
        print(f"# wrote {args.json_out}")
    if args.png:
        try:
            plot(adv, args.png)
        except AdviseError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"# wrote {args.png}")
    return 0


_REPRO_FLAGS = (("profile", "--profile"), ("bench", "--bench"), ("allreduces", "--allreduces"),
                ("allreduce_us", "--allreduce-us"), ("compute_ms", "--compute-ms"),
                ("plain_ms", "--plain-ms"), ("trace", "--trace"), ("accept", "--accept"))


def repro_command(args) -> str:
    """The command line that gives this answer again (from the parsed flags)."""
    cmd = ["fastverify", "advise"]
    for key, flag in _REPRO_FLAGS:
        if getattr(args, key, None) is not None:
            cmd += [flag, str(getattr(args, key))]
    for d in args.drafter:
        cmd += ["--drafter", d]
    using_trace = args.accept is None and (args.trace or "").lower() != "none"
    if using_trace and args.tree_widths != [8]:
        cmd += ["--tree-widths", ",".join(map(str, args.tree_widths))]
    if using_trace and args.chain_lengths != [1, 2, 3, 4, 7]:
        cmd += ["--chain-lengths", ",".join(map(str, args.chain_lengths))]
    for key, flag, default in (("max_chain", "--max-chain", 7), ("concurrency", "--concurrency", 1),
                               ("lookup_ms", "--lookup-ms", 0.0),
                               ("margin", "--margin", DEFAULT_MARGIN)):
        if getattr(args, key) != default:
            cmd += [flag, str(getattr(args, key))]
    for key, flag in (("json_out", "--json"), ("png", "--png")):
        if getattr(args, key):
            cmd += [flag, getattr(args, key)]
    return " ".join(shlex.quote(c) for c in cmd)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastverify.advise",
                                description=__doc__.split("\n\n")[0])
    _fill_parser(p)
    return run_cli(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
