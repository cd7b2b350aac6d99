"""The simulator's OpenTelemetry spans: what a traced request (one carrying a W3C `traceparent`) did on this
process, with vLLM's span name and attribute names (vllm/v1/engine/output_processor.py `do_tracing`) carrying the
times the cost model used, exported as OTLP/HTTP protobuf to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the variable
vLLM reads) in small batches. Every span is marked emulated (epdbench.otlp.EMULATED_ATTR).

An engine's `llm_request` spans its API server's receipt of the request to the response's end; a PD decode that
pulls KV adds a `kv_transfer` span over the pull; the EPD proxy a `router.request` span over the whole request,
whose id it passes on as the legs' parent. Clock: the engine's host clock (perf_counter), turned into unix epoch
ns when the span is made; the attributes are modelled seconds (host seconds ÷ time_scale).

The virtual core (sim.vcluster) makes the same spans from the same notes, its clock being the virtual loop's
seconds from 0, turned into epoch ns from a fixed anchor (virtual_epoch) that every span states
(VIRTUAL_ANCHOR_ATTR)."""
from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from epdbench.otlp import EMULATED_ATTR, POD_ATTR, ROLE_ATTR, encode_spans, new_span_id

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
FLUSH_S = 0.1            # batch delay: spans leave within this of their end
MAX_BATCH = 512
SPAN_ROLE = {"server": "aggregated"}   # the role names of the spans contract (traces/<config>.parquet)
PROXY_ROLE, PROXY_POD = "proxy", "router"
CLOCK_ATTR = "epdbench.clock"                       # "virtual" on the virtual core's spans
VIRTUAL_ANCHOR_ATTR = "epdbench.clock.anchor_ns"    # their epoch ns of virtual second 0


def epoch_ns(t: float) -> int:
    """A perf_counter reading as unix epoch ns (through the current offset between the two clocks)."""
    return time.time_ns() + int((t - time.perf_counter()) * 1e9)


def virtual_epoch(anchor_ns: int) -> Callable[[float], int]:
    """Virtual-loop seconds as unix epoch ns: virtual second 0 is `anchor_ns`."""
    return lambda t: anchor_ns + round(t * 1e9)


def span_resource(role: str, replica: int | None = None) -> dict:
    """The resource of a replica's spans (role `server` named aggregated, pod `<role>-<replica>`), or, without a
    replica, of the built-in proxy's."""
    if replica is None:
        return {"service.name": PROXY_POD, ROLE_ATTR: PROXY_ROLE, POD_ATTR: PROXY_POD}
    pod = f"{role}-{replica}"
    return {"service.name": pod, ROLE_ATTR: SPAN_ROLE.get(role, role), POD_ATTR: pod}


def router_span(trace_id: str, span_id: str, parent_id: str, start_ns: int, end_ns: int, rid: str,
                mode: str) -> dict:
    """The built-in proxy's `router.request` span over a whole request (its legs' parent)."""
    return {"trace_id": trace_id, "span_id": span_id, "parent_span_id": parent_id, "name": "router.request",
            "start_ns": start_ns, "end_ns": end_ns,
            "attributes": {"gen_ai.request.id": rid, "epdbench.router.mode": mode, EMULATED_ATTR: True}}


@dataclass
class RequestNotes:
    """What a traced request's path noted on the way (host perf_counter seconds)."""
    trace_id: str
    parent_id: str
    arrival: float
    rid: str = ""
    seq: object = None                  # the engine's Sequence (sim.engine), once submitted
    prompt_tokens: int | None = None
    kv: tuple | None = None             # (start, end, tokens, ok) of a decode's KV pull
    encode: tuple | None = None         # (queued, started, done) of an encode replica's vision encoder


def _seconds(a: float | None, b: float | None, scale: float) -> float | None:
    return None if a is None or b is None else max(0.0, (b - a) / scale)


def request_spans(n: RequestNotes, end: float, scale: float, transport: str,
                  epoch: Callable[[float], int] = epoch_ns) -> list[dict]:
    """The spans of one traced request on an engine: `llm_request` (vLLM's attributes, from the modelled times
    its Sequence carries) and, for a decode that pulled KV, `kv_transfer`. `epoch`: the notes' clock as unix
    epoch ns (the host's perf_counter by default)."""
    seq = n.seq
    attrs = {"gen_ai.request.id": n.rid, "gen_ai.latency.e2e": _seconds(n.arrival, end, scale), EMULATED_ATTR: True}
    if n.prompt_tokens is not None:
        attrs["gen_ai.usage.prompt_tokens"] = n.prompt_tokens
    if seq is not None:
        first, last = getattr(seq, "first_token_at", None), getattr(seq, "last_token_at", None)
        scheduled = getattr(seq, "scheduled_at", None)
        attrs.update({
            "gen_ai.usage.completion_tokens": seq.generated,
            "gen_ai.request.max_tokens": seq.max_tokens,
            "gen_ai.latency.time_to_first_token": _seconds(n.arrival, first, scale),
            "gen_ai.latency.time_in_queue": _seconds(seq.arrived, scheduled, scale),
            "gen_ai.latency.time_in_model_prefill": _seconds(scheduled, getattr(seq, "prefill_end_at", None), scale),
            "gen_ai.latency.time_in_model_decode": _seconds(first, last, scale),
            "gen_ai.latency.time_in_model_inference": _seconds(scheduled, last, scale),
            "epdbench.cached_tokens": seq.cached,
        })
    if n.encode is not None:
        # an encoder-only instance as vLLM reports it: waiting for the encoder, then the encoder's own time (its
        # prefill); its "first token" is the encoder output being ready
        queued, started, done = n.encode
        attrs.update({"gen_ai.latency.time_in_queue": _seconds(queued, started, scale),
                      "gen_ai.latency.time_in_model_prefill": _seconds(started, done, scale),
                      "gen_ai.latency.time_to_first_token": _seconds(n.arrival, done, scale)})
    spans = [{"trace_id": n.trace_id, "span_id": new_span_id(), "parent_span_id": n.parent_id, "name": "llm_request",
              "start_ns": epoch(n.arrival), "end_ns": epoch(end),
              "attributes": {k: v for k, v in attrs.items() if v is not None}}]
    if n.kv is not None:
        start, stop, tokens, ok = n.kv
        spans.append({"trace_id": n.trace_id, "span_id": new_span_id(), "parent_span_id": n.parent_id,
                      "name": "kv_transfer", "start_ns": epoch(start), "end_ns": epoch(stop), "server": False,
                      "attributes": {"gen_ai.request.id": n.rid, "epdbench.kv.tokens": tokens,
                                     "epdbench.kv.transport": transport, "epdbench.kv.ok": ok,
                                     "epdbench.kv.seconds": _seconds(start, stop, scale), EMULATED_ATTR: True}})
    return spans


class SpanExporter:
    """Spans handed over with add(), posted to the endpoint every FLUSH_S (never blocking a request); a failed
    post is reported once on stderr and its spans dropped (the run's collector counts what arrived)."""

    def __init__(self, endpoint: str, resource: dict):
        self.endpoint = endpoint
        self.resource = resource     # span_resource's
        self.pending: list[dict] = []
        self.failures = 0
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_env(cls, resource: dict) -> "SpanExporter | None":
        endpoint = os.environ.get(ENDPOINT_ENV)
        return cls(endpoint, resource) if endpoint else None

    def add(self, spans: list[dict]) -> None:
        self.pending += spans

    def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self.flush()

    async def flush(self) -> None:
        while self.pending and self._session is not None:
            batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
            try:
                async with self._session.post(self.endpoint, data=encode_spans(batch, self.resource),
                                              headers={"Content-Type": "application/x-protobuf"}) as r:
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status}")
            except Exception as e:  # noqa: BLE001 - tracing never fails a request
                self.failures += 1
                if self.failures == 1:
                    print(f"epdbench sim: spans not exported to {self.endpoint}: {type(e).__name__}: {e}",
                          file=sys.stderr, flush=True)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self.flush()
        if self._session is not None:
            await self._session.close()
