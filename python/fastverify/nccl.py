"""NCCL tuning for the TP all-reduces of the verify pass: flags -> validated environment.

The verify pass of a TP model runs two all-reduces per layer (122 for a 61-layer model). On a PCIe
box whose NCCL picked a poor protocol/channel count they cost ~205 us each (25 of 30 ms per pass);
tuned boxes measure 17-25 us for 4-256 KB. This module turns the `launch_server` flags into the
NCCL_* variables to export, validates every value before anything starts, and records where each
effective value came from.

Flags (SGLang `launch_server`, added by patch 0002-nccl-tuning-flags):
    --nccl-algo A            NCCL_ALGO: Ring, Tree, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT
                             (case-insensitive; lists "Ring,Tree", exclusion "^NVLS", per-collective
                             "allreduce:tree;allgather:ring" which needs NCCL >= 2.24)
    --nccl-proto P           NCCL_PROTO: LL, LL128, Simple (same list syntax)
    --nccl-min-channels N    NCCL_MIN_NCHANNELS, 1..64
    --nccl-max-channels N    NCCL_MAX_NCHANNELS, 1..64 (NCCL's compile-time MAXCHANNELS is 64)
    --nccl-buffsize BYTES    NCCL_BUFFSIZE, 64 KiB..1 GiB (NCCL's default is 4 MiB)
    --nccl-env NAME=VALUE    any other NCCL_* variable (repeatable)
    --nccl-tuning-profile F  a tuning profile (format below)

Precedence (documented and tested): explicit flag > profile > variable already in the environment.
When a flag or the profile replaces a value that was already in the
environment, the provenance says so.

Tree. A global NCCL_ALGO applies to every collective. Broadcast and Reduce only have a Ring
algorithm, so a global list that leaves Ring out (e.g. NCCL_ALGO=Tree) makes those collectives fail;
this is how a CUDA-graph capture failed in the reference report. NCCL >= 2.24 accepts a
per-collective form, so such a global list is rewritten to `allreduce:<list>`; with an older (or
unknown) NCCL it is refused.

Tuning profile (JSON, written by the all-reduce microbenchmark through `write_profile`):
    {
      "format": "fastverify-nccl-profile/1",
      "env": {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4", ...},   # NCCL_* only, validated like
                                                                     flags
      "source": {"gpu": "...", "nccl": "2.28.9", "command": "..."},  # free-form, informational
      "by_size": [{"bytes": 14336, "best": {"NCCL_PROTO": "LL"}, "us": 9.1}, ...]   # optional
    }
Only "env" is applied; "source" and "by_size" document the measurement.

The library never reads os.environ: the caller (fastverify.glue.nccl_hook) passes the environment
and the NCCL version in, once.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, Tuple

PROFILE_FORMAT = "fastverify-nccl-profile/1"

ALGORITHMS = ("Ring", "Tree", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTOCOLS = ("LL", "LL128", "Simple")
# NCCL's collective names as accepted in the per-collective prefix (ncclFuncStr, lower-cased).
COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce", "sendrecv", "send",
               "recv", "alltoall", "gather", "scatter")
PER_COLLECTIVE_MIN_VERSION = (2, 24, 0)
MAX_CHANNELS = 64                       # NCCL src/include/device.h: MAXCHANNELS 64
# below this a Simple-protocol step is smaller than one chunk
MIN_BUFFSIZE = 64 << 10
# NCCL keeps buffer sizes in an int; 1 GiB per peer is already absurd
MAX_BUFFSIZE = 1 << 30
_NCCL_NAME = re.compile(r"^NCCL_[A-Z0-9_]+$")

# flag name -> NCCL variable it sets
FLAG_VARS = {
    "--nccl-algo": "NCCL_ALGO",
    "--nccl-proto": "NCCL_PROTO",
    "--nccl-min-channels": "NCCL_MIN_NCHANNELS",
    "--nccl-max-channels": "NCCL_MAX_NCHANNELS",
    "--nccl-buffsize": "NCCL_BUFFSIZE",
}

FLAG_HELP = {
    "nccl_algo": "NCCL_ALGO for every TP worker: " + ", ".join(ALGORITHMS)
                 + " (case-insensitive; lists, '^' exclusion, per-collective 'allreduce:tree' on "
                 "NCCL >= 2.24). A global Tree is rewritten to 'allreduce:tree' (NCCL >= 2.24) or "
                 "refused.",
    "nccl_proto": "NCCL_PROTO for every TP worker: " + ", ".join(PROTOCOLS)
                  + " (same list syntax).",
    "nccl_min_channels": f"NCCL_MIN_NCHANNELS (1..{MAX_CHANNELS}).",
    "nccl_max_channels": f"NCCL_MAX_NCHANNELS (1..{MAX_CHANNELS}).",
    "nccl_buffsize": f"NCCL_BUFFSIZE in bytes ({MIN_BUFFSIZE}..{MAX_BUFFSIZE}; NCCL default "
                     "4194304).",
    "nccl_env": "Any other NCCL_* variable as NAME=VALUE for every TP worker (repeatable).",
    "nccl_tuning_profile": f"JSON tuning profile ({PROFILE_FORMAT}) with NCCL_* values; flags "
                           "override it, it overrides variables already in the environment.",
}


class NcclConfigError(ValueError):
    """A bad NCCL flag, --nccl-env entry or tuning profile; the message names the flag
    and the allowed values."""


# --------------------------------------------------------------------------------------------------
# value validation
# --------------------------------------------------------------------------------------------------

def _fmt_version(version: Optional[Sequence[int]]) -> str:
    return "unknown" if version is None else ".".join(str(v) for v in version)


def _parse_list(value: str, allowed: Sequence[str], origin: str) -> list:
    """Parse NCCL's list grammar into [(collective or None, excluded, [names]), ...].

    Grammar (NCCL src/graph/tuning.cc parseList): groups separated by ';'; only the first may
    omit the 'collective:' prefix; each group is a comma list, optionally led by '^'
    (everything except).
    """
    canon = {a.lower(): a for a in allowed}
    groups = []
    text = value.strip()
    if not text:
        raise NcclConfigError(f"{origin}: empty value; allowed: {', '.join(allowed)}")
    for i, raw in enumerate(text.split(";")):
        raw = raw.strip()
        coll = None
        if ":" in raw:
            coll, raw = (s.strip() for s in raw.split(":", 1))
            if coll.lower() not in COLLECTIVES:
                raise NcclConfigError(f"{origin}: unknown collective {coll!r} in {value!r}; "
                                      f"allowed collectives: {', '.join(COLLECTIVES)}")
            coll = coll.lower()
        elif i > 0:
            raise NcclConfigError(f"{origin}: only the first ';' group may omit the 'collective:' "
                                  f"prefix (got {value!r}); e.g. 'ring;allreduce:tree'")
        excluded = raw.startswith("^")
        names = [n.strip() for n in raw.lstrip("^").split(",")]
        if not names or any(not n for n in names):
            raise NcclConfigError(f"{origin}: empty name in {value!r}; allowed: "
                                  f"{', '.join(allowed)}")
        for n in names:
            if n.lower() not in canon:
                raise NcclConfigError(f"{origin}: unknown name {n!r} in {value!r}; allowed "
                                      f"(case-insensitive): {', '.join(allowed)}")
        groups.append((coll, excluded, [canon[n.lower()] for n in names]))
    return groups


def _render(groups) -> str:
    out = []
    for coll, excluded, names in groups:
        body = ("^" if excluded else "") + ",".join(n.lower() if coll else n for n in names)
        out.append(f"{coll}:{body}" if coll else body)
    return ";".join(out)


def _check_per_collective(groups, origin: str, version) -> None:
    if (any(c for c, _, _ in groups) and version is not None
            and tuple(version) < PER_COLLECTIVE_MIN_VERSION):
        raise NcclConfigError(f"{origin}: per-collective syntax needs NCCL >= 2.24; this NCCL is "
                              f"{_fmt_version(version)}. Use a global list such as 'Ring,Tree' "
                              "instead.")


def normalize_algo(value: str, origin: str,
                   nccl_version: Optional[Sequence[int]]) -> Tuple[str, str]:
    """Validate NCCL_ALGO; return (value to export, note). A global list without Ring
    is moved to allreduce."""
    groups = _parse_list(value, ALGORITHMS, origin)
    _check_per_collective(groups, origin, nccl_version)
    coll, excluded, names = groups[0]
    ring_left = ("Ring" not in names) if excluded else ("Ring" in names)
    if coll is not None or ring_left:
        return _render(groups), ""
    # A global list that removes Ring breaks Broadcast/Reduce (Ring is their only algorithm).
    if any(c == "allreduce" for c, _, _ in groups[1:]):
        raise NcclConfigError(f"{origin}: {value!r} leaves Ring out for every collective and also "
                              "names allreduce explicitly; write the allreduce group only, e.g. "
                              "'allreduce:tree'.")
    why = (f"a global NCCL_ALGO={value!r} applies to every collective, and Broadcast/Reduce have "
           "no algorithm but Ring, so they fail (this is how CUDA-graph capture failed with "
           "NCCL_ALGO=Tree)")
    if nccl_version is None or tuple(nccl_version) < PER_COLLECTIVE_MIN_VERSION:
        raise NcclConfigError(f"{origin}: refused: {why}. The per-collective form "
                              f"'allreduce:{_render([groups[0]])}' needs NCCL >= 2.24 and this "
                              f"NCCL is {_fmt_version(nccl_version)}. Add Ring (e.g. 'Ring,Tree') "
                              "or upgrade NCCL.")
    translated = _render([("allreduce", excluded, names)] + groups[1:])
    return translated, (f"translated from {value!r}: {why}; NCCL {_fmt_version(nccl_version)} >= "
                        f"2.24 accepts {translated!r}")


def normalize_proto(value: str, origin: str, nccl_version: Optional[Sequence[int]]) -> str:
    groups = _parse_list(value, PROTOCOLS, origin)
    _check_per_collective(groups, origin, nccl_version)
    return _render(groups)


def _int_in(value, origin: str, lo: int, hi: int, what: str) -> int:
    try:
        n = int(str(value).strip(), 0)
    except ValueError:
        raise NcclConfigError(f"{origin}: {value!r} is not an integer; allowed: {what} "
                              f"{lo}..{hi}") from None
    if not lo <= n <= hi:
        raise NcclConfigError(f"{origin}: {n} is out of range; allowed: {what} {lo}..{hi}")
    return n


def normalize_value(name: str, value, origin: str, nccl_version) -> Tuple[str, str]:
    """Validate one NCCL_* value (from a flag, --nccl-env, the profile or the environment);
    return (value, note)."""
    if name == "NCCL_ALGO":
        return normalize_algo(str(value), origin, nccl_version)
    if name == "NCCL_PROTO":
        return normalize_proto(str(value), origin, nccl_version), ""
    if name in ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"):
        return str(_int_in(value, origin, 1, MAX_CHANNELS, "channels")), ""
    if name == "NCCL_BUFFSIZE":
        return str(_int_in(value, origin, MIN_BUFFSIZE, MAX_BUFFSIZE, "bytes")), ""
    text = str(value)
    if "\n" in text or "\0" in text:
        raise NcclConfigError(f"{origin}: value of {name} contains a newline or NUL")
    return text, ""


def check_name(name: str, origin: str) -> str:
    if not _NCCL_NAME.match(name):
        raise NcclConfigError(f"{origin}: {name!r} is not an NCCL variable; allowed: names "
                              "matching NCCL_[A-Z0-9_]+ (e.g. NCCL_P2P_LEVEL=SYS)")
    return name


def parse_env_items(items: Optional[Iterable[str]]) -> list:
    """`--nccl-env NAME=VALUE` entries -> [(name, value)], refusing non-NCCL
    names and duplicates."""
    out, seen = [], set()
    for item in items or ():
        if "=" not in item:
            raise NcclConfigError(f"--nccl-env: {item!r} is not NAME=VALUE; allowed: "
                                  "NCCL_<NAME>=<value>, e.g. --nccl-env NCCL_P2P_LEVEL=SYS")
        name, value = item.split("=", 1)
        name = check_name(name.strip(), "--nccl-env")
        if name in seen:
            raise NcclConfigError(f"--nccl-env: {name} is given twice")
        seen.add(name)
        out.append((name, value))
    return out


# --------------------------------------------------------------------------------------------------
# tuning profile
# --------------------------------------------------------------------------------------------------

def load_profile(path) -> dict:
    """Read and validate the shape of a tuning profile; values are validated
    when the tuning is built."""
    origin = f"--nccl-tuning-profile {path}"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise NcclConfigError(f"{origin}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise NcclConfigError(f"{origin}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise NcclConfigError(f"{origin}: not valid JSON ({e}); expected {{\"format\": "
                              f"\"{PROFILE_FORMAT}\", "
                              "\"env\": {...}}") from None
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise NcclConfigError(f"{origin}: \"format\" must be {PROFILE_FORMAT!r} (got {got!r})")
    env = data.get("env")
    if not isinstance(env, dict) or not env:
        raise NcclConfigError(f"{origin}: \"env\" must be a non-empty object of NCCL_* names to "
                              "values")
    for k, v in env.items():
        check_name(k, origin)
        if not isinstance(v, (str, int)) or isinstance(v, bool):
            raise NcclConfigError(f"{origin}: env value of {k} must be a string or integer, got "
                                  f"{v!r}")
    if "source" in data and not isinstance(data["source"], dict):
        raise NcclConfigError(f"{origin}: \"source\" must be an object")
    by_size = data.get("by_size", [])
    if not isinstance(by_size, list) or any(
            not isinstance(r, dict) or not isinstance(r.get("bytes"), int)
            or not isinstance(r.get("best"), dict) for r in by_size):
        raise NcclConfigError(f"{origin}: \"by_size\" must be a list of {{\"bytes\": int, "
                              f"\"best\": {{...}}, "
                              "\"us\": number}}")
    return data


def write_profile(path, env: Mapping[str, object], source: Mapping[str, object],
                  by_size: Optional[Sequence[Mapping[str, object]]] = None) -> dict:
    """Write a tuning profile (validated by reading it back); returns the written dict."""
    data = {"format": PROFILE_FORMAT, "env": {k: str(v) for k, v in env.items()},
            "source": dict(source)}
    if by_size:
        data["by_size"] = [dict(r) for r in by_size]
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    load_profile(path)
    return data


# --------------------------------------------------------------------------------------------------
# the frozen tuning
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Setting:
    """One effective NCCL variable and where it came from."""
    name: str
    value: str
    # "--nccl-proto", "--nccl-env", "profile PATH", "environment"
    source: str
    # (source, value) of the lower-precedence value it overrode
    replaced: Optional[Tuple[str, str]] = None
    note: str = ""

    def describe(self) -> str:
        text = f"{self.name}={self.value} [{self.source}"
        if self.replaced:
            text += f"; overrides {self.replaced[0]} value {self.replaced[1]!r}"
        if self.note:
            text += f"; {self.note}"
        return text + "]"


@dataclasses.dataclass(frozen=True)
class NcclTuning:
    """Validated NCCL settings, built once from the flag values and the environment passed in."""
    settings: Tuple[Setting, ...]
    nccl_version: Optional[Tuple[int, ...]] = None
    profile_path: Optional[str] = None

    @classmethod
    def from_flags(cls, *, algo: Optional[str] = None, proto: Optional[str] = None,
                   min_channels: Optional[int] = None, max_channels: Optional[int] = None,
                   buffsize: Optional[int] = None, env: Optional[Iterable[str]] = None,
                   profile: Optional[str] = None, environ: Mapping[str, str] = (),
                   nccl_version: Optional[Sequence[int]] = None) -> "NcclTuning":
        version = tuple(nccl_version) if nccl_version is not None else None
        layers = []  # lowest precedence first: (source, [(name, raw value, origin for errors)])
        environ = dict(environ)
        layers.append(("environment",
                       [(k, v, f"environment variable {k}") for k, v in sorted(environ.items())
                        if k.startswith("NCCL_")]))
        if profile:
            data = load_profile(profile)
            layers.append((f"profile {profile}", [(k, v, f"--nccl-tuning-profile {profile}: {k}")
                                                  for k, v in data["env"].items()]))
        flag_vals = {"--nccl-algo": algo, "--nccl-proto": proto,
                     "--nccl-min-channels": min_channels,
                     "--nccl-max-channels": max_channels, "--nccl-buffsize": buffsize}
        flags = [(FLAG_VARS[f], v, f) for f, v in flag_vals.items() if v is not None]
        dedicated = {name: f for f, name in FLAG_VARS.items() if flag_vals[f] is not None}
        for name, value in parse_env_items(env):
            if name in dedicated:
                raise NcclConfigError(f"--nccl-env {name}={value} conflicts with "
                                      f"{dedicated[name]}; give it once")
            flags.append((name, value, "--nccl-env"))
        layers.append(("flag", flags))

        effective = {}
        for source, items in layers:
            for name, raw, origin in items:
                src = origin if source == "flag" else source
                if source == "environment":
                    # Values already in the environment are only checked when
                    # something would build on them.
                    value, note = str(raw), ""
                else:
                    value, note = normalize_value(name, raw, origin, version)
                prev = effective.get(name)
                replaced = ((prev.source, prev.value) if prev is not None
                            and prev.value != value else None)
                effective[name] = Setting(name, value, src, replaced, note)
        tuning = cls(tuple(effective[k] for k in sorted(effective)), version, profile)
        tuning._check_channels()
        return tuning

    def _check_channels(self) -> None:
        by = {s.name: s for s in self.settings}
        lo, hi = by.get("NCCL_MIN_NCHANNELS"), by.get("NCCL_MAX_NCHANNELS")
        if (lo and hi and lo.value.isdigit() and hi.value.isdigit()
                and int(lo.value) > int(hi.value)):
            raise NcclConfigError(f"channel min > max: NCCL_MIN_NCHANNELS={lo.value} (from "
                                  f"{lo.source}) is greater than NCCL_MAX_NCHANNELS={hi.value} "
                                  f"(from {hi.source}); allowed: 1 <= --nccl-min-channels <= "
                                  f"--nccl-max-channels <= {MAX_CHANNELS}")

    @property
    def requested(self) -> bool:
        """True when any flag or profile sets something (otherwise the
        environment is left alone)."""
        return any(s.source != "environment" for s in self.settings)

    def exports(self) -> dict:
        """NCCL_* variables to set in each TP worker (those not already in
        the environment as-is)."""
        return {s.name: s.value for s in self.settings if s.source != "environment"}

    def effective(self) -> dict:
        return {s.name: s.value for s in self.settings}

    def provenance_lines(self) -> list:
        return [s.describe() for s in self.settings]

    def log_line(self, rank: int) -> str:
        body = "; ".join(self.provenance_lines()) or "no NCCL_* variables set"
        return (f"fastverify NCCL settings (rank {rank}, NCCL {_fmt_version(self.nccl_version)}): "
                f"{body}")


def tuning_from_args(args, environ: Mapping[str, str], nccl_version) -> NcclTuning:
    """Build the tuning from any object carrying the SGLang field names
    (ServerArgs, a namespace)."""
    get = lambda k: getattr(args, k, None)  # noqa: E731
    return NcclTuning.from_flags(algo=get("nccl_algo"), proto=get("nccl_proto"),
                                 min_channels=get("nccl_min_channels"),
                                 max_channels=get("nccl_max_channels"),
                                 buffsize=get("nccl_buffsize"), env=get("nccl_env"),
                                 profile=get("nccl_tuning_profile"), environ=environ,
                                 nccl_version=nccl_version)
