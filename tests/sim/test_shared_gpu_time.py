"""Engines on one GPU time-slice its compute (sim.gpu): processor sharing in virtual time."""
import asyncio

import pytest

from epdbench.sim.engine import Engine, Sequence
from epdbench.sim.gpu import GpuShare, shares_one_gpu
from epdbench.sim.vloop import run
from epdbench.specs.models import EngineSpec, load_spec
from tests.sim.streams import token_gaps
from tests.sim.test_engine import COST, TOY_GPU

LIMITS = EngineSpec(max_num_batched_tokens=512, max_num_seqs=8)


def ends(jobs: list[tuple[float, float]]) -> list[float]:
    """Each job (start, GPU seconds) on one shared GPU: when it ends."""
    async def main():
        gpu, loop = GpuShare(), asyncio.get_running_loop()

        async def job(start, seconds):
            await asyncio.sleep(start)
            await gpu.run(seconds)
            return round(loop.time(), 9)
        out = await asyncio.gather(*(job(s, w) for s, w in jobs))
        return out, round(gpu.busy_s, 9), round(gpu.shared_s, 9)
    return run(main())


def test_a_job_alone_runs_at_full_speed():
    assert ends([(1.0, 0.25)]) == ([1.25], 0.25, 0.0)


def test_two_jobs_at_once_each_run_at_half_speed():
    assert ends([(0.0, 1.0), (0.0, 1.0)]) == ([2.0, 2.0], 2.0, 2.0)


def test_a_short_job_arriving_during_a_long_one_slows_both_while_they_overlap():
    """A 10 ms decode step arriving 5 ms into a 100 ms prefill: 20 ms at half speed each, so the decode ends at
    25 ms and the prefill, 10 ms of its work lent, at 110 ms."""
    out, busy, shared = ends([(0.0, 0.100), (0.005, 0.010)])
    assert out == [pytest.approx(0.110), pytest.approx(0.025)]
    assert busy == pytest.approx(0.110) and shared == pytest.approx(0.020)


def test_three_jobs_share_in_thirds_then_halves():
    # 3 jobs of 0.3, 0.6, 0.9 s from t=0: the first ends at 0.9 (thirds), the second after 0.3 more at halves (1.5),
    # the last alone for 0.3 more (1.8)
    out, busy, shared = ends([(0.0, 0.3), (0.0, 0.6), (0.0, 0.9)])
    assert out == [pytest.approx(0.9), pytest.approx(1.5), pytest.approx(1.8)]
    assert busy == pytest.approx(1.8) and shared == pytest.approx(1.5)


def test_zero_work_returns_at_once():
    assert ends([(0.5, 0.0)]) == ([0.5], 0.0, 0.0)


def test_the_local_targets_one_gpu_placement_is_shared_on_the_simulator():
    spec = load_spec("gpu-qwen25vl")
    by_name = {c.name: c for c in spec.configurations}
    assert spec.target.local.gpu_share
    assert not shares_one_gpu(spec, by_name["aggregated"])         # one engine: nothing to share
    assert shares_one_gpu(spec, by_name["pd-nixl-tcp"]) and shares_one_gpu(spec, by_name["epd"])
    smoke = load_spec("smoke")
    assert not any(shares_one_gpu(smoke, c) for c in smoke.configurations)     # a GPU per role


def test_a_prefill_on_the_engine_beside_it_stretches_a_decodes_token_gaps_by_its_gpu_part():
    """PD on one GPU, in virtual time: a decode engine's token gaps while the prefill engine beside it computes a
    prompt last longer than alone — its steps' GPU part at half speed, their host part (step_overhead_ms) not;
    on GPUs of their own the same gaps are unchanged."""
    def gaps(shared: bool) -> list[float]:
        async def main():
            loop = asyncio.get_running_loop()
            decode, prefill = (Engine(COST, LIMITS, clock=loop.time) for _ in range(2))
            if shared:
                decode.gpu = prefill.gpu = GpuShare()
            decode.start(), prefill.start()
            a = Sequence("a", prompt_tokens=16, max_tokens=40)
            decode.submit(a)
            try:
                return await token_gaps(a, 5, lambda: prefill.submit(Sequence("b", prompt_tokens=2048, max_tokens=1)))
            finally:
                await decode.stop()
                await prefill.stop()
        return run(main())

    alone, beside = gaps(False), gaps(True)
    step = COST.step_seconds([20], [])
    host = TOY_GPU.step_overhead_ms / 1e3
    assert max(alone) == pytest.approx(step, rel=0.05)               # its own GPU: the prefill is elsewhere
    stretched = [g for g in beside if g > step * 1.05]
    assert stretched and max(beside) == pytest.approx(host + 2 * (step - host), rel=0.05)
    # the prefill, 4 chunks of ~51 ms alone on this toy GPU, takes half of it for longer still: 20 gaps and more
    assert len(stretched) >= 20
