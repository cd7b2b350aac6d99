"""tasks/local/target.py starting gpu-qwen25vl's pd-mooncake-tcp, its processes faked (no GPU here): the prefill's
bootstrap server on a port of its own, each engine's Mooncake ports in its own block, the proxy told the connector
and the prefill's bootstrap port, and nothing of epdbench's own environment choosing Mooncake's transport."""
from __future__ import annotations

import pytest

from epdbench.specs.commands import MOONCAKE_RPC_PORTS
from epdbench.tasks.proc.processes import PORT_BLOCK
from tests.tasks.local.test_target_gpu import start_faked


@pytest.fixture
def started(monkeypatch, tmp_path):
    for name in ("MC_FORCE_HCA", "MC_LOG_DIR", "MC_INTRANODE_NVLINK"):
        monkeypatch.setenv(name, "1")
    dep, events, _ = start_faked(monkeypatch, tmp_path, "pd-mooncake-tcp")
    return dep, {e[1]: e for e in events if e[0] == "spawn"}, next(e for e in events if e[0] == "router")


def test_the_prefills_bootstrap_server_gets_its_own_port_and_the_proxy_learns_it(started):
    dep, spawned, router = started
    prefill, decode = dep.processes
    env = spawned["pd-mooncake-tcp/prefill-0"][3]
    assert prefill.bootstrap_port == int(env["VLLM_MOONCAKE_BOOTSTRAP_PORT"]) and decode.bootstrap_port is None
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in spawned["pd-mooncake-tcp/decode-0"][3]
    assert prefill.bootstrap_port not in {int(prefill.url.rsplit(":", 1)[1]), int(decode.url.rsplit(":", 1)[1])}
    cmd = router[1]
    assert cmd[cmd.index("--kv-connector") + 1] == "mooncake"
    assert cmd[cmd.index("--prefill") + 1:cmd.index("--prefill") + 3] == [prefill.url, str(prefill.bootstrap_port)]
    assert dep.router == "epdbench-proxy"


def test_each_engines_mooncake_ports_lie_in_its_own_block_and_its_transport_is_epdbenchs_choice(started):
    _, spawned, _ = started
    blocks = []
    for name in ("pd-mooncake-tcp/prefill-0", "pd-mooncake-tcp/decode-0"):
        env = spawned[name][3]
        block = int(env["VLLM_PORT"])
        assert (int(env["MC_MIN_RPC_PORT"]), int(env["MC_MAX_RPC_PORT"])) == tuple(block + p for p in MOONCAKE_RPC_PORTS)
        assert env["MC_FORCE_TCP"] == "1" and env["VLLM_HOST_IP"] == "127.0.0.1"
        assert not {"MC_FORCE_HCA", "MC_LOG_DIR", "MC_INTRANODE_NVLINK"} & set(env)
        blocks.append(block)
    assert MOONCAKE_RPC_PORTS[1] < PORT_BLOCK and abs(blocks[0] - blocks[1]) >= PORT_BLOCK
