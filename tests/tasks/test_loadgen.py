"""Load generator timing with a scripted clock (no socket), and against a loopback server."""
import asyncio

import pytest
from aiohttp import web

from epdbench.specs.workload import RequestSpec
from epdbench.tasks.loadgen import LoadGenerator, consume_stream, derive_timing


class ScriptedClock:
    """Each read advances one tick of `step` ns (vLLM benchmarks' timing test) and is counted."""

    def __init__(self, start=1_000, step=7):
        self.t = start
        self.step = step
        self.reads = 0

    def __call__(self):
        self.reads += 1
        self.t += self.step
        return self.t


async def lines(items):
    for x in items:
        yield x


def completion_chunk(text, usage=None):
    import json
    d = {"choices": [{"index": 0, "text": text, "finish_reason": None}]}
    if usage:
        d["usage"] = usage
    return b"data: " + json.dumps(d).encode() + b"\n"


def test_latency_minus_ttft_equals_sum_of_itl_exactly():
    clock = ScriptedClock(step=13)
    send = clock()
    stream = [b": keep-alive\n", completion_chunk(""), completion_chunk(" a"), b"\n", completion_chunk(" b"),
              completion_chunk(" c"), completion_chunk(" d"),
              b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}\n',
              b"data: [DONE]\n"]
    t = asyncio.run(consume_stream(lines(stream), send, clock))
    timing = derive_timing(t)
    assert len(t.chunk_offsets_ns) == 4                   # empty-content chunk is not a token
    assert (timing["e2e_ns"] - timing["ttft_ns"]) - sum(timing["itl_ns"]) == 0
    assert timing["ttft_ns"] == 3 * 13                    # third event read after send
    assert t.usage["completion_tokens"] == 4 and t.saw_done
    assert t.done_ns > timing["e2e_ns"]


def test_tokens_per_chunk_from_continuous_usage():
    clock = ScriptedClock()
    send = clock()
    stream = [completion_chunk(" a", {"completion_tokens": 1}), completion_chunk(" b c d", {"completion_tokens": 4}),
              b"data: [DONE]\n"]
    t = asyncio.run(consume_stream(lines(stream), send, clock))
    assert t.chunk_tokens == [1, 3]


def test_stream_without_done_and_malformed_event_are_errors():
    clock = ScriptedClock()
    t = asyncio.run(consume_stream(lines([completion_chunk(" a"), b"data: {not json\n"]), clock(), clock))
    assert not t.saw_done
    assert "malformed" in t.error


def _request(i, phase="measured", max_tokens=5):
    return RequestSpec(index=i, phase=phase, api="completions", payload={"prompt": "a b c", "max_tokens": max_tokens},
                       target_prompt_tokens=3, max_tokens=max_tokens, prompt_hash=f"h{i}")


@pytest.fixture
def fake_server():
    """A loopback server: streams max_tokens chunks, or 500 for prompts asking for 99 tokens."""
    state = {"concurrent": 0, "max_concurrent": 0, "ids": []}

    async def handler(request):
        body = await request.json()
        state["ids"].append((body["request_id"], request.headers.get("X-Request-Id")))
        if body["max_tokens"] == 99:
            return web.json_response({"error": "boom"}, status=500)
        if body["max_tokens"] == 77:  # stream cut after two tokens
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(completion_chunk(" x") + b"\n" + completion_chunk(" y") + b"\n")
            await asyncio.sleep(0.01)
            request.transport.abort()
            return resp
        state["concurrent"] += 1
        state["max_concurrent"] = max(state["max_concurrent"], state["concurrent"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(body["max_tokens"]):
            await asyncio.sleep(0.002)
            await resp.write(completion_chunk(" x", {"completion_tokens": i + 1}) + b"\n")
        await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n'
                         % body["max_tokens"])
        await resp.write(b"data: [DONE]\n\n")
        state["concurrent"] -= 1
        return resp

    return handler, state


def test_closed_loop_against_loopback_server(fake_server):
    handler, state = fake_server

    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            reqs = [_request(0, "warmup"), *[_request(i) for i in range(1, 7)], _request(7, max_tokens=99),
                    _request(8, max_tokens=77)]
            async with LoadGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=10) as lg:
                return await lg.run_cell(reqs, concurrency=3)
        finally:
            await runner.cleanup()

    recs = asyncio.run(go())
    assert [r.index for r in recs] == list(range(9))
    assert state["max_concurrent"] <= 3
    ok = [r for r in recs if r.ok]
    assert len(ok) == 7
    bad, cut = recs[7], recs[8]
    assert not bad.ok and bad.status == 500 and "HTTP 500" in bad.error     # kept, not dropped
    assert not cut.ok and cut.error and len(cut.chunk_offsets_ns) == 2      # partial timings kept
    assert cut.ttft_ms is not None and cut.done_ms >= cut.ttft_ms
    for r in ok:
        assert r.output_tokens == 5 and len(r.chunk_offsets_ns) == 5 and r.chunk_tokens == [1] * 5
        assert 0 < r.ttft_ms <= r.e2e_ms <= r.done_ms
        assert r.send_ns >= r.scheduled_ns
    assert all(body_id == header_id for body_id, header_id in state["ids"])  # one id, body and header
