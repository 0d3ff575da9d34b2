"""lab/gpu/scheduler_pid.sh: the TP-0 scheduler of a server's process group, as SGLang names it."""
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _group(*titles):
    """A leader process in a new session and children in its group, each with a title in its
    command line (python's -X takes any name), as a server's launcher and its schedulers."""
    children = "; ".join(
        f"subprocess.Popen([sys.executable, '-X', {t!r}, '-c', 'import time; time.sleep(30)'])"
        for t in titles)
    leader = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys, time; {children}; time.sleep(30)"],
        start_new_session=True)
    time.sleep(1.0)
    return leader


def _find(pgid) -> str:
    return subprocess.run(["bash", str(ROOT / "lab/gpu/scheduler_pid.sh"), str(pgid)],
                          capture_output=True, text=True, timeout=30).stdout.strip()


def _title_of(pid: str) -> str:
    return subprocess.run(["ps", "-o", "args=", "-p", pid], capture_output=True,
                          text=True).stdout


def _stop(leader):
    subprocess.run(["kill", "-TERM", "--", f"-{leader.pid}"], check=False)
    leader.wait(timeout=10)


def test_finds_the_tp1_scheduler_and_the_tp0_one_never_another_rank():
    for titles, want in ((("sglang::detokenizer", "sglang::scheduler"), "sglang::scheduler "),
                         (("sglang::scheduler_TP1", "sglang::scheduler_TP0"), "_TP0"),
                         (("sglang::scheduler_DP0_TP0",), "_DP0_TP0")):
        leader = _group(*titles)
        try:
            pid = _find(leader.pid)
            assert pid and want in _title_of(pid) + " ", (titles, pid)
        finally:
            _stop(leader)


def test_prints_nothing_where_no_scheduler_of_that_group_runs():
    leader = _group("sglang::scheduler_TP1", "sglang::detokenizer")
    try:
        assert _find(leader.pid) == ""
        assert _find(999999) == ""
    finally:
        _stop(leader)
