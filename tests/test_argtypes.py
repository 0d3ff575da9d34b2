"""The comma-separated integer lists the command-line tools share (fastverify.argtypes), and that a
bad list ends each tool with its usage error (exit status 2, the flag named), never a traceback."""
import argparse

import pytest

from fastverify import advise, replay, sim
from fastverify.argtypes import int_list


def test_int_list_parses_and_rejects():
    parse = int_list("--sizes", minimum=1)
    assert parse("1,4,8") == [1, 4, 8]
    assert parse(" 2 , 3,") == [2, 3]  # spaces and an empty item are skipped
    for bad in ("", ",", "1,x", "1.5", "0", "4,-1"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"--sizes takes comma-separated "
                                                                r"integers >= 1, got"):
            parse(bad)
    anything = int_list("--n")
    assert anything("0,-3") == [0, -3]
    with pytest.raises(argparse.ArgumentTypeError, match=r"^--n takes comma-separated integers, "
                                                         r"got 'a'$"):
        anything("a")


@pytest.mark.parametrize("main,argv,flag", [
    (sim.main, ["--batch-sizes", "1,x"], "--batch-sizes"),
    (sim.main, ["--batch-sizes", "0"], "--batch-sizes"),
    (replay.main, ["--buckets", "0,8"], "--buckets"),
    (replay.main, ["--chain-lengths", "two"], "--chain-lengths"),
    (advise.main, ["--profile", "pcie-ipc-sm120", "--tree-widths", "8,x"], "--tree-widths"),
])
def test_a_bad_list_is_a_usage_error(main, argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "takes comma-separated integers" in err
    assert "Traceback" not in err


def test_sim_refuses_empty_loads_before_any_work(capsys):
    # (these ran the whole report for nothing, or looped, before they were checked)
    assert sim.main(["--tables", "h200-dummy24", "--requests", "0"]) == 2
    assert sim.main(["--tables", "h200-dummy24", "--length", "0"]) == 2
    assert "--requests, --length and --probe-max >= 1" in capsys.readouterr().err
