"""A replica's vision encoder: its encoder cache, the encodes in flight, and the EPD handoff of encoder
outputs (ec_transfer_params) from the encode replica to the prefill."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from epdbench.physics.costmodel import image_tokens, transfer_seconds
from epdbench.sim import logfmt
from epdbench.sim.tokenizer import image_size

if TYPE_CHECKING:
    from epdbench.sim.replica import Replica


class PullError(RuntimeError):
    """A pull from another replica failed: the request is answered 502."""


class Encoder:
    def __init__(self, replica: Replica):
        self.replica = replica
        self.lock = asyncio.Lock()                     # the encode replica's GPU
        self.cache: set[str] = set()
        self.encoding: dict[str, asyncio.Future] = {}  # image hash -> its encode in progress

    def tokens(self, image: bytes) -> int:
        return image_tokens(self.replica.spec.model, *image_size(image))

    async def image_work(self, rid: str, body: dict, images: list[bytes], hashes: list[str]) -> int:
        """Image tokens this replica must encode itself (0 when the encoder output was pulled)."""
        if not images:
            return 0
        r = self.replica
        ecp = body.get("ec_transfer_params") or {}
        if r.config.topology == "epd" and ecp.get("encoder_url"):
            await self.pull_embeddings(rid, ecp["encoder_url"], hashes, images)
            return 0
        todo = 0
        for h, b in zip(hashes, images):
            r.counters.mm_cache_queries += 1
            if h in self.cache:
                r.counters.mm_cache_hits += 1
            else:
                self.cache.add(h)
                todo += self.tokens(b)
        return todo

    async def encode_images(self, rid: str, images: list[bytes], hashes: list[str]) -> None:
        """Run the vision encoder on the images not in the encoder cache. As vLLM's encoder cache manager,
        an image already being encoded for another request is a hit: this request waits for that output."""
        r = self.replica
        todo = cached = 0
        mine: list[str] = []
        waits: list[asyncio.Future] = []
        for h, b in zip(hashes, images):
            r.counters.mm_cache_queries += 1
            if h in self.cache or h in self.encoding:
                r.counters.mm_cache_hits += 1
                cached += 1
                if h in self.encoding:
                    waits.append(self.encoding[h])
                continue
            if h not in mine:
                mine.append(h)
                self.encoding[h] = asyncio.get_running_loop().create_future()
                todo += self.tokens(b)
        try:
            async with self.lock:
                seconds = r.cost.encode_seconds(todo) + (r.spec.hardware.step_overhead_ms / 1e3 if todo else 0)
                await asyncio.sleep(seconds * r.time_scale)
            self.cache.update(mine)
        finally:
            for h in mine:
                fut = self.encoding.pop(h)
                if not fut.done():
                    fut.set_result(None)
        if waits:
            await asyncio.gather(*waits)
        r.engine_log(f"Encoded {len(images)} image(s) for {rid}: {todo} tokens computed, "
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
                                  json={"hashes": hashes, "bytes": n_bytes, "request_id": rid}) as resp:
            if resp.status != 200:
                raise PullError(f"encoder cache pull failed for {rid}: HTTP {resp.status} {await resp.text()}")
        r.counters.ec_bytes += n_bytes
        r.engine_log(f"ec_consumer loaded {len(hashes)} encoder output(s) for {rid}: {n_bytes} bytes "
                     f"from {encoder_url} {logfmt.EMULATED_MARK}", file="ec_connector.py")

    async def ec_pull(self, request: web.Request) -> web.Response:
        """Encode side of the EPD handoff: send the asked encoder outputs over the pod's link."""
        r = self.replica
        body = await request.json()
        missing = [h for h in body.get("hashes", []) if h not in self.cache]
        if missing:
            r.engine_log(f"EC pull for {body.get('request_id')}: missing {missing}", level="ERROR",
                         file="ec_connector.py")
            return web.json_response({"error": f"missing {missing}"}, status=404)
        async with r.link_lock:
            await asyncio.sleep(transfer_seconds(r.spec.hardware, "tcp", int(body.get("bytes", 0))) * r.time_scale)
        return web.json_response({"ok": True})
