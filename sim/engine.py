"""Step-level continuous-batching engine: the timing core of one simulated vLLM replica.

Each step packs every running decode (one token each) plus prefill chunks of waiting sequences
into the token budget (max_num_batched_tokens), as vLLM's scheduler does with chunked prefill.
The step lasts what the cost model says, so a long prefill co-scheduled with decodes stretches
their token gaps in aggregated mode, and a decode-only replica (PD) does not see it.

The KV cache is counted in blocks of 16 tokens, its size what GPU memory leaves after the weights (or
engine.num_gpu_blocks_override), and admission and preemption follow vLLM v1's scheduler
(vllm/v1/core/sched/scheduler.py `schedule`, 0.33):
- a waiting request is admitted only when the blocks of its whole sequence are free
  (`scheduler_reserve_full_isl`, on by default), first come first served, and none is admitted in a step
  that preempted; it then takes the blocks of each prefill chunk as it is computed;
- a running request whose next token needs a block when none is free preempts the most recently admitted
  request (FCFS policy: `self.running.pop()`), possibly itself: the victim's blocks are freed and it goes
  back to the front of the waiting queue with nothing computed but what of its prompt the prefix cache still
  holds, to prefill its prompt and the tokens it already generated again (recompute), then goes on
  generating; tokens it already streamed are not streamed again.
The prefix cache (sim.prefix_cache) is part of the KV cache: a request takes the cached blocks of its prefix
when it is admitted, sequences sharing them hold them once, and the blocks steps allocate evict the least
recently freed cached ones. Simplification: a recompute needs no new encoder work.
"""
from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from dataclasses import dataclass

from epdbench.physics.costmodel import CostModel, chunk_prefill, output_seconds
from epdbench.sim.fused import decode_stretch
from epdbench.sim.gpu import GpuShare
from epdbench.sim.lag import Lag
from epdbench.sim.prefix_cache import BLOCK_TOKENS, PrefixCache
from epdbench.sim.sequence import Sequence, admission_order, blocks, drop, new_blocks
from epdbench.specs.models import EngineSpec
from epdbench.timer import cancel_and_wait


@dataclass
class EngineStats:
    steps: int = 0
    busy_s: float = 0.0
    prompt_tokens_computed: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    encoder_tokens: int = 0
    preemptions: int = 0


class Engine:
    """Runs steps while there is work; tokens are pushed to each sequence's queue as
    ("token", n) events and a final ("done", finish_reason)."""

    def __init__(self, cost: CostModel, limits: EngineSpec, clock=time.perf_counter, sleep=asyncio.sleep,
                 time_scale: float = 1.0, fuse_decodes: bool = False):
        self.cost = cost
        # virtual time only (clock must be the running loop's): runs of decode-only steps as one event (sim.fused)
        self.fuse_decodes = fuse_decodes
        self._interrupt: asyncio.Future | None = None   # set while a fused stretch waits: a submit or abort cuts it
        self.limits = limits
        self.clock, self.sleep = clock, sleep
        self.time_scale = time_scale   # modelled durations are stretched by this factor on the host clock
        self.lag = Lag()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []   # decoding, in admission order
        self.stats = EngineStats()
        self.kv_blocks = (limits.num_gpu_blocks_override if limits.num_gpu_blocks_override is not None
                          else cost.kv_capacity_tokens(limits.gpu_memory_utilization) // BLOCK_TOKENS)
        self.prefix_cache: PrefixCache | None = None   # its cached blocks are part of kv_blocks (sim.prefix_cache)
        self._admissions = 0
        self._output_busy = 0.0   # when the API server's output path is done with the tokens handed to it so far
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.gpu: GpuShare | None = None   # virtual time: the GPU it shares with other engines (sim.gpu)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    @property
    def task(self) -> asyncio.Task | None:
        """The step loop (done with an exception when the engine failed: its replica must not go on serving)."""
        return self._task

    def submit(self, seq: Sequence) -> None:
        seq.arrived = self.clock()
        self.waiting.append(seq)
        self._wake.set()
        self._cut_stretch()

    def _cut_stretch(self) -> None:
        if self._interrupt is not None and not self._interrupt.done():
            self._interrupt.set_result(None)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def used_blocks(self) -> int:
        """KV blocks held: a decoding sequence holds all its tokens but the last sampled one (the next step
        computes its KV); an admitted, still prefilling one what it computed so far; the prefix cache's blocks
        that admitted sequences hold count once however many share them."""
        b = BLOCK_TOKENS
        used = (sum((s.computed + s.generated + b - 2) // b - len(s.shared) for s in self.running)
                + sum((s.computed + b - 1) // b - len(s.shared) for s in self.waiting if s.admitted is not None))
        return used if self.prefix_cache is None else used + self.prefix_cache.held_blocks

    def plan_step(self, start: float | None = None):
        """Choose this step's work: (decodes, [(seq, chunk)], [tokens of each image to encode]). Every running decode
        first, each taking the block its token needs (preempting when none is free), then prefill chunks FCFS in the
        token budget: sequences already admitted first, then waiting ones while their whole sequence fits. With
        `start` (the step's modelled start), a sequence that arrived after it is not there yet."""
        free = self.kv_blocks - self.used_blocks()
        preempted = False
        decodes = self.running[: self.limits.max_num_seqs]
        needs = new_blocks(decodes)
        if needs <= free:
            free -= needs
        else:
            free, decodes = self._plan_decodes(free)
            preempted = True
        budget = self.limits.max_num_batched_tokens - len(decodes)
        slots = max(0, self.limits.max_num_seqs - len(decodes))
        admitted, fresh = [], []
        for s in self.waiting:
            if s.admitted is not None:
                admitted.append(s)
            elif start is not None and s.arrived is not None and s.arrived > start:
                continue                     # it came after the step was modelled to start
            elif len(fresh) < slots:
                fresh.append(s)
        candidates = (sorted(admitted, key=admission_order) + fresh)[:slots]
        chunks = chunk_prefill([(s.computed, s.prefill_end) for s in candidates], budget)
        scheduled: list = []
        for i, c in chunks:
            seq = candidates[i]
            if seq.admitted is None:
                # its prefix-cache hit: blocks other sequences hold cost nothing, free ones leave the free queue
                hits = seq.block_hashes[:seq.hit] if self.prefix_cache is not None and seq.hit else []
                shared = self.prefix_cache.probe(hits) if hits else 0
                need = blocks(c.start + c.tokens) - shared
                if preempted or blocks(seq.prefill_end) - shared > free:
                    break                    # FCFS: the requests behind it wait too
                self._admissions += 1
                seq.admitted = self._admissions
                if hits:
                    seq.shared = self.prefix_cache.acquire(hits)
            elif (need := blocks(c.start + c.tokens) - blocks(seq.computed)) > free:
                free, room = self._make_room(seq, need, free, decodes)
                preempted = True
                if not room:
                    break
            free -= need
            scheduled.append((seq, c))
            if seq.scheduled_at is None:
                seq.scheduled_at = start if start is not None else self.clock()
        if self.prefix_cache is not None:
            self.prefix_cache.fit(free)      # the blocks this step takes come off the free queue's front
        # the encoder runs with a sequence's first chunk, wherever its prefix cache hit ends
        encoder_images = [n for s, c in scheduled if c.start == s.cached for n in s.image_tokens]
        return decodes, scheduled, encoder_images

    def _plan_decodes(self, free: int) -> tuple[int, list[Sequence]]:
        """The running decodes when their new blocks do not all fit: in order, each preempting the newest
        requests until its block is free; returns the free blocks and the decodes."""
        decodes: list[Sequence] = []
        for seq in self.running[: self.limits.max_num_seqs]:
            if seq.admitted is None and not any(s is seq for s in self.running):
                continue                     # an earlier decode of this step preempted it
            kv = seq.computed + seq.generated
            need = blocks(kv) - blocks(kv - 1)
            if need > free:
                free, room = self._make_room(seq, need, free, decodes)
                if not room:
                    break                    # it preempted itself: as vLLM, schedule no further running request
            free -= need
            decodes.append(seq)
        return free, decodes

    def _make_room(self, seq: Sequence, need: int, free: int, decodes: list[Sequence]) -> tuple[int, bool]:
        """Preempt the most recently admitted requests until `need` blocks are free for `seq` (vLLM v1, FCFS
        policy); returns the free blocks and whether `seq` itself is still admitted."""
        while need > free:
            newest = max([s for s in self.waiting if s.admitted is not None] + self.running[-1:],
                         key=admission_order)
            free += self._preempt(newest, decodes)
            if newest is seq:
                return free, False
        return free, True

    def _preempt(self, seq: Sequence, decodes: list[Sequence]) -> int:
        """Recompute preemption (vLLM `_preempt_request`): free the sequence's blocks and put it back at the
        front of the waiting queue with nothing computed; returns the blocks freed (with the one a decode
        planned in this step had taken)."""
        if drop(self.running, seq):
            kv = seq.computed + seq.generated
            own = blocks(kv - 1)
            if drop(decodes, seq):
                own += blocks(kv) - blocks(kv - 1)
        else:
            drop(self.waiting, seq)
            own = blocks(seq.computed)
        freed = self._release(seq, own)
        seq.recompute_tokens = seq.generated
        seq.computed = 0
        if self.prefix_cache is not None and seq.block_hashes is not None:   # its prompt's blocks may still be
            seq.computed = self.prefix_cache.lookup(seq.prompt_tokens, seq.block_hashes)   # cached: vLLM looks
            seq.hit = seq.computed // BLOCK_TOKENS                                        # again when it readmits
        seq.admitted = None
        seq.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)
        return freed

    async def _run(self) -> None:
        """Steps on the modelled timeline: while the engine stays busy, a step starts where the last one was
        modelled to end, not when the host woke it, so a late step is made up by the next one and host
        overheads never add up; after an idle wait the timeline restarts at the wake-up. A step serves only the
        sequences that arrived by its modelled start: one that a host which fell behind saw arrive later waits
        for the first step modelled to start after it came (the engine idling until then if it has nothing
        else), so host lag neither lets a request in early nor stretches the running sequences' token gaps.
        Each step lasts its modelled duration × time_scale on the host clock. How late each step ended against
        its modelled end is measured (`lag`, in modelled seconds); the tokens it emits carry when they were
        modelled to leave the API server (output_stamps), so the response writer writes each no earlier and can
        measure how late each reached the client's socket."""
        modelled_end: float | None = None
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                modelled_end = None
            start = self.clock() if modelled_end is None else modelled_end
            preemptions = self.stats.preemptions
            decodes, scheduled, encoder_images = self.plan_step(start)
            if not decodes and not scheduled:
                later = [s.arrived for s in self.waiting if s.arrived is not None and s.arrived > start]
                if later:
                    modelled_end = min(later)   # the modelled engine idles until the next one comes
                elif self.stats.preemptions == preemptions:
                    # nothing fits (a sequence larger than the whole KV cache): idle until a submit or an abort,
                    # as vLLM leaves it waiting, instead of spinning
                    self._wake.clear()
                    await self._wake.wait()
                    modelled_end = None
                continue
            launching = [s for s, c in scheduled if c.start == s.cached and s.image_tokens and not s.pass_launched]
            if launching and self.cost.vision_pass_s > 0:
                for seq in launching:
                    seq.pass_launched = True
                modelled_end = await self._pass_step(start, decodes)
                continue
            # every image here had its pass's fixed time spent in the step before (vision_pass_ms 0: none to spend)
            duration = self.cost.step_seconds([s.context for s in decodes],
                                              [c for _, c in scheduled], encoder_images, pass_fixed=False)
            if self.gpu is not None:            # its GPU part shared with the engines beside it (not fused:
                await self.on_shared_gpu(start, duration)   # each step's length depends on what they run)
                modelled_end = self.clock()
            else:
                modelled_end = start + duration * self.time_scale
                if (self.fuse_decodes and decodes and not scheduled and not encoder_images
                        and self.stats.preemptions == preemptions):
                    modelled_end = await self._run_stretch(decodes, modelled_end, duration)
                    continue
                await self.sleep(max(0.0, modelled_end - self.clock()))
            self.lag.observe(max(0.0, self.clock() - modelled_end) / self.time_scale)
            self.stats.steps += 1
            self.stats.busy_s += (modelled_end - start) / self.time_scale
            self.stats.encoder_tokens += sum(encoder_images)
            self._finish_step(decodes, scheduled, modelled_end)

    def _decodes_seconds(self, decodes: list[Sequence]) -> float:
        return self.cost.step_seconds([s.context for s in decodes], []) if decodes else 0.0

    async def _pass_step(self, start: float, decodes: list[Sequence]) -> float:
        """The step before one that encodes images, when a vision pass has a fixed time (hardware.vision_pass_ms):
        the engine spends it on the host, preparing and launching the pass, while the GPU runs the decodes planned
        with it, which then get their token; the images' requests are scheduled from its start and their pass (its
        law's time) and prefill run in the next step. So in the H100 records at 1792 px, c=4
        (benchmarks/data/README.md), the running decodes stall twice as an image request starts — 66–94 ms, then
        112–141 ms ending with its first token — where one step of both would stall them once."""
        if self.gpu is not None:      # the decodes' GPU work in the share, beside the host's fixed time
            await asyncio.gather(self.sleep(max(0.0, start + self.cost.vision_pass_s - self.clock())),
                                 self.on_shared_gpu(start, self._decodes_seconds(decodes)))
            end = self.clock()
        else:
            end = start + max(self.cost.vision_pass_s, self._decodes_seconds(decodes)) * self.time_scale
            await self.sleep(max(0.0, end - self.clock()))
        self.lag.observe(max(0.0, self.clock() - end) / self.time_scale)
        self.stats.steps += 1
        self.stats.busy_s += (end - start) / self.time_scale
        self._finish_step(decodes, [], end)
        return end

    async def on_shared_gpu(self, start: float, duration: float) -> None:
        """Virtual time, on a GPU shared with other engines (sim.gpu): a step's (or an encode role's pass's) host part
        (step_overhead_ms) from `start`, then its GPU part at the share the others leave it."""
        host = min(duration, self.cost.hw.step_overhead_ms / 1e3)
        await self.sleep(max(0.0, start + host - self.clock()))
        await self.gpu.run(duration - host)

    async def _run_stretch(self, decodes: list[Sequence], first_end: float, first_duration: float) -> float:
        """Virtual time: the planned decode-only step and the ones that follow it unchanged (sim.fused), waited
        for as one event. A submit or an abort cuts the stretch: the steps that ended by then and the one in
        progress are done, as stepping one by one would have done them (that one was planned before the
        event), and the engine plans again at the in-progress step's end. Returns the last done step's end."""
        free = self.kv_blocks - self.used_blocks()
        free -= new_blocks(decodes)
        contexts = [s.context for s in decodes]
        ends, durations = decode_stretch(self.cost, contexts, [s.max_tokens - s.generated for s in decodes], free,
                                         first_end, first_duration, self.time_scale)
        if self.prefix_cache is not None:   # the stretch's blocks, taken at its start (stepping: step by step)
            self.prefix_cache.fit(free - sum(blocks(k + len(ends) - 1) - blocks(k) for k in contexts))
        loop = asyncio.get_running_loop()
        self._interrupt = loop.create_future()
        timer = loop.call_at(ends[-1], self._cut_stretch)
        try:
            await self._interrupt
        finally:
            timer.cancel()
            self._interrupt = None
        now = self.clock()
        done = min(len(ends), bisect.bisect_left(ends, now) + 1)
        live = [s for s in decodes if not s.aborted]     # as _finish_step of a decode-only step
        self.lag.observe(0.0, done)
        self.stats.steps += done
        for duration in durations[:done]:
            self.stats.busy_s += duration
        # the tokens of every done step at once: each step's output_stamps, arranged per sequence (a sequence
        # finishes at the stretch's last step at the earliest, so the order of events per sequence is unchanged)
        per_token = self._output_per_token()
        starts = [self._output_start(end, len(live)) for end in ends[:done]]
        for k, seq in enumerate(live):
            offset = per_token * (k + 1) if per_token > 0 else 0.0
            self._emit_tokens(seq, [start + offset for start in starts])
        if ends[done - 1] > now:
            await self.sleep(ends[done - 1] - now)
        return ends[done - 1]

    def _finish_step(self, decodes, scheduled, modelled_end: float = 0.0) -> None:
        emitted = [seq for seq in decodes if not seq.aborted]
        for seq, chunk in scheduled:
            if seq.aborted:
                continue
            seq.computed += chunk.tokens
            seq.image_tokens = []
            self.stats.prompt_tokens_computed += chunk.tokens
            if seq.computed >= seq.prefill_end:
                if seq.prefill_end_at is None:
                    seq.prefill_end_at = modelled_end
                if self.prefix_cache is not None and seq.block_hashes is not None:
                    self.prefix_cache.register(seq.block_hashes, seq.shared)
                seq.computed -= seq.recompute_tokens   # recomputed output tokens count as generated again
                seq.recompute_tokens = 0
                drop(self.waiting, seq)
                bisect.insort(self.running, seq, key=admission_order)
                emitted.append(seq)    # the step that completes a prefill also samples the next token
        for seq, stamp in zip(emitted, self.output_stamps(modelled_end, len(emitted))):
            self._emit(seq, stamp)

    def output_stamps(self, step_end: float, n: int) -> list[float]:
        """When each of a step's `n` tokens leaves the API server, on the host clock: vLLM's output handler
        (vllm/v1/engine/async_llm.py) takes a step's outputs in order once the step ends and, on the API server's
        one event loop, detokenizes each, turns it into a RequestOutput and its SSE chunk
        (hardware.output_us_per_token each, physics.costmodel.output_seconds); a step's outputs wait for the
        previous step's. The engine core runs on in its own process meanwhile, so this never delays a step."""
        per_token = self._output_per_token()
        if per_token <= 0:
            return [step_end] * n
        t = self._output_start(step_end, n)
        return [t + per_token * (k + 1) for k in range(n)]

    def _output_per_token(self) -> float:
        return output_seconds(self.cost.hw, 1) * self.time_scale

    def _output_start(self, step_end: float, n: int) -> float:
        """When the output path takes up a step's `n` tokens (the k-th leaves per_token · k later); it is then busy
        until the last has left. Without an output cost, at the step's end."""
        per_token = self._output_per_token()
        if per_token <= 0:
            return step_end
        t = max(step_end, self._output_busy)
        if n:
            self._output_busy = t + per_token * n
        return t

    def _emit_tokens(self, seq: Sequence, stamps: list[float]) -> None:
        """Several tokens of one sequence, none but the last able to finish it (a fused stretch): at once when its
        event sink takes a list (`put_stamps`, the virtual core's), else one by one."""
        put = getattr(seq.out, "put_stamps", None)
        if put is None:
            for stamp in stamps:
                self._emit(seq, stamp)
            return
        seq.generated += len(stamps)
        self.stats.generation_tokens += len(stamps)
        if stamps:
            seq.first_token_at = stamps[0] if seq.first_token_at is None else seq.first_token_at
            seq.last_token_at = stamps[-1]
        put(stamps)
        self._finish_if_done(seq)

    def _emit(self, seq: Sequence, modelled_end: float) -> None:
        """One token; its event carries the host-clock time it was modelled to leave the API server (its step's end,
        plus the output path: output_stamps)."""
        seq.generated += 1
        self.stats.generation_tokens += 1
        if seq.first_token_at is None:
            seq.first_token_at = modelled_end
        seq.last_token_at = modelled_end
        seq.out.put_nowait(("token", modelled_end))
        self._finish_if_done(seq)

    def _finish_if_done(self, seq: Sequence) -> None:
        if seq.generated >= seq.max_tokens:
            seq.finish_reason = "length"
            self.running.remove(seq)
            self._release(seq, blocks(seq.computed + seq.generated - 1))
            self.stats.requests_finished += 1
            seq.out.put_nowait(("done", "length"))

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence whose client went away (also mid-step: the step's results skip it)."""
        self._cut_stretch()
        seq.aborted = True
        if drop(self.running, seq):
            self._release(seq, blocks(seq.computed + seq.generated - 1))
        elif drop(self.waiting, seq) and seq.admitted is not None:
            self._release(seq, blocks(seq.computed))
        seq.admitted = None
        self._wake.set()   # its blocks are free: a sequence waiting for them may fit now

    def _release(self, seq: Sequence, own: int) -> int:
        """Free `own` blocks of a sequence, its shared prefix blocks among them (sim.prefix_cache: last first);
        returns the blocks that became free."""
        if self.prefix_cache is None:
            return own
        return self.prefix_cache.release(seq.shared, own - len(seq.shared))
