"""Streaming load generator: one aiohttp session, closed-loop or scheduled workers, warm-up then measured
(optionally in several processes sharing the concurrency: tasks.load.loadgen_procs).

The clock is injected (perf_counter_ns by default) and read once per received buffer (tasks.load.sse); each
request keeps its raw chunk offsets and tokens per chunk, server usage and any error, so every metric is
derived later from records.

On the simulator each chunk also carries when its token was emitted on the modelled timeline (CLOCK_MONOTONIC
ns, analysis.logformats.MODELLED_FIELD). When every content chunk of a response has one, lying after the send
and no later than the chunk's arrival, the request is timed by them (`timing` "modelled": host load between
the engine and this process cannot bend its token times) and the arrivals are kept beside them
(`chunk_arrival_ns`), so the delivery lag of every token is on record; otherwise it is timed by arrival.
"""
from __future__ import annotations

import asyncio
import operator
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Callable

import aiohttp

from epdbench.otlp import format_traceparent, new_span_id, new_trace_id
from epdbench.tasks.load.sse import Clock, StreamTiming, _fail, _is_int, consume_stream, ttft_e2e_ns
from epdbench.specs.workload import RequestSpec

PROCESS_START_MARGIN_S = 0.05   # worker processes start a phase together this long after it is handed out


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
    # a traced request's client span (not a records.parquet column: it goes to traces/<config>.parquet):
    # [trace id, span id, start, end] in unix epoch ns, from before the request is written to after its last byte
    trace: list | None = None


def modelled_offsets(t: StreamTiming) -> list[int] | None:
    """The chunks' modelled offsets when they can time the request: one per content chunk, after the send,
    in order, and none later than its chunk's arrival (1 µs of rounding); else None."""
    m, a = t.chunk_modelled_ns, t.chunk_offsets_ns
    if t.modelled_missing or not m or len(m) != len(a):
        return None
    if m[0] <= 0 or any(map(operator.lt, m[1:], m)):
        return None
    if m == a:                           # the virtual core's: its stamps are when the chunks arrive
        return list(m)
    if any(x > arr + 1000 for x, arr in zip(m, a)):
        return None
    return [min(x, arr) for x, arr in zip(m, a)]


def _int_or_none(v) -> int | None:
    return v if _is_int(v) else None


def _fill(rec: Record, t: StreamTiming) -> None:
    offsets = modelled_offsets(t)
    if offsets is not None:
        rec.timing, rec.chunk_arrival_ns = "modelled", t.chunk_offsets_ns
    else:
        offsets = t.chunk_offsets_ns
    rec.chunk_offsets_ns, rec.chunk_tokens = offsets, t.chunk_tokens
    ttft, e2e = ttft_e2e_ns(offsets)     # the ITLs are derived from the offsets where they are read
    rec.ttft_ms = ttft / 1e6 if ttft is not None else None
    rec.e2e_ms = e2e / 1e6 if e2e is not None else None
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
    elif not offsets:
        rec.error = "no generated content in stream"
    rec.ok = rec.error is None


class LoadGenerator:
    def __init__(self, base_url: str, model: str, timeout_s: float, clock: Clock = time.perf_counter_ns,
                 run_tag: str = "", time_scale: float = 1.0, processes: int = 1):
        """`time_scale` > 1 (a dilated simulator): every stamp is taken on a clock running that many times
        slower, so records hold modelled durations; arrival offsets and the timeout stretch by it.
        `processes` > 1: phases run in that many worker processes sharing the concurrency
        (tasks.load.loadgen_procs); their event-loop lag samples collect in `worker_lag_s`."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.time_scale = time_scale
        self.timeout_s = timeout_s * time_scale
        self.clock = clock if time_scale == 1 else (lambda: int(clock() / time_scale))
        # the simulator's modelled stamps are CLOCK_MONOTONIC ns: usable only on that clock
        self.modelled_scale = time_scale if clock is time.perf_counter_ns else None
        self.run_tag = run_tag or uuid.uuid4().hex[:8]
        self.on_record_errors = 0   # exceptions raised by on_record callbacks (logged once, then counted)
        self.processes = processes
        self.pool = None
        self.worker_lag_s: list[float] = []

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
            headers = {"X-Request-Id": rid}
            if req.traced:
                rec.trace = [new_trace_id(), new_span_id(), time.time_ns(), 0]
                headers["traceparent"] = format_traceparent(rec.trace[0], rec.trace[1])
            async with session.post(self.base_url + path, json=body, headers=headers,
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
        if rec.trace is not None:
            rec.trace[3] = time.time_ns()
        return rec

    def take_worker_lag(self) -> list[float]:
        """The worker processes' loop-lag samples since the last call (empty with one process)."""
        samples, self.worker_lag_s = self.worker_lag_s, []
        return samples

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
                        on_record: Callable[[Record], None] | None = None, start_ns: int | None = None
                        ) -> list[Record]:
        """`concurrency` workers, each sends its next request as soon as the last ends (closed loop), or
        not before the request's scheduled offset from `start_ns` (default now); scheduled vs actual send
        time is recorded. Every finished request is returned and passed to `on_record` as soon as it
        finishes (with worker processes, as each process ends its share)."""
        if self.pool is not None and len(requests) > 1:
            def batch(recs, lags):
                self.worker_lag_s += lags
                for rec in recs:
                    self._notify(on_record, rec)
            start = self.clock() + int(PROCESS_START_MARGIN_S * 1e9)
            return sorted(await self.pool.run_phase(requests, concurrency, start, batch), key=lambda r: r.index)
        if start_ns is not None and start_ns > self.clock():     # a worker process waits for the common start
            await asyncio.sleep((start_ns - self.clock()) / 1e9 * self.time_scale)
        queue: asyncio.Queue[RequestSpec] = asyncio.Queue()
        # scheduled ones first, in order of their slots (a closed loop's first wave), then the rest by index
        for r in sorted(requests, key=lambda r: (r.offset_s if r.offset_s is not None else float("inf"), r.index)):
            queue.put_nowait(r)
        records: list[Record] = []
        start_ns = self.clock() if start_ns is None else start_ns

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
        if self.processes > 1:
            from epdbench.tasks.load.loadgen_procs import Settings, WorkerPool
            self.pool = WorkerPool(Settings(self.base_url, self.model, self.timeout_s / self.time_scale,
                                            self.run_tag, self.time_scale), self.processes)
            await asyncio.to_thread(self.pool.start)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()
        if self.pool is not None:
            await asyncio.to_thread(self.pool.close)

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


def unfinished_record(req: RequestSpec, run_tag: str, error: str) -> Record:
    """A failed Record for a request the load generator was stopped before it finished (in flight or not sent):
    a process of the deployment died. Its id is new: a request id is never used twice."""
    now = time.perf_counter_ns()
    return Record(f"epd-{run_tag}-u{req.index}-{uuid.uuid4().hex[:6]}", req.index, req.phase, req.api,
                  req.target_prompt_tokens, req.max_tokens, req.prompt_hash, req.image_px, req.image_hash, now, now,
                  time.time(), ok=False, error=error[:300])


def records_as_dicts(records: list[Record]) -> list[dict]:
    """Each record's fields (its chunk lists shared, not copied: records are not changed once finished)."""
    return [dict(r.__dict__) for r in records]
