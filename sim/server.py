"""One simulated vLLM replica (role server, prefill, decode or encode) on a loopback port.

Speaks the vLLM OpenAI API (completions, chat completions with image data URLs, streaming with
usage, /tokenize, /v1/models, /health, /metrics) and the PD/EPD handoff through
kv_transfer_params / ec_transfer_params. KV and encoder outputs really cross process
boundaries (HTTP pull between replicas), timed by the cost model; logs are written in vLLM,
uvicorn and Mooncake formats, every transport line marked as emulated.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from epdbench.sim import logfmt
from epdbench.physics.costmodel import CostModel, image_tokens, transfer_seconds
from epdbench.sim.engine import Engine, Sequence
from epdbench.sim.prefix_cache import PrefixCache
from epdbench.sim.tokenizer import chat_parts, image_end_positions, image_hash, image_size, prompt_ids
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, load_spec

OUTPUT_WORDS = ["the", "model", "answers", "with", "tokens", "that", "stream", "back", "to", "you"]


def log(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class Counters:
    request_success: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prompt_by_source: dict[str, int] = field(
        default_factory=lambda: {"local_compute": 0, "local_cache_hit": 0, "external_kv_transfer": 0})
    mm_cache_queries: int = 0
    mm_cache_hits: int = 0
    kv_bytes: int = 0
    kv_transfers: int = 0
    kv_failed_transfers: int = 0
    kv_failed_recvs: int = 0
    kv_xfer_seconds: float = 0.0
    ec_bytes: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0


class Replica:
    def __init__(self, spec: ExperimentSpec, config: ConfigurationSpec, role: str, replica: int,
                 host: str, port: int, bootstrap_port: int | None):
        self.spec, self.config, self.role, self.replica = spec, config, role, replica
        self.host, self.port, self.bootstrap_port = host, port, bootstrap_port
        role_spec = config.role(role)
        assert role_spec is not None, f"configuration {config.name} has no role {role}"
        self.role_spec = role_spec
        self.cost = CostModel(spec.model, spec.hardware, role_spec.tp)
        self.engine = Engine(self.cost, spec.engine)
        self.pid = os.getpid()
        self.engine_id = f"{config.name}-{role}-{replica}-{uuid.uuid4().hex[:8]}"
        self.counters = Counters()
        self.transfers: dict[str, tuple[int, str]] = {}  # transfer id -> (prompt tokens, request id)
        self.link_lock = asyncio.Lock()                   # the sending pod's NIC(s): one transfer at a time
        self.encoder_lock = asyncio.Lock()                # the encode replica's GPU
        self.encoder_cache: set[str] = set()
        self.encoding: dict[str, asyncio.Future] = {}     # image hash -> its encode in progress
        self.prefix_cache = (PrefixCache(self.kv_capacity_tokens())
                             if spec.engine.enable_prefix_caching and role in ("server", "prefill", "decode")
                             else None)
        self.window = {"bytes": 0, "count": 0, "lat_ms": []}
        self.session: aiohttp.ClientSession | None = None
        self.genuine = spec.target.sim.kv_engine == "mooncake" and self.moves_kv
        self.mooncake = None  # sim.mooncake_kv.MooncakeKV once serving, in genuine mode
        # Every line about KV movement carries the emulated mark, unless real bytes move (genuine mode).
        self.kv_mark = "" if self.genuine else f" {logfmt.EMULATED_MARK}"

    def kv_capacity_tokens(self) -> int:
        """KV cache of the replica: memory left after the weights, over bytes per token."""
        total = self.spec.hardware.hbm_gb * 1e9 * self.spec.engine.gpu_memory_utilization * self.role_spec.tp
        return max(0, int((total - self.spec.model.weight_bytes) / self.spec.model.kv_bytes_per_token))

    # --- logging -------------------------------------------------------------------------
    def api_log(self, msg: str, level: str = "INFO", file: str = "api_server.py", line: int = 1) -> None:
        log(logfmt.vllm_line("APIServer", self.pid, level, file, line, msg))

    def engine_log(self, msg: str, level: str = "INFO", file: str = "scheduler.py", line: int = 1) -> None:
        log(logfmt.vllm_line("EngineCore_DP0", self.pid, level, file, line, msg))

    def mc_log(self, msg: str, severity: str = "I", file: str = "transfer_engine.cpp", line: int = 1) -> None:
        log(logfmt.glog_line(severity, self.pid, file, line, msg))

    @property
    def transport(self) -> str:
        return self.config.kv_transport

    @property
    def moves_kv(self) -> bool:
        return self.role in ("prefill", "decode")

    def startup_lines(self) -> None:
        hw = self.spec.hardware
        what = "[epdbench sim: emulated GPU, genuine Mooncake KV transport]" if self.genuine else logfmt.EMULATED_MARK
        self.api_log(f"epdbench simulator {what}: vLLM API server role={self.role} "
                     f"replica={self.replica} config={self.config.name} model={self.spec.model.name} "
                     f"tp={self.role_spec.tp} hardware={hw.gpu}")
        if self.moves_kv:
            kv_role = "kv_producer" if self.role == "prefill" else "kv_consumer"
            self.engine_log(f"Creating v1 connector with name: MooncakeConnector and engine_id: {self.engine_id} "
                            f"(kv_role={kv_role}){self.kv_mark}", file="factory.py")
            self.engine_log("Registering KV_Caches. use_mla: False", file="mooncake_connector.py")
            if self.genuine:
                from epdbench.sim.mooncake_kv import MooncakeKV
                self.mooncake = MooncakeKV(self.host, self.spec.target.sim.kv_buffer_mb * 1024 ** 2)
                self.engine_log(f"Genuine KV transport: Mooncake transfer engine session {self.mooncake.session}, "
                                f"moving {self.spec.target.sim.kv_scale:g} of modelled KV bytes",
                                file="mooncake_connector.py")
            elif self.transport == "tcp":
                self.mc_log("MC_FORCE_TCP is set, using TCP transport only")
                self.mc_log("No RDMA devices found, check your device installation", "W", "topology.cpp")
                self.mc_log("Topology discovery complete. Found 0 HCAs.")
                self.mc_log(f"TcpTransport: listen on port {self.port + 10000}", file="tcp_transport.cpp")
            else:
                n = self.role_spec.rdma_interfaces
                self.mc_log(f"Topology discovery complete. Found {n} HCAs.")
                self.mc_log("installTransport, type=rdma", file="transfer_engine_impl.cpp")
                for i in range(n):
                    self.mc_log(f"RDMA device: sim_mlx5_{i}, LID: 0, GID: (GID_Index 0) "
                                "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00", file="rdma_context.cpp")
            if not self.genuine:
                self.mc_log(f"Transfer Engine RPC using P2P handshake, listening on {self.host}:{self.port + 10000}")
        self.api_log(f"Starting vLLM API server 0 on http://{self.host}:{self.port}", file="launcher.py")

    # --- request parsing -----------------------------------------------------------------
    def parse(self, body: dict, chat: bool) -> tuple[list[int], list[bytes], list[int]]:
        """(prompt token ids, raw images, where each image's tokens end) of a request body."""
        if chat:
            text, images = chat_parts(body.get("messages") or [])
            placed = [(image_hash(b), image_tokens(self.spec.model, *image_size(b))) for b in images]
            overhead = self.spec.model.chat_overhead_tokens
            return prompt_ids(text, placed, True, overhead), images, image_end_positions(placed, overhead)
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        return prompt_ids(prompt, [], False, 0), [], []

    # --- handlers --------------------------------------------------------------------------
    async def generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
            ids, images, image_ends = self.parse(body, chat)
            prompt_tokens = len(ids)
        except (ValueError, json.JSONDecodeError, OSError) as e:
            return web.json_response({"error": {"message": f"bad request: {e}", "code": 400}}, status=400)
        if images and self.spec.model.vision is None:
            return web.json_response({"error": {"message": "model is not multimodal", "code": 400}}, status=400)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if prompt_tokens + max_tokens > self.spec.engine.max_model_len:
            msg = (f"This model's maximum context length is {self.spec.engine.max_model_len} tokens. However, "
                   f"you requested {prompt_tokens + max_tokens} tokens.")
            return web.json_response({"error": {"message": msg, "code": 400}}, status=400)
        client_id = body.get("request_id") or request.headers.get("X-Request-Id") or uuid.uuid4().hex
        prefix = "chatcmpl" if chat else "cmpl"
        rid = f"{prefix}-{client_id}"
        kvp = body.get("kv_transfer_params") or {}
        self.api_log(f"Received request {rid}: role={self.role} prompt_tokens={prompt_tokens} "
                     f"max_tokens={max_tokens} images={len(images)} "
                     f"kv_transfer_params={json.dumps(kvp, sort_keys=True) if kvp else None}",
                     file="logger.py", line=49)

        seq = Sequence(request_id=rid, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
        hashes = [image_hash(b) for b in images]
        cached = self.prefix_lookup(seq, ids, kvp)
        prefill_only = self.role in ("prefill", "encode") or bool(kvp.get("do_remote_decode"))
        if prefill_only:
            seq.max_tokens = 1
        try:
            if self.role == "encode":
                await self.encode_images(rid, images, hashes)
                return await self.respond_prefill_only(request, body, rid, seq, chat, kvp=None)
            # As vLLM's scheduler: an image whose tokens lie inside the cached prefix needs neither the
            # encoder nor its encoder output (its KV is already there).
            todo = [i for i, end in enumerate(image_ends) if end > cached]
            if todo:
                seq.image_tokens = await self.image_work(rid, body, [images[i] for i in todo],
                                                         [hashes[i] for i in todo])
            if self.role == "decode" and kvp.get("do_remote_prefill"):
                ok = await self.pull_kv(rid, kvp, prompt_tokens - cached)
                if ok:
                    seq.computed = prompt_tokens - 1  # last prompt token is recomputed locally
                    seq.image_tokens = 0
            elif self.role == "decode":
                self.engine_log(f"Request {rid} arrived without kv_transfer_params: prefilling locally",
                                level="WARNING", file="mooncake_connector.py")
        except PullError as e:
            return web.json_response({"error": {"message": str(e), "code": 502}}, status=502)
        self.counters.prompt_tokens += prompt_tokens
        external = seq.computed - cached
        self.counters.prompt_by_source["local_compute"] += prompt_tokens - seq.computed
        self.counters.prompt_by_source["local_cache_hit"] += cached
        self.counters.prompt_by_source["external_kv_transfer"] += external
        self.engine_log(f"Added request {rid}.", file="scheduler.py")
        self.engine.submit(seq)
        if prefill_only:
            return await self.respond_prefill_only(request, body, rid, seq, chat, kvp=kvp)
        if body.get("stream"):
            return await self.stream(request, body, rid, seq, chat)
        return await self.complete(request, body, rid, seq, chat)

    def prefix_lookup(self, seq: Sequence, ids: list[int], kvp: dict) -> int:
        """Start the sequence after its cached prefix (vLLM automatic prefix caching); returns the
        cached tokens. On a decode leg, the KV connector then loads only the blocks not cached locally."""
        if self.prefix_cache is None:
            return 0
        cached = self.prefix_cache.lookup(ids)
        self.counters.prefix_queries += len(ids)
        self.counters.prefix_hits += cached
        seq.computed = seq.cached = cached
        seq.on_prefilled = lambda: self.prefix_cache.insert(ids)
        return cached

    async def image_work(self, rid: str, body: dict, images: list[bytes], hashes: list[str]) -> int:
        """Image tokens this replica must encode itself (0 when the encoder output was pulled)."""
        if not images:
            return 0
        ecp = body.get("ec_transfer_params") or {}
        if self.config.topology == "epd" and ecp.get("encoder_url"):
            await self.pull_embeddings(rid, ecp["encoder_url"], hashes, images)
            return 0
        todo = 0
        for h, b in zip(hashes, images):
            self.counters.mm_cache_queries += 1
            if h in self.encoder_cache:
                self.counters.mm_cache_hits += 1
            else:
                self.encoder_cache.add(h)
                todo += image_tokens(self.spec.model, *image_size(b))
        return todo

    async def encode_images(self, rid: str, images: list[bytes], hashes: list[str]) -> None:
        """Run the vision encoder on the images not in the encoder cache. As vLLM's encoder cache manager,
        an image already being encoded for another request is a hit: this request waits for that output."""
        todo = cached = 0
        mine: list[str] = []
        waits: list[asyncio.Future] = []
        for h, b in zip(hashes, images):
            self.counters.mm_cache_queries += 1
            if h in self.encoder_cache or h in self.encoding:
                self.counters.mm_cache_hits += 1
                cached += 1
                if h in self.encoding:
                    waits.append(self.encoding[h])
                continue
            if h not in mine:
                mine.append(h)
                self.encoding[h] = asyncio.get_running_loop().create_future()
                todo += image_tokens(self.spec.model, *image_size(b))
        try:
            async with self.encoder_lock:
                seconds = self.cost.encode_seconds(todo) + (self.spec.hardware.step_overhead_ms / 1e3 if todo else 0)
                await asyncio.sleep(seconds)
            self.encoder_cache.update(mine)
        finally:
            for h in mine:
                fut = self.encoding.pop(h)
                if not fut.done():
                    fut.set_result(None)
        if waits:
            await asyncio.gather(*waits)
        self.engine_log(f"Encoded {len(images)} image(s) for {rid}: {todo} tokens computed, "
                        f"{cached} image(s) from cache "
                        f"in {seconds * 1e3:.1f} ms; ec_producer stored {','.join(hashes)} "
                        f"(ECCPUConnector) {logfmt.EMULATED_MARK}", file="ec_connector.py")

    async def pull_embeddings(self, rid: str, encoder_url: str, hashes: list[str], images: list[bytes]) -> None:
        n_tok = sum(image_tokens(self.spec.model, *image_size(b)) for b in images)
        n_bytes = self.cost.embedding_bytes(n_tok)
        assert self.session is not None
        async with self.session.post(f"{encoder_url}/epdbench/ec_pull",
                                     json={"hashes": hashes, "bytes": n_bytes, "request_id": rid}) as r:
            if r.status != 200:
                raise PullError(f"encoder cache pull failed for {rid}: HTTP {r.status} {await r.text()}")
        self.counters.ec_bytes += n_bytes
        self.engine_log(f"ec_consumer loaded {len(hashes)} encoder output(s) for {rid}: {n_bytes} bytes "
                        f"from {encoder_url} {logfmt.EMULATED_MARK}", file="ec_connector.py")

    async def ec_pull(self, request: web.Request) -> web.Response:
        body = await request.json()
        missing = [h for h in body.get("hashes", []) if h not in self.encoder_cache]
        if missing:
            self.engine_log(f"EC pull for {body.get('request_id')}: missing {missing}", level="ERROR",
                            file="ec_connector.py")
            return web.json_response({"error": f"missing {missing}"}, status=404)
        async with self.link_lock:
            await asyncio.sleep(transfer_seconds(self.spec.hardware, "tcp", int(body.get("bytes", 0))))
        return web.json_response({"ok": True})

    async def pull_kv(self, rid: str, kvp: dict, tokens: int) -> bool:
        """Decode side of a KV handoff: ask the prefill to push `tokens` tokens of KV (those of the prompt
        not already in this replica's prefix cache)."""
        addr = kvp.get("remote_bootstrap_addr") or (
            f"{kvp.get('remote_host')}:{kvp.get('remote_port')}" if kvp.get("remote_host") else None)
        if not addr:
            self.counters.kv_failed_recvs += 1
            self.engine_log(f"pulling kv_caches for {rid} failed: no remote bootstrap address",
                            level="ERROR", file="mooncake_connector.py")
            return False
        url = addr if addr.startswith("http") else f"http://{addr}"
        xfer = kvp.get("transfer_id") or rid
        t0 = time.perf_counter()
        assert self.session is not None
        try:
            body = {"transfer_id": xfer, "request_id": rid, "tokens": tokens, "engine_id": self.engine_id}
            if self.mooncake:
                body.update({"mooncake_session": self.mooncake.session, "mooncake_addr": self.mooncake.addr})
            async with self.session.post(f"{url}/epdbench/kv_pull", json=body) as r:
                ok = r.status == 200
                detail = await r.json() if ok else await r.text()
        except aiohttp.ClientError as e:
            ok, detail = False, str(e)
        if not ok:
            self.counters.kv_failed_recvs += 1
            self.engine_log(f"pulling kv_caches for {rid} failed: {detail}; recomputing prefill locally",
                            level="ERROR", file="mooncake_connector.py")
            return False
        self.counters.kv_transfers += 1
        self.counters.kv_bytes += detail["bytes"]
        self.counters.kv_xfer_seconds += time.perf_counter() - t0
        self.engine_log(f"Received KV for {rid} (transfer {xfer}): {detail['bytes']} bytes over "
                        f"{self.transport} in {(time.perf_counter() - t0) * 1e3:.1f} ms{self.kv_mark}",
                        file="mooncake_connector.py")
        return True

    async def kv_pull(self, request: web.Request) -> web.Response:
        """Prefill side of a KV handoff: push the held KV of a transfer to the asking decode."""
        body = await request.json()
        xfer = body.get("transfer_id", "")
        held = self.transfers.pop(xfer, None)
        if held is None:
            self.counters.kv_failed_transfers += 1
            self.engine_log(f"Sending to {body.get('engine_id')} failed (ret=-1) after 0.0 ms "
                            f"(0 descriptors, 0 bytes): unknown transfer {xfer}", level="ERROR",
                            file="mooncake_connector.py")
            return web.json_response({"error": f"unknown transfer {xfer}"}, status=404)
        tokens, rid = held
        tokens = min(tokens, int(body.get("tokens", tokens)))   # the decode already holds its cached prefix
        n_bytes = self.cost.kv_bytes(tokens)
        seconds = transfer_seconds(self.spec.hardware, self.transport, n_bytes, self.role_spec.rdma_interfaces)
        t0 = time.perf_counter()
        async with self.link_lock:
            real = None
            if self.mooncake and body.get("mooncake_session"):
                n_real = int(n_bytes * self.spec.target.sim.kv_scale)
                real = asyncio.create_task(asyncio.to_thread(
                    self.mooncake.write, body["mooncake_session"], int(body["mooncake_addr"]), n_real))
            await asyncio.sleep(seconds)
            if real is not None and await real != 0:
                self.counters.kv_failed_transfers += 1
                self.engine_log(f"Sending to {body.get('engine_id')} failed (ret=-1) after "
                                f"{(time.perf_counter() - t0) * 1e3:.1f} ms: Mooncake write of {rid} failed",
                                level="ERROR", file="mooncake_connector.py")
                return web.json_response({"error": "mooncake transfer failed"}, status=500)
        latency_ms = (time.perf_counter() - t0) * 1e3
        self.counters.kv_transfers += 1
        self.counters.kv_bytes += n_bytes
        self.counters.kv_xfer_seconds += seconds
        self.window["bytes"] += n_bytes
        self.window["count"] += 1
        self.window["lat_ms"].append(latency_ms)
        self.engine_log(f"Sent KV of {rid} (transfer {xfer}) to {body.get('engine_id')}: {n_bytes} bytes over "
                        f"{self.transport} in {latency_ms:.1f} ms{self.kv_mark}", file="mooncake_connector.py")
        return web.json_response({"bytes": n_bytes, "seconds": seconds})

    async def bootstrap_query(self, request: web.Request) -> web.Response:
        return web.json_response({"0": {"engine_id": self.engine_id}})

    # --- responses -------------------------------------------------------------------------
    async def collect(self, seq: Sequence) -> str:
        while True:
            kind, _ = await seq.out.get()
            if kind == "done":
                return seq.finish_reason or "length"

    def usage(self, seq: Sequence, generated: int | None = None) -> dict:
        n = seq.generated if generated is None else generated
        return {"prompt_tokens": seq.prompt_tokens, "completion_tokens": n,
                "total_tokens": seq.prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": seq.cached}}

    def finished(self, seq: Sequence, reason: str) -> None:
        self.counters.request_success[reason] = self.counters.request_success.get(reason, 0) + 1
        self.counters.generation_tokens += seq.generated

    def text_of(self, n: int) -> str:
        return "".join(" " + OUTPUT_WORDS[i % len(OUTPUT_WORDS)] for i in range(n))

    async def respond_prefill_only(self, request, body, rid, seq, chat, kvp) -> web.Response:
        if self.role == "encode":
            reason = "length"
            seq.generated = 1
        else:
            reason = await self.collect(seq)
        self.finished(seq, reason)
        out = self.response_json(body, rid, seq, chat, reason)
        if kvp and kvp.get("do_remote_decode"):
            xfer = kvp.get("transfer_id") or rid
            self.transfers[xfer] = (seq.prompt_tokens, rid)
            out["kv_transfer_params"] = {
                "do_remote_prefill": True, "do_remote_decode": False, "transfer_id": xfer,
                "remote_engine_id": self.engine_id,
                "remote_bootstrap_addr": f"{self.host}:{self.bootstrap_port}",
                "remote_host": self.host, "remote_port": self.bootstrap_port,
            }
        if self.role == "encode":
            out["ec_transfer_params"] = {"encoder_url": f"http://{self.host}:{self.port}"}
        return web.json_response(out)

    def response_json(self, body: dict, rid: str, seq: Sequence, chat: bool, reason: str) -> dict:
        text = self.text_of(seq.generated)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                  if chat else {"index": 0, "text": text, "finish_reason": reason})
        return {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": body.get("model") or self.spec.model.name,
                "choices": [choice], "usage": self.usage(seq)}

    async def complete(self, request, body, rid, seq, chat) -> web.Response:
        reason = await self.collect(seq)
        self.finished(seq, reason)
        return web.json_response(self.response_json(body, rid, seq, chat, reason))

    async def stream(self, request, body, rid, seq, chat) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        model = body.get("model") or self.spec.model.name
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices, usage=None) -> bytes:
            d = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
            if usage is not None:
                d["usage"] = usage
            return b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"

        n = 0
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        try:
            if chat:
                await resp.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]))
            while True:
                kind, _ = await seq.out.get()
                if kind == "done":
                    break
                word = " " + OUTPUT_WORDS[n % len(OUTPUT_WORDS)]
                n += 1
                last = n >= seq.max_tokens
                reason = "length" if last else None
                piece = ({"index": 0, "delta": {"content": word}, "finish_reason": reason} if chat
                         else {"index": 0, "text": word, "finish_reason": reason})
                await resp.write(chunk([piece], self.usage(seq, n) if continuous else None))
            self.finished(seq, seq.finish_reason or "length")
            if (body.get("stream_options") or {}).get("include_usage"):
                await resp.write(chunk([], self.usage(seq)))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.abort(seq)
            raise
        return resp

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids, _, _ = self.parse(body, chat="messages" in body)
        return web.json_response({"count": len(ids), "max_model_len": self.spec.engine.max_model_len,
                                  "tokens": ids})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.spec.model.name, "object": "model", "owned_by": "vllm",
             "max_model_len": self.spec.engine.max_model_len}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.prometheus_text(), content_type="text/plain")

    def prometheus_text(self) -> str:
        c = self.counters
        lbl = f'engine="0",model_name="{self.spec.model.name}"'
        lines = ["# HELP epdbench_sim_info Emulated engine (no GPU). 1 means this is the epdbench simulator.",
                 "# TYPE epdbench_sim_info gauge",
                 f'epdbench_sim_info{{{lbl},role="{self.role}",transport="{self.transport}"}} 1']

        def counter(name, value, extra=""):
            lines.append(f"# TYPE vllm:{name} counter")
            lines.append(f"vllm:{name}_total{{{lbl}{extra}}} {value}")

        for reason, n in sorted(c.request_success.items()) or [("length", 0)]:
            counter("request_success", n, f',finished_reason="{reason}"')
        counter("prompt_tokens", c.prompt_tokens)
        counter("generation_tokens", c.generation_tokens)
        for src, n in c.prompt_by_source.items():
            counter("prompt_tokens_by_source", n, f',source="{src}"')
        counter("prefix_cache_queries", c.prefix_queries)
        counter("prefix_cache_hits", c.prefix_hits)
        counter("mm_cache_queries", c.mm_cache_queries)
        counter("mm_cache_hits", c.mm_cache_hits)
        lines += ["# TYPE vllm:num_requests_running gauge",
                  f"vllm:num_requests_running{{{lbl}}} {self.engine.num_running}",
                  "# TYPE vllm:num_requests_waiting gauge",
                  f"vllm:num_requests_waiting{{{lbl}}} {self.engine.num_waiting}"]
        if self.moves_kv:
            counter("mooncake_bytes_transferred", c.kv_bytes)
            counter("mooncake_num_failed_transfers", c.kv_failed_transfers)
            counter("mooncake_num_failed_recvs", c.kv_failed_recvs)
            lines.append("# TYPE vllm:mooncake_xfer_time_seconds summary")
            lines.append(f"vllm:mooncake_xfer_time_seconds_count{{{lbl}}} {c.kv_transfers}")
            lines.append(f"vllm:mooncake_xfer_time_seconds_sum{{{lbl}}} {c.kv_xfer_seconds:.6f}")
        return "\n".join(lines) + "\n"

    # --- periodic transport metrics (MC_TE_METRIC=1 style) ---------------------------------------
    async def metrics_windows(self, interval_s: float) -> None:
        last = {"transfers": 0, "failed": 0, "recv_failed": 0}
        while True:
            await asyncio.sleep(interval_s)
            w = self.window
            if w["count"] and not self.genuine:
                mb_s = w["bytes"] / 1e6 / interval_s
                lat = sorted(w["lat_ms"])
                under_1ms = sum(1 for x in lat if x < 1) / len(lat) * 100
                self.mc_log(f"[Metrics] Transfer Engine Stats (over last {interval_s:g}s): Throughput: "
                            f"{mb_s:.2f} MB/s | Latency Distribution (count={len(lat)}): "
                            f"0-1000μs:{under_1ms:.1f}%, >1000μs:{100 - under_1ms:.1f}%")
                self.window = {"bytes": 0, "count": 0, "lat_ms": []}
            c = self.counters
            new = {"transfers": c.kv_transfers, "failed": c.kv_failed_transfers, "recv_failed": c.kv_failed_recvs}
            if new != last:
                # Mooncake pushes from Prefill: successes are reported there, failures on Decode.
                dn = new["transfers"] - last["transfers"] if self.role == "prefill" else 0
                avg_mb = (c.kv_bytes / c.kv_transfers / 1e6) if c.kv_transfers else 0.0
                log(logfmt.vllm_line(
                    "APIServer", self.pid, "INFO", "metrics.py", 103,
                    f"KV Transfer metrics: Num successful transfers={dn}, Avg MB per transfer={avg_mb:.1f}, "
                    f"Num failed transfers={new['failed'] - last['failed']}, "
                    f"Num failed recvs={new['recv_failed'] - last['recv_failed']}, Num KV expired reqs=0"
                    f"{self.kv_mark}"))
                last = new

    # --- app ---------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[access_log_middleware(self.pid)], client_max_size=256 * 1024 ** 2)
        app.router.add_post("/v1/completions", lambda r: self.generate(r, chat=False))
        app.router.add_post("/v1/chat/completions", lambda r: self.generate(r, chat=True))
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        if self.role == "encode":
            app.router.add_post("/epdbench/ec_pull", self.ec_pull)
        return app

    def bootstrap_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/query", self.bootstrap_query)
        app.router.add_post("/epdbench/kv_pull", self.kv_pull)
        return app


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error", 502: "Bad Gateway"}


def access_log_middleware(pid: int):
    """One uvicorn-format access line per request, as vLLM's API server writes them."""
    @web.middleware
    async def access_log(request: web.Request, handler):
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            peer = request.transport.get_extra_info("peername") if request.transport else None
            peer_s = f"{peer[0]}:{peer[1]}" if peer else "127.0.0.1:0"
            log(logfmt.access_line(pid, peer_s, request.method, request.path_qs, status, REASONS.get(status, "")))
    return access_log


class PullError(RuntimeError):
    pass


async def until_signalled() -> None:
    """Return on SIGTERM or SIGINT (how the targets stop a simulated process)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(replica: Replica) -> None:
    replica.startup_lines()
    replica.engine.start()
    replica.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
    runners = []
    for app, port in [(replica.app(), replica.port)] + (
            [(replica.bootstrap_app(), replica.bootstrap_port)] if replica.bootstrap_port else []):
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, replica.host, port).start()
        runners.append(runner)
    tasks = []
    if replica.moves_kv:
        interval = float(os.environ.get("MC_TE_METRIC_INTERVAL_SECONDS", "5"))
        tasks.append(asyncio.get_running_loop().create_task(replica.metrics_windows(interval)))
    try:
        await until_signalled()
    finally:
        for t in tasks:
            t.cancel()
        await replica.engine.stop()
        await replica.session.close()
        for r in runners:
            await r.cleanup()
        replica.api_log("Shutting down simulator.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epdbench sim", description="Serve one simulated vLLM role replica.")
    p.add_argument("--spec", required=True, help="spec YAML (path or preset name)")
    p.add_argument("--config", required=True, help="configuration name in the spec")
    p.add_argument("--role", required=True, choices=["server", "prefill", "decode", "encode"])
    p.add_argument("--replica", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bootstrap-port", type=int, default=None,
                   help="Mooncake bootstrap port (prefill replicas of PD/EPD)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spec = load_spec(args.spec)
    config = spec.configuration(args.config)
    if config.role(args.role) is None:
        print(f"configuration {config.name} has no role {args.role}", file=sys.stderr)
        return 2
    replica = Replica(spec, config, args.role, args.replica, args.host, args.port, args.bootstrap_port)
    asyncio.run(serve(replica))
    return 0


if __name__ == "__main__":
    sys.exit(main())
