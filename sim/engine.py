"""Step-level continuous-batching engine: the timing core of one simulated vLLM replica.

Each step packs every running decode (one token each) plus prefill chunks of waiting sequences
into the token budget (max_num_batched_tokens), as vLLM's scheduler does with chunked prefill.
The step lasts what the cost model says, so a long prefill co-scheduled with decodes stretches
their token gaps in aggregated mode, and a decode-only replica (PD) does not see it.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from epdbench.physics.costmodel import CostModel, chunk_prefill
from epdbench.specs.models import EngineSpec
from epdbench.timer import cancel_and_wait


@dataclass
class Sequence:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    image_tokens: int = 0          # vision work this engine must do before the first prefill chunk
    computed: int = 0              # prompt tokens already in the KV cache
    cached: int = 0                # of which found in the prefix cache
    generated: int = 0
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    finish_reason: str | None = None
    aborted: bool = False
    on_prefilled: object = None    # callable run once the prompt's KV is complete (prefix-cache insert)
    arrived: float | None = None   # host clock at submit: no step that serves it can start earlier
    scheduled: bool = False        # served by a step already

    @property
    def context(self) -> int:
        return self.computed + self.generated


# Upper edges of the emulation-lag histograms (seconds of modelled time): fine below 10 ms, where a lag
# starts to matter against decode steps of a few ms.
LAG_BUCKETS_S = (0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25,
                 0.5, 1.0)


@dataclass
class Lag:
    """How late events happened against their modelled time (emulation lag): count, sum, max and a
    cumulative histogram over LAG_BUCKETS_S, in modelled seconds."""
    count: int = 0
    sum_s: float = 0.0
    max_s: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(LAG_BUCKETS_S))

    def observe(self, lag_s: float) -> None:
        self.count += 1
        self.sum_s += lag_s
        self.max_s = max(self.max_s, lag_s)
        for i, edge in enumerate(LAG_BUCKETS_S):
            if lag_s <= edge:
                self.buckets[i] += 1


@dataclass
class EngineStats:
    steps: int = 0
    busy_s: float = 0.0
    prompt_tokens_computed: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    encoder_tokens: int = 0


class Engine:
    """Runs steps while there is work; tokens are pushed to each sequence's queue as
    ("token", n) events and a final ("done", finish_reason)."""

    def __init__(self, cost: CostModel, limits: EngineSpec, clock=time.perf_counter, sleep=asyncio.sleep,
                 time_scale: float = 1.0):
        self.cost = cost
        self.limits = limits
        self.clock, self.sleep = clock, sleep
        self.time_scale = time_scale   # modelled durations are stretched by this factor on the host clock
        self.lag = Lag()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = EngineStats()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def submit(self, seq: Sequence) -> None:
        seq.arrived = self.clock()
        self.waiting.append(seq)
        self._wake.set()

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def plan_step(self):
        """Choose this step's work: (decodes, [(seq, chunk)], encoder_tokens)."""
        decodes = self.running[: self.limits.max_num_seqs]
        budget = self.limits.max_num_batched_tokens - len(decodes)
        slots = self.limits.max_num_seqs - len(decodes)
        candidates = list(self.waiting)[: max(0, slots)]
        chunks = chunk_prefill([(s.computed, s.prompt_tokens) for s in candidates], budget)
        scheduled = [(candidates[i], c) for i, c in chunks]
        encoder_tokens = sum(s.image_tokens for s, c in scheduled if c.start == s.computed == 0)
        return decodes, scheduled, encoder_tokens

    async def _run(self) -> None:
        """Steps on the modelled timeline: while the engine stays busy, a step starts where the last one was
        modelled to end, not when the host woke it, so a late step is made up by the next one and host
        overheads never add up; after an idle wait the timeline restarts at the wake-up, and a step that
        serves a sequence for the first time starts no earlier than its arrival (a host that fell behind
        cannot let a new request into a step modelled to start before it came). Each step lasts
        its modelled duration × time_scale on the host clock. How late each step ended against its
        modelled end is measured (`lag`, in modelled seconds); the tokens it emits carry that end, so the
        response writer can measure how late each reached the client's socket."""
        modelled_end: float | None = None
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                modelled_end = None
            start = self.clock() if modelled_end is None else modelled_end
            decodes, scheduled, encoder_tokens = self.plan_step()
            newcomers = [s.arrived for s, _ in scheduled if not s.scheduled and s.arrived is not None]
            start = max([start, *newcomers])
            for s, _ in scheduled:
                s.scheduled = True
            duration = self.cost.step_seconds([s.context for s in decodes],
                                              [c for _, c in scheduled], encoder_tokens)
            modelled_end = start + duration * self.time_scale
            await self.sleep(max(0.0, modelled_end - self.clock()))
            self.lag.observe(max(0.0, self.clock() - modelled_end) / self.time_scale)
            self.stats.steps += 1
            self.stats.busy_s += duration
            self.stats.encoder_tokens += encoder_tokens
            self._finish_step(decodes, scheduled, modelled_end)

    def _finish_step(self, decodes, scheduled, modelled_end: float = 0.0) -> None:
        for seq in decodes:
            if not seq.aborted:
                self._emit(seq, modelled_end)
        for seq, chunk in scheduled:
            if seq.aborted:
                continue
            seq.computed += chunk.tokens
            seq.image_tokens = 0
            self.stats.prompt_tokens_computed += chunk.tokens
            if seq.computed >= seq.prompt_tokens:
                if seq.on_prefilled:
                    seq.on_prefilled()
                self.waiting.remove(seq)
                self.running.append(seq)
                self._emit(seq, modelled_end)  # the step that completes a prefill also samples the first token

    def _emit(self, seq: Sequence, modelled_end: float) -> None:
        """One token; its event carries the host-clock time the step was modelled to end."""
        seq.generated += 1
        self.stats.generation_tokens += 1
        seq.out.put_nowait(("token", modelled_end))
        if seq.generated >= seq.max_tokens:
            seq.finish_reason = "length"
            self.running.remove(seq)
            self.stats.requests_finished += 1
            seq.out.put_nowait(("done", "length"))

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence whose client went away (also mid-step: the step's results skip it)."""
        seq.aborted = True
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
