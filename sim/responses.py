"""OpenAI-style answers of a replica: completion JSON, SSE chunks with usage, and the prefill-only answer
that hands the KV or encoder outputs on."""
from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

from aiohttp import web

from epdbench.analysis.logformats import MODELLED_FIELD
from epdbench.sim.sequence import Sequence

if TYPE_CHECKING:
    from epdbench.sim.replica import Replica

# vLLM puts its version and a build hash here on a whole answer and on a stream's last chunk; the simulator names
# itself.
SYSTEM_FINGERPRINT = "epdbench-sim"
OUTPUT_WORDS = ["the", "model", "answers", "with", "tokens", "that", "stream", "back", "to", "you"]


def word(i: int) -> str:
    """The i-th output token's text."""
    return " " + OUTPUT_WORDS[i % len(OUTPUT_WORDS)]


def text_of(n: int) -> str:
    return "".join(word(i) for i in range(n))


def usage(seq: Sequence, generated: int | None = None, chat: bool = False) -> dict:
    """vLLM's usage (with --enable-prompt-tokens-details): a decode whose prompt came by KV transfer reports its
    prefill's prefix-cache hit (kv_transfer_params' remote_prefill_cached_tokens, vLLM 0.33
    v1/engine/output_processor.py), not its own near-whole hit from the transfer. Chat answers also count
    `created_cache_tokens` (0: no prompt-cache writes are asked for), as vLLM 0.32's chat server does."""
    n = seq.generated if generated is None else generated
    cached = seq.cached if seq.reported_cached is None else seq.reported_cached
    details = {"cached_tokens": cached, **({"created_cache_tokens": 0} if chat else {})}
    return {"prompt_tokens": seq.prompt_tokens, "completion_tokens": n,
            "total_tokens": seq.prompt_tokens + n, "prompt_tokens_details": details}


def model_of(replica: Replica, body: dict) -> str:
    return body.get("model") or replica.spec.model.name


def response_json(replica: Replica, body: dict, rid: str, seq: Sequence, chat: bool, reason: str) -> dict:
    text = text_of(seq.generated)
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
              if chat else {"index": 0, "text": text, "finish_reason": reason})
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model_of(replica, body),
            "choices": [choice], "system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage(seq, chat=chat)}


async def until(stamp: float) -> None:
    """Wait until the host clock reaches a token's stamp: when the engine modelled it to leave the API server."""
    delay = stamp - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def collect(seq: Sequence) -> str:
    while True:
        kind, stamp = await seq.out.get()
        if kind == "done":
            return seq.finish_reason or "length"
        await until(stamp)


async def respond_prefill_only(replica: Replica, body: dict, rid: str, seq: Sequence, chat: bool,
                               kvp: dict | None) -> web.Response:
    if replica.role == "encode":
        reason = "length"
        seq.generated = 1
    else:
        reason = await collect(seq)
    replica.counters.finish(reason, seq.generated)
    replica.counters.time_request(seq, replica.time_scale)
    out = response_json(replica, body, rid, seq, chat, reason)
    if kvp and kvp.get("do_remote_decode"):
        out["kv_transfer_params"] = replica.kv.hold(kvp, rid, seq.prompt_tokens, seq.cached)
    if replica.role == "encode":
        out["ec_transfer_params"] = replica.encoder.transfer_params()
    return web.json_response(out)


async def complete(replica: Replica, body: dict, rid: str, seq: Sequence, chat: bool) -> web.Response:
    reason = await collect(seq)
    replica.counters.finish(reason, seq.generated)
    replica.counters.time_request(seq, replica.time_scale)
    return web.json_response(response_json(replica, body, rid, seq, chat, reason))


async def stream(replica: Replica, request: web.Request, body: dict, rid: str, seq: Sequence,
                 chat: bool) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    model = model_of(replica, body)
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"

    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(choices, usage_=None, modelled_end: float | None = None, last: bool = False) -> bytes:
        d = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
        if usage_ is not None:
            d["usage"] = usage_
        if last:                       # vLLM: the stream's last chunk before [DONE] carries the fingerprint
            d["system_fingerprint"] = SYSTEM_FINGERPRINT
        if modelled_end is not None:   # when the token was emitted on the modelled timeline (host clock, ns)
            d[MODELLED_FIELD] = int(modelled_end * 1e9)
        return b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"

    n = 0
    continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
    try:
        if chat:
            await resp.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}]))
        while True:
            kind, modelled_end = await seq.out.get()
            if kind == "done":
                break
            text = word(n)
            n += 1
            last = n >= seq.max_tokens
            reason = "length" if last else None
            piece = ({"index": 0, "delta": {"content": text}, "finish_reason": reason} if chat
                     else {"index": 0, "text": text, "finish_reason": reason})
            await until(modelled_end)
            await resp.write(chunk([piece], usage(seq, n, chat) if continuous else None, modelled_end,
                                   last=last and not include_usage))
            replica.emit_lag.observe(max(0.0, time.perf_counter() - modelled_end) / replica.time_scale)
        replica.counters.finish(seq.finish_reason or "length", seq.generated)
        replica.counters.time_request(seq, replica.time_scale)
        if include_usage:
            await resp.write(chunk([], usage(seq, chat=chat), last=True))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionResetError:
        replica.engine.abort(seq)   # the client left: vLLM aborts the request; the 200 status line stands
    except asyncio.CancelledError:
        replica.engine.abort(seq)
        raise
    return resp
