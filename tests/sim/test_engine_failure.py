"""A replica whose engine fails exits (code 1) with vLLM's fatal-error line, instead of serving requests that
wait forever for tokens."""
import asyncio
import re

import pytest

from epdbench.sim import server
from epdbench.sim.sequence import Sequence
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


def test_an_engine_whose_kv_cache_cannot_hold_max_model_len_does_not_start(tiny_spec, tmp_path, capsys):
    """As vLLM's check_enough_kv_cache_memory: the replica exits (code 1) before it serves, with vLLM's words."""
    import yaml
    data = tiny_spec.model_dump(mode="json")
    data["engine"]["gpu_memory_utilization"] = 0.2          # 16 GB for 15.2 GB of weights: ~14k tokens of KV
    data["engine"]["max_model_len"] = 16384
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    assert server.main(["--spec", str(path), "--config", "aggregated", "--role", "server", "--port", "9"]) == 1
    out = capsys.readouterr().out
    assert "ERROR" in out and "EngineCore failed to start." in out
    assert re.search(r"ValueError: To serve at least one request with the models's max seq len \(16384\), "
                     r"\(0\.88 GiB KV cache is needed, which is larger than the available KV cache memory "
                     r"\(0\.\d\d GiB\)\. Based on the available memory, the estimated maximum model length is "
                     r"\d+\.", out)
    assert "RuntimeError: Engine core initialization failed. See root cause above." in out
    assert "epdbench simulator [emulated by epdbench sim" in out.splitlines()[0]      # never read as a real server's
    assert "Starting vLLM API server" not in out                                  # it never served
