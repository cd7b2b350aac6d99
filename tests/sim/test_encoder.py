"""sim/encoder.py: the encoder cache's token budget (vLLM's derivation) and its least-recently-used eviction; the
API server's image preprocessing and which replica does it."""
from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import pytest
from PIL import Image

from epdbench.physics.costmodel import CostModel
from epdbench.sim.encoder import Encoder, EncoderCache
from epdbench.sim.metrics import Counters
from epdbench.sim.tokenizer import image_hash
from epdbench.sim.vloop import run
from epdbench.specs.models import EngineSpec, HardwareSpec, ModelSpec, VisionSpec

# Images of at most 1000 tokens (784,000 px) and a 1024-token context: vLLM's encoder cache is then
# max(max_num_batched_tokens = 16, largest item = 1000) = 1000 tokens, room for two 560×560 images (400 each).
MODEL = ModelSpec(name="toy/vl", params_b=1.0, n_layers=4, hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64,
                  vision=VisionSpec(params_b=0.1, embed_dim=256, max_pixels=1000 * 28 * 28))
GPU = HardwareSpec(gpu="toy", bf16_tflops=1000, hbm_tb_s=1.0, nvlink_gb_s=100, tcp_gb_s=1.0, rdma_nic_gbit_s=100,
                   step_overhead_ms=0.0)


def replica(topology: str = "aggregated") -> SimpleNamespace:
    spec = SimpleNamespace(model=MODEL, hardware=GPU, engine=EngineSpec(max_num_batched_tokens=16, max_model_len=1024))
    log: list[str] = []
    return SimpleNamespace(spec=spec, config=SimpleNamespace(topology=topology, ec_expected="tcp"), counters=Counters(),
                           log=log, cost=CostModel(MODEL, GPU), time_scale=1.0, pid=1,
                           role="encode" if topology == "epd" else "server",
                           engine=SimpleNamespace(clock=lambda: asyncio.get_running_loop().time(), gpu=None),
                           engine_log=lambda msg, **kw: log.append(msg))


def bmp(shade: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (560, 560), color=(shade, 0, 0)).save(buf, format="BMP")
    return buf.getvalue()


A, B, C = bmp(1), bmp(2), bmp(3)


def test_the_least_recently_used_outputs_make_room():
    cache = EncoderCache(1000)
    cache.add("a", 400)
    cache.add("b", 400)
    assert cache.hit("a")                      # a is now the most recently used
    cache.add("c", 400)                        # 1200 > 1000: b goes
    assert "a" in cache and "c" in cache and "b" not in cache
    assert (cache.used_tokens, cache.evictions) == (800, 1)
    cache.add("huge", 1001)                    # larger than the whole cache: not kept, nothing evicted
    assert "huge" not in cache and len(cache) == 2


def test_an_evicted_image_is_encoded_again_on_its_next_use():
    r = replica()
    enc = Encoder(r)
    assert enc.cache.capacity_tokens == 1000 and enc.tokens(A) == 400

    def work(image: bytes) -> int:
        return sum(asyncio.run(enc.image_work("r", {}, [image], [image_hash(image)])))
    assert [work(A), work(B), work(A), work(C), work(A), work(B)] == [400, 400, 0, 400, 0, 400]
    assert (r.counters.mm_cache_queries, r.counters.mm_cache_hits) == (6, 2)


def test_the_encode_role_reencodes_an_evicted_image_but_still_serves_its_stored_output():
    r = replica("epd")
    enc = Encoder(r)

    async def encode(*images: bytes) -> None:
        await enc.encode_images("r", list(images), [image_hash(im) for im in images])
    asyncio.run(encode(A, B, C))               # 1200 tokens through a 1000-token cache: A is evicted
    assert image_hash(A) not in enc.cache and {image_hash(A), image_hash(B), image_hash(C)} == enc.stored
    asyncio.run(encode(A))
    assert "400 tokens computed" in r.log[-1] and image_hash(A) in enc.cache
    asyncio.run(encode(C))
    assert "0 tokens computed, 1 image(s) from cache" in r.log[-1]


@pytest.mark.parametrize("topology, role", [
    ("aggregated", "server"), ("pd", "prefill"), ("pd", "decode"), ("epd", "encode"), ("epd", "prefill"),
    ("epd", "decode")])
def test_every_replica_on_the_path_preprocesses_the_images(topology, role):
    # each is sent the whole request and runs vLLM's multimodal processor on it before its engine sees it
    r = replica(topology)
    r.role = role
    r.spec.hardware = GPU.model_copy(update={"image_preprocess_ms": 1.5, "image_preprocess_ms_per_mp": 100.0})
    enc = Encoder(r)

    async def preprocess(*images: bytes) -> float:
        await enc.preprocess(list(images), [image_hash(im) for im in images])
        return asyncio.get_running_loop().time()
    modelled = (1.5 + 100.0 * 0.3136) * 2 / 1e3                          # two 560×560 images
    assert run(preprocess(A, B)) == pytest.approx(modelled)
    assert run(preprocess()) == 0.0


def test_one_request_is_preprocessed_at_a_time():
    r = replica()
    r.role = "server"
    r.spec.hardware = GPU.model_copy(update={"image_preprocess_ms": 10.0, "image_preprocess_ms_per_mp": 0.0})
    enc = Encoder(r)

    async def two_requests() -> list[float]:
        ends: list[float] = []

        async def one(image: bytes) -> None:
            await enc.preprocess([image], [image_hash(image)])
            ends.append(asyncio.get_running_loop().time())
        await asyncio.gather(one(A), one(B))
        return ends
    assert run(two_requests()) == pytest.approx([0.010, 0.020])


def test_an_image_in_the_processor_cache_is_only_decoded_and_hashed():
    r = replica()
    r.role = "server"
    r.spec.hardware = GPU.model_copy(update={"image_preprocess_ms": 1.0, "image_preprocess_ms_per_mp": 100.0,
                                             "image_decode_ms_per_mp": 30.0})
    enc = Encoder(r)
    assert enc.processed_bytes(A) == 1600 * 3 * 2 * 14 * 14 * 4      # 560 px: 1600 patches of float32 pixel_values

    async def preprocess(image: bytes) -> float:
        t0 = asyncio.get_running_loop().time()
        await enc.preprocess([image], [image_hash(image)])
        return asyncio.get_running_loop().time() - t0
    assert [run(preprocess(im)) for im in (A, A, B)] == pytest.approx([(1.0 + 100.0 * 0.3136) / 1e3,
                                                                       (1.0 + 30.0 * 0.3136) / 1e3,
                                                                       (1.0 + 100.0 * 0.3136) / 1e3])
