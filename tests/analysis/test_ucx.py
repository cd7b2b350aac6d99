"""analysis.ucx: which transport NIXL's UCX chose, per pod, worker and lane, from the real line formats."""
from pathlib import Path

import pytest

from epdbench.analysis.logformats import parse_line
from epdbench.analysis.transport import kv_expectation
from epdbench.analysis.ucx import client_request_id, lane_class, nixl_of_pod, parse_lanes, verify_nixl
from epdbench.sim.logfmt import ucx_line
from epdbench.sim.metrics import TransferWindow, nixl_stats_line

DATA = Path(__file__).parents[1] / "data" / "logs" / "nixl"
EP = "[1765333150.098983] [host-1:{pid}:{thr}]      ucp_worker.c:1912 UCX  INFO    ucp_context_0 {scope} cfg#2 {groups}"
RDMA = "rma(rc_mlx5/mlx5_0:1)  amo(rc_mlx5/mlx5_0:1)  am(rc_mlx5/mlx5_0:1)  ka(rc_mlx5/mlx5_0:1)"
TCP = "rma_am(tcp/eth1)  amo_am(tcp/eth1)  am(tcp/eth1 tcp/eth6)  ka(tcp/eth1)"
STATS = ("(APIServer pid=714) INFO 12-01 22:25:41 [metrics.py:108] KV Transfer metrics: Num successful transfers={n}, "
         "Avg xfer time (ms)=31.2, P90 xfer time (ms)=40.1, Avg post time (ms)=0.4, P90 post time (ms)=0.6, "
         "Avg MB per transfer=28.000, Throughput (MB/s)=897.3, Avg number of descriptors=14336.0, "
         "Num failed transfers=0, Num KV expired reqs=0, Num notifs after expiry=0")


def ep(groups, pid=245, thr="3", scope="inter-node"):
    return EP.format(pid=f"{pid:<5d}", thr=thr, scope=scope, groups=groups)


@pytest.mark.parametrize("tl,cls", [("rc_mlx5", "rdma"), ("rc_verbs", "rdma"), ("dc_mlx5", "rdma"), ("ud_verbs", "rdma"),
                                    ("srd", "rdma"), ("tcp", "tcp"), ("cuda_ipc", "nvlink"), ("cuda_copy", "local"),
                                    ("sysv", "local"), ("cma", "local"), ("self", "local"), ("posix", "local")])
def test_lane_classes(tl, cls):
    assert lane_class(tl) == cls


def test_ucx_lines_parse_with_their_process_and_async_thread():
    line = parse_line(ep(RDMA, pid=245, thr="a"))
    assert line.kind == "ucx" and line.file == "ucp_worker.c" and line.worker == "thread 245"
    assert line.message.startswith("ucp_context_0 inter-node cfg#2 rma(")
    # the simulator's own UCX lines are the same format, marked emulated
    sim = parse_line(ucx_line("INFO", 4242, "ucp_worker.c", 1903, "ucp_context_0 self cfg#0 am(self/memory)", indent=1))
    assert sim.kind == "ucx" and sim.emulated and sim.message == "ucp_context_0 self cfg#0 am(self/memory)"


def test_lanes_repeat_and_a_truncated_line_keeps_what_it_has():
    lanes = parse_lanes("am(rc_mlx5/mlx5_ib2:1 rc_mlx5/mlx5_ib7:1 rc_mlx5/mlx5_ib2:1)  ka(tcp/eth")
    assert [x["device"] for x in lanes] == ["mlx5_ib2:1", "mlx5_ib7:1", "mlx5_ib2:1", "eth"]
    assert lanes[-1]["class"] == "tcp"


def test_self_endpoints_and_host_local_lanes_say_nothing_about_the_network():
    pod = nixl_of_pod([ep("rma(self/memory)  am(self/memory tcp/lo)", scope="self"),
                       ep("am(sysv/memory cma/memory cuda_copy/cuda)", scope="intra-node")])
    assert pod["observed"] is None
    out = verify_nixl("rdma", {"p": pod})
    assert out["verdict"] == "no-evidence" and "only self or host-local lanes" in out["reasons"][0]


def test_workers_take_the_name_of_their_vllm_prefix():
    pod = nixl_of_pod([ep(RDMA, pid=801),
                       "(Worker_TP1 pid=801) 2026-12-01 22:26:01 NIXL INFO    _api.py:405 Backend UCX was instantiated"])
    assert list(pod["workers"]) == ["Worker_TP1 pid=801"] and pod["backends"] == ["UCX"]


def test_verified_needs_every_lane_on_the_transport_and_reads_on_the_decode():
    prefill, decode = nixl_of_pod([ep(RDMA, pid=1)]), nixl_of_pod([ep(RDMA, pid=2), STATS.format(n=12)])
    roles = {"prefill-0": "prefill", "decode-0": "decode"}
    out = verify_nixl("rdma", {"prefill-0": prefill, "decode-0": decode}, roles=roles)
    assert out["verdict"] == "verified" and "mlx5_0:1" in out["reasons"][0]
    assert decode["successful_transfers"] == 12 and decode["bytes"] == 12 * 28 * 2 ** 20
    # the same lanes with no successful read on the decode: nothing proves the KV moved
    idle = nixl_of_pod([ep(RDMA, pid=2)])
    out = verify_nixl("rdma", {"prefill-0": prefill, "decode-0": idle}, roles=roles)
    assert out["verdict"] == "no-evidence" and "decode-0: UCX set up rdma lanes but no KV transfer succeeded" in out["reasons"]
    # on a run, the decode side's counters must give the volume
    kv = kv_expectation([{"ok": True, "prompt_tokens": 4096, "cached_tokens": 0, "phase": "measured"}], 57344)
    pods = {"prefill-0": prefill, "decode-0": decode}
    counted = {**kv, "transfers": 1, "bytes": 4096 * 57344}
    assert verify_nixl("rdma", pods, roles=roles, kv=counted)["verdict"] == "verified"
    out = verify_nixl("rdma", pods, roles=roles, kv={**counted, "transfers": None, "bytes": None})
    assert out["verdict"] == "no-evidence" and any(
        r.startswith("KV volume not checked: the Decode pods' /metrics gave no vllm:nixl_xfer_time_seconds_count and "
                     "no vllm:nixl_bytes_transferred_sum") for r in out["reasons"])


def test_one_tcp_lane_of_one_worker_is_a_mismatch_naming_it():
    pod = nixl_of_pod([ep(RDMA, pid=801), ep("rma(rc_mlx5/mlx5_1:1)  am(rc_mlx5/mlx5_1:1 tcp/eth0)", pid=802),
                       STATS.format(n=3)])
    out = verify_nixl("rdma", {"decode-0": pod})
    assert out["verdict"] == "mismatch"
    assert out["reasons"] == ["expected rdma; decode-0 thread 802 inter-node cfg#2: lane am(tcp/eth0) on TCP"]


def test_nvlink_lanes_are_neither_tcp_nor_rdma():
    pod = nixl_of_pod([ep("rma_am(tcp/eth1)  am(tcp/eth1 cuda_ipc/cuda)  ka(tcp/eth1)", scope="intra-node"),
                       STATS.format(n=3)])
    out = verify_nixl("tcp", {"decode-0": pod})
    assert out["verdict"] == "mismatch" and "am(cuda_ipc/cuda) on NVLINK" in out["reasons"][0]


def test_ucx_tls_asked_for_is_never_evidence():
    env = "[1765333150.0] [h:9    :0]          parser.c:2368 UCX  INFO  UCX_* env variables: UCX_TLS=rc UCX_LOG_LEVEL=info"
    out = verify_nixl("rdma", {"p": nixl_of_pod([env, STATS.format(n=4)])})
    assert out["verdict"] == "no-evidence" and "UCX_TLS=rc was asked for: not evidence" in out["reasons"][0]


def test_lines_quoted_in_a_prompt_are_not_evidence():
    quoted = ('(APIServer pid=1) INFO 12-01 22:25:40 [request_logger.py:40] Request cmpl-7 JSON body: {"prompt": "'
              + ep(RDMA) + '"}')
    assert nixl_of_pod([quoted])["workers"] == {}


def test_kv_volume_and_failures_make_a_mismatch():
    pod = nixl_of_pod([ep(TCP), STATS.format(n=2)])
    records = [{"ok": True, "prompt_tokens": 4096, "cached_tokens": 0, "phase": "measured"}] * 2
    kv = kv_expectation(records, kv_bytes_per_token=57344) | {"transfers": 2, "bytes": 1e6}
    out = verify_nixl("tcp", {"decode-0": pod}, roles={"decode-0": "decode"}, kv=kv)
    assert out["verdict"] == "mismatch" and any("MB of KV moved" in r for r in out["reasons"])
    failing = nixl_of_pod([ep(TCP), STATS.format(n=2), "(EngineCore_DP0 pid=9) ERROR 12-01 22:25:44 [base_worker.py:3429] "
                           "NIXL transfer failure: transfer_failed | Context: {'failure_type': 'transfer_failed'}"])
    out = verify_nixl("tcp", {"decode-0": failing})
    assert out["verdict"] == "mismatch" and "transfer_failures=1" in out["reasons"][0]


def test_encoder_outputs_need_a_completed_read():
    enc = "(EngineCore pid=1) DEBUG 12-01 22:26:10 [distributed/.../cpu/session.py:368] EC producer: NIXL READ completed mm_hash=ab key=1-0"
    with_read = nixl_of_pod([ep(TCP, pid=1), enc])
    without = nixl_of_pod([ep(TCP, pid=2)])
    assert verify_nixl("tcp", {"encode-0": with_read, "prefill-0": without}, what="ec")["verdict"] == "verified"
    out = verify_nixl("tcp", {"encode-0": without}, what="ec")
    assert out["verdict"] == "no-evidence" and "completed NIXL READ of encoder outputs" in out["reasons"][-1]


def test_simulated_lines_give_emulated():
    line = ucx_line("INFO", 77, "ucp_worker.c", 1903, "ucp_context_0 intra-node cfg#1 " + TCP, indent=1)
    w = TransferWindow()
    w.record(28 * 2 ** 20, 12.0, 1792)
    stats = f"(APIServer pid=77) INFO 12-01 22:25:41 [metrics.py:108] {nixl_stats_line(w, 0)}"
    out = verify_nixl("tcp", {"decode-0": nixl_of_pod([line, stats])}, roles={"decode-0": "decode"})
    assert out["verdict"] == "emulated" and out["pods"]["decode-0"]["bytes"] == 28 * 2 ** 20


def test_expected_none_is_not_applicable():
    assert verify_nixl("none", {})["verdict"] == "not-applicable"


def test_stats_lines_of_every_vllm_form_count():
    old = "(APIServer pid=1) INFO 10-01 12:00:00 [metrics.py:97] KV Transfer metrics: num_successful_transfers=4"
    multi = ("(APIServer pid=1) INFO 10-01 12:00:00 [metrics.py:103] KV Transfer metrics: NixlConnector="
             "{'Num successful transfers': 3, 'Avg xfer time (ms)': 2.5, 'Avg MB per transfer': 1.0}, "
             "LMCacheConnectorV1={'hits': 9}")
    pod = nixl_of_pod([ep(TCP), old, multi])
    assert pod["successful_transfers"] == 7 and pod["bytes"] == 3 * 2 ** 20


def test_endpoints_sharing_a_lane_set_make_one_reason_with_their_count():
    """UCX prints one configuration per endpoint: ten alike on two pods are one reason, counted per pod; a second
    lane set is a second reason."""
    decode = nixl_of_pod([ep(TCP, pid=801 + i % 2) for i in range(6)] + [STATS.format(n=3)])
    prefill = nixl_of_pod([ep(TCP, pid=701 + i % 2) for i in range(4)] + [ep("am(tcp/eth7)", pid=703)])
    out = verify_nixl("rdma", {"decode-0": decode, "prefill-0": prefill})
    mismatches = [r for r in out["reasons"] if r.startswith("expected rdma;")]
    assert out["verdict"] == "mismatch"
    assert mismatches == [
        "expected rdma; 10 endpoints (decode-0: 6, prefill-0: 4): lanes rma_am(tcp/eth1), amo_am(tcp/eth1), "
        "am(tcp/eth1), am(tcp/eth6), ka(tcp/eth1) on TCP",
        "expected rdma; prefill-0 thread 703 inter-node cfg#2: lane am(tcp/eth7) on TCP"]


def test_a_request_whose_kv_failed_in_several_lines_and_forms_is_lost_once_by_the_clients_id():
    """vLLM's engine id carries the client's id between `cmpl-` and the choice index with a random part; a line that
    names the client's id itself is the same request."""
    assert client_request_id("cmpl-epdbench-probe-0-9c26ea38") == "epdbench-probe"
    assert client_request_id("chatcmpl-epd-7-1-m2-ab12cd-1f2e3d4c") == "epd-7-1-m2-ab12cd"
    assert client_request_id("epd-7-1-m2-ab12cd") == "epd-7-1-m2-ab12cd"            # no vLLM prefix: as it is
    assert client_request_id("cmpl-short") == "cmpl-short"                          # no random part: not vLLM's form
    line = ("NIXL transfer failure: handshake_failed | Context: {'failure_type': 'handshake_failed', "
            "'request_id': '%s', 'engine_id': 'e1'}")
    lines = [f"(EngineCore_DP0 pid=9) ERROR 12-08 00:10:0{i} [base_worker.py:1261] " + line % rid
             for i, rid in enumerate(["cmpl-epdbench-probe-0-9c26ea38", "epdbench-probe", "cmpl-m1-0-0a0b0c0d"])]
    pod = nixl_of_pod(lines)
    assert pod["transfer_failures"] == ["handshake_failed"] * 3
    assert pod["kv_lost_requests"] == ["epdbench-probe", "m1"]


def test_a_failed_handshake_names_the_requests_whose_kv_never_arrived():
    """vLLM 0.32's own lines (CPU build, a side channel no one listened on): the lanes were tcp and transfers had
    succeeded, yet the verdict is a mismatch that counts NIXL's failure lines by kind and names the request."""
    lines = (DATA / "cpu-handshake-failed-decode.log").read_text().splitlines()
    pod = nixl_of_pod(lines)
    assert pod["observed"] == "tcp" and pod["successful_transfers"] >= 1
    assert sorted(pod["transfer_failures"]) == ["handshake_failed"] * 2 + ["handshake_setup_failed"] * 2
    lost = ["epd-7-204832-m1-49da4e", "epd-7-204832-m4-9f0648"]     # the client's ids of cmpl-<id>-0-<8 hex>
    assert pod["kv_lost_requests"] == lost                   # the handshake's own line names no request
    out = verify_nixl("tcp", {"decode-0": pod}, roles={"decode-0": "decode"})
    assert out["verdict"] == "mismatch" and out["failed_transfers"] == 6     # 2 in vLLM's metrics, 4 NIXL lines
    assert (f"decode-0: transfers failed (failed_transfers=2, transfer_failures=4); NIXL's lines: "
            f"handshake_failed ×2, handshake_setup_failed ×2; KV never arrived for 2 request(s) ({', '.join(lost)})" in out["reasons"])
