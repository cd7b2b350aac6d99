"""sim/engine.py: step planning (token budget, max_num_seqs, mixed steps) and the timing it produces."""
from __future__ import annotations

import asyncio
import statistics

import pytest

from epdbench.physics.costmodel import CostModel, PrefillChunk
from epdbench.sim.engine import Engine, Sequence
from epdbench.specs.models import EngineSpec, HardwareSpec, ModelSpec

# A toy model on a toy GPU: a decode step reads 2 GB at 1 TB/s (2 ms) + 1 ms overhead = 3 ms;
# a 512-token prefill chunk needs ~1 TFLOP at 20 TFLOP/s (~51 ms).
TINY = ModelSpec(name="toy/tiny", params_b=1.0, n_layers=4, hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64)
TOY_GPU = HardwareSpec(gpu="toy", bf16_tflops=20, hbm_tb_s=1.0, compute_efficiency=1.0, hbm_efficiency=1.0,
                       step_overhead_ms=1.0, nvlink_gb_s=100, tcp_gb_s=1.0, rdma_nic_gbit_s=100, output_us_per_token=0.0)
COST = CostModel(TINY, TOY_GPU)


def engine(**limits) -> Engine:
    return Engine(COST, EngineSpec(**limits))


def decoding(rid: str, prompt: int = 16, max_tokens: int = 100) -> Sequence:
    """A sequence whose prompt is already in the KV cache (it is in the running set)."""
    return Sequence(rid, prompt, max_tokens, computed=prompt, generated=1)


def test_figures_give_steps_of_a_few_ms():
    assert 2.5e-3 < COST.step_seconds([16], []) < 3.5e-3
    assert 40e-3 < COST.step_seconds([16], [PrefillChunk(0, 511)]) < 60e-3


def test_decodes_and_a_prefill_chunk_share_one_step():
    e = engine(max_num_batched_tokens=1024, max_num_seqs=8)
    a, b = decoding("a"), decoding("b")
    e.running += [a, b]
    c = Sequence("c", 100, 4)
    e.submit(c)
    decodes, scheduled, encoder_images = e.plan_step()
    assert decodes == [a, b]
    assert scheduled == [(c, PrefillChunk(start=0, tokens=100))]
    assert encoder_images == []


def test_token_budget_counts_decodes_and_splits_the_prefill():
    e = engine(max_num_batched_tokens=64, max_num_seqs=16)
    e.running += [decoding(f"d{i}") for i in range(4)]
    long, short = Sequence("long", 200, 4), Sequence("short", 10, 4)
    e.submit(long)
    e.submit(short)
    decodes, scheduled, _ = e.plan_step()
    assert len(decodes) + sum(c.tokens for _, c in scheduled) == 64
    assert scheduled == [(long, PrefillChunk(start=0, tokens=60))]   # FCFS: the short one waits


def test_partially_prefilled_sequence_resumes_where_it_stopped():
    e = engine(max_num_batched_tokens=64, max_num_seqs=16)
    seq = Sequence("long", 200, 4, computed=120)
    e.submit(seq)
    _, scheduled, _ = e.plan_step()
    assert scheduled == [(seq, PrefillChunk(start=120, tokens=64))]


def test_max_num_seqs_limits_new_prefills():
    e = engine(max_num_batched_tokens=1024, max_num_seqs=3)
    e.running += [decoding("a"), decoding("b")]
    waiting = [Sequence(f"w{i}", 10, 4) for i in range(3)]
    for s in waiting:
        e.submit(s)
    decodes, scheduled, _ = e.plan_step()
    assert len(decodes) == 2
    assert [s for s, _ in scheduled] == [waiting[0]]


def test_max_num_seqs_limits_decodes_and_blocks_prefill_when_full():
    e = engine(max_num_batched_tokens=1024, max_num_seqs=3)
    e.running += [decoding(f"d{i}") for i in range(5)]
    e.submit(Sequence("w", 10, 4))
    decodes, scheduled, _ = e.plan_step()
    assert decodes == e.running[:3]
    assert scheduled == []


def test_encoder_work_is_charged_with_the_first_chunk_only():
    e = engine(max_num_batched_tokens=64, max_num_seqs=4)
    fresh = Sequence("img", 500, 4, image_tokens=[400])
    e.submit(fresh)
    assert e.plan_step()[2] == [400]
    fresh.computed = 64
    assert e.plan_step()[2] == []


async def _token_times(long_prompt: int | None) -> list[float]:
    """Loop time of each token of a short decoding sequence; a long prompt arrives after its 4th token."""
    loop = asyncio.get_running_loop()
    e = engine(max_num_batched_tokens=512, max_num_seqs=8)
    e.start()
    a = Sequence("a", prompt_tokens=16, max_tokens=24)
    e.submit(a)
    times: list[float] = []
    try:
        while True:
            kind, _ = await asyncio.wait_for(a.out.get(), timeout=1.0)
            if kind == "done":
                break
            times.append(loop.time())
            if long_prompt and len(times) == 4:
                e.submit(Sequence("b", prompt_tokens=long_prompt, max_tokens=2))
    finally:
        await e.stop()
    return times


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


def test_long_prompt_stretches_a_co_scheduled_decode():
    alone = _gaps(asyncio.run(_token_times(None)))
    mixed = _gaps(asyncio.run(_token_times(1024)))
    assert len(alone) == len(mixed) == 23
    mixed_step = COST.step_seconds([20], [PrefillChunk(0, 511)])   # ~51 ms: one decode + one 511-token chunk
    decode_step = COST.step_seconds([20], [])                       # ~3 ms
    # 1024 prompt tokens at 511 per step: two gaps of the decoding sequence last a whole mixed step
    assert sorted(mixed)[-2] >= 0.9 * mixed_step
    assert statistics.median(alone) == pytest.approx(decode_step, abs=2e-3)
    assert max(alone) < 0.5 * mixed_step
    assert max(mixed) > 4 * max(alone)


async def _abort_then_serve(abort_after_first_token: bool) -> str:
    e = engine(max_num_batched_tokens=1024, max_num_seqs=8)
    e.start()
    victim = Sequence("victim", prompt_tokens=16 if abort_after_first_token else 512,
                      max_tokens=2 if abort_after_first_token else 50)
    e.submit(victim)
    if abort_after_first_token:
        await victim.out.get()      # the engine is now inside the step that emits the last token
    else:
        await asyncio.sleep(0)      # the engine is now inside the step that prefills the whole prompt
    e.abort(victim)                 # the client went away mid-step (server.py does this on disconnect)
    other = Sequence("other", prompt_tokens=16, max_tokens=1)
    e.submit(other)
    try:
        kind, _ = await asyncio.wait_for(other.out.get(), timeout=0.3)
        return kind
    finally:
        await e.stop()


@pytest.mark.parametrize("after_first_token", [False, True], ids=["abort-during-prefill", "abort-during-decode"])
def test_engine_keeps_serving_after_an_abort_mid_step(after_first_token):
    assert asyncio.run(_abort_then_serve(after_first_token)) == "token"


class HostClock:
    """A scripted host: sleep(d) lasts d plus the overshoot scripted for that call (0 when none)."""

    def __init__(self, overshoots: list[float]):
        self.now, self.overshoots = 0.0, list(overshoots)

    def clock(self) -> float:
        return self.now

    async def sleep(self, d: float) -> None:
        self.now += d + (self.overshoots.pop(0) if self.overshoots else 0.0)
        await asyncio.sleep(0)


async def token_times(e: Engine, seq: Sequence, host: HostClock) -> list[float]:
    """Host times at which the engine emitted each token of `seq`."""
    times: list[float] = []
    emit = e._emit

    def stamped(s: Sequence, modelled_end: float) -> None:
        times.append(host.now)
        emit(s, modelled_end)
    e._emit = stamped
    e.start()
    e.submit(seq)
    try:
        while (await asyncio.wait_for(seq.out.get(), timeout=5))[0] != "done":
            pass
        return times
    finally:
        await e.stop()


def test_a_late_step_is_made_up_by_the_next_one_on_the_modelled_timeline():
    d = COST.step_seconds([16], [])                        # one decode step of the toy model
    prefill = COST.step_seconds([], [PrefillChunk(0, 16)])
    host = HostClock([0.0, 0.5 * d])                       # the first decode step wakes half a step late
    e = Engine(COST, EngineSpec(), clock=host.clock, sleep=host.sleep)
    times = asyncio.run(token_times(e, Sequence("s", 16, 5), host))
    # step k (k ≥ 1) is modelled to end at prefill + k·d; only the late step's token comes late
    # (a decode step grows by nanoseconds with the context: 1 µs of tolerance, against a 1.5 ms delay)
    assert times[0] == pytest.approx(prefill, abs=1e-6)
    assert times[1] == pytest.approx(prefill + 1.5 * d, abs=1e-6)
    assert times[2:] == pytest.approx([prefill + k * d for k in range(2, 5)], abs=1e-6)
    assert e.lag.count == 5 and e.lag.max_s == pytest.approx(0.5 * d) and e.lag.sum_s == pytest.approx(0.5 * d)


def test_after_an_idle_wait_the_timeline_restarts_at_the_wake_up():
    host = HostClock([])
    e = Engine(COST, EngineSpec(), clock=host.clock, sleep=host.sleep)
    first = asyncio.run(token_times(e, Sequence("a", 16, 2), host))
    host.now += 1.0                                        # idle for a second
    e2 = Engine(COST, EngineSpec(), clock=host.clock, sleep=host.sleep)
    second = asyncio.run(token_times(e2, Sequence("b", 16, 2), host))
    assert second[0] - (first[-1] + 1.0) == pytest.approx(first[0])   # same modelled durations from the wake-up
    assert e.lag.max_s == 0.0 and e2.lag.max_s == 0.0


def test_time_scale_stretches_steps_on_the_host_clock_and_reports_lag_in_modelled_time():
    d = COST.step_seconds([16], [])
    prefill = COST.step_seconds([], [PrefillChunk(0, 16)])
    host = HostClock([0.0, 0.5 * d])                       # the first decode step wakes 0.5·d host seconds late
    e = Engine(COST, EngineSpec(), clock=host.clock, sleep=host.sleep, time_scale=4.0)
    times = asyncio.run(token_times(e, Sequence("s", 16, 3), host))
    assert times[0] == pytest.approx(4 * prefill, abs=1e-6)
    assert times[2] == pytest.approx(4 * (prefill + 2 * d), abs=1e-6)   # made up on the stretched timeline
    assert e.lag.max_s == pytest.approx(0.5 * d / 4)                    # host lateness over the scale
    assert e.stats.busy_s == pytest.approx(prefill + 2 * d, rel=1e-3)   # busy time stays modelled


def test_emitted_tokens_carry_their_steps_modelled_end():
    host = HostClock([])
    e = Engine(COST, EngineSpec(), clock=host.clock, sleep=host.sleep)
    seq = Sequence("s", 16, 2)

    async def events():
        e.start()
        e.submit(seq)
        out = [await asyncio.wait_for(seq.out.get(), timeout=5) for _ in range(3)]
        await e.stop()
        return out
    (k1, t1), (k2, t2), (k3, _) = asyncio.run(events())
    assert (k1, k2, k3) == ("token", "token", "done")
    assert t1 == pytest.approx(COST.step_seconds([], [PrefillChunk(0, 16)]))
    assert t2 - t1 == pytest.approx(COST.step_seconds([16], []), rel=1e-3)


def test_a_steps_tokens_leave_the_api_server_one_after_another_without_delaying_the_engine():
    c = 0.5e-3                                               # 500 µs per token on the output path
    cost = CostModel(TINY, TOY_GPU.model_copy(update={"output_us_per_token": c * 1e6}))
    host = HostClock([])
    e = Engine(cost, EngineSpec(), clock=host.clock, sleep=host.sleep)
    seqs = [Sequence(f"s{i}", 16, 3) for i in range(4)]

    async def go():
        e.start()
        for s in seqs:
            e.submit(s)
        out = {s.request_id: [(await asyncio.wait_for(s.out.get(), timeout=5)) for _ in range(4)] for s in seqs}
        await e.stop()
        return out
    out = asyncio.run(go())
    prefill = cost.step_seconds([], [PrefillChunk(0, 16)] * 4)
    decode = cost.step_seconds([17] * 4, [])
    stamps = [[v for k, v in out[s.request_id] if k == "token"] for s in seqs]
    assert all(out[s.request_id][-1] == ("done", "length") for s in seqs)
    # the prefill step's four tokens leave at its end + 1, 2, 3, 4 × c, in the step's order
    assert [st[0] for st in stamps] == pytest.approx([prefill + k * c for k in (1, 2, 3, 4)], abs=1e-9)
    # the engine stepped on its own timeline (decode steps of ~3 ms); each step's tokens queue behind the last's
    assert [st[1] for st in stamps] == pytest.approx([prefill + decode + k * c for k in (1, 2, 3, 4)], abs=1e-6)
    assert e.stats.busy_s == pytest.approx(prefill + 2 * decode, rel=1e-3)
    # an output path slower than the steps falls behind: tokens leave at its pace, not the engine's
    assert e.output_stamps(0.0, 1000)[-1] > stamps[-1][-1] + 1000 * c - 1e-9


def test_a_request_joining_a_late_engine_is_not_served_before_it_arrived():
    d = COST.step_seconds([16], [])
    host = HostClock([0.0, 50 * d])                        # the first decode step wakes 50 steps late
    e = Engine(COST, EngineSpec(), clock=host.clock, sleep=host.sleep)
    a, b = Sequence("a", 16, 200), Sequence("b", 16, 1)

    async def go():
        e.start()
        e.submit(a)
        for _ in range(2):
            await asyncio.wait_for(a.out.get(), timeout=5)
        arrived = host.now                                   # b comes while the timeline lags the host
        e.submit(b)
        kind, end = await asyncio.wait_for(b.out.get(), timeout=5)
        await e.stop()
        return arrived, end
    arrived, first_token = asyncio.run(go())
    assert first_token >= arrived + COST.step_seconds([17], [PrefillChunk(0, 16)]) - 1e-9


def test_a_request_joining_a_late_engine_does_not_stretch_the_running_token_gaps():
    d = COST.step_seconds([16], [])
    mixed = COST.step_seconds([60], [PrefillChunk(0, 256)])  # the longest step a's tokens can see: a decode, b's prefill
    host = HostClock([0.0, 0.0, 20 * d])                   # the second decode step wakes 20 steps late
    e = Engine(COST, EngineSpec(), clock=host.clock, sleep=host.sleep)
    a, b = Sequence("a", 16, 40), Sequence("b", 256, 1)

    async def go():
        e.start()
        e.submit(a)
        stamps = [(await asyncio.wait_for(a.out.get(), timeout=5))[1] for _ in range(3)]
        arrived = host.now                                   # b comes 20 steps after a's last modelled token
        e.submit(b)
        while (event := await asyncio.wait_for(a.out.get(), timeout=5))[0] != "done":
            stamps.append(event[1])
        first_b = (await asyncio.wait_for(b.out.get(), timeout=5))[1]
        await e.stop()
        return stamps, arrived, first_b
    stamps, arrived, first_b = asyncio.run(go())
    gaps = _gaps(stamps)
    assert len(stamps) == 40 and stamps[2] < arrived - 10 * d
    # the modelled engine went on decoding a while the host was late, and took b in at the first step that starts
    # after b came: no gap of a holds the host's lateness, one holds b's prefill
    assert max(gaps) <= mixed + 1e-9 and sum(g > 1.5 * d for g in gaps) == 1
    assert arrived <= first_b - COST.step_seconds([], [PrefillChunk(0, 256)]) + 1e-9
    assert first_b - arrived < d + mixed


# --- KV cache capacity, admission, preemption and recompute (vLLM v1's scheduler) ---------------------------

def test_kv_blocks_come_from_gpu_memory_or_the_override():
    # 80 GB × 0.9 − 2 GB of weights = 70 GB, over 2 × 4 layers × 2 KV heads × 64 × 2 B = 2048 B per token
    assert Engine(COST, EngineSpec()).kv_blocks == 34_179_687 // 16
    assert Engine(COST, EngineSpec(gpu_memory_utilization=0.5)).kv_blocks == 18_554_687 // 16
    assert Engine(COST, EngineSpec(num_gpu_blocks_override=4)).kv_blocks == 4


def running(e: Engine, rid: str, kv_tokens: int, max_tokens: int = 100) -> Sequence:
    """A decoding sequence admitted now, holding the KV of `kv_tokens` tokens (its prompt and all but its last
    generated token)."""
    e._admissions += 1
    seq = Sequence(rid, kv_tokens, max_tokens, computed=kv_tokens, generated=1, admitted=e._admissions)
    e.running.append(seq)
    return seq


def test_a_waiting_request_is_admitted_only_when_its_whole_prompt_fits():
    e = engine(num_gpu_blocks_override=4, max_num_batched_tokens=16)
    a = running(e, "a", 40)                          # 3 blocks held, 1 free
    big, small = Sequence("big", 30, 4), Sequence("small", 10, 4)
    e.submit(big)
    e.submit(small)
    decodes, scheduled, _ = e.plan_step()
    assert decodes == [a] and scheduled == []        # big needs 2 blocks (even for a 15-token chunk); small waits
    e.waiting.remove(big)
    decodes, scheduled, _ = e.plan_step()
    assert scheduled == [(small, PrefillChunk(0, 10))] and small.admitted is not None
    assert e.stats.preemptions == 0


def test_a_decode_that_needs_a_block_preempts_the_newest_request():
    e = engine(num_gpu_blocks_override=4)
    a, b = running(e, "a", 32), running(e, "b", 32)  # 2 + 2 blocks: full; a's next token starts a third block
    late = Sequence("late", 8, 4)
    e.submit(late)
    decodes, scheduled, _ = e.plan_step()
    assert decodes == [a] and scheduled == []        # no admission in a step that preempted
    assert e.running == [a] and list(e.waiting) == [b, late]
    assert (b.computed, b.recompute_tokens, b.prefill_end, b.admitted, b.preemptions) == (0, 1, 33, None, 1)
    assert e.stats.preemptions == 1 and e.used_blocks() == 2


def test_the_newest_request_is_preempted_even_while_it_prefills_and_may_be_the_one_in_need():
    e = engine(num_gpu_blocks_override=4, max_num_batched_tokens=64)
    a = running(e, "a", 32)                          # 2 blocks
    p = Sequence("p", 100, 4, computed=32)           # admitted after a, prefilled 32 of 100: 2 blocks
    e._admissions += 1
    p.admitted = e._admissions
    e.waiting.append(p)
    decodes, scheduled, _ = e.plan_step()            # a needs a third block: p, the newest, goes back
    assert decodes == [a] and scheduled == [] and p.computed == 0 and e.stats.preemptions == 1
    e2 = engine(num_gpu_blocks_override=2)
    alone = running(e2, "alone", 32)                 # the whole cache: its next token cannot get a block
    assert e2.plan_step() == ([], [], [])
    assert list(e2.waiting) == [alone] and e2.running == [] and alone.recompute_tokens == 1


def test_the_encoder_runs_with_the_first_chunk_after_a_prefix_cache_hit():
    e = engine(max_num_batched_tokens=64, max_num_seqs=4)
    seq = Sequence("img", 500, 4, image_tokens=[400], computed=64, cached=64)
    e.submit(seq)
    assert e.plan_step()[2] == [400]


def test_a_preempted_request_recomputes_its_prompt_and_tokens_and_streams_each_token_once(serve):
    host = HostClock([])
    e = Engine(COST, EngineSpec(num_gpu_blocks_override=6), clock=host.clock, sleep=host.sleep)
    a, b = Sequence("a", 32, 40), Sequence("b", 32, 40)
    tokens = asyncio.run(serve(e, [a, b]))
    # both prefill in step 1 (2 + 2 blocks); at 48 tokens of KV each needs a 4th block and only 2 are free:
    # a's decode preempts b, which holds 17 tokens then; b fits again (4 blocks for 49 tokens) once a is done
    assert len(tokens["a"]) == len(tokens["b"]) == 40 and e.stats.generation_tokens == 80
    assert e.stats.preemptions == b.preemptions == 1 and a.preemptions == 0
    assert e.stats.prompt_tokens_computed == 32 + 32 + (32 + 17)
    assert tokens["b"][16] < tokens["a"][-1] < tokens["b"][17]
    recompute = COST.step_seconds([], [PrefillChunk(0, 49)])
    assert tokens["b"][17] - tokens["a"][-1] == pytest.approx(recompute, rel=1e-9)
    assert tokens["b"][18] - tokens["b"][17] == pytest.approx(COST.step_seconds([50], []), rel=1e-9)
    assert e.used_blocks() == 0


def test_a_request_larger_than_the_kv_cache_waits_without_spinning():
    host = HostClock([])
    e = Engine(COST, EngineSpec(num_gpu_blocks_override=2), clock=host.clock, sleep=host.sleep)
    plan, plans = e.plan_step, []

    def counted(*args):
        plans.append(1)
        if len(plans) > 100:
            raise RuntimeError("the engine spins")
        return plan(*args)
    e.plan_step = counted
    huge, small = Sequence("huge", 64, 2), Sequence("small", 8, 2)

    async def go():
        e.start()
        e.submit(huge)
        await asyncio.sleep(0.01)
        e.submit(small)                               # FCFS: it waits behind the one that can never fit
        await asyncio.sleep(0.01)
        stuck = len(plans)
        e.abort(huge)                                 # its client gives up: the small one is served
        kinds = [(await asyncio.wait_for(small.out.get(), timeout=5))[0] for _ in range(3)]
        await e.stop()
        return stuck, kinds
    stuck, kinds = asyncio.run(go())
    assert stuck <= 2 and kinds == ["token", "token", "done"]
