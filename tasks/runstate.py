"""Who owns a results folder, and what it started: an exclusive lock with the holder's pid and host, and a
registry of every process a run started (pid and start time), so a later resume, `cleanup --run` or
`down` ends what a killed run left — by recorded pid and start time, never by name.

The lock is a kernel lock (flock) on `.lock`: a holder that dies, even by SIGKILL, releases it, so a
stale lock is taken over without any guess about whether its owner still lives.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import signal
import socket
import time
from pathlib import Path

LOCK_FILE = ".lock"
REGISTRY = "processes.json"
STOP_GRACE_S = 5.0


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


class RunFolder:
    """The exclusive hold of one results folder by this process, and its process registry."""

    def __init__(self, rdir: Path):
        self.rdir = rdir
        self._fd: int | None = None

    def acquire(self) -> "RunFolder":
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
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def register(self, pids: list[int], what: str) -> None:
        """Remember processes this run started (their pid and start time)."""
        entries = read_registry(self.rdir)
        known = {(e["pid"], e["start"]) for e in entries}
        for pid in pids:
            start = process_start_time(pid)
            if start is not None and (pid, start) not in known:
                entries.append({"pid": pid, "start": start, "what": what, "owner": os.getpid()})
        tmp = self.rdir / f"{REGISTRY}.tmp"
        tmp.write_text(json.dumps(entries, indent=1))
        os.replace(tmp, self.rdir / REGISTRY)

    def register_descendants(self, what: str) -> None:
        """Every process below this one now (Prefect's temporary server, engine processes, routers)."""
        self.register(descendants_of(os.getpid()), what)


def _read_json_bytes(data: bytes) -> dict:
    try:
        out = json.loads(data.decode() or "{}")
        return out if isinstance(out, dict) else {}
    except (ValueError, UnicodeDecodeError):
        return {}


def read_registry(rdir: Path) -> list[dict]:
    path = rdir / REGISTRY
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text())
    except ValueError:
        return []
    return [e for e in entries if isinstance(e, dict) and {"pid", "start"} <= e.keys()] \
        if isinstance(entries, list) else []


def leftovers(rdir: Path) -> list[dict]:
    """Registered processes still running as the very process that was registered (same start time),
    other than this process and its ancestors."""
    mine = {os.getpid(), os.getppid()}
    return [e for e in read_registry(rdir)
            if e["pid"] not in mine and process_start_time(e["pid"]) == e["start"]]


def end_leftovers(rdir: Path, grace_s: float = STOP_GRACE_S) -> list[dict]:
    """SIGTERM what a killed run left running, SIGKILL what remains after `grace_s`; returns what was found."""
    found = leftovers(rdir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [e for e in found if process_start_time(e["pid"]) == e["start"]]
        for e in alive:
            try:
                os.kill(e["pid"], sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [e for e in alive if process_start_time(e["pid"]) == e["start"]]
        if not alive:
            break
    return found
