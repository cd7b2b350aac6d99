"""sim/proxy.py's EPD legs as real vLLM engines receive them (the local target puts it in front of vLLM 0.26): the
encode leg a one-token, non-streamed copy of the request; the prefill leg with `do_remote_decode`; the decode leg
with the prefill's kv_transfer_params; the encoder's ec_transfer_params passed on only when it answered some."""
import asyncio
import socket

import aiohttp
from aiohttp import web

from epdbench.sim.proxy import Proxy

IMAGE = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                                     {"type": "text", "text": "what is it?"}]}


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine(role: str, seen: list, answer: dict) -> web.Application:
    async def chat(request):
        seen.append((role, request.headers.get("X-Request-Id"), await request.json()))
        return web.json_response({"choices": [{"message": {"content": "x"}}], **answer})
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def run(encoder_answer: dict) -> list:
    seen: list = []
    runners, urls = [], {}
    answers = {"encode": encoder_answer, "decode": {},
               "prefill": {"kv_transfer_params": {"remote_engine_id": "p", "remote_block_ids": [1]}}}
    for role, answer in answers.items():
        r = web.AppRunner(engine(role, seen, answer))
        await r.setup()
        p = port()
        await web.TCPSite(r, "127.0.0.1", p).start()
        runners.append(r)
        urls[role] = f"http://127.0.0.1:{p}"
    proxy = Proxy([], [urls["encode"]], [urls["prefill"]], [urls["decode"]])
    proxy.session = aiohttp.ClientSession()
    r = web.AppRunner(proxy.app())
    await r.setup()
    p = port()
    await web.TCPSite(r, "127.0.0.1", p).start()
    runners.append(r)
    body = {"model": "m", "messages": [IMAGE], "max_completion_tokens": 128, "stream": False, "request_id": "req-1"}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://127.0.0.1:{p}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
    await proxy.session.close()
    for r in runners:
        await r.cleanup()
    return seen


def test_real_vllm_legs_carry_the_clients_id_and_only_what_each_engine_answered():
    seen = asyncio.run(run({"ec_transfer_params": None}))
    assert [(role, rid) for role, rid, _ in seen] == [("encode", "req-1"), ("prefill", "req-1"), ("decode", "req-1")]
    encode, prefill, decode = (b for _, _, b in seen)
    assert (encode["max_tokens"], encode["stream"], encode["stream_options"]) == (1, False, None)
    assert "max_completion_tokens" not in encode and encode["messages"] == [IMAGE]
    assert "ec_transfer_params" not in prefill and "ec_transfer_params" not in decode
    assert prefill["kv_transfer_params"]["do_remote_decode"] is True and prefill["max_tokens"] == 1
    assert decode["kv_transfer_params"] == {"remote_engine_id": "p", "remote_block_ids": [1]}
    assert decode["max_completion_tokens"] == 128


def test_an_encoders_ec_transfer_params_reach_the_prefill_leg_only():
    seen = asyncio.run(run({"ec_transfer_params": {"encoder_url": "http://enc"}}))
    prefill, decode = seen[1][2], seen[2][2]
    assert prefill["ec_transfer_params"] == {"encoder_url": "http://enc"} and "ec_transfer_params" not in decode
