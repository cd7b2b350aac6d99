"""Streaming load generator: one aiohttp session, closed-loop workers, warm-up then measured.

The clock is injected (perf_counter_ns by default) and read once per SSE event; each request
keeps its raw chunk offsets and tokens per chunk, server usage and any error, so every metric is
derived later from records.

On the simulator each chunk also carries when its token was emitted on the modelled timeline (CLOCK_MONOTONIC
ns, analysis.logformats.MODELLED_FIELD). When every content chunk of a response has one, lying after the send
and no later than the chunk's arrival, the request is timed by them (`timing` "modelled": host load between
the engine and this process cannot bend its token times) and the arrivals are kept beside them
(`chunk_arrival_ns`), so the delivery lag of every token is on record; otherwise it is timed by arrival.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator, Callable

import aiohttp

from epdbench.analysis.logformats import MODELLED_FIELD

try:                     # a C JSON parser where installed (5–10× json's speed on chunk-sized events)
    from orjson import loads
except ImportError:      # pragma: no cover - orjson is a dependency; json is the fallback
    from json import loads
from epdbench.specs.workload import RequestSpec

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


def derive_timing(t: StreamTiming) -> dict:
    """TTFT, E2E (last content chunk) and ITLs in ns; latency − TTFT == Σ ITL exactly."""
    offs = t.chunk_offsets_ns
    if not offs:
        return {"ttft_ns": None, "e2e_ns": None, "itl_ns": []}
    return {"ttft_ns": offs[0], "e2e_ns": offs[-1], "itl_ns": [b - a for a, b in zip(offs, offs[1:])]}


@dataclass
class Record:
    request_id: str
    index: int
    phase: str
    api: str
    target_prompt_tokens: int
    max_tokens: int
    prompt_hash: str
    image_px: int | None
    image_hash: str | None
    scheduled_ns: int
    send_ns: int
    send_wall_s: float
    status: int | None = None
    ok: bool = False
    error: str | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    done_ms: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    chunk_offsets_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    timing: str = "arrival"              # what chunk_offsets_ns are: "arrival" or "modelled" (simulator stamps)
    chunk_arrival_ns: list[int] = field(default_factory=list)   # with modelled timing: when each chunk arrived


def modelled_offsets(t: StreamTiming) -> list[int] | None:
    """The chunks' modelled offsets when they can time the request: one per content chunk, after the send,
    in order, and none later than its chunk's arrival (1 µs of rounding); else None."""
    m, a = t.chunk_modelled_ns, t.chunk_offsets_ns
    if t.modelled_missing or not m or len(m) != len(a):
        return None
    if m[0] <= 0 or any(y < x for x, y in zip(m, m[1:])) or any(x > arr + 1000 for x, arr in zip(m, a)):
        return None
    return [min(x, arr) for x, arr in zip(m, a)]


def _int_or_none(v) -> int | None:
    return v if _is_int(v) else None


def _fill(rec: Record, t: StreamTiming) -> None:
    modelled = modelled_offsets(t)
    if modelled is not None:
        rec.timing, rec.chunk_arrival_ns = "modelled", t.chunk_offsets_ns
        t = StreamTiming(**{**t.__dict__, "chunk_offsets_ns": modelled})
    timing = derive_timing(t)
    rec.chunk_offsets_ns, rec.chunk_tokens = t.chunk_offsets_ns, t.chunk_tokens
    rec.ttft_ms = timing["ttft_ns"] / 1e6 if timing["ttft_ns"] is not None else None
    rec.e2e_ms = timing["e2e_ns"] / 1e6 if timing["e2e_ns"] is not None else None
    rec.done_ms = t.done_ns / 1e6 if t.done_ns is not None else None
    if isinstance(t.usage, dict):  # consume_stream only keeps well-typed usage; re-checked here anyway
        details = t.usage.get("prompt_tokens_details")
        rec.prompt_tokens = _int_or_none(t.usage.get("prompt_tokens"))
        rec.output_tokens = _int_or_none(t.usage.get("completion_tokens"))
        rec.cached_tokens = _int_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None
    if t.error:
        rec.error = t.error
    elif not t.saw_done:
        rec.error = "stream ended without [DONE]"
    elif not t.chunk_offsets_ns:
        rec.error = "no generated content in stream"
    rec.ok = rec.error is None


class LoadGenerator:
    def __init__(self, base_url: str, model: str, timeout_s: float, clock: Clock = time.perf_counter_ns,
                 run_tag: str = "", time_scale: float = 1.0):
        """`time_scale` > 1 (a dilated simulator): every stamp is taken on a clock running that many times
        slower, so records hold modelled durations; arrival offsets and the timeout stretch by it."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.time_scale = time_scale
        self.timeout_s = timeout_s * time_scale
        self.clock = clock if time_scale == 1 else (lambda: int(clock() / time_scale))
        # the simulator's modelled stamps are CLOCK_MONOTONIC ns: usable only on that clock
        self.modelled_scale = time_scale if clock is time.perf_counter_ns else None
        self.run_tag = run_tag or uuid.uuid4().hex[:8]
        self.on_record_errors = 0   # exceptions raised by on_record callbacks (logged once, then counted)

    async def send(self, session: aiohttp.ClientSession, req: RequestSpec, scheduled_ns: int) -> Record:
        """One streamed request. Never raises except asyncio.CancelledError: every failure (HTTP error,
        timeout, connection error, malformed stream, any other exception) ends up in the Record
        (ok=False, error) with the partial timings gathered before it."""
        rid = f"epd-{self.run_tag}-{req.phase[0]}{req.index}-{uuid.uuid4().hex[:6]}"
        send_ns = self.clock()
        rec = Record(rid, req.index, req.phase, req.api, req.target_prompt_tokens, req.max_tokens,
                     req.prompt_hash, req.image_px, req.image_hash, scheduled_ns, send_ns, time.time())
        timing = StreamTiming()
        try:
            path = "/v1/completions" if req.api == "completions" else "/v1/chat/completions"
            body = {**req.payload, "model": self.model, "stream": True, "request_id": rid,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            async with session.post(self.base_url + path, json=body, headers={"X-Request-Id": rid},
                                    timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                rec.status = resp.status
                if resp.status != 200:
                    _fail(timing, f"HTTP {resp.status}")
                    text = await resp.text(errors="replace")
                    timing.error = f"HTTP {resp.status}: {text[:300]}"
                    timing.done_ns = self.clock() - send_ns
                else:
                    await consume_stream(resp.content.iter_any(), send_ns, self.clock, timing, self.modelled_scale)
        except asyncio.TimeoutError:
            _fail(timing, f"timeout after {self.timeout_s:g}s")
        except aiohttp.ClientError as e:
            _fail(timing, f"{type(e).__name__}: {e}")
        except Exception as e:  # a bug or an unforeseen failure: this request's error, never the worker's
            _fail(timing, f"unexpected {type(e).__name__}: {e}")
        try:
            _fill(rec, timing)
        except Exception as e:
            rec.ok, rec.error = False, f"unexpected {type(e).__name__} in recording: {e}"[:300]
        if rec.done_ms is None:
            rec.done_ms = (self.clock() - send_ns) / 1e6
        return rec

    def _broken_record(self, req: RequestSpec, scheduled_ns: int, e: Exception) -> Record:
        """A failed Record for a request that could not even be sent (e.g. an ill-formed RequestSpec)."""
        g = lambda name, default=None: getattr(req, name, default)  # noqa: E731
        rid = f"epd-{self.run_tag}-x{g('index')}-{uuid.uuid4().hex[:6]}"
        return Record(rid, g("index", -1), g("phase", ""), g("api", ""), g("target_prompt_tokens", 0),
                      g("max_tokens", 0), g("prompt_hash", ""), g("image_px"), g("image_hash"), scheduled_ns,
                      scheduled_ns, time.time(), ok=False, error=f"unexpected {type(e).__name__}: {e}"[:300])

    def _notify(self, on_record: Callable[[Record], None] | None, rec: Record) -> None:
        """Call the on_record callback; its own failure is logged to stderr once and never loses a record."""
        if on_record is None:
            return
        try:
            on_record(rec)
        except Exception:
            self.on_record_errors += 1
            if self.on_record_errors == 1:
                print(f"epdbench loadgen: on_record callback failed (request {rec.request_id}); records are "
                      f"kept, further callback errors are not shown:\n{traceback.format_exc()}",
                      file=sys.stderr, end="", flush=True)

    async def run_phase(self, session, requests: list[RequestSpec], concurrency: int,
                        on_record: Callable[[Record], None] | None = None) -> list[Record]:
        """`concurrency` workers, each sends its next request as soon as the last ends (closed loop), or
        not before the request's scheduled offset (bursts); scheduled vs actual send time is recorded.
        Every finished request is returned and passed to `on_record` as soon as it finishes."""
        queue: asyncio.Queue[RequestSpec] = asyncio.Queue()
        # scheduled ones first, in order of their slots (a closed loop's first wave), then the rest by index
        for r in sorted(requests, key=lambda r: (r.offset_s if r.offset_s is not None else float("inf"), r.index)):
            queue.put_nowait(r)
        records: list[Record] = []
        start_ns = self.clock()

        async def worker():
            while True:
                try:
                    req = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                scheduled_ns = start_ns
                try:
                    scheduled_ns = self.clock()
                    if req.offset_s is not None:  # a scheduled arrival: wait for the request's slot
                        scheduled_ns = start_ns + int(req.offset_s * 1e9)
                        delay_s = (scheduled_ns - self.clock()) / 1e9
                        if delay_s > 0:
                            await asyncio.sleep(delay_s * self.time_scale)
                    rec = await self.send(session, req, scheduled_ns)
                except Exception as e:  # send() records its own failures; this is the last resort
                    rec = self._broken_record(req, scheduled_ns, e)
                records.append(rec)
                self._notify(on_record, rec)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)) or 1)))
        return sorted(records, key=lambda r: r.index)

    async def __aenter__(self) -> "LoadGenerator":
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()

    async def run_streams(self, streams: list[tuple[list[RequestSpec], int]],
                          on_record: Callable[[Record], None] | None = None) -> list[list[Record]]:
        """Several streams at once (a mixed suite): warm-ups of every stream first, then all measured
        phases together in one window."""
        warm: list[list[Record]] = []
        for requests, conc in streams:
            phase = [r for r in requests if r.phase == "warmup"]
            warm.append(await self.run_phase(self.session, phase, conc, on_record) if phase else [])
        measured = await asyncio.gather(*(
            self.run_phase(self.session, [r for r in requests if r.phase == "measured"], conc, on_record)
            for requests, conc in streams))
        return [w + m for w, m in zip(warm, measured)]

    async def run_cell(self, requests: list[RequestSpec], concurrency: int,
                       on_record: Callable[[Record], None] | None = None) -> list[Record]:
        """Warm-up requests first (all finished), then the measured ones, on the shared session."""
        warm = [r for r in requests if r.phase == "warmup"]
        measured = [r for r in requests if r.phase == "measured"]
        out = await self.run_phase(self.session, warm, concurrency, on_record) if warm else []
        out += await self.run_phase(self.session, measured, concurrency, on_record)
        return out


def records_as_dicts(records: list[Record]) -> list[dict]:
    return [asdict(r) for r in records]
