"""sim/proxy.py's EPD legs as real vLLM engines receive them (the local target puts it in front of vLLM 0.26): the
encode leg a one-token, non-streamed copy of the request; the prefill leg with `do_remote_decode`; the decode leg
with the prefill's kv_transfer_params; the encoder's ec_transfer_params passed on only when it answered some."""
import asyncio

from epdbench.sim.proxy import Proxy
from tests.sim.fake_engines import Served, engine, post

IMAGE = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                                     {"type": "text", "text": "what is it?"}]}


async def run(encoder_answer: dict) -> list:
    seen: list = []
    served, urls = Served(), {}
    answers = {"encode": encoder_answer, "decode": {},
               "prefill": {"kv_transfer_params": {"remote_engine_id": "p", "remote_block_ids": [1]}}}
    for role, answer in answers.items():
        urls[role] = await served.start(engine(role, seen, answer))
    proxy = await served.start_proxy(Proxy([], [urls["encode"]], [urls["prefill"]], [urls["decode"]]))
    body = {"model": "m", "messages": [IMAGE], "max_completion_tokens": 128, "stream": False, "request_id": "req-1"}
    status, _ = await post(proxy, body)
    assert status == 200
    await served.close()
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
