"""One simulated vLLM replica (role server, prefill, decode or encode): cost model, engine, vLLM-format logs,
and the request path through prefix cache, encoder, KV handoff and responses."""
from __future__ import annotations

import json
import os
import signal
import time
import uuid

import aiohttp
from aiohttp import web

from epdbench.physics.costmodel import CostModel
from epdbench.sim import logfmt, responses
from epdbench.sim.apiserver import ApiServer
from epdbench.sim.encoder import Encoder, PullError
from epdbench.sim.engine import Engine, Sequence
from epdbench.sim.kv_handoff import KVHandoff
from epdbench.otlp import parse_traceparent
from epdbench.sim.lag import Lag
from epdbench.sim.spans import RequestNotes, SpanExporter, request_spans, span_resource
from epdbench.sim.link import Link
from epdbench.timer import precise_sleep
from epdbench.sim.metrics import Counters, prometheus_text
from epdbench.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes
from epdbench.sim.tokenizer import chat_parts, image_end_positions, image_hash, prompt_ids
from epdbench.sim.validate import (BadRequest, check_schema, check_served, empty_prompt, malformed_json,
                                   output_budget, request_id_of)
from epdbench.specs.commands import MAX_LOG_LEN
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec


def log(msg: str) -> None:
    print(msg, flush=True)


class Replica:
    def __init__(self, spec: ExperimentSpec, config: ConfigurationSpec, role: str, replica: int,
                 host: str, port: int, bootstrap_port: int | None):
        self.spec, self.config, self.role, self.replica = spec, config, role, replica
        self.host, self.port, self.bootstrap_port = host, port, bootstrap_port
        role_spec = config.role(role)
        assert role_spec is not None, f"configuration {config.name} has no role {role}"
        self.role_spec = role_spec
        self.cost = CostModel(spec.model, spec.hardware, role_spec.tp)
        self.time_scale = spec.target.sim.time_scale
        self.engine = Engine(self.cost, spec.engine, sleep=precise_sleep(), time_scale=self.time_scale)
        self.emit_lag = Lag()   # how late each streamed token was written against its step's modelled end
        self.pid = os.getpid()
        self.started = time.time()
        self.engine_id = f"{config.name}-{role}-{replica}-{uuid.uuid4().hex[:8]}"
        self.counters = Counters()
        self.requests_seen = 0   # completion requests received (fault injection counts them)
        self.link = Link(self.time_scale)  # the sending pod's NIC(s), shared by its transfers (KV or encoder outputs)
        self.prefix_cache = (PrefixCache(self.engine.kv_blocks)
                             if spec.engine.enable_prefix_caching and role in ("server", "prefill", "decode")
                             else None)
        self.engine.prefix_cache = self.prefix_cache
        self.session: aiohttp.ClientSession | None = None
        self.kv = KVHandoff(self)
        self.encoder = Encoder(self)
        self.api = ApiServer(self)
        self.spans = SpanExporter.from_env(span_resource(role, replica))

    def kv_capacity_tokens(self) -> int:
        """KV cache of the replica in tokens: its engine's blocks (CostModel.kv_capacity_tokens: memory left after
        the weights, over bytes per token, unless engine.num_gpu_blocks_override sets them)."""
        return self.engine.kv_blocks * BLOCK_TOKENS

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

    def header_line(self) -> None:
        """The first line of every replica's log: what it emulates (the mark that keeps it from being read as a
        real server's)."""
        what = ("[epdbench sim: emulated GPU, genuine Mooncake KV transport]" if self.kv.genuine
                else logfmt.EMULATED_MARK)
        self.api_log(f"epdbench simulator {what}: vLLM API server role={self.role} "
                     f"replica={self.replica} config={self.config.name} model={self.spec.model.name} "
                     f"tp={self.role_spec.tp} hardware={self.spec.hardware.gpu}")

    def startup_lines(self) -> None:
        self.header_line()
        if self.moves_kv:
            self.kv.startup_lines()
        if self.encoder.nixl:
            self.encoder.nixl.startup_lines()
        self.api_log(f"Starting vLLM API server 0 on http://{self.host}:{self.port}", file="launcher.py")

    # --- request parsing -----------------------------------------------------------------
    def parse(self, body: dict, chat: bool) -> tuple[list[int], list[bytes], list[int]]:
        """(prompt token ids, raw images, where each image's tokens end) of a request body."""
        if chat:
            text, images = chat_parts(body.get("messages") or [])
            placed = [(image_hash(b), self.encoder.tokens(b)) for b in images]
            overhead = self.spec.model.chat_overhead_tokens
            return prompt_ids(text, placed, True, overhead), images, image_end_positions(placed, overhead)
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        return prompt_ids(prompt, [], False, 0), [], []

    # --- handlers --------------------------------------------------------------------------
    def maybe_die(self) -> None:
        """Fault injection (target.sim.faults.kill_replica): die as a crashed engine does, without a word."""
        faults = self.spec.target.sim.faults
        if faults.kill_replica != f"{self.role}-{self.replica}":
            return
        self.requests_seen += 1
        if self.requests_seen >= faults.kill_after_requests:
            os.kill(os.getpid(), signal.SIGKILL)

    def refuse(self, problem: BadRequest) -> web.Response:
        """vLLM's error response; the reason in the API server's log."""
        self.api_log(f"{problem.type}: {problem.message}".replace("\n", " "), level="WARNING", file="serving.py")
        return web.json_response(problem.body(), status=problem.status)

    async def generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """A completion; with a span exporter and a W3C traceparent on the request, its spans (sim.spans) once
        the response has ended, however it ended."""
        ctx = parse_traceparent(request.headers.get("traceparent")) if self.spans is not None else None
        if ctx is None:
            return await self._generate(request, chat, None)
        notes = RequestNotes(ctx[0], ctx[1], time.perf_counter())
        try:
            return await self._generate(request, chat, notes)
        finally:
            self.spans.add(request_spans(notes, time.perf_counter(), self.time_scale, self.transport))

    async def _generate(self, request: web.Request, chat: bool, notes: RequestNotes | None) -> web.StreamResponse:
        self.maybe_die()
        try:
            body = json.loads(await request.text())
        except json.JSONDecodeError as e:
            return self.refuse(malformed_json(e.pos))
        except (UnicodeDecodeError, OSError) as e:
            return self.refuse(BadRequest(400, "BadRequestError", f"bad request: {e}"))
        problem = check_schema(body, chat)
        if problem:
            return self.refuse(problem)
        body_id = body.get("request_id") or uuid.uuid4().hex
        # as vLLM with --enable-log-requests and VLLM_REQUEST_BODY_LOG_LEVEL=INFO (request_logger.py): the body is
        # logged once the request model accepted it, before the handler's own checks (model, n, lengths)
        self.api_log(f"Request {body_id} JSON body: {json.dumps(body, separators=(',', ':'))[:MAX_LOG_LEN]}",
                     file="request_logger.py", line=86)
        problem = check_served(body, self.spec.model.name)
        if problem:
            return self.refuse(problem)
        try:
            ids, images, image_ends = self.parse(body, chat)
            prompt_tokens = len(ids)
        except (ValueError, TypeError) as e:
            return self.refuse(BadRequest(400, "BadRequestError", f"bad request: {e}"))
        max_tokens = output_budget(body, chat, prompt_tokens, self.spec.engine.max_model_len)
        if isinstance(max_tokens, BadRequest):
            return self.refuse(max_tokens)
        if prompt_tokens == 0:
            return self.refuse(empty_prompt())
        if images and self.spec.model.vision is None:
            return self.refuse(BadRequest(400, "BadRequestError", "model is not multimodal"))
        client_id = request_id_of(request.headers.get("X-Request-Id"), body) or body_id
        prefix = "chatcmpl" if chat else "cmpl"
        rid = f"{prefix}-{client_id}"
        kvp = body.get("kv_transfer_params") or {}
        # vLLM 0.33 (serve/utils/request_logger.py log_inputs): a completion's id with its choice index
        self.api_log(f"Received request {rid if chat else rid + '-0'}: params: "
                     f"{logfmt.sampling_params(body, max_tokens, kvp)}, lora_request: None.",
                     file="request_logger.py", line=67)

        seq = Sequence(request_id=rid, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
        if notes is not None:
            notes.rid, notes.seq, notes.prompt_tokens = rid, seq, prompt_tokens
        hashes = [image_hash(b) for b in images]
        # the API server's CPU before the engine sees the request: the prompt text's tokens, then the images
        await self.api.tokenize(prompt_tokens, images)
        await self.encoder.preprocess(images, hashes)
        cached = self.prefix_lookup(seq, ids, kvp)
        prefill_only = self.role in ("prefill", "encode") or bool(kvp.get("do_remote_decode"))
        if prefill_only:
            seq.max_tokens = 1
        try:
            if self.role == "encode":
                await self.encoder.encode_images(rid, images, hashes, notes)
                return await responses.respond_prefill_only(self, body, rid, seq, chat, kvp=None)
            # As vLLM's scheduler: an image whose tokens lie inside the cached prefix needs neither the
            # encoder nor its encoder output (its KV is already there).
            todo = [i for i, end in enumerate(image_ends) if end > cached]
            if todo:
                seq.image_tokens = await self.encoder.image_work(rid, body, [images[i] for i in todo],
                                                                 [hashes[i] for i in todo])
            if self.role == "decode" and kvp.get("do_remote_prefill"):
                if isinstance(kvp.get("remote_prefill_cached_tokens"), int):
                    seq.reported_cached = kvp["remote_prefill_cached_tokens"]
                pull_start = time.perf_counter()
                ok = await self.kv.pull_kv(rid, kvp, prompt_tokens - cached)
                if notes is not None:
                    notes.kv = (pull_start, time.perf_counter(), prompt_tokens - cached, bool(ok))
                if ok:
                    seq.computed = prompt_tokens - 1  # last prompt token is recomputed locally
                    seq.image_tokens = []
            elif self.role == "decode":
                self.engine_log(f"Request {rid} arrived without kv_transfer_params: prefilling locally",
                                level="WARNING", file="mooncake_connector.py")
        except PullError as e:
            return web.json_response({"error": {"message": str(e), "code": 502}}, status=502)
        self.counters.admit(prompt_tokens, seq.computed, cached)
        self.engine_log(f"Added request {rid}.", file="scheduler.py")
        self.engine.submit(seq)
        if prefill_only:
            return await responses.respond_prefill_only(self, body, rid, seq, chat, kvp=kvp)
        if body.get("stream"):
            return await responses.stream(self, request, body, rid, seq, chat)
        return await responses.complete(self, body, rid, seq, chat)

    def prefix_lookup(self, seq: Sequence, ids: list[int], kvp: dict) -> int:
        """Start the sequence after its cached prefix (vLLM automatic prefix caching); returns the
        cached tokens. On a decode leg, the KV connector then loads only the blocks not cached locally."""
        if self.prefix_cache is None:
            return 0
        seq.block_hashes = block_hashes(ids)
        cached = self.prefix_cache.lookup(len(ids), seq.block_hashes)
        seq.hit = cached // BLOCK_TOKENS                 # the engine takes the blocks when it admits the request
        self.counters.prefix_queries += len(ids)
        self.counters.prefix_hits += cached
        seq.computed = seq.cached = cached
        return cached

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids, _, _ = self.parse(body, chat="messages" in body)
        return web.json_response({"count": len(ids), "max_model_len": self.spec.engine.max_model_len,
                                  "tokens": ids})

    async def models(self, request: web.Request) -> web.Response:
        """vLLM's model card (0.32: entrypoints/openai/models/protocol.py), its permission entry included."""
        created = int(self.started)
        permission = {"id": f"modelperm-{self.engine_id}", "object": "model_permission", "created": created,
                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                      "organization": "*", "group": None, "is_blocking": False}
        return web.json_response({"object": "list", "data": [
            {"id": self.spec.model.name, "object": "model", "created": created, "owned_by": "vllm",
             "root": self.spec.model.name, "parent": None, "max_model_len": self.spec.engine.max_model_len,
             "permission": [permission]}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=prometheus_text(self), content_type="text/plain")
