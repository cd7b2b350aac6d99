"""sim/fused.py: the steps of a decode stretch — as many as the first decode to finish allows, cut where a
decode's next KV block would not fit, each lasting what step_seconds says for its contexts."""
from __future__ import annotations

import pytest

from epdbench.physics.costmodel import CostModel
from epdbench.sim.fused import decode_stretch
from epdbench.specs.models import load_spec


@pytest.fixture(scope="module")
def cost():
    spec = load_spec("smoke")
    return CostModel(spec.model, spec.hardware)


def test_a_stretch_lasts_until_the_first_decode_finishes_with_each_steps_own_duration(cost):
    kv, first = [100, 250], cost.step_seconds([100, 250], [])
    ends, durations = decode_stretch(cost, kv, [5, 9], free_blocks=10, first_end=1.0 + first, first_duration=first)
    assert len(ends) == len(durations) == 5
    assert durations == [cost.step_seconds([k + i for k in kv], []) for i in range(5)]
    assert ends[-1] == pytest.approx(1.0 + sum(durations), abs=1e-12)
    assert all(b - a == pytest.approx(d) for a, b, d in zip(ends, ends[1:], durations[1:]))


def test_a_stretch_ends_before_the_step_whose_blocks_do_not_fit(cost):
    # contexts 17 and 33: step i needs a block for each decode whose kv + i − 1 fills whole blocks, i.e. both
    # at i = 16 (32 and 48 tokens); with one block free that step is left to the engine's own planning
    ends, _ = decode_stretch(cost, [17, 33], [100, 100], free_blocks=1, first_end=0.0, first_duration=0.0)
    assert len(ends) == 16
    ends, _ = decode_stretch(cost, [17, 33], [100, 100], free_blocks=2, first_end=0.0, first_duration=0.0)
    assert len(ends) == 32


def test_a_stretch_is_bounded_and_scaled_by_time_scale(cost):
    first = cost.step_seconds([10], [])
    ends, _ = decode_stretch(cost, [10], [10_000], 10_000, first * 3, first, time_scale=3.0, max_steps=50)
    assert len(ends) == 50
    assert ends[1] - ends[0] == pytest.approx(3 * cost.step_seconds([11], []))


def reference_stretch(cost, kv, remaining, free_blocks, first_end, first_duration, time_scale=1.0, max_steps=1024):
    """Step by step, as the engine plans: each step takes a block for every decode whose context fills whole
    blocks, lasts step_seconds of its contexts, and the stretch stops before a step whose blocks do not fit."""
    ends, durations, end = [first_end], [first_duration], first_end
    for i in range(1, min(min(remaining), max_steps)):
        needs = sum(1 for k in kv if (k + i - 1) % 16 == 0)
        if needs > free_blocks:
            break
        free_blocks -= needs
        duration = cost.step_seconds([k + i for k in kv], [])
        end += duration * time_scale
        ends.append(end)
        durations.append(duration)
    return ends, durations


def test_a_stretch_is_the_steps_the_engine_would_plan_one_by_one(cost):
    import random
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(1, 12)
        kv = [rng.randint(1, 3000) for _ in range(n)]
        remaining = [rng.randint(1, 400) for _ in range(n)]
        free = rng.choice([0, 1, n, 3 * n, 10_000])
        first = cost.step_seconds(kv, [])
        scale = rng.choice([1.0, 2.5])
        got = decode_stretch(cost, kv, remaining, free, 3.0 + first, first, scale, max_steps=300)
        want = reference_stretch(cost, kv, remaining, free, 3.0 + first, first, scale, max_steps=300)
        assert len(got[0]) == len(want[0])
        assert got[1] == pytest.approx(want[1], rel=1e-12) and got[0] == pytest.approx(want[0], rel=1e-12)
