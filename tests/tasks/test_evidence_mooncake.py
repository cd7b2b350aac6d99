"""tasks/evidence.py for MooncakeConnector under vLLM 0.26, which exports no Prometheus metrics of its own
(mooncake/stats.py:15): the KV volume comes from the prefill engine's own lines over the run — each request whose
blocks it sent once (`Sending kv_caches for request`, DEBUG), the bytes of its `KV Transfer metrics` — never the
connector's count of batch writes, and a last window logged after the cell is waited for."""
from __future__ import annotations

from pathlib import Path

from epdbench.specs.models import load_spec
from epdbench.tasks.deployment import Deployment, Process
from epdbench.tasks.evidence import kv_transport, settled_transport
from tests.analysis.test_mooncake_log import FORCED_TCP, WINDOW, glog, kv_stats_line, sent
from tests.tasks.test_evidence_settle import Clock

SPEC = load_spec("gpu-qwen25vl")
CONFIG = SPEC.configuration("pd-mooncake-tcp")
PROMPT = 1024        # 64 blocks of 16 tokens: 56 MiB of Qwen2.5-VL-7B's KV (57,344 bytes a token)
RECORDS = [{"ok": True, "phase": "measured", "prompt_tokens": PROMPT, "cached_tokens": 0}] * 4
DECODE = [glog("transfer_engine_impl.cpp", 218, "MC_FORCE_TCP is set, using TCP transport only", thread=5151),
          glog("tcp_transport.cpp", 343, "TcpTransport: listen on port 20215", thread=5151)]
SMOKE = [sent("chatcmpl-smoke-1", 1), kv_stats_line(1, 0.875)]
# four requests in three batch writes: the second carried two requests' blocks
RUN = [sent(f"chatcmpl-r{i}-0a1b", 64) for i in range(4)] + [WINDOW, kv_stats_line(2, 56.0)]
LAST = kv_stats_line(1, 112.0)


def deployment(tmp_path: Path, prefill_lines: list[str], debug: bool = True) -> tuple[Deployment, dict]:
    """The pair's logs (the prefill's smoke request before the run's first offset) and those offsets."""
    if not debug:
        prefill_lines = [x for x in prefill_lines if " DEBUG " not in x]
        smoke = [x for x in SMOKE if " DEBUG " not in x]
    else:
        smoke = SMOKE
    prefill, decode = tmp_path / "prefill-0.log", tmp_path / "decode-0.log"
    prefill.write_text("\n".join(FORCED_TCP + smoke) + "\n")
    since = {"prefill-0": prefill.stat().st_size, "decode-0": 0}
    with prefill.open("a") as f:
        f.write("\n".join(prefill_lines) + "\n")
    decode.write_text("\n".join(DECODE) + "\n")
    dep = Deployment("pd-mooncake-tcp", "", "", [Process("prefill-0", "prefill", "", prefill),
                                                 Process("decode-0", "decode", "", decode)], kv_log_interval_s=5.0)
    return dep, since


def test_the_volume_of_the_run_comes_from_the_prefills_own_lines_one_per_request(tmp_path):
    dep, since = deployment(tmp_path, RUN + [LAST])
    t = kv_transport(dep, SPEC, CONFIG, {}, RECORDS, since)
    assert t["verdict"] == "verified", t["reasons"]
    kv = t["kv_check"]
    assert (kv["source"], kv["transfers"], kv["bytes"]) == ("log", 4, 4 * PROMPT * 57_344)
    assert t["pods"]["prefill-0"]["successful_transfers"] == 4      # 1 smoke + 3 batch writes: not per request
    assert "234.9 MB moved (4 requests' KV sent) for 4 measured requests" in t["reasons"][-1]
    assert t["pods"]["prefill-0"]["advertised"] == ["127.0.0.1"]


def test_without_the_connectors_debug_lines_the_requests_are_not_counted_and_kv_is_not_verified(tmp_path):
    dep, since = deployment(tmp_path, RUN + [LAST], debug=False)
    t = kv_transport(dep, SPEC, CONFIG, {}, RECORDS, since)
    assert t["verdict"] == "no-evidence" and t["kv_check"]["transfers"] is None
    assert ("KV volume not checked: the Prefill pods export no vllm:mooncake_* metrics (vLLM 0.26) and their logs "
            "gave no `Sending kv_caches for request` lines (MooncakeConnector at DEBUG) over the run") in t["reasons"]


def test_prometheus_counters_where_vllm_exports_them_come_first(tmp_path):
    dep, since = deployment(tmp_path, RUN + [LAST])
    deltas = {"prefill": {"mooncake_transfers": 4.0, "mooncake_bytes_transferred": 4 * PROMPT * 57_344.0}}
    t = kv_transport(dep, SPEC, CONFIG, deltas, RECORDS, since)
    assert t["verdict"] == "verified" and t["kv_check"]["source"] == "metrics"


def test_the_last_window_logged_after_the_cell_is_waited_for(tmp_path):
    dep, since = deployment(tmp_path, RUN)
    prefill = dep.processes[0].log_path

    def sync():
        with prefill.open("a") as f:
            f.write(LAST + "\n")
        dep.sync_logs = None
    dep.sync_logs = sync
    clock = Clock()
    t = settled_transport(dep, SPEC, CONFIG, {}, RECORDS, clock=clock, sleep=clock.sleep, since=since)
    assert t["verdict"] == "verified" and t["kv_check"]["bytes"] == 4 * PROMPT * 57_344
    assert len(clock.sleeps) == 1
