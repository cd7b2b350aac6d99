"""physics/lone.py: a lone request's engine times from the step laws — its prompt in chunks of the step's token
budget, its images encoded with the first chunk, one decode step per further token over a growing context. (That
the virtual core's engine spends the same: tests/tasks/sim/test_engine_times.py.)"""
from __future__ import annotations

import pytest

from epdbench.physics.costmodel import CostModel, PrefillChunk
from epdbench.physics.lone import lone_request
from epdbench.specs.models import load_spec


@pytest.fixture(scope="module")
def spec():
    return load_spec("vllm-truth")


@pytest.fixture(scope="module")
def cost(spec):
    return CostModel(spec.model, spec.hardware, 1)


def test_a_prompt_within_the_budget_is_one_step_and_each_token_after_the_first_one_decode_step(spec, cost):
    times = lone_request(cost, spec.engine, 1024, [], 4)
    assert times.prefill_s == cost.step_seconds([], [PrefillChunk(0, 1024)])
    assert times.decode_s == sum(cost.decode_step_seconds(1, 1024 + k) for k in (1, 2, 3))
    assert times.decode_per_token_s(4) == pytest.approx(times.decode_s / 3)
    assert lone_request(cost, spec.engine, 1024, [], 1).decode_per_token_s(1) is None


def test_a_longer_prompt_is_chunked_at_the_budget_and_its_image_encoded_with_the_first_chunk(spec, cost):
    engine = spec.engine.model_copy(update={"max_num_batched_tokens": 2048})
    times = lone_request(cost, engine, 4519, [4096], 2)
    steps = [cost.step_seconds([], [PrefillChunk(0, 2048)], [4096]), cost.step_seconds([], [PrefillChunk(2048, 2048)]),
             cost.step_seconds([], [PrefillChunk(4096, 423)])]
    assert times.prefill_s == pytest.approx(sum(steps), rel=1e-12)
    assert times.prefill_s > lone_request(cost, engine, 4519, [], 2).prefill_s + 0.9 * cost.encode_seconds(4096)


def test_cached_tokens_are_not_computed(spec, cost):
    assert lone_request(cost, spec.engine, 2048, [], 2, cached_tokens=1024).prefill_s == \
        cost.step_seconds([], [PrefillChunk(1024, 1024)])


@pytest.mark.parametrize("prompt, out, cached", [(0, 8, 0), (16, 0, 0), (16, 8, 16)])
def test_a_request_with_nothing_to_compute_is_refused(spec, cost, prompt, out, cached):
    with pytest.raises(ValueError, match="at least one prompt token not cached and one token out"):
        lone_request(cost, spec.engine, prompt, [], out, cached)
