"""lab/gpu/lossless.sh's table of servers: every entry parses and passes the flag rules the
patched SGLang applies at parse time (scripts/gpu/check_args.py), so that none stops at its start
on the GPU machine."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_args", ROOT / "scripts/gpu/check_args.py")
check_args = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_args)


def _cases() -> dict:
    text = (ROOT / "lab/gpu/lossless.sh").read_text()
    ng = re.search(r'^NG="([^"]*)"$', text, re.M).group(1)
    body = re.search(r"cat <<CASES\n(.*?)\nCASES\n", text, re.S).group(1)
    return {name: flags.replace("$NG", ng)
            for name, flags in (line.split("|", 1) for line in body.splitlines())}


def test_every_server_of_the_lossless_table_passes_the_flag_rules():
    server_args = pytest.importorskip("sglang.srt.server_args")
    cases = _cases()
    assert {"plain", "tree", "chain_w", "auto_w"} <= set(cases)
    refused = {name: why for name, args in cases.items()
               if (why := check_args.check_line(server_args.ServerArgs, name,
                                                "--model-path m " + args)[0])}
    assert not refused, refused
