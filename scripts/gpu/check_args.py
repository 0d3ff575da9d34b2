#!/usr/bin/env python3
"""Parse every server command line of run_e2e.sh with the patched SGLang's own
argument parser and apply the series' flag rules to it (build host).

    bash run_e2e.sh --print-commands | python check_args.py PATCHED_DIR

PATCHED_DIR holds the patched `sglang` package (build_bundle.sh's .scratch/gpu-build/patched). A
flag that the series does not define, a value outside a flag's choices, or flags that
fastverify.flags.check refuses (the rules patch 0010 applies when the server parses its
arguments) fail here instead of on the GPU machine. The checks SGLang runs in
ServerArgs.__post_init__ need a GPU and are not run.
"""
import argparse
import shlex
import sys

PICKED = ("speculative_algorithm", "speculative_ngram_verify_mode",
          "speculative_ngram_verify_widths", "tp_allreduce", "nccl_proto", "nccl_max_channels",
          "enable_verify_timing")


def check_line(server_args, name: str, args: str) -> tuple:
    """(None, the flags picked for the report) where the server line ``name|args`` parses with
    ``server_args`` (SGLang's ServerArgs class) and passes the flag rules, else (why, {})."""
    from fastverify import flags

    p = argparse.ArgumentParser(prog=name, exit_on_error=False)
    server_args.add_cli_args(p)

    def refuse(msg):
        raise ValueError(msg)
    p.error = refuse
    try:
        ns = p.parse_args(shlex.split(args))
        flags.check(ns)
    except (argparse.ArgumentError, ValueError) as e:  # (FlagError is a ValueError)
        return str(e), {}
    return None, {k: getattr(ns, k) for k in PICKED if getattr(ns, k, None)}


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.path.insert(0, sys.argv[1])
    from sglang.srt.server_args import ServerArgs

    bad = 0
    for line in sys.stdin:
        if "|" not in line:
            continue
        name, args = line.rstrip("\n").split("|", 1)
        why, picked = check_line(ServerArgs, name, args)
        if why is not None:
            bad += 1
            print(f"{name}: REFUSED: {why}")
        else:
            print(f"{name}: ok {picked}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
