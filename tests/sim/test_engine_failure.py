"""A replica whose engine fails exits (code 1) with vLLM's fatal-error line, instead of serving requests that
wait forever for tokens."""
import asyncio

import pytest

from epdbench.sim import server
from epdbench.sim.engine import Sequence
from epdbench.sim.replica import Replica


def test_an_engine_failure_ends_the_replica_with_vllms_line(tiny_spec, capsys):
    config = tiny_spec.configuration("aggregated")
    replica = Replica(tiny_spec, config, "server", 0, "127.0.0.1", 0, None)

    def broken(*args):
        raise RuntimeError("planned failure")
    replica.engine.plan_step = broken

    async def main():
        serving = asyncio.create_task(server.serve(replica))
        await asyncio.sleep(0.2)
        replica.engine.submit(Sequence("r1", prompt_tokens=16, max_tokens=2))
        await asyncio.wait_for(serving, timeout=10)

    with pytest.raises(server.EngineDead):
        asyncio.run(main())
    out = capsys.readouterr().out
    assert "ERROR" in out and "EngineCore encountered a fatal error." in out and "planned failure" in out
    assert "Shutting down simulator." in out
