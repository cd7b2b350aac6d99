"""tasks/evidence.py on NIXL pods: the KV verdict read as NixlConnector writes it, EPD's encoder-output verdict, and
what a run's evidence needs (tasks.publishing.publish.evidence_ok)."""
from pathlib import Path

from epdbench.specs.models import load_spec, parse_spec
from epdbench.tasks.deployment import Deployment, Process
from epdbench.tasks.evidence import ec_transport, kv_transport
from epdbench.tasks.publishing.publish import evidence_ok

LOGS = Path(__file__).parents[1] / "data" / "logs" / "nixl"


def deployment(config: str, logs: dict[str, tuple[str, str]]) -> Deployment:
    return Deployment(config, "", "", [Process(name, role, "", LOGS / f"{log}.log") for name, (role, log) in logs.items()])


def on_kubernetes(preset: str, **engine) -> object:
    data = load_spec(preset).model_dump(mode="json")
    data["target"] = {"kind": "kubernetes", "kubernetes": {"engine": engine} if engine else {}}
    return parse_spec(data)


def test_a_nixl_configuration_is_read_from_ucx_lanes_and_the_decodes_reads():
    spec = load_spec("pd-nixl")
    dep = deployment("pd-nixl-rdma", {"prefill-0": ("prefill", "rdma-ok-prefill"),
                                       "decode-0": ("decode", "rdma-tp-worker-tcp-lane-decode")})
    t = kv_transport(dep, spec, spec.configuration("pd-nixl-rdma"), {}, [])
    assert t["connector"] == "nixl" and t["verdict"] == "mismatch"
    assert "decode-0 Worker_TP1 pid=3102205 inter-node cfg#3: lanes am(tcp/eth0), ka(tcp/eth0) on TCP" in t["reasons"][0]


def test_epd_encoder_outputs_get_their_own_verdict_unless_the_cluster_uses_another_connector():
    spec = on_kubernetes("epd-multimodal")
    dep = deployment("epd", {"encode-0": ("encode", "ec-tcp-encode"), "prefill-0": ("prefill", "ec-tcp-prefill")})
    ec = ec_transport(dep, spec, spec.configuration("epd"))
    assert ec["verdict"] == "verified" and ec["what"] == "ec"
    ok = {"ok": True, "transport": {"verdict": "verified", "ec": ec}, "stages": {"verdict": "verified"}}
    assert evidence_ok(ok, "kubernetes")
    assert not evidence_ok({**ok, "transport": {"verdict": "verified", "ec": {"verdict": "mismatch"}}}, "kubernetes")
    shared = on_kubernetes("epd-multimodal", ec_connector="ECExampleConnector")
    other = ec_transport(dep, shared, shared.configuration("epd"))
    assert other["verdict"] == "not-read" and "ECExampleConnector" in other["reasons"][0]
    assert evidence_ok({**ok, "transport": {"verdict": "verified", "ec": other}}, "kubernetes")


def test_kv_expected_to_move_counts_the_kv_heads_a_decode_tp_above_them_replicates():
    from epdbench.analysis.transport import check_kv_volume
    from epdbench.tasks.evidence import kv_moved
    spec = load_spec("smoke")                            # Qwen2.5-VL-7B: 4 KV heads
    tp1 = spec.configuration("pd-tcp")
    tp8 = tp1.model_copy(update={"roles": [r.model_copy(update={"tp": 8}) for r in tp1.roles]})
    records = [{"ok": True, "phase": "measured", "prompt_tokens": 1000, "cached_tokens": 0}] * 4
    sent = 2 * 4 * 1000 * spec.model.kv_bytes_per_token  # every TP-8 rank sends its shard, each head twice
    deltas = {"prefill": {"mooncake_transfers": 4, "mooncake_bytes_transferred": sent}}
    assert kv_moved(spec, tp8, deltas, records)["expected_bytes_min"] == sent
    assert check_kv_volume(kv_moved(spec, tp8, deltas, records)) == []
    assert check_kv_volume(kv_moved(spec, tp1, deltas, records))    # at TP 1 those bytes are twice too many
