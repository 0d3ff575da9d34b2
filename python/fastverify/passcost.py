"""Pass-cost profiles: what one forward pass of N tokens costs on a deployment, as data.

A profile says how many all-reduces one pass of the target model makes, what one all-reduce costs
(us) at each token count of the pass, and optionally the compute of the pass (ms) at each token
count:

    pass_ms(n) = allreduces_per_pass * allreduce_us(n) / 1000 + compute_ms(n)

The same files feed the offline tools (`fastverify advise`, `fastverify sim`, `fastverify replay`)
and the pass-cost emulator of the patched server, so a prediction and an emulated server are
compared on one set of numbers.

File format (JSON; keys of the point maps are token counts, values numbers >= 0):

    {"name": "...", "source": ["where each number comes from", ...],
     "derivation": "how the curve is built",
     "allreduces_per_pass": 122,
     "allreduce_us": {"1": 59.0, "4": 205.0, "8": 230.0},
     "compute_ms": {"1": 5.0, "64": 5.0}}   (optional; without it: communication only)

Other keys are kept in `meta` (e.g. "measured": the payload sizes a curve was derived from, which
tests/test_passcost.py re-derives the curve from).

Between two given token counts a value is interpolated linearly; below the smallest it is the
smallest's value; above the largest it is extrapolated with the slope of the last two points (never
below the last value), and `extrapolated(n)` says so. Built-in profiles live in
fastverify/data/profiles/ and are named without ".json".

Measurements quoted per message size map to token counts through the payload of one all-reduce,
[tokens, hidden] in bf16: 2 * hidden bytes per token (14 KiB for hidden 7168); `payload_curve`
interpolates linearly in bytes between the measured sizes and extends past the largest with the
last slope.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from fastverify.costs import interp  # one piecewise-linear rule for cost tables and profiles

PROFILE_DIR = Path(__file__).resolve().parent / "data" / "profiles"
CURVE_TOKENS = (1, 2, 4, 8, 16, 32, 64)  # the token counts the built-in curves are given at


class PassCostError(ValueError):
    """A pass-cost profile that cannot be read; the message names the file (or flag) and field."""


_KEYS_HELP = "keys are token counts (integers >= 1)"


def _points(obj, key: str, source: str) -> tuple:
    if not isinstance(obj, Mapping) or not obj:
        raise PassCostError(f"{source}: '{key}' must be a non-empty object of token count -> "
                            f"number (e.g. {{\"1\": 59.0, \"8\": 230.0}})")
    pts = []
    for k, v in obj.items():
        try:
            n = int(k)
        except (TypeError, ValueError):
            raise PassCostError(f"{source}: '{key}' has key {k!r}; {_KEYS_HELP}") from None
        if n < 1 or str(n) != str(k).strip():
            raise PassCostError(f"{source}: '{key}' has key {k!r}; {_KEYS_HELP}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < 0:
            raise PassCostError(f"{source}: '{key}'[{k}] = {v!r}; values are finite numbers >= 0")
        pts.append((n, float(v)))
    return tuple(sorted(pts))


@dataclass(frozen=True)
class PassCostProfile:
    name: str
    allreduces_per_pass: int
    allreduce_us: tuple  # ((tokens, us per all-reduce), ...) sorted by tokens
    compute_ms: tuple = ()  # ((tokens, ms per pass), ...); empty: communication only
    source: tuple = ()  # citations, one string each
    derivation: str = ""
    path: str = ""  # the file it came from ("" when built in code)
    meta: dict = field(default_factory=dict, compare=False)
    # requests decoded together, each with the same tokens per pass: a "pass of n tokens" is then
    # one of batch * n tokens of the deployment (`batched`); 1: one stream
    batch: int = 1

    @property
    def has_compute(self) -> bool:
        return bool(self.compute_ms)

    def ar_us(self, tokens: int) -> float:
        """Cost of one all-reduce of a pass of `tokens` tokens (per request: `batch` times that
        many in the deployment's pass), in us."""
        return interp(self.allreduce_us, tokens * self.batch)

    def comm_ms(self, tokens: int) -> float:
        """All-reduce time of one pass of `tokens` tokens, in ms."""
        return self.allreduces_per_pass * self.ar_us(tokens) / 1000.0

    def compute_pass_ms(self, tokens: int) -> float:
        return interp(self.compute_ms, tokens * self.batch) if self.compute_ms else 0.0

    def pass_ms(self, tokens: int, compute: bool = True) -> float:
        """One forward pass of `tokens` tokens: communication, plus compute when the profile has
        it and `compute` is true."""
        return self.comm_ms(tokens) + (self.compute_pass_ms(tokens) if compute else 0.0)

    def extrapolated(self, tokens: int) -> bool:
        top = self.allreduce_us[-1][0]
        if self.compute_ms:
            top = min(top, self.compute_ms[-1][0])
        return tokens * self.batch > top

    def batched(self, requests: int) -> "PassCostProfile":
        """The same deployment decoding `requests` requests together in steady state, each with
        the same tokens per pass (a decode step of `requests` streams, or a verify pass of n tokens
        for each): a pass of n tokens here is one of requests * n tokens there. Rates computed
        from it are per request."""
        if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
            raise PassCostError(f"requests per pass must be an integer >= 1, got {requests!r}")
        if requests == self.batch:
            return self
        name = self.name.removesuffix(f" x{self.batch} requests") if self.batch > 1 else self.name
        return replace(self, name=f"{name} x{requests} requests" if requests > 1 else name,
                       batch=requests)

    def with_allreduce_us(self, us: float) -> "PassCostProfile":
        """The same profile with one flat per-call all-reduce cost (what-if sweeps)."""
        return PassCostProfile(f"{self.name}@{us:g}us", self.allreduces_per_pass,
                               ((1, float(us)),), self.compute_ms, self.source,
                               f"flat {us:g} us per all-reduce", self.path, self.meta,
                               self.batch)

    def with_compute(self, compute_ms: tuple, note: str) -> "PassCostProfile":
        """The same communication with another compute curve ((tokens, ms), ...); `note` says
        where it comes from and is added to the sources."""
        return PassCostProfile(self.name, self.allreduces_per_pass, self.allreduce_us,
                               tuple(sorted(compute_ms)), self.source + (note,),
                               self.derivation, self.path, self.meta, self.batch)

    def cost_table(self, tokens: Sequence[int] = CURVE_TOKENS, compute: bool = True):
        """The profile as the controller's cost table (fastverify.costs.CostTable): a decode
        step of bs requests is a pass of bs tokens, a verify pass of n tokens a pass of n."""
        from fastverify.costs import CostTable
        pts = tuple((t, round(self.pass_ms(t, compute), 4)) for t in sorted(set(tokens)))
        return CostTable(pts, pts, f"profile {self.name}")

    def to_json(self) -> dict:
        out = {"name": self.name, "source": list(self.source), "derivation": self.derivation,
               "allreduces_per_pass": self.allreduces_per_pass,
               "allreduce_us": {str(n): v for n, v in self.allreduce_us}}
        if self.compute_ms:
            out["compute_ms"] = {str(n): v for n, v in self.compute_ms}
        if self.batch > 1:
            out["requests_per_pass"] = self.batch
        return out


def parse_profile(obj, source: str = "<profile>") -> PassCostProfile:
    if not isinstance(obj, Mapping):
        raise PassCostError(f"{source}: expected a JSON object with 'allreduces_per_pass' and "
                            f"'allreduce_us'")
    for key in ("allreduces_per_pass", "allreduce_us"):
        if key not in obj:
            raise PassCostError(
                f"{source}: missing key '{key}' (format: {{\"allreduces_per_pass\": 122, "
                f"\"allreduce_us\": {{\"1\": 59.0, \"8\": 230.0}}, "
                f"\"compute_ms\": {{\"1\": 5.0}}}})")
    n = obj["allreduces_per_pass"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise PassCostError(f"{source}: 'allreduces_per_pass' = {n!r}; expected an integer >= 0")
    compute = ()
    if obj.get("compute_ms") is not None:
        compute = _points(obj["compute_ms"], "compute_ms", source)
    src = obj.get("source", ())
    src = (src,) if isinstance(src, str) else tuple(str(s) for s in src)
    batch = obj.get("requests_per_pass", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise PassCostError(f"{source}: 'requests_per_pass' = {batch!r}; expected an integer >= 1")
    known = {"name", "source", "derivation", "allreduces_per_pass", "allreduce_us", "compute_ms",
             "requests_per_pass"}
    return PassCostProfile(str(obj.get("name") or Path(source).stem), n,
                           _points(obj["allreduce_us"], "allreduce_us", source), compute, src,
                           str(obj.get("derivation", "")), source,
                           {k: v for k, v in obj.items() if k not in known}, batch)


def builtin_names() -> list:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def _read_json(p: Path, flag: str):
    try:
        return json.loads(p.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise PassCostError(f"{flag} {p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except OSError as e:
        raise PassCostError(f"{flag} {p}: cannot be read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise PassCostError(f"{flag} {p}: not UTF-8 text") from None


def is_microbenchmark(obj) -> bool:
    """A `fastverify bench allreduce --json` result (summary.rows)."""
    return isinstance(obj, Mapping) and isinstance(obj.get("summary"), Mapping) \
        and "rows" in obj["summary"]


def load_profile(name_or_path: str, flag: str = "--profile") -> PassCostProfile:
    """A profile by built-in name (fastverify/data/profiles/NAME.json) or from a file path. A
    `fastverify bench allreduce --json` result is read too (`PATH#backend` picks its backend)."""
    text = str(name_or_path)
    path_part, _, backend = text.partition("#")
    p = Path(path_part)
    if not p.is_file():
        if (PROFILE_DIR / f"{text}.json").is_file():
            p, backend = PROFILE_DIR / f"{text}.json", ""
        else:
            raise PassCostError(f"{flag} {text}: no such file and no built-in profile of that name "
                                f"(built in: {', '.join(builtin_names()) or 'none'})")
    obj = _read_json(p, flag)
    if is_microbenchmark(obj):
        return from_microbenchmark(obj, f"{flag} {p}", backend or None)
    if backend:
        raise PassCostError(f"{flag} {text}: '#{backend}' names a backend, but {p} is a profile, "
                            f"not a microbenchmark result")
    return parse_profile(obj, f"{flag} {p}")


def from_microbenchmark(obj: Mapping, source: str, backend: Optional[str] = None,
                        with_compute: bool = True) -> PassCostProfile:
    """A profile from `fastverify bench allreduce --json`: per-call all-reduce time in a CUDA graph
    (`ar_graph_us`) per token count of one backend, the plan's all-reduces per pass, and the
    compute column (`compute_us`, measured once per token count, found on the NCCL rows)."""
    rows = [r for r in obj["summary"]["rows"] if isinstance(r, Mapping) and not r.get("error")]
    backends = sorted({str(r.get("backend")) for r in rows if r.get("ar_graph_us")})
    if not backends:
        raise PassCostError(f"{source}: the microbenchmark result has no rows with a per-call "
                            f"time (ar_graph_us)")
    if backend is None:
        backend = "nccl" if "nccl" in backends else backends[0]
    if backend not in backends:
        raise PassCostError(f"{source}: backend {backend!r} not in the file; allowed: "
                            f"{', '.join(backends)} (name one as PATH#backend)")
    ar = {int(r["tokens"]): float(r["ar_graph_us"]) for r in rows
          if r.get("backend") == backend and r.get("ar_graph_us")}
    compute = microbenchmark_compute(obj, source) if with_compute else ()
    plan = obj.get("plan") or {}
    n = int(plan.get("allreduces_per_pass") or 0)
    if n <= 0:
        raise PassCostError(f"{source}: the result's plan does not say how many all-reduces a "
                            f"pass makes")
    file = source.split()[-1]
    cite = (f"fastverify bench allreduce --json {file} (backend {backend}; "
            f"{_gpus(obj)}; {(obj.get('env') or {}).get('date_utc', 'date not recorded')})")
    src = (cite,)
    if compute:
        src += (compute_note(obj, file),)
    return PassCostProfile(f"{Path(file).stem}#{backend}", n, tuple(sorted(ar.items())),
                           compute, src, "measured: medians in CUDA graphs", source)


def _gpus(obj: Mapping) -> str:
    gpus = (obj.get("env") or {}).get("gpus") or []
    if not gpus:
        return "GPUs not recorded"
    names = sorted(set(gpus))
    return ", ".join(f"{gpus.count(g)}x {g}" for g in names)


def microbenchmark_compute(obj: Mapping, source: str) -> tuple:
    """The compute column of a microbenchmark result: ((tokens, ms per pass), ...)."""
    if not is_microbenchmark(obj):
        raise PassCostError(f"{source}: not a `fastverify bench allreduce --json` result")
    pts = {}
    for r in obj["summary"]["rows"]:
        if isinstance(r, Mapping) and not r.get("error") and r.get("compute_us"):
            pts.setdefault(int(r["tokens"]), float(r["compute_us"]) / 1000.0)
    return tuple(sorted(pts.items()))


def compute_note(obj: Mapping, file: str) -> str:
    """Where a microbenchmark's compute column comes from: the GPUs and dtype it ran in."""
    plan = obj.get("plan") or {}
    prof = plan.get("profile") or {}
    tp = plan.get("shard_tp")
    return (f"compute: the GEMMs of one pass of {prof.get('name', 'the model')}"
            + (f" sharded for TP={tp}" if tp else "") + f", {prof.get('dtype', 'dtype?')} on "
            f"{_gpus(obj)} ({file}, compute column; not the deployment's own kernels)")


def payload_curve(measured_us: Mapping, bytes_per_token: float,
                  tokens: Sequence[int] = CURVE_TOKENS) -> dict:
    """Per-all-reduce cost per token count from costs measured per message size.

    `measured_us`: {message bytes: us}; a pass of n tokens all-reduces n * bytes_per_token bytes.
    Linear in bytes between two measured sizes, the smallest size's cost below it, the slope of
    the last two sizes past the largest. Returns {tokens: us} rounded to 0.1 us."""
    pts = tuple(sorted((float(b), float(us)) for b, us in measured_us.items()))
    if not pts:
        raise PassCostError("payload_curve: no measured sizes")
    return {int(t): round(interp(pts, t * bytes_per_token), 1) for t in tokens}


# ------------------------------------------------------------------------- command-line numbers
def parse_points(text: str, flag: str, what: str = "value") -> dict:
    """'1:59,4:205,8:230' -> {1: 59.0, 4: 205.0, 8: 230.0}; a single number 'X' -> {1: X} (the
    same at every token count)."""
    text = str(text).strip()
    out = {}
    try:
        if ":" not in text:
            out[1] = float(text)
        else:
            for part in text.split(","):
                if not part.strip():
                    continue
                k, sep, v = part.partition(":")
                if not sep:
                    raise ValueError(part)
                out[int(k)] = float(v)
    except ValueError:
        raise PassCostError(f"{flag} {text!r}: expected a number or TOKENS:{what} pairs "
                            f"separated by commas (e.g. 1:59,4:205,8:230)") from None
    for n, v in out.items():
        if n < 1 or not math.isfinite(v) or v < 0:
            raise PassCostError(f"{flag} {text!r}: token counts must be >= 1 and values finite "
                                f"and >= 0 (got {n}:{v:g})")
    if not out:
        raise PassCostError(f"{flag} {text!r}: no values")
    return out


def from_numbers(allreduces: int, allreduce_us: Mapping, compute_ms: Union[Mapping, float, None],
                 plain_ms: Optional[float] = None, name: str = "command line",
                 source: Sequence[str] = ()) -> PassCostProfile:
    """A profile from numbers typed in: all-reduces per pass, us per all-reduce per token count,
    compute ms per token count (or one number for all), and optionally the plain decode step (ms),
    which then fixes the 1-token all-reduce: (plain_ms - compute(1)) / allreduces."""
    if isinstance(allreduces, bool) or not isinstance(allreduces, int) or allreduces < 1:
        raise PassCostError(f"--allreduces {allreduces!r}: expected an integer >= 1 "
                            f"(all-reduces in one forward pass, e.g. 122 = 2 per layer x 61)")
    if compute_ms is None:
        compute = ()
    elif isinstance(compute_ms, Mapping):
        compute = tuple(sorted((int(k), float(v)) for k, v in compute_ms.items()))
    else:
        compute = ((1, float(compute_ms)),)
    ar = {int(k): float(v) for k, v in (allreduce_us or {}).items()}
    derivation = "typed in"
    if plain_ms is not None:
        if not math.isfinite(plain_ms) or plain_ms <= 0:
            raise PassCostError(f"--plain-ms {plain_ms!r}: expected a positive number of ms")
        if 1 in ar:
            raise PassCostError("--plain-ms and a 1-token point in --allreduce-us both set the "
                                "1-token all-reduce cost; give one of them")
        c1 = interp(compute, 1) if compute else 0.0
        if plain_ms <= c1:
            raise PassCostError(f"--plain-ms {plain_ms:g} is not above the 1-token compute "
                                f"({c1:g} ms): no time is left for the all-reduces")
        ar[1] = round((plain_ms - c1) * 1000.0 / allreduces, 3)
        derivation += (f"; 1-token all-reduce from --plain-ms: ({plain_ms:g} - {c1:g}) ms / "
                       f"{allreduces} = {ar[1]:g} us")
    if not ar:
        raise PassCostError("--allreduce-us: no per-all-reduce cost given (e.g. 1:59,4:205,8:230)")
    return PassCostProfile(name, allreduces, tuple(sorted(ar.items())), compute, tuple(source),
                           derivation)


def describe(profile: PassCostProfile, tokens: Sequence[int] = CURVE_TOKENS) -> str:
    """A fixed-width table of the profile: us per all-reduce, comm ms, compute ms and pass ms per
    token count."""
    lines = [f"# profile {profile.name}: {profile.allreduces_per_pass} all-reduces per pass"
             + ("" if profile.has_compute else " (communication only)")]
    lines.append(f"{'tokens':>7} {'us/all-reduce':>14} {'comm ms':>9} {'compute ms':>11} "
                 f"{'pass ms':>9}")
    for t in tokens:
        lines.append(f"{t:>7} {profile.ar_us(t):>14.1f} {profile.comm_ms(t):>9.2f} "
                     f"{profile.compute_pass_ms(t):>11.2f} {profile.pass_ms(t):>9.2f}"
                     + ("  (extrapolated)" if profile.extrapolated(t) else ""))
    return "\n".join(lines)
