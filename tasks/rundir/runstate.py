"""Who owns a results folder, and what it started: an exclusive lock with the holder's pid and host, and a
registry of every process a run started (pid and start time), so a later resume, `cleanup --run` or
`down` ends what a killed run left — by recorded pid and start time, never by name.

The lock is a kernel lock (flock) on `.lock`: a holder that dies, even by SIGKILL, releases it, so a
stale lock is taken over without any guess about whether its owner still lives.

Before the holder starts anything, the registry gets the run's token, and the holder's environment carries it
(EPDBENCH_RUN_TOKENS, inherited by every process below it): a process carrying the token of a holder that is
gone is a leftover too, even one whose pid was never written (forked the instant before the holder died, or
started by a child, or by a library). The holder's guard (tasks/proc/runguard.py), a process of its own, ends
them all the moment the holder dies, however it dies.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

LOCK_FILE = ".lock"
REGISTRY = "processes.json"
STOP_GRACE_S = 5.0
TOKENS_ENV = "EPDBENCH_RUN_TOKENS"     # comma-separated tokens of the runs a process belongs to
GUARDED = sys.platform.startswith("linux")    # /proc to find processes by; elsewhere no guard, no token scan


class FolderLocked(RuntimeError):
    """Another live process holds the results folder; the message names it."""


def process_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (/proc/PID/stat field 22); None when it is gone or a
    zombie. Together with the pid it names one process: a reused pid has another start time."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def children_of(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def descendants_of(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children_of(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def ancestors_of(pid: int) -> list[int]:
    out: list[int] = []
    while len(out) < 1024:
        parent = _parent_of(pid)
        if not parent:
            return out
        out.append(parent)
        pid = parent
    return out


def carriers_of(tokens: set[str]) -> list[int]:
    """Processes whose environment, as they were started, names one of the runs' `tokens`."""
    prefix = f"{TOKENS_ENV}=".encode()
    out = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            data = environ.read_bytes()
        except OSError:
            continue
        for var in data.split(b"\0"):
            if var.startswith(prefix):
                if tokens & set(var[len(prefix):].decode(errors="replace").split(",")):
                    out.append(int(environ.parent.name))
                break
    return out


def live_stats():
    """(pid, the fields of its /proc/PID/stat after the command: state, ppid, pgrp, session, …) of every live
    process, zombies left out; a process gone while read is skipped."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            yield int(stat.parent.name), fields


def sessions_of(sids: set[int]) -> list[tuple[int, int, int]]:
    """(pid, session id, start time) of every live process (zombies left out) in one of the sessions `sids`."""
    out = []
    for pid, fields in live_stats():
        if int(fields[3]) in sids:
            out.append((pid, int(fields[3]), int(fields[19])))
    return out


def command_of(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in args[:4] if a)[:160]


_HELD: "RunFolder | None" = None     # the run folder this process holds now, if any


def register_child(pid: int, what: str) -> None:
    """Register a process just started in the folder this process holds (none held: nothing to do)."""
    hold = _HELD
    if hold is not None:
        hold.register([pid], what)


class RunFolder:
    """The exclusive hold of one results folder by this process, its process registry and its guard."""

    def __init__(self, rdir: Path):
        self.rdir = rdir
        self._fd: int | None = None
        self.token: str | None = None
        self._tokens_before: str | None = None
        self._write_lock = threading.Lock()     # the spawner thread and the flow's thread both register
        self._guard: subprocess.Popen | None = None
        self._guard_pipe: int | None = None

    def acquire(self, guard: bool = True) -> "RunFolder":
        """Take the folder; then, before this process starts anything, the run's token into the registry and
        into this process's environment, and (on Linux, unless `guard` is False) the guard."""
        global _HELD
        self.rdir.mkdir(parents=True, exist_ok=True)
        path = self.rdir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_json_bytes(os.read(fd, 4096))
            os.close(fd)
            raise FolderLocked(
                f"{self.rdir} is in use by pid {holder.get('pid', '?')} on {holder.get('host', '?')} "
                f"(since {holder.get('since', '?')}); wait for that run to end or stop it, then retry") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": dt.datetime.now().isoformat(timespec="seconds")}).encode())
        self._fd = fd
        self.token = uuid.uuid4().hex
        with self._write_lock:
            self._write([*_read_entries(self.rdir), {"token": self.token, "owner": os.getpid(),
                                                     "owner_start": process_start_time(os.getpid())}])
        if guard and GUARDED:
            self._start_guard()
        self._tokens_before = os.environ.get(TOKENS_ENV)
        os.environ[TOKENS_ENV] = ",".join(t for t in (self._tokens_before, self.token) if t)
        _HELD = self
        return self

    def release(self) -> None:
        """Give the folder up: the run's token marked ended, the guard told to leave (it ends nothing)."""
        global _HELD
        if _HELD is self:
            _HELD = None
        self._stop_guard()
        if self.token is not None:
            if self._tokens_before is None:
                os.environ.pop(TOKENS_ENV, None)
            else:
                os.environ[TOKENS_ENV] = self._tokens_before
            try:      # at worst (a full disk) the run counts as going on until this process ends
                with self._write_lock:
                    self._write([{**e, "ended": True} if e.get("token") == self.token and "pid" not in e else e
                                 for e in _read_entries(self.rdir)])
            except OSError:
                pass
            self.token = None
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def register(self, pids: list[int], what: str) -> None:
        """Remember processes this run started (their pid and start time)."""
        with self._write_lock:
            entries = _read_entries(self.rdir)
            known = {(e.get("pid"), e.get("start")) for e in entries}
            for pid in pids:
                start = process_start_time(pid)
                if start is not None and (pid, start) not in known:
                    entries.append({"pid": pid, "start": start, "what": what, "owner": os.getpid(),
                                    "token": self.token})
            self._write(entries)

    def register_descendants(self, what: str) -> None:
        """Every process below this one now (Prefect's temporary server, engine processes, routers), less the
        guard."""
        guard = self._guard.pid if self._guard is not None else None
        self.register([p for p in descendants_of(os.getpid()) if p != guard], what)

    def _write(self, entries: list[dict]) -> None:
        tmp = self.rdir / f"{REGISTRY}.tmp"
        tmp.write_text(json.dumps(entries, indent=1))
        os.replace(tmp, self.rdir / REGISTRY)

    def _start_guard(self) -> None:
        """A process of its own session that reads a pipe only this process writes: end of file is this
        process's death, however it died (the kernel closes the pipe); then it ends the run's leftovers."""
        r, w = os.pipe()
        try:
            self._guard = subprocess.Popen(
                [sys.executable, "-P", "-m", "epdbench.tasks.proc.runguard", str(self.rdir.resolve()), str(os.getpid()),
                 str(process_start_time(os.getpid()))],
                stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._guard_pipe = w

    def _stop_guard(self) -> None:
        if self._guard_pipe is not None:
            try:
                os.write(self._guard_pipe, b"q")
            except OSError:
                pass
            os.close(self._guard_pipe)
            self._guard_pipe = None
        if self._guard is not None:
            try:
                self._guard.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._guard.kill()
                self._guard.wait(timeout=5)
            self._guard = None


def _read_json_bytes(data: bytes) -> dict:
    try:
        out = json.loads(data.decode() or "{}")
        return out if isinstance(out, dict) else {}
    except (ValueError, UnicodeDecodeError):
        return {}


def _read_entries(rdir: Path) -> list[dict]:
    path = rdir / REGISTRY
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text())
    except ValueError:
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def read_registry(rdir: Path) -> list[dict]:
    """The processes registered in the folder (pid, start, what, owner; token: the run that started them)."""
    return [e for e in _read_entries(rdir) if {"pid", "start"} <= e.keys()]


def _live_tokens(entries: list[dict]) -> set[str]:
    """Tokens of runs still going: not released, their holder still the very process that took them."""
    return {e["token"] for e in entries if "token" in e and "pid" not in e and not e.get("ended")
            and e.get("owner_start") is not None and process_start_time(e.get("owner", 0)) == e["owner_start"]}


def leftovers(rdir: Path) -> list[dict]:
    """What runs of the folder that are over left running — never a live run's processes, this process or its
    ancestors: registered processes still running as the very process that was registered (same start time),
    and any other process carrying such a run's token (started the instant before its run died, or by a child
    of the run, or by a library)."""
    mine = {os.getpid(), *ancestors_of(os.getpid())}
    entries = _read_entries(rdir)
    live = _live_tokens(entries)
    found = [e for e in entries if {"pid", "start"} <= e.keys() and e["pid"] not in mine
             and e.get("token") not in live and process_start_time(e["pid"]) == e["start"]]
    over = {e["token"] for e in entries if "token" in e and "pid" not in e} - live
    seen = mine | {e["pid"] for e in found}
    for pid in carriers_of(over) if over and GUARDED else []:
        start = process_start_time(pid)
        if pid not in seen and start is not None:
            seen.add(pid)
            found.append({"pid": pid, "start": start, "what": f"unregistered ({command_of(pid)})"})
    # The sessions the run's processes lead (each starts in a session of its own): what they started stays in them,
    # also once their leader is dead, and a process may hide the run's token (vLLM's engine core and workers rename
    # themselves with setproctitle, which writes over their environment in /proc). A session keeps its leader's pid
    # while any member lives, so no other process can have taken that pid meanwhile; a member older than the leader
    # registered, or a leader's pid that is another process now, is not the run's.
    leaders = {e["pid"]: e for e in entries if {"pid", "start"} <= e.keys() and e["pid"] not in mine
               and e.get("token") not in live}
    for pid, sid, start in sessions_of(set(leaders)) if leaders and GUARDED else []:
        leader = leaders[sid]
        if pid not in seen and start >= leader["start"] and process_start_time(sid) in (None, leader["start"]):
            seen.add(pid)
            found.append({"pid": pid, "start": start, "what": f"{leader['what']}'s {command_of(pid)}"})
    return found


RESOURCE_TRACKER = b"multiprocessing.resource_tracker"   # in the command line of Python's resource tracker
TRACKER_GRACE_S = 3.0     # a resource tracker's own exit once its last client died: it unlinks what they leaked


def is_resource_tracker(pid: int) -> bool:
    """Python's multiprocessing resource tracker (vLLM's engines start one each): it ignores SIGTERM and SIGINT and
    leaves when its last client has died, unlinking the shared memory they left (vLLM's message queues: hundreds of
    MiB each in /dev/shm). SIGKILLed with them, it leaves those segments in memory for good."""
    try:
        return RESOURCE_TRACKER in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def end_leftovers(rdir: Path, grace_s: float = STOP_GRACE_S) -> list[dict]:
    """SIGTERM what a killed run left running, SIGKILL what remains after `grace_s` — resource trackers last, once
    their clients are gone and they have had TRACKER_GRACE_S to leave by themselves; returns what was found."""
    found = leftovers(rdir)

    def alive(entries: list[dict]) -> list[dict]:
        return [e for e in entries if process_start_time(e["pid"]) == e["start"]]

    def signal_and_wait(entries: list[dict], sig: int | None, wait_s: float) -> list[dict]:
        for e in alive(entries) if sig is not None else []:
            try:
                os.kill(e["pid"], sig)
            except ProcessLookupError:
                pass
        left, deadline = alive(entries), time.monotonic() + wait_s
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = alive(left)
        return left

    left = signal_and_wait(found, signal.SIGTERM, grace_s)
    trackers = [e for e in left if is_resource_tracker(e["pid"])]
    signal_and_wait([e for e in left if e not in trackers], signal.SIGKILL, grace_s)
    if signal_and_wait(trackers, None, TRACKER_GRACE_S):     # still there once their clients are gone
        signal_and_wait(trackers, signal.SIGKILL, grace_s)
    return found
