"""Anchored parsers of the log lines epdbench reads as evidence (pure).

A line counts only when it parses whole in its producer's own format: Mooncake's glog lines
(`I1018 00:45:47.961021 1844453 transfer_engine_impl.cpp:212] message`), vLLM's lines
(`INFO 10-18 00:46:10 [metrics.py:103] message`) and uvicorn's access lines, each behind any number
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
# by it on the simulator and checks it against their arrival (tasks/loadgen.py).
MODELLED_FIELD = "epdbench_modelled_ns"
_PREFIXES = re.compile(r"^((?:\([A-Za-z_][\w.-]* pid=\d+\) )*)")
_ONE_PREFIX = re.compile(r"\(([A-Za-z_][\w.-]*) pid=(\d+)\) ")
GLOG = re.compile(r"^([IWEF])(\d{4}) (\d\d:\d\d:\d\d\.\d{6})\s+(\d+) ([\w.+-]+\.(?:cpp|cc|h)):(\d+)\] (.*)$")
VLLM = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d) \[([\w.-]+\.py):(\d+)\] (.*)$")
ACCESS = re.compile(r'^INFO:\s+(\S+) - "(GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS) (\S+) HTTP/[\d.]+" (\d{3})(?: .*)?$')


@dataclass(frozen=True)
class LogLine:
    """One parsed line: `kind` is glog, vllm or access; `worker` names the emitter within the pod."""
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
    prefixes = _PREFIXES.match(line).group(1)
    body = line[len(prefixes):]
    if m := GLOG.match(body):
        thread = int(m.group(4))
        message, emulated = _unmark(m.group(7))
        return LogLine("glog", m.group(1), m.group(5), message, _worker(prefixes, thread), emulated, thread)
    if m := VLLM.match(body):
        message, emulated = _unmark(m.group(5))
        return LogLine("vllm", m.group(1), m.group(3), message, _worker(prefixes, None), emulated)
    if m := ACCESS.match(body):
        return LogLine("access", "INFO", "", "", _worker(prefixes, None), method=m.group(2), path=m.group(3),
                       status=int(m.group(4)))
    return None
