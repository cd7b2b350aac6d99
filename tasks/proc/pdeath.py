"""A child that dies with its parent: Linux's parent-death signal, armed before the child's own command runs.

Run as a script, it is the first program of a child process: `python -I -S pdeath.py PARENT_PID COMMAND...`
arms the signal (prctl PR_SET_PDEATHSIG, which survives exec), then checks that its parent is still
PARENT_PID — had the parent died before the signal was armed, the child was already handed to another
parent and no signal would ever come, so it leaves without starting COMMAND — and execs COMMAND in its own
place (same pid). Standard library only: it runs without site-packages, before any of epdbench loads.

The kernel sends the signal when the *thread* that forked the child ends, not the process; tasks/proc/lifeline.py
therefore forks every child from one thread that lives as long as the process. The signal reaches the child
alone, never its own children: the run's guard (tasks/proc/runguard.py) ends those.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
EXIT_ORPHANED = 125     # the parent was gone before the signal was armed: COMMAND never started
SUPPORTED = sys.platform.startswith("linux")


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send `sig` to this process when its parent ends; False when the parent is no longer
    `parent_pid` (it died already: the caller must leave at once). Elsewhere than Linux: True, nothing armed."""
    if not SUPPORTED:
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    return os.getppid() == parent_pid


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[1:]
    if not die_with_parent(parent):
        os._exit(EXIT_ORPHANED)
    try:
        os.execv(command[0], command)
    except OSError as e:
        print(f"cannot start {command[0]}: {e.strerror}", file=sys.stderr, flush=True)
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
