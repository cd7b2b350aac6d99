"""Server-sent events of a (chat) completions stream, parsed (pure; no I/O): the body as it arrives, in
buffers of any size, split into lines and `data:` events; one clock read per received buffer stamps every
event completed in it; each content chunk's offset from the send, tokens (from running usage), modelled
emission stamp (simulator) and the request's first error. tasks.load.loadgen feeds it from the HTTP response."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from epdbench.analysis.logformats import MODELLED_FIELD

try:                     # a C JSON parser where installed (5–10× json's speed on chunk-sized events)
    from orjson import loads
except ImportError:      # pragma: no cover - orjson is a dependency; json is the fallback
    from json import loads

Clock = Callable[[], int]


@dataclass
class StreamTiming:
    """What one streamed response yielded, times in ns relative to send."""
    chunk_offsets_ns: list[int] = field(default_factory=list)   # content-bearing chunks only
    chunk_tokens: list[int] = field(default_factory=list)
    done_ns: int | None = None                                   # [DONE] or end of stream
    usage: dict | None = None
    saw_done: bool = False
    error: str | None = None
    chunk_modelled_ns: list[int] = field(default_factory=list)   # modelled emission of each content chunk
    modelled_missing: bool = False                               # a content chunk came without one


class MalformedEvent(ValueError):
    """One SSE event whose shape is not that of a (chat) completions chunk."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def content_of(event: dict) -> str:
    """Generated text carried by one completions or chat-completions chunk ('' if none).
    Raises MalformedEvent when the event does not have a chunk's shape."""
    if not isinstance(event, dict):
        raise MalformedEvent("not a JSON object")
    choices = event.get("choices")
    if choices is None:
        return ""
    if not isinstance(choices, list):
        raise MalformedEvent("choices is not a list")
    if not choices:
        return ""
    c = choices[0]
    if not isinstance(c, dict):
        raise MalformedEvent("choices[0] is not an object")
    if "text" in c:
        text = c["text"]
        where = "choices[0].text"
    else:
        delta = c.get("delta")
        if delta is None:
            return ""
        if not isinstance(delta, dict):
            raise MalformedEvent("choices[0].delta is not an object")
        text = delta.get("content")
        where = "choices[0].delta.content"
    if text is None:
        return ""
    if not isinstance(text, str):
        raise MalformedEvent(f"{where} is not a string")
    return text


def _usage_of(event: dict) -> dict | None:
    """The event's usage block (None if absent); MalformedEvent if any field used later is ill-typed."""
    usage = event.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise MalformedEvent("usage is not an object")
    for k in ("prompt_tokens", "completion_tokens"):
        if usage.get(k) is not None and not _is_int(usage[k]):
            raise MalformedEvent(f"usage.{k} is not an integer")
    details = usage.get("prompt_tokens_details")
    if details is not None:
        if not isinstance(details, dict):
            raise MalformedEvent("usage.prompt_tokens_details is not an object")
        if details.get("cached_tokens") is not None and not _is_int(details["cached_tokens"]):
            raise MalformedEvent("usage.prompt_tokens_details.cached_tokens is not an integer")
    return usage


def _server_error(err) -> str:
    """A short text for an in-stream {"error": ...} event, whatever the type of its payload."""
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        text = err["message"]
    elif isinstance(err, str):
        text = err
    else:
        try:
            text = json.dumps(err)
        except (TypeError, ValueError):
            text = repr(err)
    return f"server error event: {text}"[:300]


def _fail(t: StreamTiming, error: str) -> None:
    """Record the request's first error (the root cause); later ones do not overwrite it."""
    if t.error is None:
        t.error = error[:300]


class _Progress:
    """Running state of one stream's events: completion tokens counted so far."""
    __slots__ = ("completion",)

    def __init__(self) -> None:
        self.completion = 0


def _event(data: bytes, now: int, send_ns: int, t: StreamTiming, progress: _Progress,
           modelled_scale: float | None) -> None:
    """One `data:` payload (not [DONE]) stamped `now`: its content chunk, usage and modelled stamp, or
    its error (MalformedEvent, server error event) on `t`."""
    try:
        try:
            event = loads(data)
        except UnicodeDecodeError:
            raise MalformedEvent("invalid UTF-8") from None
        except (ValueError, RecursionError):
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedEvent("invalid UTF-8") from None
            raise MalformedEvent("not JSON") from None
        if type(event) is not dict:
            raise MalformedEvent("not a JSON object")
        if "error" in event:
            _fail(t, _server_error(event["error"]))
            return
        # Fast paths for well-formed chunks (the checks of _usage_of / content_of, inlined); anything
        # unusual goes through those, which name what is wrong.
        usage = event.get("usage")
        if usage is not None and (type(usage) is not dict or "prompt_tokens_details" in usage
                                  or type(usage.get("completion_tokens", 0)) is not int
                                  or type(usage.get("prompt_tokens", 0)) is not int):
            usage = _usage_of(event)
        choices = event.get("choices")
        first = choices[0] if type(choices) is list and choices else None
        content = first.get("text") if type(first) is dict else None
        if type(content) is not str:
            content = content_of(event)
    except MalformedEvent as e:
        _fail(t, f"malformed SSE event: {e}: {data[:80]!r}")
        return
    except Exception as e:  # a bug in parsing one event: fail the request, never the stream reader
        _fail(t, f"malformed SSE event: {type(e).__name__}: {e}: {data[:80]!r}")
        return
    if usage:
        t.usage = usage
    if not content:
        return
    t.chunk_offsets_ns.append(now - send_ns)
    if modelled_scale is not None:
        stamp = event.get(MODELLED_FIELD)
        if _is_int(stamp):
            t.chunk_modelled_ns.append(int(stamp / modelled_scale) - send_ns)
        else:
            t.modelled_missing = True
    completion = (usage or {}).get("completion_tokens")
    if completion is not None and completion > progress.completion:
        t.chunk_tokens.append(completion - progress.completion)
        progress.completion = completion
    else:
        t.chunk_tokens.append(1)
        progress.completion += 1


async def consume_stream(buffers: AsyncIterator[bytes], send_ns: int, clock: Clock,
                         t: StreamTiming | None = None, modelled_scale: float | None = None) -> StreamTiming:
    """Read an SSE body as it arrives, in buffers of any size (`resp.content.iter_any()`); the clock is read
    once per received buffer and stamps every event completed in it. Fills `t` as it goes, so a stream cut
    by an exception leaves its partial timings behind.

    Lines are split on LF (a CR before it is dropped); a line that is not `data:` (comments, `event:`,
    blank) is skipped; a line cut by the end of a buffer waits for the next one. A malformed event (bad
    UTF-8, not JSON, not an object, ill-shaped choices/usage) or a server error event sets `t.error` and
    contributes nothing itself; chunks before it are kept and the stream is read on to [DONE] or its end
    (so done_ns is still the stream's end). Exceptions raised by `buffers` itself (connection errors,
    timeouts, cancellation) propagate to the caller. With `modelled_scale` (the clock is CLOCK_MONOTONIC ns
    divided by it), each content chunk's modelled emission stamp is kept as an offset from the send on the
    same clock."""
    t = t if t is not None else StreamTiming()
    progress = _Progress()
    tail = b""
    ended = False
    async for buf in buffers:
        now = clock()
        if not isinstance(buf, (bytes, bytearray)):
            _fail(t, f"malformed SSE event: TypeError: read a {type(buf).__name__}, not bytes")
            continue
        lines = (tail + buf if tail else buf).split(b"\n")
        tail = lines.pop()
        if _lines(lines, now, send_ns, t, progress, modelled_scale):
            ended = True
            break
    if not ended and tail:                      # a last line without its newline
        _lines([tail], clock(), send_ns, t, progress, modelled_scale)
    if t.done_ns is None:
        t.done_ns = clock() - send_ns
    return t


def _lines(lines: list[bytes], now: int, send_ns: int, t: StreamTiming, progress: _Progress,
           modelled_scale: float | None) -> bool:
    """The complete lines of one buffer; True once [DONE] is read (t.done_ns set)."""
    for line in lines:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            t.saw_done = True
            t.done_ns = now - send_ns
            return True
        _event(data, now, send_ns, t, progress, modelled_scale)
    return False


def ttft_e2e_ns(offs: list[int]) -> tuple[int | None, int | None]:
    """TTFT and E2E (last content chunk) in ns from a stream's chunk offsets (StreamTiming.chunk_offsets_ns, or
    the modelled ones that replace them); None for a stream without content."""
    return (offs[0], offs[-1]) if offs else (None, None)


def derive_timing(offs: list[int]) -> dict:
    """ttft_e2e_ns and the ITLs in ns; latency − TTFT == Σ ITL exactly."""
    ttft, e2e = ttft_e2e_ns(offs)
    return {"ttft_ns": ttft, "e2e_ns": e2e, "itl_ns": [b - a for a, b in zip(offs, offs[1:])]}
