#!/usr/bin/env python3
"""Parse every server command line of run_e2e.sh with the patched SGLang's own
argument parser (build host).

    bash run_e2e.sh --print-commands | python check_args.py PATCHED_DIR

PATCHED_DIR holds the patched `sglang` package (build_bundle.sh's .scratch/gpu-build/patched). A
flag that the series does not define, or a value outside a flag's choices, fails here instead of on
the GPU machine. Parser level only: the checks SGLang runs in ServerArgs.__post_init__ need a GPU.
"""
import argparse
import shlex
import sys


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
        p = argparse.ArgumentParser(prog=name, exit_on_error=False)
        ServerArgs.add_cli_args(p)

        def refuse(msg):
            raise ValueError(msg)
        p.error = refuse
        try:
            ns = p.parse_args(shlex.split(args))
        except (argparse.ArgumentError, ValueError) as e:
            bad += 1
            print(f"{name}: REFUSED: {e}")
            continue
        picked = {k: getattr(ns, k)
                  for k in ("speculative_algorithm", "speculative_ngram_verify_mode",
                            "speculative_ngram_verify_widths", "tp_allreduce", "nccl_proto",
                            "nccl_max_channels", "enable_verify_timing")
                  if getattr(ns, k, None)}
        print(f"{name}: ok {picked}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
