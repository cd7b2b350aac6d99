"""analysis/mooncake_log.py on the lines vLLM 0.26's MooncakeConnector and Mooncake 0.3.14's transfer engine write on
the local target: each message copied from its format string (vLLM 0.26 mooncake/mooncake_connector.py, mooncake/
mooncake_utils.py, kv_connector/v1/metrics.py; Mooncake transfer_engine_impl.cpp and tcp_transport.cpp, every message
also in the 0.3.14 CUDA 13 wheel's engine.so), with vLLM 0.26's prefixes (`(EngineCore pid=N)` on the engine core,
`(APIServer pid=N)` on the stat logger) and glog's lines written straight to the engine core's stderr."""
from __future__ import annotations

import pytest

from epdbench.analysis.mooncake_log import failures, moved, transport_of_pod
from epdbench.analysis.transport import verify_transport

CORE, API = "(EngineCore pid=4242) ", "(APIServer pid=4200) "


def glog(file: str, line: int, message: str, thread: int = 4242) -> str:
    return f"I1207 01:50:13.901234 {thread:>6} {file}:{line}] {message}"


def vllm(message: str, file: str = "mooncake_connector.py", line: int = 934, level: str = "INFO",
         prefix: str = CORE) -> str:
    return f"{prefix}{level} 12-07 01:50:13 [{file}:{line}] {message}"


def kv_stats_line(n: int, avg_mb: float, failed: int = 0, recvs: int = 0) -> str:
    """metrics.py:103 joining mooncake/stats.py's `reduce` (MB as bytes / 2**20)."""
    return vllm(f"KV Transfer metrics: Num successful transfers={n}, Avg xfer time (ms)=123.4, P90 xfer time "
                f"(ms)=130.2, Avg MB per transfer={avg_mb}, Throughput (MB/s)=453.809, Avg number of descriptors=56.0, "
                f"Num failed transfers={failed}, Num failed recvs={recvs}, Num KV expired reqs=0",
                file="metrics.py", line=103, prefix=API)


def sent(request: str, blocks: int) -> str:
    return vllm(f"Sending kv_caches for request {request} ({blocks} blocks) to 127.0.0.1:20212", line=1607,
                level="DEBUG")


FORCED_TCP = [
    vllm("The Mooncake Transfer Engine is using tcp as its protocol."),
    glog("transfer_engine_impl.cpp", 182, "Transfer Engine RPC using P2P handshake, listening on 127.0.0.1:20149"),
    glog("transfer_engine_impl.cpp", 218, "MC_FORCE_TCP is set, using TCP transport only"),
    glog("tcp_transport.cpp", 343, "TcpTransport: listen on port 20151"),
    vllm("Mooncake Bootstrap Server started at 0.0.0.0:13321", file="mooncake_utils.py", line=80),
]
WINDOW = glog("transfer_engine_impl.cpp", 1145, "[Metrics] Transfer Engine Stats (over last 5s): Throughput: 22.40 MB/s "
              "| Latency Distribution (count=2): 100000-200000μs:100.0%", thread=4250)


def test_a_prefill_forced_to_tcp_on_loopback_with_its_sends_and_volume():
    pod = transport_of_pod(FORCED_TCP + [WINDOW, sent("chatcmpl-r1-0a1b", 64), sent("chatcmpl-r2-9f8e", 63),
                                         sent("chatcmpl-r1-0a1b", 64), kv_stats_line(2, 56.0)])
    assert pod["observed"] == "tcp" and pod["force_tcp"] and pod["vllm_protocol_claim"] == "tcp"
    assert pod["advertised"] == ["127.0.0.1"] and pod["p2p_handshake"] == 1
    assert pod["throughput_mb_s"] == [22.4] and moved(pod)
    assert (pod["requests_sent"], pod["blocks_sent"], pod["connector_debug"]) == (2, 191, True)
    assert (pod["successful_transfers"], pod["kv_stats_lines"]) == (2, 1)
    assert pod["transfer_bytes"] == 2 * 56.0 * 2 ** 20
    assert failures(pod) == {}


@pytest.mark.parametrize("install, observed", [
    ("Using TCP transport (no HCA detected)", "tcp"),
    ("Using RDMA transport (RoCE/iWARP)", "rdma"),
    ("Using Intra-Node NVLink transport (MC_INTRANODE_NVLINK set)", "nvlink"),
    ("MC_FORCE_SHM is set, using SHM transport only", "shm"),
])
def test_the_transport_0314_says_it_installed_is_the_one_observed(install, observed):
    lines = [glog("transfer_engine_impl.cpp", 273, "Topology discovery complete. Found 2 HCAs."),
             glog("transfer_engine_impl.cpp", 395, install)]
    assert transport_of_pod(lines)["observed"] == observed
    # the same message from another source file, or inside a logged prompt, is no install line
    assert transport_of_pod([glog("topology.cpp", 71, install),
                             vllm(f"Received request r1: prompt: '{install}'", file="logger.py")])["observed"] is None


def test_nvlink_or_shared_memory_between_two_engines_is_a_mismatch_for_tcp():
    for install in ("Using Intra-Node NVLink transport (MC_INTRANODE_NVLINK set)",
                    "MC_FORCE_SHM is set, using SHM transport only"):
        pod = transport_of_pod([glog("transfer_engine_impl.cpp", 368, install), WINDOW])
        v = verify_transport("tcp", {"prefill-0": pod}, roles={"prefill-0": "prefill"})
        assert v["verdict"] == "mismatch" and v["reasons"][0].startswith("expected tcp; prefill-0 thread 4242 "), v


def test_a_window_of_latencies_alone_counts_no_throughput():
    latency_only = glog("transfer_engine_impl.cpp", 1145, "[Metrics] Transfer Engine Stats (over last 5s): | Latency "
                        "Distribution (count=1): 10-20μs:100.0%", thread=4250)
    pod = transport_of_pod(FORCED_TCP + [latency_only])
    assert pod["throughput_mb_s"] == [] and not moved(pod)


def test_sends_count_only_at_debug_from_the_connector_and_each_request_once():
    quoted = vllm("Received request r9: prompt: 'Sending kv_caches for request x (3 blocks) to y'", file="logger.py")
    info = vllm("Sending kv_caches for request r1 (3 blocks) to 127.0.0.1:1", line=1607)
    pod = transport_of_pod([quoted, info, sent("r2", 4), sent("r2", 4)])
    assert (pod["requests_sent"], pod["blocks_sent"]) == (1, 8)
    assert not transport_of_pod([quoted, info])["connector_debug"]


FAILURES = [
    ("send_failures", "Sending to 127.0.0.1:20212 failed (ret=-1) after 0.5 (56 descriptors, 58720256 bytes)", 1643),
    ("pull_failures", "pulling kv_caches for ['chatcmpl-a-1', 'chatcmpl-b-2'] failed: Timeout waiting for P side "
                      "ready.", 1899),
    ("recv_errors", "Error happens during transferring kvcache for {'chatcmpl-a-1'}: P num blocks less than D", 1864),
    ("recv_errors", "MooncakeXferMetadata transfer failed for {'chatcmpl-a-1'}: Resource temporarily unavailable",
     1877),
    ("send_errors", "Error processing Mooncake xfer request: 'x'", 1179),
    ("send_errors", "Error in Mooncake sender thread: boom. Exiting thread.", 1163),
    ("ready_timeouts", "Timeout waiting for P side ready: ['chatcmpl-a-1']", 1286),
    ("expired_sends", "Request chatcmpl-a-1 timed out after 480 seconds without being sent. Freeing its blocks on "
                      "the producer side.", 1765),
    ("bootstrap_failures", "Failed to connect to bootstrap server http://127.0.0.1:13321: All connection attempts "
                           "failed", 1923),
    ("bootstrap_failures", "Failed to find remote engine_id 5f0c-ab from bootstrap server http://127.0.0.1:13321",
     1980),
    ("invalid_params", "Got invalid KVTransferParams: {'do_remote_prefill': True, 'transfer_id': 'xfer-1'}. This "
                       "request will not utilize KVTransfer", 790),
    ("missing_transfer_ids", "Missing transfer_id in kv_transfer_params from router!", 801),
]


@pytest.mark.parametrize("counter, message, line", FAILURES)
def test_each_connector_failure_counts_in_its_own_format_only(counter, message, line):
    pod = transport_of_pod(FORCED_TCP + [WINDOW, vllm(message, line=line, level="ERROR")])
    assert failures(pod) == {counter: 1}
    v = verify_transport("tcp", {"prefill-0": pod}, roles={"prefill-0": "prefill"})
    assert v["verdict"] == "mismatch" and f"prefill-0: transfers failed ({counter}=1)" in v["reasons"]
    elsewhere = transport_of_pod([vllm(message, file="logger.py", level="ERROR"),
                                  vllm(f"Received request r1: prompt: '{message}'", file="logger.py")])
    assert failures(elsewhere) == {}


def test_an_ack_for_an_unconnected_endpoint_is_no_ready_ack_received():
    ack, stray = ("Received RDMA ready ACK.", "Received RDMA ready ACK for unconnected endpoint")
    pod = transport_of_pod([glog("rdma_endpoint.cpp", 671, ack), glog("rdma_endpoint.cpp", 653, stray)])
    assert pod["ready_acks_received"] == 1


def test_the_stats_line_of_failed_receives_on_the_decode():
    pod = transport_of_pod([kv_stats_line(0, 0, recvs=2)])
    assert (pod["failed_recvs"], pod["successful_transfers"], pod["transfer_bytes"]) == (2, 0, 0.0)
