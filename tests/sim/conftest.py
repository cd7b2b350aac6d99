import asyncio

import pytest


async def _serve(e, seqs) -> dict[str, list[float]]:
    """Modelled end of each token of each sequence, running the engine (sim.engine.Engine) until all are done."""
    out: dict[str, list[float]] = {s.request_id: [] for s in seqs}

    async def drain(s) -> None:
        while (ev := await asyncio.wait_for(s.out.get(), timeout=5))[0] != "done":
            out[s.request_id].append(ev[1])
    e.start()
    for s in seqs:
        e.submit(s)
    try:
        await asyncio.gather(*(drain(s) for s in seqs))
    finally:
        await e.stop()
    return out


@pytest.fixture
def serve():
    """async serve(engine, sequences): each sequence's token stamps, once the engine has finished them all."""
    return _serve
