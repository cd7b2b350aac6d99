"""sim/replica.py in process (aiohttp's test server on loopback): what the request path charges the encoder and
the API server's image preprocessing, and the engine's KV figures on /metrics."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image

from epdbench.sim.replica import Replica
from epdbench.sim.server import app
from epdbench.sim.tokenizer import VOCAB, image_hash


def bmp(shade: int, px: int = 56) -> bytes:
    """A px×px image (56: 4 tokens); BMP, so its bytes (and hash) do not depend on a compression library."""
    buf = io.BytesIO()
    Image.new("RGB", (px, px), color=(shade % 256, shade // 256, 7)).save(buf, format="BMP")
    return buf.getvalue()


def chat(image: bytes, text: str) -> dict:
    url = "data:image/bmp;base64," + base64.b64encode(image).decode()
    return {"model": "Qwen/Qwen2.5-VL-7B-Instruct", "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": text}]}]}


async def _serve(replica: Replica, bodies: list[dict],
                 latencies: list[float] | None = None) -> tuple[list[dict], str]:
    """Answers to the bodies sent one at a time, and /metrics after; each answer's seconds into `latencies`."""
    replica.engine.start()
    client = TestClient(TestServer(app(replica)))
    await client.start_server()
    try:
        out = []
        for body in bodies:
            t0 = time.perf_counter()
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status == 200, await resp.text()
            out.append(await resp.json())
            if latencies is not None:
                latencies.append(time.perf_counter() - t0)
        metrics = await (await client.get("/metrics")).text()
        return out, metrics
    finally:
        await client.close()
        await replica.engine.stop()


def test_a_new_image_after_the_same_text_with_another_image_is_encoded(tiny_spec):
    # Two images whose hashes agree in the 17 bits a single placeholder id per image used to keep (found by a
    # birthday search over shades): with that id, the second request hit the first one's KV through its image
    # and skipped the encoder.
    first, second = bmp(222), bmp(464)
    assert int(image_hash(first)[:8], 16) % VOCAB == int(image_hash(second)[:8], 16) % VOCAB
    text = "what is shown in this picture and which colours does it use, in one short sentence please"
    replica = Replica(tiny_spec, tiny_spec.configuration("aggregated"), "server", 0, "127.0.0.1", 0, None)
    answers, metrics = asyncio.run(_serve(replica, [chat(first, text), chat(second, text)]))
    assert replica.engine.stats.encoder_tokens == 4 + 4        # both images went through the vision encoder
    assert replica.counters.mm_cache_hits == 0
    assert answers[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    lbl = 'engine="0",model_name="Qwen/Qwen2.5-VL-7B-Instruct"'
    assert f"vllm:num_preemptions_total{{{lbl}}} 0" in metrics
    assert f"vllm:kv_cache_usage_perc{{{lbl}}} 0.000000" in metrics


def test_a_bigger_image_reaches_its_first_token_later_by_its_modelled_preprocessing(tiny_spec):
    def body(shade: int, px: int) -> dict:
        return dict(chat(bmp(shade, px), "describe it"), max_tokens=1)
    # after a warm-up (the first image request's one-time host costs), two new images of each size, alternating:
    # the faster of each pair, as the host's jitter only adds
    bodies = [body(9, 560)] + [body(shade, px) for shade in (1, 2) for px in (56, 560)]

    def latencies(ms_per_mp: float) -> tuple[float, float]:
        hw = tiny_spec.hardware.model_copy(update={"image_preprocess_ms": 0.0, "image_preprocess_ms_per_mp": ms_per_mp})
        spec = tiny_spec.model_copy(update={"hardware": hw})
        replica = Replica(spec, spec.configuration("aggregated"), "server", 0, "127.0.0.1", 0, None)
        seconds: list[float] = []
        asyncio.run(_serve(replica, bodies, seconds))
        return min(seconds[1::2]), min(seconds[2::2])
    (small_on, big_on), (small_off, big_off) = latencies(400.0), latencies(0.0)
    # 400 ms per megapixel: 125.4 ms for 560 × 560 px, 1.3 ms for 56 × 56 px; the host's jitter is a few ms
    assert big_on - big_off == pytest.approx(0.4 * 0.3136, abs=0.03)
    assert small_on - small_off == pytest.approx(0.4 * 0.003136, abs=0.03)


def test_a_streamed_token_is_written_once_its_modelled_output_path_is_done(tiny_spec):
    """With 5 ms per token on the API server's output path, every chunk reaches the client no earlier than the
    stamp it carries (when it was modelled to leave the API server), and a lone request's first token comes
    at least that much after its send."""
    from epdbench.analysis.logformats import MODELLED_FIELD
    hw = tiny_spec.hardware.model_copy(update={"output_us_per_token": 5000.0})
    spec = tiny_spec.model_copy(update={"hardware": hw})
    replica = Replica(spec, spec.configuration("aggregated"), "server", 0, "127.0.0.1", 0, None)

    async def go():
        replica.engine.start()
        client = TestClient(TestServer(app(replica)))
        await client.start_server()
        try:
            t0 = time.perf_counter_ns()
            resp = await client.post("/v1/completions", json={"model": spec.model.name, "prompt": "hello there",
                                                              "max_tokens": 4, "stream": True})
            chunks = []
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    stamp = json.loads(line[6:]).get(MODELLED_FIELD)
                    if stamp is not None:
                        chunks.append((stamp, time.perf_counter_ns()))
            return t0, chunks
        finally:
            await client.close()
            await replica.engine.stop()
    t0, chunks = asyncio.run(go())
    assert len(chunks) == 4
    assert all(arrived >= stamp for stamp, arrived in chunks)
    assert chunks[0][0] - t0 >= 5e6
