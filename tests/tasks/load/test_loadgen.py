"""Load generator timing with a scripted clock (no socket), and against a loopback server."""
import asyncio
import contextlib

import pytest
from aiohttp import web

from epdbench.specs.workload import RequestSpec
from epdbench.tasks.load.loadgen import LoadGenerator
from epdbench.tasks.load.sse import consume_stream, derive_timing


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
    timing = derive_timing(t.chunk_offsets_ns)
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


@contextlib.asynccontextmanager
async def serving(handler):
    """`handler` as POST /v1/completions on a loopback port; yields the port."""
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]
    finally:
        await runner.cleanup()


def test_closed_loop_against_loopback_server(fake_server):
    handler, state = fake_server

    async def go():
        async with serving(handler) as port:
            reqs = [_request(0, "warmup"), *[_request(i) for i in range(1, 7)], _request(7, max_tokens=99),
                    _request(8, max_tokens=77)]
            async with LoadGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=10) as lg:
                return await lg.run_cell(reqs, concurrency=3)

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


def test_time_scale_divides_every_stamp_and_stretches_arrivals_and_the_timeout():
    """A dilated simulator runs `scale` times slower: the records hold modelled durations."""
    async def go():
        async def handler(request):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await asyncio.sleep(0.12)                       # 120 ms of host time before the first token
            await resp.write(completion_chunk(" a", {"prompt_tokens": 1, "completion_tokens": 1}))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        async with serving(handler) as port:
            late = RequestSpec(1, "measured", "completions", {"prompt": "x", "max_tokens": 1}, 1, 1, "h1",
                               offset_s=0.05)                     # a modelled 50 ms after the cell starts
            async with LoadGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=10, time_scale=4.0) as lg:
                assert lg.timeout_s == 40.0
                return await lg.run_phase(lg.session, [late], concurrency=1)

    (rec,) = asyncio.run(go())
    assert rec.ok
    assert 120 / 4 <= rec.ttft_ms < 120 / 4 + 15               # 120 ms of host time are 30 ms modelled
    assert 0 <= (rec.send_ns - rec.scheduled_ns) / 1e6 < 10  # sent at its modelled offset (200 ms of host time)


def stamped_chunk(text, modelled_ns):
    import json
    d = {"choices": [{"index": 0, "text": text, "finish_reason": None}], "epdbench_modelled_ns": modelled_ns}
    return b"data: " + json.dumps(d).encode() + b"\n"


def _filled(stream, send_ns, clock, scale=1.0):
    from epdbench.tasks.load.loadgen import Record, _fill
    from epdbench.tasks.load.sse import StreamTiming
    t = asyncio.run(consume_stream(lines(stream), send_ns, clock, StreamTiming(), modelled_scale=scale))
    rec = Record("r", 0, "measured", "completions", 1, 3, "h", None, None, send_ns, send_ns, 0.0)
    _fill(rec, t)
    return rec


def test_modelled_stamps_time_the_tokens_and_arrivals_are_kept():
    clock = ScriptedClock(start=1_000, step=500)            # arrivals at 1500, 2000, 2500, [DONE] 3000
    send = 1_000
    rec = _filled([stamped_chunk(" a", 1_200), stamped_chunk(" b", 1_700), stamped_chunk(" c", 2_100),
                   b"data: [DONE]\n"], send, clock)
    assert rec.ok and rec.timing == "modelled"
    assert rec.chunk_offsets_ns == [200, 700, 1100] and rec.chunk_arrival_ns == [500, 1000, 1500]
    assert rec.ttft_ms == 200 / 1e6 and rec.e2e_ms == 1100 / 1e6


def test_dilated_stamps_are_divided_like_the_clock():
    clock = ScriptedClock(start=1_000, step=500)
    rec = _filled([stamped_chunk(" a", 2 * 1_200), b"data: [DONE]\n"], 1_000, clock, scale=2.0)
    assert rec.timing == "modelled" and rec.chunk_offsets_ns == [200]


@pytest.mark.parametrize("stream", [
    [stamped_chunk(" a", 1_200), completion_chunk(" b"), b"data: [DONE]\n"],               # one chunk without
    [stamped_chunk(" a", 1_200), stamped_chunk(" b", 9_999), b"data: [DONE]\n"],            # after its arrival
    [stamped_chunk(" a", 900), stamped_chunk(" b", 1_700), b"data: [DONE]\n"],              # before the send
    [stamped_chunk(" a", 1_400), stamped_chunk(" b", 1_300), b"data: [DONE]\n"],            # out of order
], ids=["missing", "after-arrival", "before-send", "out-of-order"])
def test_stamps_that_cannot_be_checked_against_arrival_fall_back_to_arrival(stream):
    clock = ScriptedClock(start=1_000, step=500)
    rec = _filled(stream, 1_000, clock)
    assert rec.timing == "arrival" and rec.chunk_offsets_ns == [500, 1000] and rec.chunk_arrival_ns == []


def test_scheduled_first_wave_then_closed_loop_and_open_loop_arrivals_are_kept(fake_server):
    """Requests with offsets are sent at their slots (scheduled_ns = phase start + offset), the rest as
    soon as a worker frees; an open-loop arrival that finds every worker busy waits, and its lag is recorded."""
    import dataclasses
    handler, _ = fake_server

    async def go(reqs, concurrency):
        async with serving(handler) as port:
            async with LoadGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=10) as lg:
                return await lg.run_cell(reqs, concurrency=concurrency)

    first_wave = [0.06, 0.0, 0.03]
    reqs = [dataclasses.replace(_request(i), offset_s=first_wave[i] if i < 3 else None) for i in range(6)]
    recs = sorted(asyncio.run(go(reqs, 3)), key=lambda r: r.index)
    start = min(r.scheduled_ns for r in recs[:3]) - int(min(first_wave) * 1e9)
    for r, offset in zip(recs[:3], first_wave):
        assert r.scheduled_ns == start + int(offset * 1e9) and r.send_ns >= r.scheduled_ns
        assert (r.send_ns - r.scheduled_ns) / 1e6 < 20                   # sent at its slot
    later = recs[3:]
    assert all(r.send_ns >= min(x.send_ns + x.done_ms * 1e6 for x in recs[:3]) - 1e6 for r in later)
    # one worker, arrivals 5 ms apart, each request ~12 ms long: later arrivals wait for the worker
    burst = [dataclasses.replace(_request(i), offset_s=0.005 * i) for i in range(4)]
    recs = sorted(asyncio.run(go(burst, 1)), key=lambda r: r.index)
    lags_ms = [(r.send_ns - r.scheduled_ns) / 1e6 for r in recs]
    assert lags_ms[0] < 5 and lags_ms[-1] > 10 and all(r.ok for r in recs)
