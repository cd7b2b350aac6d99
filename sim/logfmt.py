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


def sampling_params(body: dict, max_tokens: int, kv_transfer_params: dict | None = None) -> str:
    """SamplingParams as vLLM 0.33 logs it in its `Received request` line (sampling_params.py __repr__): the
    request's sampling fields, its max_tokens as the server set them, and its kv_transfer_params in extra_args."""
    def num(name: str, default: float) -> float:
        value = body.get(name)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
    extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
    return (f"SamplingParams(n=1, presence_penalty={num('presence_penalty', 0.0)}, "
            f"frequency_penalty={num('frequency_penalty', 0.0)}, repetition_penalty=1.0, "
            f"temperature={num('temperature', 1.0)}, watermarking=None, top_p={num('top_p', 1.0)}, top_k=0, "
            f"min_p=0.0, seed={body.get('seed')}, stop=[], stop_token_ids=[], bad_words=[], "
            f"thinking_token_budget=None, include_stop_str_in_output=False, "
            f"ignore_eos={body.get('ignore_eos') is True}, max_tokens={max_tokens}, min_tokens=0, logprobs=None, "
            f"prompt_logprobs=None, skip_special_tokens=True, "
            f"spaces_between_special_tokens=True, structured_outputs=None, extra_args={extra})")
