"""analysis/evidence.py: transport and stage verdicts from real (and simulated) log lines."""
from __future__ import annotations

import pytest

from epdbench.analysis.evidence import stage_counts, transport_of_pod, verify_stages, verify_transport
from epdbench.sim import logfmt

VLLM = "(EngineCore_DP0 pid=714) "

# Real Mooncake glog lines (shared/REFERENCE.md, from public issues).
RDMA_POD = [
    VLLM + "WARNING: Logging before InitGoogleLogging() is written to STDERR",
    VLLM + "I1018 00:45:47.969202 1844453 rdma_context.cpp:129] RDMA device: mlx5_ib1, LID: 470, GID: "
           "(GID_Index 0) fe:80:00:00:00:00:00:00:a0:88:c2:03:00:17:87:71",
]
TCP_POD = [
    VLLM + "W1023 22:08:09.675546 67953 topology.cpp:71] No RDMA devices found, check your device installation",
    VLLM + "I1023 22:08:09.675566 67953 transfer_engine.cpp:200] Topology discovery complete. Found 0 HCAs.",
    VLLM + "I1023 22:08:09.675581 67953 tcp_transport.cpp:306] TcpTransport: listen on port 15535",
]
TPUT_OLD = "I0616 06:29:14.501163 1115123 transfer_engine.cpp:387] [Metrics] Transfer Engine Throughput: " \
           "113.07 MB/s (over last 5s)"
TPUT_NEW = ("I0616 06:29:19.501163 1115123 transfer_engine_impl.cpp:612] [Metrics] Transfer Engine Stats "
            "(over last 5s): Throughput: 1390.73 MB/s | Latency Distribution (count=120): 500-1000μs:60.0%, "
            "1000-2000μs:40.0%")
VLLM_SAYS_RDMA = ("(EngineCore_DP0 pid=714) INFO 10-23 22:08:09 [mooncake_connector.py:301] The Mooncake "
                  "Transfer Engine is using rdma as its protocol.")


def kv_metrics(failed: int, recvs: int = 0) -> str:
    return ("(APIServer pid=428) INFO 07-13 16:33:58 [metrics.py:103] KV Transfer metrics: Num successful "
            "transfers=12, Avg xfer time (ms)=4.1, P90 xfer time (ms)=6.3, Avg MB per transfer=28.0, Throughput "
            f"(MB/s)=6829.268, Avg number of descriptors=56.0, Num failed transfers={failed}, Num failed "
            f"recvs={recvs}, Num KV expired reqs=0")


def test_rdma_pod_is_verified_for_rdma():
    pod = transport_of_pod(RDMA_POD + [VLLM + TPUT_OLD])
    assert pod["observed"] == "rdma" and not pod["emulated"]
    assert pod["rdma_devices"] == [{"name": "mlx5_ib1", "lid": 470}]
    v = verify_transport("rdma", {"prefill-0": pod, "decode-0": transport_of_pod(RDMA_POD)})
    assert v["verdict"] == "verified"
    assert any("mlx5_ib1" in r for r in v["reasons"])


def test_installed_transport_without_kv_activity_is_not_verified():
    v = verify_transport("rdma", {"prefill-0": transport_of_pod(RDMA_POD), "decode-0": transport_of_pod(RDMA_POD)})
    assert v["verdict"] == "no-evidence"


def test_tcp_fallback_is_a_mismatch_when_rdma_was_expected():
    pod = transport_of_pod(TCP_POD + [VLLM_SAYS_RDMA])   # vLLM's protocol line proves nothing
    assert pod["observed"] == "tcp" and pod["hcas"] == 0 and pod["tcp_listen"]
    v = verify_transport("rdma", {"prefill-0": transport_of_pod(RDMA_POD), "decode-0": pod})
    assert v["verdict"] == "mismatch"
    assert any("TCP" in r and "decode-0" in r for r in v["reasons"])


def test_tcp_pod_is_verified_for_tcp():
    assert verify_transport("tcp", {"p": transport_of_pod(TCP_POD + [kv_metrics(failed=0)])})["verdict"] == "verified"


def test_forced_tcp_on_an_rdma_node_is_tcp():
    pod = transport_of_pod([
        "I1023 22:08:09.675566 67953 transfer_engine.cpp:200] Topology discovery complete. Found 2 HCAs.",
        "I1023 22:08:09.675570 67953 transfer_engine.cpp:180] MC_FORCE_TCP is set, using TCP transport only",
    ])
    assert pod["observed"] == "tcp" and pod["force_tcp"] and pod["hcas"] == 2


def test_hca_count_alone_decides_when_no_transport_line():
    assert transport_of_pod([TCP_POD[1]])["observed"] == "tcp"
    found_one = TCP_POD[1].replace("Found 0 HCAs", "Found 1 HCAs")
    assert transport_of_pod([found_one])["observed"] == "rdma"


def test_old_and_new_throughput_formats():
    pod = transport_of_pod(RDMA_POD + [TPUT_OLD, VLLM + TPUT_NEW])
    assert pod["throughput_mb_s"] == [113.07, 1390.73]
    v = verify_transport("rdma", {"p": pod})
    assert (v["throughput_mb_s_min"], v["throughput_mb_s_max"]) == (113.07, 1390.73)


def test_failed_kv_transfers_make_a_mismatch():
    pod = transport_of_pod(RDMA_POD + [kv_metrics(failed=3)])
    assert (pod["successful_transfers"], pod["failed_transfers"], pod["failed_recvs"]) == (12, 3, 0)
    v = verify_transport("rdma", {"decode-0": pod})
    assert v["verdict"] == "mismatch" and v["failed_transfers"] == 3
    assert any("decode-0" in r and "failed" in r and "3" in r for r in v["reasons"])


def test_clean_kv_metrics_keep_the_verdict():
    pod = transport_of_pod(RDMA_POD + [kv_metrics(failed=0), kv_metrics(failed=0)])
    assert (pod["successful_transfers"], pod["failed_transfers"]) == (24, 0)
    v = verify_transport("rdma", {"p": pod})
    assert v["verdict"] == "verified" and v["failed_transfers"] == 0


def sim_pod_lines(transport: str) -> list[str]:
    """The Mooncake lines sim/server.py writes at start-up, through sim/logfmt."""
    if transport == "tcp":
        return [logfmt.glog_line("I", 11, "transfer_engine.cpp", 1, "MC_FORCE_TCP is set, using TCP transport only"),
                logfmt.glog_line("I", 11, "transfer_engine.cpp", 1, "Topology discovery complete. Found 0 HCAs."),
                logfmt.glog_line("I", 11, "tcp_transport.cpp", 1, "TcpTransport: listen on port 18001")]
    return [logfmt.glog_line("I", 11, "transfer_engine.cpp", 1, "Topology discovery complete. Found 1 HCAs."),
            logfmt.glog_line("I", 11, "transfer_engine_impl.cpp", 1, "installTransport, type=rdma"),
            logfmt.glog_line("I", 11, "rdma_context.cpp", 1, "RDMA device: sim_mlx5_0, LID: 0, GID: (GID_Index 0) "
                                                              "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00")]


SIM_WINDOW = logfmt.glog_line("I", 11, "transfer_engine.cpp", 1, "[Metrics] Transfer Engine Stats (over last 1s): "
                               "Throughput: 812.50 MB/s | Latency Distribution (count=4): 0-1000μs:100.0%, "
                               ">1000μs:0.0%")


@pytest.mark.parametrize("transport", ["tcp", "rdma"])
def test_simulated_transport_is_emulated_never_verified(transport):
    pods = {"prefill-0": transport_of_pod(sim_pod_lines(transport) + [SIM_WINDOW]),
            "decode-0": transport_of_pod([VLLM + line for line in sim_pod_lines(transport)])}
    assert all(p["emulated"] and p["observed"] == transport for p in pods.values())
    v = verify_transport(transport, pods)
    assert v["verdict"] == "emulated"
    assert v["throughput_mb_s_max"] == 812.5


def test_simulated_tcp_when_rdma_was_expected_is_a_mismatch():
    v = verify_transport("rdma", {"prefill-0": transport_of_pod(sim_pod_lines("tcp") + [SIM_WINDOW])})
    assert v["verdict"] == "mismatch"


def test_vllm_protocol_claim_alone_is_no_evidence():
    pod = transport_of_pod([VLLM_SAYS_RDMA])
    assert pod["observed"] is None
    assert verify_transport("rdma", {"p": pod})["verdict"] == "no-evidence"


@pytest.mark.parametrize("file, msg", [
    ("transfer_engine.cpp", "Topology discovery complete. Found 1 HCAs."),
    ("transfer_engine_impl.cpp", "installTransport, type=rdma"),
    ("transfer_engine.cpp", "MC_FORCE_TCP is set, using TCP transport only"),
    ("rdma_context.cpp", "RDMA device: sim_mlx5_0, LID: 0, GID: (GID_Index 0) 00:00"),
    ("tcp_transport.cpp", "TcpTransport: listen on port 18001"),
])
def test_any_marked_transport_line_makes_the_pod_emulated(file, msg):
    pod = transport_of_pod([logfmt.glog_line("I", 11, file, 1, msg), TPUT_OLD])   # real-looking activity
    assert pod["observed"] is not None
    assert pod["emulated"]
    assert verify_transport(pod["observed"], {"p": pod})["verdict"] == "emulated"


def test_emulated_mark_in_analysis_matches_the_simulator():
    from epdbench.analysis.evidence import EMULATED_MARK
    assert logfmt.EMULATED_MARK.startswith(EMULATED_MARK)


def test_expected_none_is_not_applicable():
    v = verify_transport("none", {"server-0": transport_of_pod(TCP_POD + [TPUT_OLD])})
    assert v["verdict"] == "not-applicable"
    assert verify_transport("none", {})["verdict"] == "not-applicable"


def test_no_lines_is_no_evidence():
    pod = transport_of_pod([])
    assert pod["observed"] is None
    assert verify_transport("rdma", {"prefill-0": pod, "decode-0": pod})["verdict"] == "no-evidence"
    assert verify_transport("tcp", {})["verdict"] == "no-evidence"


def test_one_silent_pod_is_no_evidence_not_verified():
    v = verify_transport("rdma", {"prefill-0": transport_of_pod(RDMA_POD + [TPUT_OLD]), "decode-0": transport_of_pod([])})
    assert v["verdict"] == "no-evidence"
    assert any("decode-0" in r for r in v["reasons"])


GARBAGE = [
    "", "\n", "\x00\xff\ufffd", VLLM, "(EngineCore_DP0 pid=", "I1018 00:45:47.96",
    "I1018 00:45:47.969202 1844453 rdma_context.cpp:129] RDMA device: ",
    "I1018 00:45:47.969202 1844453 rdma_context.cpp:129] RDMA device: mlx5_ib1, LID: ",
    "Topology discovery complete. Found", "Topology discovery complete. Found many HCAs.",
    "[Metrics] Transfer Engine Throughput: MB/s", "[Metrics] Transfer Engine Stats (over last 5s): Throughput: ",
    "KV Transfer metrics: Num successful transfers=", "KV Transfer metrics: Num failed transfers=x",
    "x" * 10000,
]


def test_garbage_and_truncated_lines_do_not_crash_or_count():
    pod = transport_of_pod(GARBAGE)
    assert pod["observed"] is None and pod["hcas"] is None
    assert pod["rdma_devices"] == [] and pod["throughput_mb_s"] == []
    assert pod["failed_transfers"] == pod["failed_recvs"] == pod["successful_transfers"] == 0
    assert verify_transport("rdma", {"p": pod})["verdict"] == "no-evidence"
    # mixed in with a real log, the real lines still count
    assert transport_of_pod(GARBAGE + RDMA_POD + GARBAGE)["observed"] == "rdma"
    c = stage_counts(GARBAGE)
    assert (c["completions"], c["errors"], c["request_ids"]) == (0, 0, set())


def access(status: int = 200, chat: bool = False) -> str:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    reason = "OK" if status == 200 else "Internal Server Error"
    return f'(APIServer pid=782545) INFO:     10.35.102.36:52864 - "POST {path} HTTP/1.1" {status} {reason}'


def received(rid: str, chat: bool = False) -> str:
    prefix = "chatcmpl" if chat else "cmpl"
    return f"(APIServer pid=782545) INFO 07-13 16:33:58 [logger.py:49] Received request {prefix}-{rid}: role=decode"


def test_stage_counts_of_access_and_request_lines():
    c = stage_counts([received("r1"), access(200), received("r2", chat=True), access(200, chat=True), access(500),
                      '(APIServer pid=1) INFO:     1.2.3.4:5 - "GET /health HTTP/1.1" 200 OK'])
    assert (c["completions"], c["errors"], c["request_ids"]) == (2, 1, {"r1", "r2"})


def test_verify_stages_all_seen():
    expected = {"r1": ["prefill", "decode"], "r2": ["encode", "prefill", "decode"]}
    counts = {"encode": stage_counts([received("r2", chat=True)]),
              "prefill": stage_counts([received("r1"), received("r2", chat=True)]),
              "decode": stage_counts([received("r1"), received("r2", chat=True)])}
    assert verify_stages(expected, counts, emulated=False)["verdict"] == "verified"
    v = verify_stages(expected, counts, emulated=True)
    assert v["verdict"] == "emulated"
    assert v["fraction_seen"] == {"decode": 1.0, "encode": 1.0, "prefill": 1.0}
    assert v["skipped"] == [] and v["n_skipped"] == 0


def test_request_missing_at_decode_is_a_mismatch():
    expected = {"r1": ["prefill", "decode"], "r2": ["prefill", "decode"]}
    counts = {"prefill": stage_counts([received("r1"), received("r2")]), "decode": stage_counts([received("r1")])}
    v = verify_stages(expected, counts, emulated=True)
    assert v["verdict"] == "mismatch"
    assert v["skipped"] == [{"request_id": "r2", "missing_role": "decode"}]
    assert v["fraction_seen"]["decode"] == 0.5
    assert any(r.startswith("decode:") for r in v["reasons"])


def test_no_measured_requests_is_no_evidence():
    assert verify_stages({}, {}, emulated=True)["verdict"] == "no-evidence"


def test_real_vllm_completions_request_line_matches_the_client_id():
    rid = "epd-1a2b3c4d-m0-9f8e7d"
    line = (f"(APIServer pid=428) INFO 07-13 16:33:58 [logger.py:49] Received request cmpl-{rid}-0: "
            "prompt: 'alpha bravo', params: SamplingParams(n=1, max_tokens=64), prompt_token_ids: None, "
            "lora_request: None.")
    v = verify_stages({rid: ["server"]}, {"server": stage_counts([line])}, emulated=False)
    assert v["verdict"] == "verified"
