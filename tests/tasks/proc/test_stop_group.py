"""stop_process ends a process's whole group, also once its leader is dead: a vLLM engine's API server leads its
engine core and workers, which outlive it when it is killed (seen on the real-engine lane: an engine core and its
worker still spinning after their API server's SIGKILL and the configuration's teardown)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from epdbench.tasks.proc.processes import group_members, stop_process, stop_processes
from epdbench.tasks.rundir.runstate import is_resource_tracker, process_start_time

# A leader that starts a child of its own group (as vLLM's API server starts its engine core), writes the child's
# pid, then waits; the child ignores nothing and sleeps.
LEADER = ("import subprocess, sys, time\n"
          "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
          "open(sys.argv[1], 'w').write(str(c.pid))\n"
          "time.sleep(300)\n")


def started_writing(script: str, out: Path) -> tuple[subprocess.Popen, str]:
    """`script` run as the leader of a new session, given `out` to write: the process and what it wrote (waited for,
    30 s at most)."""
    p = subprocess.Popen([sys.executable, "-c", script, str(out)], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return p, out.read_text()


def start_leader(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    p, child = started_writing(LEADER, tmp_path / "child.pid")
    return p, int(child)


def test_a_dead_leaders_group_is_ended(tmp_path):
    leader, child = start_leader(tmp_path)
    os.kill(leader.pid, signal.SIGKILL)               # the API server killed; its engine core lives on
    leader.wait(timeout=10)
    assert group_members(leader.pid) == [child]
    t0 = time.monotonic()
    stop_process(leader, grace_s=5)
    assert process_start_time(child) is None and group_members(leader.pid) == []
    assert time.monotonic() - t0 < 5                  # SIGTERM ended it, no wait for the grace


def test_a_live_leader_and_its_group_are_ended(tmp_path):
    leader, child = start_leader(tmp_path)
    stop_process(leader, grace_s=5)
    assert leader.returncode == -signal.SIGTERM
    assert process_start_time(child) is None and group_members(leader.pid) == []


STUBBORN = ("import signal, subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import signal, sys, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); open(sys.argv[1], \"w\").write(\"ready\"); "
            "time.sleep(300)', sys.argv[1] + '.ready'])\n"
            "open(sys.argv[1], 'w').write(str(c.pid))\n"
            "time.sleep(300)\n")


def start_stubborn(pid_file: Path) -> tuple[subprocess.Popen, int]:
    """A leader whose child ignores SIGTERM (as an engine core stuck in a kernel call outlasts its SIGTERM)."""
    leader = subprocess.Popen([sys.executable, "-c", STUBBORN, str(pid_file)], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (Path(str(pid_file) + ".ready").exists() and pid_file.exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return leader, int(pid_file.read_text())


def test_a_member_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    leader, child = start_stubborn(tmp_path / "child.pid")
    t0 = time.monotonic()
    stop_process(leader, grace_s=1)
    took = time.monotonic() - t0
    assert process_start_time(child) is None and group_members(leader.pid) == []
    assert 1 <= took < 8


def test_groups_stopped_together_take_one_grace_not_one_each(tmp_path):
    started = [start_stubborn(tmp_path / f"child-{i}.pid") for i in range(3)]
    t0 = time.monotonic()
    stop_processes([leader for leader, _ in started], grace_s=2)
    took = time.monotonic() - t0
    assert all(process_start_time(child) is None and group_members(leader.pid) == [] for leader, child in started)
    assert 2 <= took < 6          # one after another: 6 s at least


# A leader that ignores SIGTERM and holds a shared memory segment: Python starts its resource tracker (a child in
# the leader's group, as in every vLLM engine), which unlinks the segment when its last client is gone.
SHM_HOLDER = ("import signal, sys, time\n"
              "from multiprocessing import shared_memory\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "shm = shared_memory.SharedMemory(create=True, size=1 << 20)\n"
              "open(sys.argv[1], 'w').write(shm.name)\n"
              "time.sleep(300)\n")


def start_shm_holder(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    leader, name = started_writing(SHM_HOLDER, tmp_path / "shm.name")
    segment = Path("/dev/shm") / name
    assert segment.exists() and any(is_resource_tracker(p) for p in group_members(leader.pid))
    return leader, segment


def test_a_resource_tracker_is_killed_last_so_the_shared_memory_it_tracks_is_unlinked(tmp_path):
    leader, segment = start_shm_holder(tmp_path)
    try:
        stop_process(leader, grace_s=1)                 # the leader needs its SIGKILL
        assert group_members(leader.pid) == []
        assert not segment.exists()                     # SIGKILLed with the group, the tracker left it in memory
    finally:
        segment.unlink(missing_ok=True)
