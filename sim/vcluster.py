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
hardware.request_hop_ms per exchange (`hop`, `reach`); the agreement check (benchmarks/vtime_agreement.py)
measures what remains between the two.
"""
from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from epdbench.physics.costmodel import CostModel, kv_descriptors, link_bytes_per_s, peer_lanes, setup_seconds
from epdbench.sim.apiserver import ApiServer
from epdbench.sim.encoder import Encoder
from epdbench.sim.engine import Engine, Sequence
from epdbench.sim.link import Link
from epdbench.sim.metrics import Counters
from epdbench.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes
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
    """The replicas of one configuration on the running virtual-time loop; `generate` serves one request."""

    def __init__(self, spec: ExperimentSpec, config: ConfigurationSpec):
        clock = asyncio.get_running_loop().time
        self.spec, self.config = spec, config
        self.replicas = {r.role: [VReplica(spec, config, r.role, i, clock) for i in range(r.replicas)]
                         for r in config.roles}
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

    async def generate(self, rid: str, prompt: Prompt, stamps: list[float]) -> tuple[int, int]:
        """Serve one request, appending to `stamps` the stamp (loop seconds) of each token the client receives;
        returns (prompt tokens, cached tokens) as the serving replica's usage reports them (a PD decode: its
        prefill's)."""
        if "server" in self.replicas:
            return await self._leg(next(self._next["server"]), rid, prompt, stamps)
        encoder = None
        if "encode" in self.replicas and prompt.images:
            encoder = next(self._next["encode"])
            if encoder.seen is not None:
                encoder.seen.add(rid)
            await self.reach(encoder, prompt)
            await encoder.encoder.preprocess(prompt.images, prompt.hashes)
            await encoder.encoder.encode_images(rid, prompt.images, prompt.hashes)
        prefill = next(self._next["prefill"])
        _, prefill_cached = await self._leg(prefill, rid, prompt, None, encoder=encoder)
        n_prompt, _ = await self._leg(next(self._next["decode"]), rid, prompt, stamps, kv_from=prefill)
        return n_prompt, prefill_cached     # the decode reports its prefill's hit, as vLLM 0.33 (sim.responses.usage)

    async def _leg(self, rep: VReplica, rid: str, prompt: Prompt, stamps: list[float] | None,
                   encoder: VReplica | None = None,
                   kv_from: VReplica | None = None) -> tuple[int, int]:
        """One replica's part (sim.replica.Replica.generate): a prefill-only leg when `stamps` is None."""
        await self.reach(rep, prompt)
        await rep.encoder.preprocess(prompt.images, prompt.hashes)    # every API server on the path too
        seq, cached = rep.admit(rid, prompt, prompt.max_tokens if stamps is not None else 1)
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
            await self.hop()                                            # the pull's handshake
            n_bytes = rep.cost.kv_bytes(moved)
            await _link(kv_from, self.config.kv_transport, n_bytes,
                        kv_descriptors(rep.cost, self.config.kv_connector, moved), peer=rep,
                        connector=self.config.kv_connector)
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
