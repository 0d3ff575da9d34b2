"""The flags this project adds to SGLang's server, in one place, and every rule on them.

Patch 0010 calls ``check_parsed`` right after SGLang's argument parser has read the command
line, before ``ServerArgs`` exists: before any model path is resolved, any config is read and any
device is looked for. A bad value or a broken rule between flags ends the launch there like an
argparse error (the flag, the value, the allowed values; exit status 2). ``check`` runs the same
rules for ``ServerArgs`` built in code (Engine(...)), at the start of SGLang's own handling of them.

What the rules need and the parser cannot know is passed in: the environment (NCCL_* variables
already set take part in the channel min <= max rule), the SGLang version (pcie-ipc exists from
0.5.23 on) and, where known, the NCCL version. Without an NCCL version the NCCL rules that depend
on it are left to the NCCL glue in the launcher's server-args checks (a global ``--nccl-algo
Tree`` is fine on NCCL >= 2.24).

Nothing here imports SGLang.
"""
from __future__ import annotations

import math
import sys
from typing import Mapping, Optional, Sequence

from fastverify import allreduce, emulator, nccl, timing, widths

# (attribute on the parsed namespace / ServerArgs, option string, patch that adds it), in the order
# the demo prints them.
OUR_FLAGS = (
    ("nccl_algo", "--nccl-algo", "0002"),
    ("nccl_proto", "--nccl-proto", "0002"),
    ("nccl_min_channels", "--nccl-min-channels", "0002"),
    ("nccl_max_channels", "--nccl-max-channels", "0002"),
    ("nccl_buffsize", "--nccl-buffsize", "0002"),
    ("nccl_env", "--nccl-env", "0002"),
    ("nccl_tuning_profile", "--nccl-tuning-profile", "0002"),
    ("tp_allreduce", "--tp-allreduce", "0003"),
    ("tp_allreduce_table", "--tp-allreduce-table", "0003"),
    ("enable_verify_timing", "--enable-verify-timing", "0006"),
    ("verify_timing_interval", "--verify-timing-interval", "0006"),
    ("verify_timing_log_interval", "--verify-timing-log-interval", "0006"),
    ("speculative_ngram_verify_mode", "--speculative-ngram-verify-mode", "0005"),
    ("speculative_ngram_verify_widths", "--speculative-ngram-verify-widths", "0008"),
    ("speculative_ngram_auto_cost_table", "--speculative-ngram-auto-cost-table", "0007"),
    ("speculative_ngram_auto_hysteresis", "--speculative-ngram-auto-hysteresis", "0007"),
    ("emulate_pass_cost", "--emulate-pass-cost", "0011"),
    ("emulate_pass_cost_compute", "--emulate-pass-cost-compute", "0011"),
)
OPTIONS = tuple(opt for _, opt, _ in OUR_FLAGS)

VERIFY_MODES = ("tree", "chain", "auto")
DEFAULT_MODE = "tree"
DEFAULT_HYSTERESIS = 0.03  # the field default in patch 0007 (a test holds the two together)
HYSTERESIS_MAX = 0.5
# SGLang's k for NGRAM when --speculative-num-draft-tokens is not given: speculative_hook's
# _handle_ngram sets 12 in 0.5.16 and 0.5.23 (a test reads it in both pristine sources).
NGRAM_DEFAULT_DRAFT_TOKENS = 12
# Judging NCCL values without a known NCCL version: as the newest NCCL would.
ANY_NCCL = (99, 0, 0)

MODE = "--speculative-ngram-verify-mode"
WIDTHS = "--speculative-ngram-verify-widths"
COSTS = "--speculative-ngram-auto-cost-table"
HYST = "--speculative-ngram-auto-hysteresis"
ALGO = "--speculative-algorithm"
TABLE = "--tp-allreduce-table"
NOT_GIVEN = "(not given)"


class FlagError(ValueError):
    """A bad value of one of our flags, or a rule between flags broken; the message names them."""


class FlagExit(SystemExit, FlagError):
    """What ``check_parsed`` raises. Uncaught it ends the process with status 2 and no traceback,
    as argparse's own errors do; callers of prepare_server_args that catch ValueError get the
    message."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = 2


def our_actions(parser) -> list:
    """The argparse actions of ``parser`` that are ours, in the order of OUR_FLAGS."""
    by_option = {opt: a for a in parser._actions for opt in a.option_strings}
    return [by_option[opt] for opt in OPTIONS if opt in by_option]


def format_help(parser, title: str = "the flags sglang-fastverify adds") -> str:
    """Our flags with their whole help, as ``parser --help`` would print them
    (argparse's formatter)."""
    formatter = parser._get_formatter()
    formatter.start_section(title)
    formatter.add_arguments(our_actions(parser))
    formatter.end_section()
    return formatter.format_help()


def check_parsed(parser, namespace, environ: Mapping[str, str] = (),
                 sglang_version: Optional[str] = None,
                 nccl_version: Optional[Sequence[int]] = None) -> None:
    """The parse-time seam: on a broken rule, end like an argparse error (stderr, status 2)."""
    try:
        check(namespace, environ=environ, sglang_version=sglang_version,
              nccl_version=nccl_version)
    except FlagError as e:
        sys.stderr.write(f"{parser.prog}: error: {e}\n")
        sys.stderr.flush()
        raise FlagExit(str(e)) from None


def check(args, *, environ: Mapping[str, str] = (), sglang_version: Optional[str] = None,
          nccl_version: Optional[Sequence[int]] = None) -> None:
    """Every rule on our flags, read off ``args`` (a parsed namespace or ServerArgs).

    Raises FlagError; the library's own errors (they name the flag and the allowed values) pass
    through as FlagError with their message unchanged."""
    for rules in (_nccl_rules, _allreduce_rules, _timing_rules, _ngram_rules, _emulator_rules):
        try:
            rules(args, environ=environ, sglang_version=sglang_version, nccl_version=nccl_version)
        except FlagError:
            raise
        except ValueError as e:
            raise FlagError(str(e)) from None


def _get(args, name, default=None):
    value = getattr(args, name, default)
    return default if value is None else value


def _shown(value) -> str:
    return NOT_GIVEN if value is None or value == "" else str(value)


# ------------------------------------------------------------------------------------------ rules
def _nccl_rules(args, *, environ, nccl_version, **_):
    nccl.tuning_from_args(args, environ, nccl_version if nccl_version is not None else ANY_NCCL)


def _allreduce_rules(args, *, sglang_version, **_):
    choice = getattr(args, "tp_allreduce", None)
    table_path = getattr(args, "tp_allreduce_table", None)
    if table_path and choice != "auto":
        raise FlagError(f"{TABLE} {table_path}: needs --tp-allreduce auto (got --tp-allreduce "
                        f"{_shown(choice)}); allowed: add --tp-allreduce auto, or drop {TABLE}")
    if choice is None:
        return
    if choice not in allreduce.CHOICES:
        raise FlagError(f"--tp-allreduce {choice!r}; allowed: {', '.join(allreduce.CHOICES)}")
    table = allreduce.load_table(table_path) if table_path else None
    if sglang_version is None and choice == "pcie-ipc":
        return  # whether this SGLang has it is left to the launcher's all-reduce pass
    # No device is touched here, so the GPU is unknown: the rules of the SGLang version and the
    # sizes only. (The other choices' rules do not depend on the version.)
    allreduce.decide(choice, sglang_version=sglang_version or "0", topology=allreduce.Topology(),
                     tp_size=int(_get(args, "tp_size", 1)), nnodes=int(_get(args, "nnodes", 1)),
                     table=table)


def _timing_rules(args, **_):
    enabled = _get(args, "enable_verify_timing", False)
    interval = _get(args, "verify_timing_interval", timing.DEFAULT_INTERVAL)
    log_interval = _get(args, "verify_timing_log_interval", timing.DEFAULT_LOG_INTERVAL_S)
    timing.TimingConfig.from_flags(enabled, interval, log_interval)
    if enabled:
        return
    for flag, value, default in ((timing.FLAG_INTERVAL, interval, timing.DEFAULT_INTERVAL),
                                 (timing.FLAG_LOG_INTERVAL, log_interval,
                                  timing.DEFAULT_LOG_INTERVAL_S)):
        if value != default:
            raise FlagError(f"{flag} {value}: needs {timing.FLAG_ENABLE}; allowed: add "
                            f"{timing.FLAG_ENABLE}, or drop {flag}")


def _ngram_rules(args, **_):
    mode = _get(args, "speculative_ngram_verify_mode", DEFAULT_MODE)
    widths_value = getattr(args, "speculative_ngram_verify_widths", None)
    costs = getattr(args, "speculative_ngram_auto_cost_table", None)
    hyst = _get(args, "speculative_ngram_auto_hysteresis", DEFAULT_HYSTERESIS)
    algo = getattr(args, "speculative_algorithm", None)

    if mode not in VERIFY_MODES:
        raise FlagError(f"{MODE} {mode!r}; allowed: {', '.join(VERIFY_MODES)}")
    number = isinstance(hyst, (int, float)) and not isinstance(hyst, bool)
    if not (number and math.isfinite(hyst) and 0.0 <= hyst < HYSTERESIS_MAX):
        raise FlagError(f"{HYST} must be in [0, {HYSTERESIS_MAX:g}), got {hyst!r}; allowed: a "
                        f"number h with 0 <= h < {HYSTERESIS_MAX:g} "
                        f"(default {DEFAULT_HYSTERESIS:g})")
    # The flags that only mean something for n-gram speculation, where given (not at the default).
    given = [(flag, value) for flag, value, default in ((MODE, mode, DEFAULT_MODE),
                                                        (WIDTHS, widths_value, None),
                                                        (COSTS, costs, None),
                                                        (HYST, hyst, DEFAULT_HYSTERESIS))
             if value not in (default, "")]
    if given and (algo is None or str(algo).upper() != "NGRAM"):
        flag, value = given[0]
        raise FlagError(f"{flag} {value}: needs {ALGO} NGRAM (got {ALGO} {_shown(algo)}); "
                        f"allowed: add {ALGO} NGRAM, or drop {flag}")
    for flag, value in given:
        if flag in (COSTS, HYST) and mode != "auto":
            raise FlagError(f"{flag} {value}: needs {MODE} auto (got {MODE} {mode}); allowed: "
                            f"add {MODE} auto, or drop {flag}")
    k = _get(args, "speculative_num_draft_tokens", NGRAM_DEFAULT_DRAFT_TOKENS)
    cfg = widths.parse_widths(widths_value, k, mode)
    if mode == "auto" and (not cfg.enabled or 1 not in cfg.widths):
        raise FlagError(f"{MODE} auto needs {WIDTHS} with 1 (the step without speculation) and "
                        f"k = {k}; got {WIDTHS} {_shown(widths_value)}; allowed: e.g. {WIDTHS} "
                        f"1,2,4,{k}")
    if mode != DEFAULT_MODE and _get(args, "enable_watermark", False):
        raise FlagError(f"{MODE} {mode} cannot be combined with --enable-watermark (the watermark "
                        "reads the tree's mask); allowed: tree")
    if costs:
        from fastverify.costs import load_cost_table  # only when a file is given

        load_cost_table(costs, COSTS)


def _emulator_rules(args, **_):
    emulator.config_from_flags(getattr(args, "emulate_pass_cost", None),
                               bool(_get(args, "emulate_pass_cost_compute", False)))
