"""One configuration's replicas and router in virtual time: the HTTP simulator's request path without HTTP.

The same `Engine` (sim.engine), cost model (physics.costmodel), prefix cache (sim.prefix_cache), encoder cache
(sim.encoder) and tokenizer (sim.tokenizer) as the HTTP simulator, driven on a virtual-time loop (sim.vloop):
- aggregated: round-robin over the server replicas (vllm-router --policy round_robin);
- PD: a prefill leg (max_tokens 1) on the next prefill replica, the KV pushed over the prefill pod's link
  (its transfers share it: sim.link), then the decode leg on the next decode replica, which
  recomputes the last prompt token and streams every token (vllm-router's PD mode, sim.kv_handoff);
- EPD: for requests with images, an encode leg first; the prefill pulls the encoder outputs over the encode
  pod's link (sim.proxy, sim.encoder), then as PD.
Each request's images are preprocessed on the API server of every replica on its path (each with its own
processor cache), as in the HTTP simulator (sim.encoder.Encoder.preprocess).
What the HTTP path spends on the host for each exchange (client, router and API-server hops) is charged as
hardware.request_hop_ms per exchange (`hop`, `reach`); the agreement check (benchmarks/simulator/vtime_agreement.py)
measures what remains between the two.

A traced request (a TraceContext) gets the HTTP simulator's spans (sim.spans): an `llm_request` per leg from the
same RequestNotes, a `kv_transfer` over a decode's KV pull, and where the built-in proxy routes (EPD, or
`target.sim.router: builtin`) its `router.request` over the whole request as the legs' parent; each with its
process's resource (role, pod), its times on the virtual clock as epoch ns from the cluster's anchor, handed to
the cluster's span sink as each leg ends.
"""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from epdbench.physics.costmodel import CostModel, kv_descriptors, link_bytes_per_s, peer_lanes, setup_seconds
from epdbench.sim.apiserver import ApiServer
from epdbench.sim.encoder import Encoder
from epdbench.sim.engine import Engine, Sequence
from epdbench.sim.gpu import GpuShare, shares_one_gpu
from epdbench.sim.link import Link
from epdbench.sim.metrics import Counters
from epdbench.otlp import new_span_id
from epdbench.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes
from epdbench.sim.spans import (CLOCK_ATTR, VIRTUAL_ANCHOR_ATTR, RequestNotes, request_spans, router_span,
                                span_resource, virtual_epoch)
from epdbench.sim.tokenizer import chat_parts, image_end_positions, image_hash, prompt_ids
from epdbench.sim.validate import BadRequest, empty_prompt, output_budget
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec


class Refused(Exception):
    """The request is refused as vLLM refuses it (HTTP 400); the message is vLLM's."""


@dataclass
class Prompt:
    """A request as the API server sees it after parsing: token ids, images, where each image's tokens end.
    Shared by every run of the same request (VirtualCluster.parse keeps them): never changed."""
    ids: list[int]
    images: list[bytes]
    hashes: list[str]
    image_ends: list[int]
    max_tokens: int                 # what vLLM lets it generate (sim.validate.output_budget); 0 when refused
    refusal: str | None = None      # why vLLM refuses it (the same)
    _blocks: list[int] | None = None

    def block_hashes(self) -> list[int]:
        """sim.prefix_cache.block_hashes of its ids, computed once."""
        if self._blocks is None:
            self._blocks = block_hashes(self.ids)
        return self._blocks


@dataclass(frozen=True)
class TraceContext:
    """A traced request as its legs see it: its W3C trace, the span they name as parent (the client's, or the
    proxy's), and its API (the engines' request ids are vLLM's `chatcmpl-<id>` / `cmpl-<id>`)."""
    trace_id: str
    parent_id: str
    api: str


PROMPT_CACHE = 4096       # parsed requests a process keeps (the same requests go to every configuration and,
_PROMPTS: dict = {}       # in calibrate and whatif, to every variant): id of the body → (body, model, Prompt)


class VReplica:
    """One replica: engine, caches, counters and the pod's link — what sim.encoder.Encoder uses of a Replica."""

    def __init__(self, spec: ExperimentSpec, config: ConfigurationSpec, role: str, index: int, clock):
        self.spec, self.config, self.role, self.replica = spec, config, role, index
        self.role_spec = config.role(role)
        self.cost = CostModel(spec.model, spec.hardware, self.role_spec.tp)
        self.time_scale = 1.0
        self.engine = Engine(self.cost, spec.engine, clock=clock, sleep=asyncio.sleep, fuse_decodes=True)
        self.counters = Counters()
        self.link = Link()
        self.prefix_cache = (PrefixCache(self.engine.kv_blocks)
                             if spec.engine.enable_prefix_caching and role in ("server", "prefill", "decode")
                             else None)
        self.engine.prefix_cache = self.prefix_cache
        self.encoder = Encoder(self)
        self.api = ApiServer(self)
        self.seen: set[str] | None = None     # request ids admitted, when the caller keeps stage evidence

    def kv_capacity_tokens(self) -> int:
        """As sim.replica.Replica: its engine's KV blocks, in tokens."""
        return self.engine.kv_blocks * BLOCK_TOKENS

    def engine_log(self, *args, **kwargs) -> None:   # no logs in virtual time
        pass

    def admit(self, rid: str, prompt: Prompt, max_tokens: int) -> tuple[Sequence, int]:
        """A sequence after the prefix-cache lookup, and its cached tokens (sim.replica.Replica.prefix_lookup)."""
        seq = Sequence(request_id=rid, prompt_tokens=len(prompt.ids), max_tokens=max_tokens)
        if self.seen is not None:
            self.seen.add(rid)
        if self.prefix_cache is None:
            return seq, 0
        seq.block_hashes = prompt.block_hashes()
        cached = self.prefix_cache.lookup(len(prompt.ids), seq.block_hashes)
        seq.hit = cached // BLOCK_TOKENS                 # the engine takes the blocks when it admits the request
        self.counters.prefix_queries += len(prompt.ids)
        self.counters.prefix_hits += cached
        seq.computed = seq.cached = cached
        return seq, cached


async def _link(sender: VReplica, transport: str, n_bytes: int, descriptors: int = 1,
                peer: VReplica | None = None, connector: str = "mooncake") -> None:
    """One transfer over the sending pod's link(s) (sim.link.Link, as sim.kv_handoff and sim.encoder): its lanes
    to `peer` if given, its setup, then its bytes sharing the link with the pod's other transfers."""
    hw = sender.spec.hardware
    await sender.link.send(setup_seconds(hw, transport, descriptors, connector),
                           n_bytes / link_bytes_per_s(hw, transport, sender.role_spec.rdma_interfaces),
                           peer=peer, lanes=peer_lanes(transport, descriptors, connector))


class _Sink:
    """Stands in for a sequence's event queue (Engine only calls `put_nowait`): token stamps go straight into
    the request's list (`stamps`; None for a prefill-only leg) and only the end wakes the request's coroutine —
    no task switch per token — at the last token's stamp (when the API server's output path hands it over:
    sim.engine.Engine.output_stamps), as the HTTP simulator's response writer waits for each stamp."""
    __slots__ = ("stamps", "loop", "done", "last")

    def __init__(self, stamps: list[float] | None):
        self.stamps = stamps
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()
        self.last = 0.0

    def put_nowait(self, event: tuple) -> None:
        kind, value = event
        if kind == "token":
            self.last = value
            if self.stamps is not None:
                self.stamps.append(value)
        elif not self.done.done():
            if self.last > self.loop.time():
                self.loop.call_at(self.last, self._finish, value)
            else:
                self.done.set_result(value)

    def put_stamps(self, stamps: list[float]) -> None:
        """Several tokens at once (sim.engine.Engine._emit_tokens)."""
        self.last = stamps[-1]
        if self.stamps is not None:
            self.stamps.extend(stamps)

    def _finish(self, value) -> None:
        if not self.done.done():
            self.done.set_result(value)


class VirtualCluster:
    """The replicas of one configuration on the running virtual-time loop; `generate` serves one request. With a
    span sink (`spans`), traced requests' spans go to it, virtual second 0 being `anchor_ns` (epoch ns)."""

    def __init__(self, spec: ExperimentSpec, config: ConfigurationSpec,
                 spans: Callable[[list[dict]], None] | None = None, anchor_ns: int = 0):
        loop = asyncio.get_running_loop()
        clock = self.now = loop.time
        self.spec, self.config = spec, config
        self.spans, self.anchor_ns, self.epoch = spans, anchor_ns, virtual_epoch(anchor_ns)
        # the built-in proxy makes a span of its own; vllm-router passes the traceparent on and makes none we get
        self.proxied = config.topology == "epd" or spec.target.sim.router != "vllm-router"
        self.replicas = {r.role: [VReplica(spec, config, r.role, i, clock) for i in range(r.replicas)]
                         for r in config.roles}
        self.gpu = GpuShare() if shares_one_gpu(spec, config) else None
        for rep in self.all():
            rep.engine.gpu = self.gpu
        self._next = {role: itertools.cycle(reps) for role, reps in self.replicas.items()}
        # what a parse depends on besides the body: the model, and the context for what the request may generate
        self._model = (spec.model.model_dump_json(), spec.engine.max_model_len)

    def start(self) -> None:
        for rep in self.all():
            rep.engine.start()

    async def stop(self) -> None:
        for rep in self.all():
            await rep.engine.stop()
            await rep.api.close()

    def all(self) -> list[VReplica]:
        return [rep for reps in self.replicas.values() for rep in reps]

    def parse(self, api: str, payload: dict, check: bool = True) -> Prompt:
        """As sim.replica.Replica.parse; with `check`, vLLM's refusals of an empty or too long prompt (POST
        /tokenize counts without them). The same body parsed again for the same model is not parsed again."""
        key = id(payload)
        kept = _PROMPTS.get(key)
        if kept is not None and kept[0] is payload and kept[1] == (api, self._model):
            prompt = kept[2]
        elif not check:                    # a one-off count (POST /tokenize): not kept
            return self._parse(api, payload)
        else:
            prompt = self._parse(api, payload)
            if len(_PROMPTS) >= PROMPT_CACHE:
                _PROMPTS.pop(next(iter(_PROMPTS)))
            _PROMPTS[key] = (payload, (api, self._model), prompt)
        if check and prompt.refusal is not None:
            raise Refused(prompt.refusal)
        if check and not prompt.ids:
            raise Refused(empty_prompt().message)
        return prompt

    def _parse(self, api: str, payload: dict) -> Prompt:
        if api == "chat":
            text, images = chat_parts(payload.get("messages") or [])
            enc = self.any_encoder()
            hashes = [image_hash(b) for b in images]
            placed = [(h, enc.tokens(b)) for h, b in zip(hashes, images)]
            overhead = self.spec.model.chat_overhead_tokens
            ids = prompt_ids(text, placed, True, overhead)
            ends = image_end_positions(placed, overhead)
        else:
            ids, images, hashes, ends = prompt_ids(str(payload.get("prompt", "")), [], False, 0), [], [], []
        budget = output_budget(payload, api == "chat", len(ids), self.spec.engine.max_model_len)
        if isinstance(budget, BadRequest):
            return Prompt(ids, images, hashes, ends, 0, budget.message)
        return Prompt(ids, images, hashes, ends, budget)

    async def hop(self) -> None:
        """One HTTP exchange of the request's path (a leg to a replica, or a KV or encoder-output pull's
        handshake): hardware.request_hop_ms of host time, which the HTTP simulator spends for real."""
        if self.spec.hardware.request_hop_ms > 0:
            await asyncio.sleep(self.hop_s())

    def hop_s(self) -> float:
        return self.spec.hardware.request_hop_ms / 1e3

    async def reach(self, rep: VReplica, prompt: Prompt) -> None:
        """A leg's HTTP exchange, then the replica's API server tokenizing the prompt (every one on the path)."""
        await rep.api.tokenize(len(prompt.ids), prompt.images, after=self.hop_s())

    def any_encoder(self) -> Encoder:
        return self.all()[0].encoder

    async def generate(self, rid: str, prompt: Prompt, stamps: list[float],
                       trace: TraceContext | None = None) -> tuple[int, int]:
        """Serve one request, appending to `stamps` the stamp (loop seconds) of each token the client receives;
        returns (prompt tokens, cached tokens) as the serving replica's usage reports them (a PD decode: its
        prefill's). A traced one's spans go to the span sink (sim.proxy's and sim.replica's, however it ends)."""
        if trace is None or self.spans is None or not self.proxied:
            return await self._route(rid, prompt, stamps, trace if self.spans is not None else None)
        span_id, start = new_span_id(), self.now()
        try:
            return await self._route(rid, prompt, stamps, replace(trace, parent_id=span_id))
        finally:
            self._emit([router_span(trace.trace_id, span_id, trace.parent_id, self.epoch(start),
                                    self.epoch(self.now()), rid, self.config.topology)], span_resource("proxy"))

    async def _route(self, rid: str, prompt: Prompt, stamps: list[float],
                     trace: TraceContext | None) -> tuple[int, int]:
        if "server" in self.replicas:
            return await self._leg(next(self._next["server"]), rid, prompt, stamps, trace)
        encoder = None
        if "encode" in self.replicas and prompt.images:
            encoder = next(self._next["encode"])
            await self._encode(encoder, rid, prompt, trace)
        prefill = next(self._next["prefill"])
        _, prefill_cached = await self._leg(prefill, rid, prompt, None, trace, encoder=encoder)
        n_prompt, _ = await self._leg(next(self._next["decode"]), rid, prompt, stamps, trace, kv_from=prefill)
        return n_prompt, prefill_cached     # the decode reports its prefill's hit, as vLLM 0.33 (sim.responses.usage)

    def _notes(self, trace: TraceContext | None, rid: str, prompt: Prompt) -> RequestNotes | None:
        """A traced leg's notes (sim.replica.Replica.generate's), its arrival when the leg's exchange reaches the
        replica's API server."""
        if trace is None:
            return None
        notes = RequestNotes(trace.trace_id, trace.parent_id, self.now() + self.hop_s(),
                             prompt_tokens=len(prompt.ids))
        notes.rid = f"{'chatcmpl' if trace.api == 'chat' else 'cmpl'}-{rid}"
        return notes

    def _emit(self, spans: list[dict], resource: dict) -> None:
        """Spans to the sink, with their process's resource and the virtual clock's anchor."""
        for s in spans:
            s["resource"] = resource
            s["attributes"].update({CLOCK_ATTR: "virtual", VIRTUAL_ANCHOR_ATTR: self.anchor_ns})
        self.spans(spans)

    def _end_leg(self, notes: RequestNotes | None, rep: VReplica) -> None:
        if notes is not None:
            self._emit(request_spans(notes, self.now(), 1.0, self.config.kv_transport, self.epoch),
                       span_resource(rep.role, rep.replica))

    async def _encode(self, rep: VReplica, rid: str, prompt: Prompt, trace: TraceContext | None) -> None:
        """EPD's encode leg (sim.replica.Replica.generate on an encode replica): the vision encoder, prefill-only."""
        if rep.seen is not None:
            rep.seen.add(rid)
        notes = self._notes(trace, rid, prompt)
        try:
            if notes is not None:
                notes.seq = Sequence(request_id=notes.rid, prompt_tokens=len(prompt.ids), max_tokens=1)
            await self.reach(rep, prompt)
            await rep.encoder.preprocess(prompt.images, prompt.hashes)
            await rep.encoder.encode_images(rid, prompt.images, prompt.hashes, notes)
        finally:
            self._end_leg(notes, rep)

    async def _leg(self, rep: VReplica, rid: str, prompt: Prompt, stamps: list[float] | None,
                   trace: TraceContext | None = None, encoder: VReplica | None = None,
                   kv_from: VReplica | None = None) -> tuple[int, int]:
        """One replica's part (sim.replica.Replica.generate): a prefill-only leg when `stamps` is None."""
        notes = self._notes(trace, rid, prompt)
        try:
            return await self._serve_leg(rep, rid, prompt, stamps, notes, encoder, kv_from)
        finally:
            self._end_leg(notes, rep)

    async def _serve_leg(self, rep: VReplica, rid: str, prompt: Prompt, stamps: list[float] | None,
                         notes: RequestNotes | None, encoder: VReplica | None,
                         kv_from: VReplica | None) -> tuple[int, int]:
        await self.reach(rep, prompt)
        await rep.encoder.preprocess(prompt.images, prompt.hashes)    # every API server on the path too
        seq, cached = rep.admit(rid, prompt, prompt.max_tokens if stamps is not None else 1)
        if notes is not None:
            notes.seq = seq
        todo = [i for i, end in enumerate(prompt.image_ends) if end > cached]
        if todo and encoder is not None:      # EPD prefill: the encoder outputs come over the encode pod's link
            n_tok = sum(rep.encoder.tokens(prompt.images[i]) for i in todo)
            await self.hop()                                            # the pull's handshake
            await _link(encoder, self.config.ec_expected, rep.cost.embedding_bytes(n_tok), connector="nixl")
        elif todo:
            seq.image_tokens = await rep.encoder.image_work(rid, {}, [prompt.images[i] for i in todo],
                                                            [prompt.hashes[i] for i in todo])
        if kv_from is not None:               # PD decode: pull the prompt's KV not cached here, then decode
            moved = len(prompt.ids) - cached
            pull_start = self.now()
            await self.hop()                                            # the pull's handshake
            n_bytes = rep.cost.kv_bytes(moved)
            await _link(kv_from, self.config.kv_transport, n_bytes,
                        kv_descriptors(rep.cost, self.config.kv_connector, moved), peer=rep,
                        connector=self.config.kv_connector)
            if notes is not None:                                      # the pull, as sim.replica's notes have it
                notes.kv = (pull_start, self.now(), moved, True)
            kv_from.counters.kv_bytes += n_bytes                       # the sending side counts, as Mooncake's
            kv_from.counters.kv_transfers += 1
            seq.computed, seq.image_tokens = len(prompt.ids) - 1, []
        rep.counters.admit(len(prompt.ids), seq.computed, cached)
        sink = seq.out = _Sink(stamps)
        rep.engine.submit(seq)
        try:
            await sink.done
        except asyncio.CancelledError:
            rep.engine.abort(seq)
            raise
        return len(prompt.ids), cached
