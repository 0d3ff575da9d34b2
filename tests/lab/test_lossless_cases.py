"""lab/gpu/lossless.sh's table of servers: every entry passes the flag rules the patched SGLang
applies at parse time (fastverify.flags.check), so that none stops at its start on the GPU
machine."""
import argparse
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cases() -> dict:
    text = (ROOT / "lab/gpu/lossless.sh").read_text()
    ng = re.search(r'^NG="([^"]*)"$', text, re.M).group(1)
    body = re.search(r"cat <<CASES\n(.*?)\nCASES\n", text, re.S).group(1)
    return {name: flags.replace("$NG", ng)
            for name, flags in (line.split("|", 1) for line in body.splitlines())}


def test_every_server_of_the_lossless_table_passes_the_flag_rules():
    server_args = pytest.importorskip("sglang.srt.server_args")
    from fastverify import flags

    cases = _cases()
    assert {"plain", "tree", "chain_w", "auto_w"} <= set(cases)
    refused = {}
    for name, args in cases.items():
        parser = argparse.ArgumentParser(prog=name)
        server_args.ServerArgs.add_cli_args(parser)
        try:
            flags.check(parser.parse_args(["--model-path", "m"] + shlex.split(args)))
        except flags.FlagError as e:
            refused[name] = str(e)
    assert not refused, refused
