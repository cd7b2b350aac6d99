"""Streaming load generator: one aiohttp session, closed-loop workers, warm-up then measured.

The clock is injected (perf_counter_ns by default) and read once per SSE event; each request
keeps its raw chunk offsets and tokens per chunk, server usage and any error, so every metric is
derived later from records.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator, Callable

import aiohttp

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


def content_of(event: dict) -> str:
    """Generated text carried by one completions or chat-completions chunk ('' if none)."""
    choices = event.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if "text" in c:
        return c.get("text") or ""
    return (c.get("delta") or {}).get("content") or ""


async def consume_stream(lines: AsyncIterator[bytes], send_ns: int, clock: Clock,
                         t: StreamTiming | None = None) -> StreamTiming:
    """Read SSE lines; stamp the clock once per event. Fills `t` as it goes, so a stream cut by an
    exception leaves its partial timings behind."""
    t = t if t is not None else StreamTiming()
    prev_completion = 0
    async for raw in lines:
        now = clock()
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            t.saw_done = True
            t.done_ns = now - send_ns
            break
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            t.error = f"malformed SSE event: {data[:80]!r}"
            continue
        if "error" in event:
            t.error = str(event["error"])[:300]
        usage = event.get("usage")
        if usage:
            t.usage = usage
        if content_of(event):
            t.chunk_offsets_ns.append(now - send_ns)
            completion = (usage or {}).get("completion_tokens")
            if completion is not None and completion > prev_completion:
                t.chunk_tokens.append(completion - prev_completion)
                prev_completion = completion
            else:
                t.chunk_tokens.append(1)
                prev_completion += 1
    if t.done_ns is None:
        t.done_ns = clock() - send_ns
    return t


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


def _fill(rec: Record, t: StreamTiming) -> None:
    timing = derive_timing(t)
    rec.chunk_offsets_ns, rec.chunk_tokens = t.chunk_offsets_ns, t.chunk_tokens
    rec.ttft_ms = timing["ttft_ns"] / 1e6 if timing["ttft_ns"] is not None else None
    rec.e2e_ms = timing["e2e_ns"] / 1e6 if timing["e2e_ns"] is not None else None
    rec.done_ms = t.done_ns / 1e6 if t.done_ns is not None else None
    if t.usage:
        rec.prompt_tokens = t.usage.get("prompt_tokens")
        rec.output_tokens = t.usage.get("completion_tokens")
        rec.cached_tokens = (t.usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if t.error:
        rec.error = t.error
    elif not t.saw_done:
        rec.error = "stream ended without [DONE]"
    elif not t.chunk_offsets_ns:
        rec.error = "no generated content in stream"
    rec.ok = rec.error is None


class LoadGenerator:
    def __init__(self, base_url: str, model: str, timeout_s: float, clock: Clock = time.perf_counter_ns,
                 run_tag: str = ""):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.clock = clock
        self.run_tag = run_tag or uuid.uuid4().hex[:8]

    async def send(self, session: aiohttp.ClientSession, req: RequestSpec, scheduled_ns: int) -> Record:
        path = "/v1/completions" if req.api == "completions" else "/v1/chat/completions"
        rid = f"epd-{self.run_tag}-{req.phase[0]}{req.index}-{uuid.uuid4().hex[:6]}"
        body = {**req.payload, "model": self.model, "stream": True, "request_id": rid,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        send_ns = self.clock()
        rec = Record(rid, req.index, req.phase, req.api, req.target_prompt_tokens, req.max_tokens,
                     req.prompt_hash, req.image_px, req.image_hash, scheduled_ns, send_ns, time.time())
        timing = StreamTiming()
        try:
            async with session.post(self.base_url + path, json=body, headers={"X-Request-Id": rid},
                                    timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                rec.status = resp.status
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    rec.done_ms = (self.clock() - send_ns) / 1e6
                    return rec
                await consume_stream(resp.content, send_ns, self.clock, timing)
        except asyncio.TimeoutError:
            timing.error = f"timeout after {self.timeout_s:g}s"
        except aiohttp.ClientError as e:
            timing.error = f"{type(e).__name__}: {e}"[:300]
        _fill(rec, timing)
        if rec.done_ms is None:
            rec.done_ms = (self.clock() - send_ns) / 1e6
        return rec

    async def run_phase(self, session, requests: list[RequestSpec], concurrency: int,
                        on_record: Callable[[Record], None] | None = None) -> list[Record]:
        """`concurrency` workers, each sends its next request as soon as the last ends (closed loop), or
        not before the request's scheduled offset (bursts); scheduled vs actual send time is recorded."""
        queue: asyncio.Queue[RequestSpec] = asyncio.Queue()
        for r in sorted(requests, key=lambda r: (r.offset_s or 0.0, r.index)):
            queue.put_nowait(r)
        records: list[Record] = []
        start_ns = self.clock()

        async def worker():
            while True:
                try:
                    req = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                scheduled_ns = self.clock()
                if req.offset_s is not None:  # open-loop arrival (bursts): wait for the request's slot
                    scheduled_ns = start_ns + int(req.offset_s * 1e9)
                    delay_s = (scheduled_ns - self.clock()) / 1e9
                    if delay_s > 0:
                        await asyncio.sleep(delay_s)
                rec = await self.send(session, req, scheduled_ns)
                records.append(rec)
                if on_record:
                    on_record(rec)

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
