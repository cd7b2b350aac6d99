"""A replica's image path: the API server's preprocessing, the vision encoder with its encoder cache and the
encodes in flight, and the EPD handoff of encoder outputs (ec_transfer_params) from the encode replica to the
prefill."""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import TYPE_CHECKING

from aiohttp import web

from epdbench.physics.costmodel import (encoder_cache_tokens, image_preprocess_seconds, image_tokens,
                                        link_bytes_per_s, setup_seconds)
from epdbench.sim import logfmt
from epdbench.sim.nixl_kv import NixlLog
from epdbench.sim.tokenizer import image_size

if TYPE_CHECKING:
    from epdbench.sim.replica import Replica


# vLLM's multimodal processor cache (vllm/config/multimodal.py: mm_processor_cache_gb 4, type lru; one per API
# server): an image whose processed output it holds skips the image processor, not its decode and hash
MM_PROCESSOR_CACHE_BYTES = 4 * 2 ** 30


class PullError(RuntimeError):
    """A pull from another replica failed: the request is answered 502."""


class EncoderCache:
    """Encoder outputs by image hash within a budget of image tokens, as vLLM's encoder cache
    (vllm/v1/core/encoder_cache_manager.py): when a new output does not fit, the oldest unused ones are evicted
    (vLLM evicts, oldest first, the outputs no running request references; here every output is
    evictable and a hit makes it the newest). An evicted image is encoded again on its next use; an output
    larger than the whole budget is not kept."""

    def __init__(self, capacity_tokens: int):
        self.capacity_tokens = capacity_tokens
        self.used_tokens = 0
        self._outputs: OrderedDict[str, int] = OrderedDict()   # image hash -> its tokens, oldest use first
        self.evictions = 0

    def __contains__(self, h: str) -> bool:
        return h in self._outputs

    def __len__(self) -> int:
        return len(self._outputs)

    def hit(self, h: str) -> bool:
        """Whether the output is cached; a hit makes it the most recently used."""
        if h not in self._outputs:
            return False
        self._outputs.move_to_end(h)
        return True

    def add(self, h: str, tokens: int) -> None:
        if h in self._outputs or tokens > self.capacity_tokens:
            return
        while self.used_tokens + tokens > self.capacity_tokens:
            _, freed = self._outputs.popitem(last=False)
            self.used_tokens -= freed
            self.evictions += 1
        self._outputs[h] = tokens
        self.used_tokens += tokens


class Encoder:
    def __init__(self, replica: Replica):
        self.replica = replica
        self.lock = asyncio.Lock()                     # the encode replica's GPU
        self.cache = EncoderCache(encoder_cache_tokens(replica.spec.model, replica.spec.engine))
        self.stored: set[str] = set()                  # outputs an encode replica handed to its EC connector
        self.encoding: dict[str, asyncio.Future] = {}  # image hash -> its encode in progress
        # vLLM's API server runs the multimodal processor on one worker thread (vllm/renderers/base.py
        # `_mm_executor`, renderer_num_workers 1 by default): one request's images at a time
        self.preprocessor = asyncio.Lock()
        self.processed = EncoderCache(MM_PROCESSOR_CACHE_BYTES)   # the same LRU, in bytes of pixel_values
        # EPD: ECCPUConnector moves encoder outputs over NIXL (the prefill READs them from the encode pod)
        epd_side = replica.config.topology == "epd" and replica.role in ("encode", "prefill")
        self.nixl = NixlLog(replica, replica.config.ec_expected, path="ec") if epd_side else None

    def tokens(self, image: bytes) -> int:
        return image_tokens(self.replica.spec.model, *image_size(image))

    def processed_bytes(self, image: bytes) -> int:
        """Size of an image's processed output (pixel_values, float32): 3 · temporal · patch² values a patch."""
        v = self.replica.spec.model.vision
        patches = self.tokens(image) * v.spatial_merge_size ** 2
        return patches * 3 * v.temporal_patch_size * v.patch_size ** 2 * 4

    async def preprocess(self, images: list[bytes], hashes: list[str]) -> None:
        """The API server's CPU work on a request's images before it reaches the engine (image_preprocess_seconds:
        decode and hash, then resize and normalise unless this API server's processor cache holds the image).
        Every replica a request with images is sent to does it: the routers forward the whole request to each leg
        (vllm-router's PD mode; vLLM's disagg_epd_proxy.py sends the original request to the encode, prefill and
        decode servers) and vLLM's API server runs the multimodal processor on every request it is sent, before
        the engine, whatever the engine then computes or loads (vllm/renderers)."""
        if not images:
            return
        r = self.replica
        async with self.preprocessor:
            full, cached = [], []
            for h, b in zip(hashes, images):
                (cached if self.processed.hit(h) else full).append(image_size(b))
                self.processed.add(h, self.processed_bytes(b))
            await asyncio.sleep(image_preprocess_seconds(r.spec.hardware, full, cached) * r.time_scale)

    async def image_work(self, rid: str, body: dict, images: list[bytes], hashes: list[str]) -> list[int]:
        """Tokens of each image this replica must encode itself (none when the encoder outputs were pulled)."""
        if not images:
            return []
        r = self.replica
        ecp = body.get("ec_transfer_params") or {}
        if r.config.topology == "epd" and ecp.get("encoder_url"):
            await self.pull_embeddings(rid, ecp["encoder_url"], hashes, images)
            return []
        todo: list[int] = []
        for h, b in zip(hashes, images):
            r.counters.mm_cache_queries += 1
            if self.cache.hit(h):
                r.counters.mm_cache_hits += 1
            else:
                n = self.tokens(b)
                self.cache.add(h, n)
                todo.append(n)
        return todo

    async def encode_images(self, rid: str, images: list[bytes], hashes: list[str], notes=None) -> None:
        """Run the vision encoder on the images not in the encoder cache. As vLLM's encoder cache manager,
        an image already being encoded for another request is a hit: this request waits for that output.
        A traced request's notes (sim.spans.RequestNotes) get (queued, encoder started, encoder done)."""
        r = self.replica
        cached = 0
        mine: dict[str, int] = {}
        waits: list[asyncio.Future] = []
        for h, b in zip(hashes, images):
            r.counters.mm_cache_queries += 1
            if self.cache.hit(h) or h in self.encoding:
                r.counters.mm_cache_hits += 1
                cached += 1
                if h in self.encoding:
                    waits.append(self.encoding[h])
                continue
            if h not in mine:
                mine[h] = self.tokens(b)
                self.encoding[h] = asyncio.get_running_loop().create_future()
        todo = list(mine.values())
        clock = r.engine.clock           # the replica's (host perf_counter; in virtual time the loop's)
        queued = clock()
        try:
            async with self.lock:
                started = clock()
                seconds = r.cost.encode_seconds(todo) + (r.spec.hardware.step_overhead_ms / 1e3 if todo else 0)
                if r.engine.gpu is not None:      # virtual time, a GPU shared with other engines (sim.gpu)
                    await r.engine.on_shared_gpu(started, seconds)
                    seconds = clock() - started
                else:
                    await asyncio.sleep(seconds * r.time_scale)
                if notes is not None:
                    notes.encode = (queued, started, clock())
            for h, n in mine.items():
                self.cache.add(h, n)
        finally:
            for h in mine:
                fut = self.encoding.pop(h)
                if not fut.done():
                    fut.set_result(None)
        if waits:
            await asyncio.gather(*waits)
        self.stored.update(hashes)
        r.engine_log(f"Encoded {len(images)} image(s) for {rid}: {sum(todo)} tokens computed, "
                     f"{cached} image(s) from cache "
                     f"in {seconds * 1e3:.1f} ms; ec_producer stored {','.join(hashes)} "
                     f"(ECCPUConnector) {logfmt.EMULATED_MARK}", file="ec_connector.py")

    def transfer_params(self) -> dict:
        """The ec_transfer_params an encode replica answers with: where to pull its outputs from."""
        return {"encoder_url": f"http://{self.replica.host}:{self.replica.port}"}

    async def pull_embeddings(self, rid: str, encoder_url: str, hashes: list[str], images: list[bytes]) -> None:
        r = self.replica
        n_tok = sum(self.tokens(b) for b in images)
        n_bytes = r.cost.embedding_bytes(n_tok)
        assert r.session is not None
        async with r.session.post(f"{encoder_url}/epdbench/ec_pull",
                                  json={"hashes": hashes, "bytes": n_bytes, "request_id": rid,
                                        "engine_id": r.engine_id}) as resp:
            if resp.status != 200:
                raise PullError(f"encoder cache pull failed for {rid}: HTTP {resp.status} {await resp.text()}")
        r.counters.ec_bytes += n_bytes
        if self.nixl:
            self.nixl.peer(encoder_url)
            for h in hashes:
                self.nixl.ec_read_done("consumer", h)
        r.engine_log(f"ec_consumer loaded {len(hashes)} encoder output(s) for {rid}: {n_bytes} bytes "
                     f"from {encoder_url} {logfmt.EMULATED_MARK}", file="ec_connector.py")

    async def ec_pull(self, request: web.Request) -> web.Response:
        """Encode side of the EPD handoff: send the asked encoder outputs over the pod's link."""
        r = self.replica
        body = await request.json()
        missing = [h for h in body.get("hashes", []) if h not in self.stored]
        if missing:
            r.engine_log(f"EC pull for {body.get('request_id')}: missing {missing}", level="ERROR",
                         file="ec_connector.py")
            return web.json_response({"error": f"missing {missing}"}, status=404)
        hw, ec = r.spec.hardware, r.config.ec_expected   # one transfer over the pod's shared link, as sim.vcluster
        if self.nixl:
            self.nixl.peer(body.get("engine_id"))
        await r.link.send(setup_seconds(hw, ec, 1, "nixl"),
                          int(body.get("bytes", 0)) / link_bytes_per_s(hw, ec, r.role_spec.rdma_interfaces))
        if self.nixl:
            for h in body.get("hashes", []):
                self.nixl.ec_read_done("producer", h)
        return web.json_response({"ok": True})
