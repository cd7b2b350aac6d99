"""Log lines in the real formats (vLLM, uvicorn access, Mooncake glog). Pure string builders.

Every transport line the simulator writes carries EMULATED_MARK, so no reader (human or the
verifier) can take it for real hardware.
"""
from __future__ import annotations

import datetime as dt

from epdbench.analysis.logformats import EMULATED_MARK  # noqa: F401 - the one mark, shared with the verifier


def vllm_line(process: str, pid: int, level: str, file: str, line: int, msg: str,
              now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now()
    return f"({process} pid={pid}) {level} {now:%m-%d %H:%M:%S} [{file}:{line}] {msg}"


def access_line(pid: int, peer: str, method: str, path: str, status: int, reason: str) -> str:
    return f'(APIServer pid={pid}) INFO:     {peer} - "{method} {path} HTTP/1.1" {status} {reason}'


def glog_line(severity: str, tid: int, file: str, line: int, msg: str, now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now()
    return f"{severity}{now:%m%d %H:%M:%S.%f} {tid:>7} {file}:{line}] {msg} {EMULATED_MARK}"
