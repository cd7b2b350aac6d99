"""The guard of a run folder's holder: `python -m epdbench.tasks.proc.runguard RDIR OWNER_PID OWNER_START`, its stdin
the read end of a pipe that only the holder writes (tasks/rundir/runstate.py starts it when the folder is taken).

The holder's death, however it dies — SIGKILL included — closes the pipe: end of file. The guard then ends
every leftover of the folder's runs (runstate.end_leftovers: registered processes, and any process carrying the
token of a run that is over — its children's children, Prefect's temporary server, a child forked the instant
before the holder died), again until two sweeps in a row find nothing, and appends one line saying what it
ended to guard.log in the folder. A "q" on the pipe is the holder giving the folder up: the guard leaves and
ends nothing. The guard runs in a session of its own (a signal to the holder's process group, a terminal's
Ctrl-C, leaves it be) and also watches the holder's pid and start time, in case a forked process kept the
pipe open.
"""
from __future__ import annotations

import datetime as dt
import os
import select
import sys
import time
from pathlib import Path

from epdbench.tasks.rundir.runstate import end_leftovers, process_start_time

POLL_S = 1.0          # how often the holder's pid is checked besides the pipe
GRACE_S = 2.0         # SIGTERM to SIGKILL, for what the parent-death signal did not end already
QUIET_SWEEPS = 2      # sweeps in a row that must find nothing
SWEEP_LIMIT_S = 60.0  # the sweeping is bounded


def wait_for_owner(owner: int, owner_start: int | None) -> bool:
    """Block until the holder dies (True) or gives the folder up (False)."""
    while True:
        ready, _, _ = select.select([0], [], [], POLL_S)
        if ready:
            data = os.read(0, 64)
            return not data.startswith(b"q")
        if owner_start is not None and process_start_time(owner) != owner_start:
            return True


def sweep(rdir: Path) -> list[dict]:
    """End the folder's leftovers until QUIET_SWEEPS sweeps in a row find nothing (bounded); what was found."""
    ended: list[dict] = []
    quiet, deadline = 0, time.monotonic() + SWEEP_LIMIT_S
    while quiet < QUIET_SWEEPS and time.monotonic() < deadline:
        found = end_leftovers(rdir, grace_s=GRACE_S)
        ended += found
        quiet = 0 if found else quiet + 1
        if quiet < QUIET_SWEEPS:
            time.sleep(0.1)
    return ended


def main(argv: list[str]) -> int:
    rdir, owner = Path(argv[0]), int(argv[1])
    owner_start = int(argv[2]) if argv[2].isdigit() else None
    if not wait_for_owner(owner, owner_start):
        return 0
    died = dt.datetime.now()
    ended = sweep(rdir)
    if ended:
        took = (dt.datetime.now() - died).total_seconds()
        try:
            with open(rdir / "guard.log", "a") as log:
                log.write(f"{died.isoformat(timespec='seconds')} pid {owner} ended without stopping "
                          f"{len(ended)} process(es); ended in {took:.1f} s: "
                          + ", ".join(f"{e['what']} pid {e['pid']}" for e in ended) + "\n")
        except OSError:
            pass      # a full disk: what mattered is done
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
