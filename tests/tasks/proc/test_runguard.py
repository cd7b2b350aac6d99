"""tasks/proc/runguard.py with tasks/rundir/runstate.py: when the process holding a run folder dies by SIGKILL,
its guard ends what it left — registered processes and processes only its token names — and says so in guard.log; a live run's
processes are nobody's leftovers; a holder that gives the folder up leaves its processes to a later cleanup."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epdbench.tasks.rundir.runstate import GUARDED, end_leftovers, leftovers, process_start_time

pytestmark = pytest.mark.skipif(not GUARDED, reason="the guard finds processes through Linux's /proc")
ROOT = Path(__file__).resolve().parents[3]

# A holder of the folder argv[1] that starts two sleeps in sessions of their own, with no death signal: one
# registered, one only carrying the run's token. It says their pids, then releases the folder if argv[2] says so.
HOLDER = """
import subprocess, sys, time
from pathlib import Path
from epdbench.tasks.rundir.runstate import RunFolder
hold = RunFolder(Path(sys.argv[1])).acquire()
registered = subprocess.Popen(["sleep", "60"], start_new_session=True)
hold.register([registered.pid], "pd-tcp/prefill-0")
unregistered = subprocess.Popen(["sleep", "60"], start_new_session=True)
print(registered.pid, unregistered.pid, flush=True)
if sys.argv[2] == "release":
    hold.release()
    sys.exit(0)
time.sleep(60)
"""


def start_holder(rdir: Path, then: str) -> tuple[subprocess.Popen, list[tuple[int, int]]]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(rdir), then], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    pids = [int(p) for p in holder.stdout.readline().split()]
    return holder, [(pid, process_start_time(pid)) for pid in pids]


def running(procs: list[tuple[int, int]]) -> list[int]:
    return [pid for pid, start in procs if process_start_time(pid) == start]


def guards_of(rdir: Path) -> list[int]:
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"epdbench.tasks.proc.runguard" in args and str(rdir).encode() in args:
            out.append(int(cmdline.parent.name))
    return out


def test_the_guard_ends_what_a_sigkilled_holder_left_registered_or_not(tmp_path):
    holder, sleeps = start_holder(tmp_path, "stay")
    try:
        assert len(running(sleeps)) == 2 and guards_of(tmp_path)
        assert leftovers(tmp_path) == []                # a live run's processes: `cleanup` ends nothing
        holder.kill()
        holder.wait(timeout=10)
        deadline = time.monotonic() + 15
        while (running(sleeps) or guards_of(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running(sleeps) == [] and guards_of(tmp_path) == []
        line = (tmp_path / "guard.log").read_text()
        assert f"pid {holder.pid} ended without stopping 2 process(es)" in line
        assert f"pd-tcp/prefill-0 pid {sleeps[0][0]}" in line and f"unregistered (sleep 60) pid {sleeps[1][0]}" in line
    finally:
        for pid in running(sleeps):
            os.kill(pid, 9)


def test_a_holder_that_gives_the_folder_up_leaves_its_processes_to_a_later_cleanup(tmp_path):
    holder, sleeps = start_holder(tmp_path, "release")
    try:
        assert holder.wait(timeout=30) == 0
        time.sleep(1.0)
        assert len(running(sleeps)) == 2 and guards_of(tmp_path) == [] and not (tmp_path / "guard.log").exists()
        ended = end_leftovers(tmp_path, grace_s=5)       # the run is over: both are its leftovers
        assert sorted(e["pid"] for e in ended) == sorted(pid for pid, _ in sleeps)
        assert running(sleeps) == []
    finally:
        for pid in running(sleeps):
            os.kill(pid, 9)


# A holder whose registered process (a session leader, as an engine's API server) starts a child that carries no
# token (vLLM's engine core writes over its environment when it renames itself), then dies before the holder.
HIDDEN = """
import subprocess, sys, time
from pathlib import Path
from epdbench.tasks.rundir.runstate import RunFolder
hold = RunFolder(Path(sys.argv[1])).acquire()
leader = subprocess.Popen([sys.executable, "-c", "import subprocess, time; "
                           "c = subprocess.Popen(['sleep', '60'], env={}); print(c.pid, flush=True); time.sleep(60)"],
                          start_new_session=True, stdout=subprocess.PIPE, text=True)
hold.register([leader.pid], "pd-tcp/prefill-0")
child = int(leader.stdout.readline())
print(leader.pid, child, flush=True)
time.sleep(60)
"""


def test_the_guard_ends_what_a_dead_leader_left_in_its_session_though_it_hides_the_token(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HIDDEN, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    leader, child = (int(p) for p in holder.stdout.readline().split())
    orphan = [(child, process_start_time(child))]
    try:
        assert b"EPDBENCH_RUN_TOKENS" not in Path(f"/proc/{child}/environ").read_bytes()
        os.kill(leader, 9)                              # the engine's API server dies first
        holder.kill()                                   # then the run
        holder.wait(timeout=10)
        deadline = time.monotonic() + 15
        while (running(orphan) or guards_of(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running(orphan) == []
        assert f"pd-tcp/prefill-0's sleep 60 pid {child}" in (tmp_path / "guard.log").read_text()
    finally:
        for pid in running(orphan):
            os.kill(pid, 9)


def test_a_leftovers_resource_tracker_ends_last_and_unlinks_the_shared_memory_it_tracks(tmp_path):
    """A killed run's engine left with its resource tracker (which ignores SIGTERM): the engine is SIGKILLed first,
    the tracker then leaves by itself, unlinking the engine's shared memory (hundreds of MiB of /dev/shm per vLLM
    engine, kept for good when the tracker was SIGKILLed with it)."""
    from epdbench.tasks.rundir.runstate import RunFolder, is_resource_tracker, sessions_of
    from tests.tasks.proc.test_stop_group import SHM_HOLDER

    hold = RunFolder(tmp_path / "run").acquire(guard=False)
    name_file = tmp_path / "shm.name"
    leader = subprocess.Popen([sys.executable, "-c", SHM_HOLDER, str(name_file)], start_new_session=True)
    segment = None
    try:
        hold.register([leader.pid], "aggregated/server-0")
        deadline = time.monotonic() + 30
        while not (name_file.exists() and name_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        segment = Path("/dev/shm") / name_file.read_text()
        tracker = [pid for pid, _, _ in sessions_of({leader.pid}) if is_resource_tracker(pid)]
        assert segment.exists() and len(tracker) == 1
        hold.release()                                   # the run is over; its engine is a leftover
        ended = end_leftovers(tmp_path / "run", grace_s=1)
        assert {e["pid"] for e in ended} >= {leader.pid, tracker[0]}
        assert process_start_time(tracker[0]) is None and not segment.exists()
    finally:
        hold.release()
        leader.kill()
        leader.wait(timeout=10)
        if segment is not None:
            segment.unlink(missing_ok=True)
