"""Log lines in the real formats (vLLM, uvicorn access, Mooncake glog, UCX, NIXL). Pure string builders.

Every transport line the simulator writes carries EMULATED_MARK, so no reader (human or the
verifier) can take it for real hardware.
"""
from __future__ import annotations

import datetime as dt
import time

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


def ucx_line(level: str, pid: int, file: str, line: int, msg: str, host: str = "sim", indent: int = 0,
             now: float | None = None) -> str:
    """UCX's default log format (ucs/debug/log.c: `[%lu.%06lu] [%s:%-5d:%s] %17s:%-4u %-4s %-5s %*s%s`)."""
    t = time.time() if now is None else now
    return (f"[{int(t)}.{int(t % 1 * 1e6):06d}] [{host}:{pid:<5d}:0] {file:>17}:{line:<4d} UCX  {level:<5} "
            f"{' ' * (2 * indent)}{msg} {EMULATED_MARK}")


def nixl_py_line(level: str, file: str, line: int, msg: str, now: dt.datetime | None = None) -> str:
    """NIXL's Python logger (nixl/logging.py): `%(asctime)s NIXL %(levelname)-7s %(filename)s:%(lineno)d`."""
    now = now or dt.datetime.now()
    return f"{now:%Y-%m-%d %H:%M:%S} NIXL {level:<7} {file}:{line} {msg} {EMULATED_MARK}"
