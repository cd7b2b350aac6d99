"""A vision pass's fixed time (hardware.vision_pass_ms) is a step of its own before the step that encodes and
prefills: the running decodes get a token at its end (sim.engine)."""
import asyncio

import pytest

from epdbench.physics.costmodel import CostModel, PrefillChunk
from epdbench.sim.engine import Engine, Sequence
from epdbench.sim.vloop import run
from epdbench.specs.models import load_spec
from tests.sim.streams import token_gaps

SPEC = load_spec("vllm-truth")


def serve(pass_ms: float) -> tuple[list[float], float, CostModel]:
    """A decoding request's token gaps while a 560-px image request (827 prompt tokens, 400 of them the image's)
    starts beside it; and the image request's prefill time (scheduled to first token)."""
    cost = CostModel(SPEC.model, SPEC.hardware.model_copy(update={"vision_pass_ms": pass_ms}))

    async def main():
        loop = asyncio.get_running_loop()
        e = Engine(cost, SPEC.engine, clock=loop.time)
        e.start()
        a, img = Sequence("a", prompt_tokens=16, max_tokens=30), Sequence("img", 827, 2, image_tokens=[400])
        e.submit(a)

        async def first_token() -> float:
            await asyncio.wait_for(img.out.get(), timeout=5.0)
            return loop.time()
        first = []
        try:
            gaps = await token_gaps(a, 5, lambda: (e.submit(img), first.append(asyncio.ensure_future(first_token()))))
            return gaps, await first[0] - img.scheduled_at
        finally:
            await e.stop()
    gaps, prefill = run(main())
    return gaps, prefill, cost


def test_the_passs_fixed_time_stalls_the_decodes_in_two_gaps_not_one():
    gaps, prefill, cost = serve(40.0)
    decode = cost.step_seconds([21], [])
    long = [g for g in gaps if g > 3 * decode]
    assert len(long) == 2                                      # the pass step, then the encode-and-prefill step
    assert long[0] == pytest.approx(0.040, rel=0.01)          # the fixed time (longer than a decode step)
    whole = cost.step_seconds([22], [PrefillChunk(0, 827)], [400], pass_fixed=False)
    assert long[1] == pytest.approx(whole, rel=0.01)
    assert prefill == pytest.approx(sum(long), rel=0.01)      # scheduled at the pass step's start


def test_without_a_fixed_time_one_step_encodes_and_prefills():
    gaps, prefill, cost = serve(0.0)
    decode = cost.step_seconds([21], [])
    long = [g for g in gaps if g > 3 * decode]
    assert len(long) == 1 and prefill == pytest.approx(long[0], rel=0.01)
    # the same request's prefill with the fixed time is that much longer, in total
    assert serve(40.0)[1] == pytest.approx(prefill + 0.040, rel=0.02)
