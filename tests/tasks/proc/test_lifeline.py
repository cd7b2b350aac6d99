"""tasks/proc/lifeline.py and tasks/proc/pdeath.py: a child is registered with its run's token before Popen returns,
outlives the thread that started it, dies with the process that started it (SIGKILL included), and never starts when that
process died before the death signal was armed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epdbench.tasks.proc import lifeline
from epdbench.tasks.proc import pdeath
from epdbench.tasks.rundir.runstate import RunFolder, carriers_of, process_start_time, read_registry

pytestmark = pytest.mark.skipif(not pdeath.SUPPORTED, reason="the parent-death signal is Linux's")
ROOT = Path(__file__).resolve().parents[3]

# A parent that starts `sleep` from a thread that ends at once, says its pid, and lives on until killed.
FROM_A_THREAD = """
import threading, time
from epdbench.tasks.proc import lifeline
started = {}
t = threading.Thread(target=lambda: started.update(p=lifeline.popen(["sleep", "60"], "x", start_new_session=True)))
t.start(); t.join()
print(started["p"].pid, flush=True)
time.sleep(60)
"""


def gone_within(pid: int, start: int, timeout_s: float) -> float | None:
    """Seconds until `pid` (with that start time) is no longer running; None if it still runs at the deadline."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if process_start_time(pid) != start:
            return time.monotonic() - t0
        time.sleep(0.005)
    return None


def test_a_child_is_registered_and_carries_the_runs_token_before_popen_returns(tmp_path):
    hold = RunFolder(tmp_path).acquire(guard=False)
    token = hold.token
    try:    # the run's token is in the registry before anything starts
        assert [e.get("token") for e in json.loads((tmp_path / "processes.json").read_text())] == [token]
        p = lifeline.popen(["sleep", "30"], "pd-tcp/router", start_new_session=True)
        try:
            [entry] = read_registry(tmp_path)          # read at once: nothing else ran since Popen returned
            assert (entry["pid"], entry["what"], entry["token"]) == (p.pid, "pd-tcp/router", hold.token)
            assert entry["start"] == process_start_time(p.pid)
            assert carriers_of({hold.token}) == [p.pid]
        finally:
            p.kill()
            p.wait(timeout=10)
    finally:
        hold.release()
    assert token not in os.environ.get("EPDBENCH_RUN_TOKENS", "").split(",")    # released: later children are not its


def test_a_child_outlives_the_thread_that_started_it_and_dies_with_its_process_by_sigkill():
    parent = subprocess.Popen([sys.executable, "-c", FROM_A_THREAD], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        child = int(parent.stdout.readline())
        start = process_start_time(child)
        assert start is not None
        time.sleep(0.5)
        assert process_start_time(child) == start       # its thread ended long ago: the child runs on
        parent.kill()
        parent.wait(timeout=10)
        assert gone_within(child, start, 5.0) is not None
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_command_whose_parent_died_before_the_signal_was_armed_never_starts(tmp_path):
    """The wrapper sees another parent than the one named (the named one is gone: the child was handed on)."""
    witness = tmp_path / "started"
    done = subprocess.run([sys.executable, "-I", "-S", lifeline.PDEATH_SCRIPT, str(os.getpid() + 1_000_000),
                           "/bin/touch", str(witness)], timeout=30)
    assert done.returncode == pdeath.EXIT_ORPHANED and not witness.exists()
    p = lifeline.popen(["/bin/touch", str(witness)], "x")      # its parent is there: it runs
    assert p.wait(timeout=30) == 0 and witness.exists()


def test_a_missing_program_fails_at_once_as_popen_would():
    with pytest.raises(FileNotFoundError, match="no-such-epdbench-program"):
        lifeline.popen(["no-such-epdbench-program"], "x")


def test_a_process_killed_at_spawn_by_the_fault_hook_leaves_its_child_unregistered_and_dying(tmp_path):
    """The hook the fault tests use: SIGKILL right after the fork, before the registry is written."""
    code = ("import sys\nfrom pathlib import Path\nfrom epdbench.tasks.proc import lifeline\n"
            "from epdbench.tasks.rundir.runstate import RunFolder\n"
            "RunFolder(Path(sys.argv[1])).acquire()\n"
            "lifeline.popen(['sleep', '60'], 'pd-tcp/router', start_new_session=True)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), lifeline.SIGKILL_AT_SPAWN: "pd-tcp/router"})
    assert done.returncode == -signal.SIGKILL
    assert read_registry(tmp_path) == []
    [token] = [e["token"] for e in json.loads((tmp_path / "processes.json").read_text())]
    deadline = time.monotonic() + 10
    while carriers_of({token}) and time.monotonic() < deadline:   # the child, had it started, dies too
        time.sleep(0.01)
    assert carriers_of({token}) == []
