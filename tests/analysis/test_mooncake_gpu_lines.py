"""The Mooncake parsers on the real transfer engine's lines on a GPU host (benchmarks/data/h200-2026-12-07/
mooncake-gpu-tcp/, `benchmarks/transport/mooncake_gpu_tcp.py`: mooncake-transfer-engine-cuda13 0.3.14, two engines
moving CUDA memory over TCP on one H200, both engines' glog lines in one stream): TCP forced (MC_FORCE_TCP=1, as the
local target starts its Mooncake pair) and chosen by the engine itself on a host without HCAs. Real TCP lines are
`verified` when TCP is expected and a `mismatch` when RDMA is; the metric windows are read as the engine printed
them. The vLLM connector's own lines (its sends, `KV Transfer metrics`) wait for a PD pair on a GPU."""
from __future__ import annotations

from pathlib import Path

import pytest

from epdbench.analysis.mooncake_log import transport_of_pod
from epdbench.analysis.transport import verify_transport

KEPT = Path(__file__).parents[2] / "benchmarks" / "data" / "h200-2026-12-07" / "mooncake-gpu-tcp"
# (file, what the engines printed about their transport, the metric windows' MB/s, the engines' main threads)
CASES = {"forced-tcp": ("MC_FORCE_TCP is set, using TCP transport only", [1044.0, 456.0], {"557", "531"}),
         "no-hca": ("Using TCP transport (no HCA detected)", [1197.0, 1368.0], {"661", "640"})}


def pod(name: str) -> dict:
    return transport_of_pod((KEPT / f"{name}.log").read_text().splitlines())


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_tcp_lines_verify_tcp_and_refuse_rdma(name):
    said, windows, threads = CASES[name]
    assert said in (KEPT / f"{name}.log").read_text()             # the engine's own words, as kept
    p = pod(name)
    assert p["observed"] == "tcp" and not p["emulated"]
    assert {w.removeprefix("thread ") for w in p["workers"]} == threads       # each engine, by its main thread
    assert all(w["observed"] == "tcp" for w in p["workers"].values())
    assert p["throughput_mb_s"] == windows and p["p2p_handshake"] == 2 and p["advertised"] == ["127.0.0.1"]
    assert p["force_tcp"] is (name == "forced-tcp") and p["hcas"] == (None if name == "forced-tcp" else 0)
    # the init-time `E... transfer_metadata.cpp] Local segment descriptor not found` is no failure
    assert "Local segment descriptor not found" in (KEPT / f"{name}.log").read_text()
    assert p["connection_failures"] == p["failed_slices"] == p["transfer_timeouts"] == 0
    ok = verify_transport("tcp", {"prefill-0": p}, roles={"prefill-0": "prefill"})
    assert ok["verdict"] == "verified", ok["reasons"]
    assert ok["reasons"][0].startswith("every KV pod and worker (2) installed TCP; KV moved (2 throughput windows")
    wrong = verify_transport("rdma", {"prefill-0": p}, roles={"prefill-0": "prefill"})
    assert wrong["verdict"] == "mismatch" and wrong["reasons"][0].startswith("expected rdma; 2 workers")


def test_every_write_moved_the_bytes_checked_at_the_rate_printed():
    """The benchmark's own lines: each size's writes checked byte for byte on the receiver's GPU."""
    for name in CASES:
        lines = [x for x in (KEPT / f"{name}.out").read_text().splitlines() if "MiB:" in x]
        assert lines and all(x.endswith("bytes checked") for x in lines)
