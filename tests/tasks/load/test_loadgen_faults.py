"""Per-request faults never escape the load generator: a malformed SSE event, bad UTF-8, a server error
event, a cut stream, a timeout or any other exception become that request's error (ok=False) with its
partial timings kept, while the other requests of the cell are unaffected. Loopback only, bounded."""
import asyncio
import json

import pytest
from aiohttp import web

from epdbench.specs.workload import RequestSpec
from epdbench.tasks.load.loadgen import LoadGenerator, Record, _fill
from epdbench.tasks.load.sse import MalformedEvent, consume_stream, content_of, derive_timing
from tests.tasks.load.test_loadgen import ScriptedClock, lines


def chunk(text, completion_tokens=None):
    d = {"choices": [{"index": 0, "text": text, "finish_reason": None}]}
    if completion_tokens is not None:
        d["usage"] = {"prompt_tokens": 3, "completion_tokens": completion_tokens}
    return b"data: " + json.dumps(d).encode() + b"\n"


DONE = b"data: [DONE]\n"

# (bad event payload after "data: ", expected start of the request's error)
MALFORMED = [
    (b"[1,2]", "malformed SSE event: not a JSON object: b'[1,2]'"),
    (b'"x"', "malformed SSE event: not a JSON object: b'\"x\"'"),
    (b"3", "malformed SSE event: not a JSON object: b'3'"),
    (b"null", "malformed SSE event: not a JSON object: b'null'"),
    (b"{not json", "malformed SSE event: not JSON: b'{not json'"),
    (b"", "malformed SSE event: not JSON: b''"),
    (b"[" * 100_000, "malformed SSE event: not JSON: b'[[["),
    (b'{"choices":[null]}', "malformed SSE event: choices[0] is not an object"),
    (b'{"choices":"x"}', "malformed SSE event: choices is not a list"),
    (b'{"choices":{"text":"a"}}', "malformed SSE event: choices is not a list"),
    (b'{"choices":[{"delta":"x"}]}', "malformed SSE event: choices[0].delta is not an object"),
    (b'{"choices":[{"delta":{"content":[1]}}]}', "malformed SSE event: choices[0].delta.content is not a string"),
    (b'{"choices":[{"text":5}]}', "malformed SSE event: choices[0].text is not a string"),
    (b'{"usage":5}', "malformed SSE event: usage is not an object"),
    (b'{"usage":"x"}', "malformed SSE event: usage is not an object"),
    (b'{"usage":{"completion_tokens":"x"}}', "malformed SSE event: usage.completion_tokens is not an integer"),
    (b'{"choices":[{"text":" z"}],"usage":{"completion_tokens":"x"}}',
     "malformed SSE event: usage.completion_tokens is not an integer"),
    (b'{"usage":{"prompt_tokens":true}}', "malformed SSE event: usage.prompt_tokens is not an integer"),
    (b'{"usage":{"prompt_tokens_details":3}}', "malformed SSE event: usage.prompt_tokens_details is not an object"),
    (b'{"usage":{"prompt_tokens_details":{"cached_tokens":"x"}}}',
     "malformed SSE event: usage.prompt_tokens_details.cached_tokens is not an integer"),
    (b"\xff\xfe{}", "malformed SSE event: invalid UTF-8: b'\\xff\\xfe{}'"),
    (b'{"choices":[{"text":"\xc3("}]}', "malformed SSE event: invalid UTF-8"),
    (b'{"error":"boom"}', "server error event: boom"),
    (b'{"error":{"message":"too long","type":"BadRequestError","code":400}}', "server error event: too long"),
    (b'{"error":{"code":500}}', 'server error event: {"code": 500}'),
    (b'{"error":[1,"a"]}', 'server error event: [1, "a"]'),
    (b'{"error":5}', "server error event: 5"),
    (b'{"error":true}', "server error event: true"),
    (b'{"error":null}', "server error event: null"),
    (b'{"error":"boom","choices":[{"text":" z"}]}', "server error event: boom"),
]


@pytest.mark.parametrize("bad,expected", MALFORMED, ids=[repr(b[:30]) for b, _ in MALFORMED])
def test_malformed_event_fails_the_request_and_keeps_earlier_chunks(bad, expected):
    clock = ScriptedClock(step=7)
    send = clock()
    stream = [chunk(" a", 1), b": keep-alive\n", chunk(" b", 2), b"data: " + bad + b"\n", chunk(" c", 3), DONE]
    t = asyncio.run(consume_stream(lines(stream), send, clock))          # no exception escapes
    assert t.error.startswith(expected), t.error
    assert len(t.error) <= 300
    # the two chunks before the bad event are kept; the stream is read on to [DONE]
    assert t.chunk_offsets_ns[:2] == [7, 21] and t.chunk_offsets_ns == [7, 21, 35]
    assert t.chunk_tokens == [1, 1, 1]
    assert t.saw_done and t.done_ns == 42
    assert clock.reads == 1 + len(stream)                                # one clock read per event
    timing = derive_timing(t.chunk_offsets_ns)
    assert timing["e2e_ns"] - timing["ttft_ns"] == sum(timing["itl_ns"])
    rec = Record("r", 0, "measured", "completions", 3, 3, "h", None, None, 0, 0, 0.0)
    _fill(rec, t)
    assert not rec.ok and rec.error == t.error
    assert rec.ttft_ms == 7e-6 and rec.done_ms == 42e-6 and len(rec.chunk_offsets_ns) == 3
    assert rec.output_tokens in (None, 3) and rec.prompt_tokens in (None, 3)


def test_first_error_is_kept_and_stream_without_done_still_times_out_of_the_loop():
    clock = ScriptedClock()
    send = clock()
    t = asyncio.run(consume_stream(lines([chunk(" a"), b"data: [1]\n", b'data: {"error":"later"}\n', chunk(" b")]),
                                   send, clock))
    assert t.error.startswith("malformed SSE event: not a JSON object") and not t.saw_done
    assert len(t.chunk_offsets_ns) == 2 and t.done_ns is not None


def test_bad_bytes_outside_data_lines_and_non_bytes_lines_do_not_escape():
    clock = ScriptedClock()
    send = clock()
    t = asyncio.run(consume_stream(lines([b": \xff\xfe comment\n", chunk(" a"), b"event: \xff\n", chunk(" b"), DONE]),
                                   send, clock))
    assert t.error is None and t.saw_done and len(t.chunk_offsets_ns) == 2
    t = asyncio.run(consume_stream(lines([chunk(" a"), "data: {}\n", chunk(" b"), DONE]), send, clock))
    assert t.error.startswith("malformed SSE event: TypeError") and len(t.chunk_offsets_ns) == 2


def test_content_of_accepts_chunks_and_rejects_odd_shapes():
    assert content_of({"choices": [{"text": " a"}]}) == " a"
    assert content_of({"choices": [{"delta": {"content": " b"}}]}) == " b"
    assert content_of({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert content_of({"choices": [{"text": None}]}) == ""
    assert content_of({"choices": []}) == content_of({"choices": None}) == content_of({}) == ""
    for odd in ([1, 2], {"choices": [None]}, {"choices": "x"}, {"choices": [{"delta": "x"}]},
                {"choices": [{"text": 1}]}):
        with pytest.raises(MalformedEvent):
            content_of(odd)


# ---------------------------------------------------------------- send() with a scripted session


class _Body:
    """A response body whose reads are the scripted generator's items (aiohttp's StreamReader.iter_any)."""

    def __init__(self, items):
        self.items = items

    def iter_any(self):
        return self.items


class _Resp:
    def __init__(self, status, content):
        self.status = status
        self.content = _Body(content)

    async def text(self, errors="strict"):
        return "x"


class _Post:
    def __init__(self, resp):
        self.resp = resp

    async def __aenter__(self):
        return self.resp

    async def __aexit__(self, *exc):
        return False


class _Session:
    def __init__(self, content):
        self.content = content

    def post(self, url, **kw):
        return _Post(_Resp(200, self.content))


def _request(i, phase="measured", max_tokens=4, **payload):
    return RequestSpec(index=i, phase=phase, api="completions",
                       payload={"prompt": "a b c", "max_tokens": max_tokens, **payload},
                       target_prompt_tokens=3, max_tokens=max_tokens, prompt_hash=f"h{i}")


def test_unexpected_exception_in_stream_becomes_the_request_error_with_partial_timings():
    async def content():
        yield chunk(" a", 1)
        yield chunk(" b", 2)
        raise RuntimeError("parser bug")

    lg = LoadGenerator("http://unused", "m", timeout_s=5, clock=ScriptedClock())
    rec = asyncio.run(lg.send(_Session(content()), _request(0), 0))
    assert not rec.ok and rec.error == "unexpected RuntimeError: parser bug"
    assert len(rec.chunk_offsets_ns) == 2 and rec.ttft_ms is not None and rec.done_ms >= rec.e2e_ms


def test_cancelled_error_still_propagates_out_of_send():
    async def content():
        yield chunk(" a", 1)
        raise asyncio.CancelledError()

    async def go():
        lg = LoadGenerator("http://unused", "m", timeout_s=5, clock=ScriptedClock())
        with pytest.raises(asyncio.CancelledError):
            await lg.send(_Session(content()), _request(0), 0)

    asyncio.run(go())


# ---------------------------------------------------------------- end to end over loopback HTTP

BAD_EVENTS = {  # payload "bad" -> raw bytes the server writes after two good chunks
    "list": b"data: [1,2]\n\n",
    "null_choice": b'data: {"choices":[null]}\n\n',
    "str_delta": b'data: {"choices":[{"delta":"x"}]}\n\n',
    "usage_int": b'data: {"usage": 5}\n\n',
    "usage_str_tokens": b'data: {"usage":{"completion_tokens":"x"}}\n\n',
    "error_obj": b'data: {"error":{"message":"engine died","code":500}}\n\n',
    "utf8": b"data: \xff\xfe\xfd\n\n",
    "huge": b"data: " + b"x" * 300_000 + b"\n\n",
}


async def _serve(handler):
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.2)   # do not wait out a hanging handler
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


async def faulty_handler(request):
    body = await request.json()
    bad = body.get("bad")
    if bad == "http_bad_utf8":
        return web.Response(status=500, body=b"\xff\xfe broken", content_type="text/plain", charset="utf-8")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    n = body["max_tokens"]
    for i in range(n):
        await asyncio.sleep(0.002)
        await resp.write(chunk(" x", i + 1) + b"\n")
        if i == 1 and bad in BAD_EVENTS:
            await resp.write(BAD_EVENTS[bad])
        if i == 1 and bad == "hang":
            await asyncio.sleep(5)
        if i == 1 and bad == "cut":
            request.transport.abort()
            return resp
    await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n' % n)
    await resp.write(b"data: [DONE]\n\n")
    return resp


def test_bad_events_over_loopback_fail_only_their_request():
    bad_kinds = [*BAD_EVENTS, "cut", "http_bad_utf8"]
    seen = []

    async def go():
        runner, port = await _serve(faulty_handler)
        try:
            reqs = [_request(0, "warmup"), *[_request(i) for i in range(1, 4)],
                    *[_request(4 + j, bad=kind) for j, kind in enumerate(bad_kinds)],
                    RequestSpec(4 + len(bad_kinds), "measured", "completions", None, 3, 4, "broken-spec")]
            async with LoadGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=10) as lg:
                return await asyncio.wait_for(lg.run_cell(reqs, concurrency=4, on_record=seen.append), 30)
        finally:
            await runner.cleanup()

    recs = asyncio.run(go())
    n = 5 + len(bad_kinds)
    assert [r.index for r in recs] == list(range(n)) and len(seen) == n
    for r in recs[:4]:                                                  # the good ones are unaffected
        assert r.ok and r.error is None and len(r.chunk_offsets_ns) == 4 and r.output_tokens == 4
    by_kind = dict(zip(bad_kinds, recs[4:]))
    expected = {
        "list": "malformed SSE event: not a JSON object: b'[1,2]'",
        "null_choice": "malformed SSE event: choices[0] is not an object",
        "str_delta": "malformed SSE event: choices[0].delta is not an object",
        "usage_int": "malformed SSE event: usage is not an object",
        "usage_str_tokens": "malformed SSE event: usage.completion_tokens is not an integer",
        "error_obj": "server error event: engine died",
        "utf8": "malformed SSE event: invalid UTF-8",
        "huge": "",                                                     # whatever aiohttp says, as an error
        "cut": "",
        "http_bad_utf8": "HTTP 500: ",
    }
    for kind, rec in by_kind.items():
        assert not rec.ok and rec.error and rec.error.startswith(expected[kind]), (kind, rec.error)
        assert rec.done_ms is not None
        if kind != "http_bad_utf8":
            assert len(rec.chunk_offsets_ns) >= 2 and rec.ttft_ms is not None, kind   # chunks before kept
    for kind in ("list", "null_choice", "str_delta", "usage_int", "usage_str_tokens", "error_obj", "utf8"):
        assert len(by_kind[kind].chunk_offsets_ns) == 4                 # read on to [DONE]
    assert by_kind["http_bad_utf8"].status == 500
    broken = recs[-1]
    assert not broken.ok and broken.error.startswith("unexpected TypeError"), broken.error


def test_timeout_keeps_partial_timings_and_others_finish():
    async def go():
        runner, port = await _serve(faulty_handler)
        try:
            reqs = [_request(0, bad="hang"), _request(1), _request(2)]
            async with LoadGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=0.5) as lg:
                return await asyncio.wait_for(lg.run_cell(reqs, concurrency=3), 20)
        finally:
            await runner.cleanup()

    hung, *rest = asyncio.run(go())
    assert not hung.ok and hung.error == "timeout after 0.5s" and len(hung.chunk_offsets_ns) == 2
    assert hung.done_ms >= 500 * 0.9
    assert all(r.ok for r in rest)


def test_failing_on_record_callback_loses_no_record_and_logs_once(capsys):
    calls = []

    def on_record(rec):
        calls.append(rec.index)
        raise ValueError("callback bug")

    async def go():
        runner, port = await _serve(faulty_handler)
        try:
            reqs = [_request(0, "warmup"), *[_request(i) for i in range(1, 6)], _request(6, bad="list")]
            async with LoadGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=10) as lg:
                recs = await asyncio.wait_for(lg.run_cell(reqs, concurrency=2, on_record=on_record), 20)
                streams = await asyncio.wait_for(lg.run_streams([(reqs[:3], 2), (reqs[3:], 2)], on_record), 20)
                return recs, streams, lg.on_record_errors
        finally:
            await runner.cleanup()

    recs, streams, errors = asyncio.run(go())
    assert [r.index for r in recs] == list(range(7))
    assert sorted(calls[:7]) == list(range(7)) and len(calls) == 14 and errors == 14
    assert [r.ok for r in recs] == [True] * 6 + [False]
    assert sorted(r.index for s in streams for r in s) == list(range(7))
    err = capsys.readouterr().err
    assert err.count("on_record callback failed") == 1 and "ValueError: callback bug" in err


def test_cancelling_a_cell_propagates_cancellation():
    async def go():
        runner, port = await _serve(faulty_handler)
        try:
            async with LoadGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=3) as lg:
                task = asyncio.create_task(lg.run_cell([_request(0, bad="hang"), _request(1)], concurrency=2))
                await asyncio.sleep(0.2)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert task.cancelled()
        finally:
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(go(), 20))
