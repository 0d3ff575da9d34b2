"""lab/gpu/evaluate.sh --print-commands: the server command lines the evaluation would launch."""
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_args", ROOT / "scripts/gpu/check_args.py")
check_args = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_args)


def _print_commands(**env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "lab/gpu/evaluate.sh"), "--print-commands"],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, TP="1", **env))


def _commands(**env) -> dict:
    r = _print_commands(**env)
    assert r.returncode == 0, r.stderr
    return dict(line.split("|", 1) for line in r.stdout.splitlines())


def test_a_servers_own_flags_reach_that_server_only():
    flag = "--enable-verify-timing --verify-timing-interval 50"
    cmds = _commands(SERVERS="A chain_w auto_w", FLAGS_SERVER_chain_w=flag)
    assert set(cmds) == {"none.A", "none.chain_w", "none.auto_w"}
    assert flag in cmds["none.chain_w"]
    assert "--enable-verify-timing" not in cmds["none.A"] + cmds["none.auto_w"]
    # after the server's own flags, before the port
    chain = cmds["none.chain_w"]
    widths = chain.index("--speculative-ngram-verify-widths")
    assert widths < chain.index(flag) < chain.index("--port")


def test_an_unknown_server_is_refused_with_the_allowed_names():
    r = _print_commands(SERVERS="A nope")
    assert "unknown server nope" in r.stderr and "auto_never" in r.stderr


def test_plain_and_speculative_servers_capture_the_same_decode_batch_sizes():
    # SGLang's default list differs (plain 1 2 4 8, speculative 1-8): a plain batch of 3 would
    # replay the graph of 4 and pay a 4-token pass where the n-gram server pays 3
    cmds = _commands(SERVERS="A P tree chain_w auto_w auto_never",
                     PROFILES="none nccl-numa-sm120")
    lists = set()
    for args in cmds.values():
        words = args.split()
        i = words.index("--cuda-graph-bs-decode")
        sizes = []
        for w in words[i + 1:]:
            if not w.isdigit():
                break
            sizes.append(int(w))
        lists.add(tuple(sizes))
    assert lists == {tuple(range(1, 9))}


def test_dummy_weights_reach_every_server_and_a_bad_value_is_refused():
    cmds = _commands(SERVERS="A P auto_never", WEIGHTS="dummy")
    assert all("--load-format dummy" in args for args in cmds.values())
    assert not any("--load-format" in args for args in _commands(SERVERS="A").values())
    r = _print_commands(SERVERS="A", WEIGHTS="random")
    assert r.returncode == 2 and "WEIGHTS must be real or dummy" in r.stderr


def test_every_server_of_the_table_passes_the_flag_rules_its_sglang_would_apply():
    # the table's servers are all launched with the series' flags: each must parse and pass
    # fastverify.flags.check (the rules patch 0010 applies at parse time), else the server would
    # stop at its start on the GPU machine (scripts/gpu/check_args.py, as the bundle build runs it)
    server_args = pytest.importorskip("sglang.srt.server_args")
    names = _print_commands(SERVERS="nope").stderr.split("allowed:", 1)[1].split()
    assert "A" in names and "auto_never" in names
    cmds = _commands(SERVERS=" ".join(names))
    assert len(cmds) == len(names)
    refused = {name: why for name, args in cmds.items()
               if (why := check_args.check_line(server_args.ServerArgs, name, args)[0])}
    assert not refused, refused


def _pins(**env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "lab/gpu/evaluate.sh"), "--print-pins"],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **{"TP": "1", **env}))


def test_each_server_name_gets_cores_of_its_own_once_whatever_the_profiles():
    r = _pins(PIN_NPROC="16", SERVERS="A chain_w auto_w auto_w_b", PROFILES="none mem")
    assert r.returncode == 0, r.stderr
    plan = dict(line.split() for line in r.stdout.splitlines())
    assert plan == {"A": "0-2", "chain_w": "3-5", "auto_w": "6-8", "auto_w_b": "9-11"}


def test_a_server_with_its_own_launch_prefix_and_pin_off_are_left_alone():
    # a server placed by its own prefix: no other is pinned (cores chosen here could overlap)
    r = _pins(PIN_NPROC="16", SERVERS="A P auto_w", ENV_SERVER_P="taskset -c 15", PIN_SPARE="0")
    assert r.stdout.strip() == "not pinned: ENV_SERVER_P places that server itself"
    assert _pins(PIN_NPROC="16", SERVERS="A P", PIN_SPARE="0").stdout.split() == [
        "A", "0-7", "P", "8-15"]
    assert _pins(PIN="0", PIN_NPROC="16").stdout == ""
    few = _pins(PIN_NPROC="4", SERVERS="A P chain_w auto_w auto_w_b").stdout
    assert few.startswith("not pinned: 4 cores for 5 servers of 1 rank(s)")
    # each of a server's TP ranks gets a core at least: 16 cores, 5 servers of 4 ranks: 3 each
    assert _pins(PIN_NPROC="16", TP="4").stdout.startswith("not pinned: 16 cores for 5 servers")
    wide = _pins(PIN_NPROC="128", TP="8", SERVERS="A P chain_w auto_w auto_w_b").stdout
    assert dict(line.split() for line in wide.splitlines())["auto_w_b"] == "100-124"


@pytest.mark.parametrize("env", [{"PIN": "yes"}, {"PIN_SPARE": "-1"}])
def test_a_bad_pin_setting_is_refused(env):
    r = _pins(**env)
    assert r.returncode == 2 and "evaluate.sh: PIN" in r.stderr


def _spies(**env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "lab/gpu/evaluate.sh"), "--print-spies"],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **{"TP": "1", "PROFILES": "none mem",
                                                  "SERVERS": "A chain_w auto_w", **env}))


def test_a_profile_may_have_py_spy_lists_of_its_own():
    """PYSPY_SERVERS_<profile> replaces PYSPY_SERVERS for that profile ("" for none), so that one
    launch can measure a profile undisturbed and sample another; a name outside SERVERS is refused
    before anything starts."""
    r = _spies(PYSPY_SERVERS="auto_w chain_w", PYSPY_SERVERS_none="")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["none: ", "mem: auto_w chain_w"]
    r = _spies(PYSPY_SERVERS="auto_w", PYSPY_SERVERS_mem="A auto_w")
    assert r.stdout.splitlines() == ["none: auto_w", "mem: A auto_w"]
    assert _spies().stdout.splitlines() == ["none: ", "mem: "]
    r = _spies(PYSPY_SERVERS_mem="auto_w tree")
    assert r.returncode == 2
    assert "py-spy server tree of profile mem is not among SERVERS" in r.stderr
