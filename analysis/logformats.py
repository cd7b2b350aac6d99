"""Anchored parsers of the log lines epdbench reads as evidence (pure).

A line counts only when it parses whole in its producer's own format: Mooncake's glog lines
(`I1018 00:45:47.961021 1844453 transfer_engine_impl.cpp:212] message`), vLLM's lines
(`INFO 10-18 00:46:10 [metrics.py:103] message`), UCX's lines (`[1796163051.165021] [vm:7700 :0]
ucp_worker.c:1997 UCX  INFO  message`, ucs/debug/log.c) and uvicorn's access lines, each behind any number
of vLLM process prefixes (`(EngineCore_DP0 pid=714) (Worker_TP0 pid=801) `). A message is then matched
from its first character against the producer's message for that source file, so a phrase inside a
logged prompt or any other line is never evidence. The emitter's identity is kept: the TP worker
from its prefix, else the glog thread id.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

EMULATED_MARK = "[emulated by epdbench sim: no GPU, no NIC]"
# The one field the simulator adds to a vLLM stream chunk: the CLOCK_MONOTONIC time (ns) at which the step that
# emitted the token was modelled to end. Clients ignore unknown fields; epdbench's load generator times tokens
# by it on the simulator and checks it against their arrival (tasks/load/loadgen.py).
MODELLED_FIELD = "epdbench_modelled_ns"
_PREFIXES = re.compile(r"^((?:\([A-Za-z_][\w.-]* pid=\d+\) )*)")
_ONE_PREFIX = re.compile(r"\(([A-Za-z_][\w.-]*) pid=(\d+)\) ")
# A worker named by its vLLM prefix (`Worker_TP1 pid=802`): its pid is the glog thread / UCX process id of its lines.
WORKER_PID = re.compile(r"^\S*Worker\S* pid=(\d+)$")
GLOG = re.compile(r"^([IWEF])(\d{4}) (\d\d:\d\d:\d\d\.\d{6})\s+(\d+) ([\w.+-]+\.(?:cpp|cc|h)):(\d+)\] (.*)$")
# vLLM's [file:line] is the file's name, or a shortened relative path under VLLM_LOGGING_LEVEL=DEBUG
# (`distributed/.../v1/metrics.py`): the name is kept (vllm/logging_utils/formatter.py).
VLLM = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d) "
                  r"\[(?:[\w.-]+/)*([\w.-]+\.py):(\d+)\] (.*)$")
# NIXL's Python logger (nixl/logging.py, 0.5.1 on): `2026-12-01 22:12:50 NIXL INFO    _api.py:405 message`.
NIXL_PY = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) NIXL (DEBUG|INFO|WARNING|ERROR|CRITICAL) +"
                     r"([\w.-]+\.py):(\d+) (.*)$")
# vLLM up to 0.30 colours its process prefix (always in 0.11); colours never change what a line says.
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# UCX's default log handler: [seconds.micros] [host:pid:thread index] file:line UCX  LEVEL message
# (the thread field is UCX's own name of the thread: a counter, or `a` for its async thread)
UCX = re.compile(r"^\[(\d+\.\d+)\] \[([^:\]\s]+):(\d+)\s*:(\w+)\]\s+([\w.+-]+\.(?:c|cc|cpp|h)):(\d+) UCX\s+"
                 r"(TRACE|DEBUG|DIAG|INFO|PRINT|WARN|ERROR|FATAL)\s+(.*)$")
ACCESS = re.compile(r'^INFO:\s+(\S+) - "(GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS) (\S+) HTTP/[\d.]+" (\d{3})(?: .*)?$')


@dataclass(frozen=True)
class LogLine:
    """One parsed line: `kind` is glog, vllm, ucx, nixl (NIXL's Python logger) or access; `worker` names the emitter within the pod."""
    kind: str
    severity: str
    file: str
    message: str
    worker: str
    emulated: bool = False
    thread: int | None = None
    method: str = ""
    path: str = ""
    status: int = 0


def _worker(prefixes: str, thread: int | None) -> str:
    """The TP worker of a line: its Worker_* prefix (e.g. `Worker_TP1 pid=802`), else `thread N` from
    glog, else the innermost process prefix (`EngineCore_DP0 pid=714`), else `pod`."""
    found = _ONE_PREFIX.findall(prefixes)
    workers = [f"{name} pid={pid}" for name, pid in found if "Worker" in name]
    if workers:
        return workers[-1]
    if thread is not None:
        return f"thread {thread}"
    return f"{found[-1][0]} pid={found[-1][1]}" if found else "pod"


def _unmark(message: str) -> tuple[str, bool]:
    if message.endswith(EMULATED_MARK):
        return message[:-len(EMULATED_MARK)].rstrip(), True
    return message, False


def parse_line(raw: str) -> LogLine | None:
    """The line in one of the known formats, or None (a line of any other shape is never evidence)."""
    line = raw.rstrip("\r\n")
    if "\x1b" in line:
        line = ANSI.sub("", line)
    prefixes = _PREFIXES.match(line).group(1)
    body = line[len(prefixes):]
    if m := GLOG.match(body):
        thread = int(m.group(4))
        message, emulated = _unmark(m.group(7))
        return LogLine("glog", m.group(1), m.group(5), message, _worker(prefixes, thread), emulated, thread)
    if m := VLLM.match(body):
        message, emulated = _unmark(m.group(5))
        return LogLine("vllm", m.group(1), m.group(3), message, _worker(prefixes, None), emulated)
    if m := NIXL_PY.match(body):
        message, emulated = _unmark(m.group(5))
        return LogLine("nixl", m.group(2), m.group(3), message, _worker(prefixes, None), emulated)
    if m := UCX.match(body):
        # UCX writes from C, under no vLLM prefix: the process id names the worker (as glog's thread id does).
        message, emulated = _unmark(m.group(8).strip())
        pid = int(m.group(3))
        return LogLine("ucx", m.group(7), m.group(5), message, _worker(prefixes, pid), emulated, pid)
    if m := ACCESS.match(body):
        return LogLine("access", "INFO", "", "", _worker(prefixes, None), method=m.group(2), path=m.group(3),
                       status=int(m.group(4)))
    return None
