"""Child processes that live no longer than the process that started them, registered as they start.

`popen` and `start_process` start a child on the spawner thread, one daemon thread per process that lives as
long as the process: Linux's parent-death signal is sent when the *thread* that forked a child ends, and flows,
tasks and asyncio executors run on threads that come and go (a child forked on one would be killed when it
ends). A command runs behind tasks/proc/pdeath.py, which arms the signal and checks the parent is still there
before the command starts; a multiprocessing child arms it first thing (`die_with_parent`). The child's pid is
registered in the run folder this process holds (tasks/rundir/runstate.py) on the same thread, the instant Popen
returns it, before anything else of the run happens; the folder already holds the run's token, which every
child carries in its environment from its first instruction, so even a child whose pid was not yet written is
found by a later resume or `cleanup`. What the signal cannot reach — a child's own children, processes
others start (Prefect's temporary server) — the run's guard (tasks/proc/runguard.py) ends when this process dies.
"""
from __future__ import annotations

import errno
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, TypeVar

from epdbench.tasks.proc import pdeath
from epdbench.tasks.rundir import runstate

T = TypeVar("T")
PDEATH_SCRIPT = str(Path(pdeath.__file__).resolve())
SPAWNER_THREAD = "epdbench-spawner"
# Fault injection for tests: `epdbench compare` SIGKILLs itself right after forking the child registered as
# this name (e.g. "pd-tcp/router"), before registering it: the window a lost run leaves behind.
SIGKILL_AT_SPAWN = "EPDBENCH_FAULT_SIGKILL_AT_SPAWN"

_lock = threading.Lock()
_jobs: "queue.SimpleQueue | None" = None
_jobs_pid = 0          # the process whose spawner thread serves _jobs (a forked child starts its own)


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        fn, fut = jobs.get()
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller, on its own thread
            fut.set_exception(e)


def on_spawner_thread(fn: Callable[[], T]) -> T:
    """fn() on the spawner thread (started on first use); its result or exception here."""
    global _jobs, _jobs_pid
    if threading.current_thread().name == SPAWNER_THREAD and _jobs_pid == os.getpid():
        return fn()
    with _lock:
        if _jobs is None or _jobs_pid != os.getpid():
            _jobs, _jobs_pid = queue.SimpleQueue(), os.getpid()
            threading.Thread(target=_serve, args=(_jobs,), name=SPAWNER_THREAD, daemon=True).start()
        jobs = _jobs
    fut: Future = Future()
    jobs.put((fn, fut))
    return fut.result()


def guarded_command(cmd: list[str], env: dict | None = None) -> list[str]:
    """`cmd` behind the parent-death wrapper (as it is, off Linux). Its program is looked up on the PATH
    of `env` now, so that a missing one fails here, as Popen would, and not in the child."""
    found = shutil.which(cmd[0], path=(os.environ if env is None else env).get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), cmd[0])
    if not pdeath.SUPPORTED:
        return cmd
    return [sys.executable, "-I", "-S", PDEATH_SCRIPT, str(os.getpid()), found, *cmd[1:]]


def _started(pid: int, what: str) -> None:
    if os.environ.get(SIGKILL_AT_SPAWN) == what:
        os.kill(os.getpid(), signal.SIGKILL)
    runstate.register_child(pid, what)


def popen(cmd: list[str], what: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    """subprocess.Popen(cmd, env=env, **kwargs), the child dying with this process and registered as `what`
    in the held run folder (if any) before this returns. The Popen's pid is the command's own."""
    wrapped = guarded_command(cmd, env)

    def start() -> subprocess.Popen:
        p = subprocess.Popen(wrapped, env=env, **kwargs)
        try:
            _started(p.pid, what)
        except BaseException:   # not registered (a full disk): it must not run
            p.kill()
            p.wait()
            raise
        return p

    return on_spawner_thread(start)


def start_process(proc, what: str) -> None:
    """proc.start() for a multiprocessing Process, on the spawner thread, registered as `what`. The child must
    call die_with_parent(parent pid) first thing."""
    def start() -> None:
        proc.start()
        try:
            _started(proc.pid, what)
        except BaseException:
            proc.kill()
            proc.join()
            raise

    on_spawner_thread(start)


def die_with_parent(parent_pid: int) -> None:
    """In a multiprocessing child, first thing: arm the death signal, and leave at once if the parent is gone."""
    if not pdeath.die_with_parent(parent_pid):
        os._exit(pdeath.EXIT_ORPHANED)
