"""sim/apiserver.py: vLLM's micro-batching tokenizer on an API server, on the virtual-time loop (exact times)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from epdbench.sim.apiserver import BATCH_WAIT_S, MAX_BATCH, ApiServer
from epdbench.sim.vloop import run
from epdbench.specs.models import HardwareSpec

US = 10.0     # µs per token: large, so each batch's cost is plain to see
HW = HardwareSpec(gpu="toy", bf16_tflops=1, hbm_tb_s=1, nvlink_gb_s=1, tcp_gb_s=1, rdma_nic_gbit_s=400,
                  tokenize_us_per_token=US)


def server(time_scale: float = 1.0) -> ApiServer:
    return ApiServer(SimpleNamespace(spec=SimpleNamespace(hardware=HW), time_scale=time_scale))


def finish_times(arrivals: list[tuple[float, int]], time_scale: float = 1.0) -> tuple[list[float], int]:
    """When each (arrival s, text tokens) prompt is tokenized, and the number of tokenizer calls."""
    api = server(time_scale)

    async def one(at: float, tokens: int) -> float:
        await asyncio.sleep(at)
        await api.tokenize(tokens)
        return asyncio.get_running_loop().time()

    async def main():
        out = await asyncio.gather(*(one(at, n) for at, n in arrivals))
        await api.close()
        return out, api.batches
    return run(main())


def test_a_lone_prompt_waits_the_batching_window_then_its_tokens():
    (t,), calls = finish_times([(0.0, 1000)])
    assert t == pytest.approx(BATCH_WAIT_S + 1000 * US / 1e6) and calls == 1


def test_prompts_arriving_inside_the_window_are_one_batch():
    times, calls = finish_times([(0.0, 1000), (0.001, 500)])
    assert times == [pytest.approx(BATCH_WAIT_S + 1500 * US / 1e6)] * 2 and calls == 1


def test_a_prompt_arriving_while_a_batch_is_tokenized_waits_for_it_then_for_its_own_window():
    first_done = BATCH_WAIT_S + 1000 * US / 1e6                     # 12 ms
    times, calls = finish_times([(0.0, 1000), (0.005, 200)])          # arrives at 5 ms, mid-tokenizing
    assert times[0] == pytest.approx(first_done)
    assert times[1] == pytest.approx(first_done + BATCH_WAIT_S + 200 * US / 1e6) and calls == 2


def test_a_full_batch_does_not_wait_out_the_window():
    times, calls = finish_times([(0.0, 10)] * MAX_BATCH + [(0.0, 10)])
    assert times[0] == pytest.approx(MAX_BATCH * 10 * US / 1e6) and calls == 2


def test_time_scale_stretches_the_window_and_the_work():
    (t,), _ = finish_times([(0.0, 1000)], time_scale=3.0)
    assert t == pytest.approx(3 * (BATCH_WAIT_S + 1000 * US / 1e6))


def test_close_cancels_waiting_prompts_instead_of_leaving_them_hanging():
    api = server()

    async def main():
        waiting = [asyncio.ensure_future(api.tokenize(100)) for _ in range(3)]
        await asyncio.sleep(0.0005)                                   # inside the window
        await api.close()
        return await asyncio.gather(*waiting, return_exceptions=True)
    results = run(main())
    assert all(isinstance(r, asyncio.CancelledError) for r in results)


def test_a_prompt_sent_with_a_hop_reaches_the_server_after_it_and_one_cancelled_on_the_way_never_does():
    api = server()

    async def main():
        loop = asyncio.get_running_loop()
        gone = asyncio.ensure_future(api.tokenize(5000, after=0.003))
        await asyncio.sleep(0.001)
        gone.cancel()                                   # its client went away during the hop
        await api.tokenize(1000, after=0.003)           # sent at 1 ms, reaches the server at 4 ms
        return loop.time(), api.batches
    t, calls = run(main())
    assert t == pytest.approx(0.004 + BATCH_WAIT_S + 1000 * US / 1e6) and calls == 1
