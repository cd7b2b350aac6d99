"""tasks/evidence.py on real engines on a GPU (benchmarks/data/h100-2026-12-0{6,7}/lane-*: vLLM 0.26.0, NIXL 1.5.1 for
CUDA 13, Qwen2.5-VL-7B's real shapes on one H100, kept from `benchmarks/gpu/gpu_local_lane.py`): the KV verdict from the
engines' UCX lanes and the decode's /metrics, the stages from their request lines, and EPD's encoder outputs through
ECExampleConnector's folder, read again from the kept logs as the lane read them live."""
import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from epdbench.analysis.ec_files import ec_files_of_pod, verify_ec_files
from epdbench.analysis.stages import verify_stages
from epdbench.specs.models import load_spec
from epdbench.tasks.deployment import Deployment, Process
from epdbench.tasks.evidence import (_metric_deltas, _role_counts, ec_expected, expected_roles, iter_lines,
                                     kv_transport)

DATA = Path(__file__).parents[2] / "benchmarks" / "data"
KEPT = DATA / "h100-2026-12-06"
LANES = {"pd-nixl-tcp": KEPT, "epd": KEPT, "aggregated": DATA / "h100-2026-12-07"}
ROLES = {"pd-nixl-tcp": ("prefill", "decode"), "epd": ("encode", "prefill", "decode"), "aggregated": ("server",)}


def lane(config: str, tmp: Path) -> tuple[Deployment, dict, dict, list[dict]]:
    """The configuration's deployment over its kept logs (unpacked), its /metrics before and after, its records."""
    kept = LANES[config] / f"lane-{config}"
    procs = []
    for name in [f"{r}-0" for r in ROLES[config]] + ["router"]:
        with gzip.open(kept / f"{name}.log.gz", "rb") as src, open(tmp / f"{name}.log", "wb") as dst:
            shutil.copyfileobj(src, dst)
        procs.append(Process(name, name.split("-")[0], "", tmp / f"{name}.log"))
    snap = {when: {"metrics": {n: gzip.decompress((kept / f"metrics-{when}-{n}.prom.gz").read_bytes()).decode()
                               for n in [p.name for p in procs]}} for when in ("before", "after")}
    records = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
               for r in pd.read_parquet(kept / "records.parquet").to_dict("records")]
    return Deployment(config, "", "", procs), snap["before"], snap["after"], records


@pytest.mark.parametrize("config", ["pd-nixl-tcp", "epd"])
def test_kv_over_nixl_between_two_engines_on_one_gpu_is_verified_with_its_volume(config, tmp_path):
    spec = load_spec("gpu-qwen25vl")
    dep, before, after, records = lane(config, tmp_path)
    t = kv_transport(dep, spec, spec.configuration(config), _metric_deltas(dep, before, after), records)
    assert t["verdict"] == "verified", t["reasons"]
    # the logs count one transfer more than the window's metrics: the start-up probe's (one 16-token block)
    assert t["reasons"][0] == ("every KV pod and UCX worker (2) used only TCP lanes; KV moved (41 successful NIXL "
                               "transfers)")
    measured = sum(1 for r in records if r["phase"] == "measured")
    assert measured == 32 and t["kv_check"]["measured_requests"] == measured
    # 40 requests (8 warm-ups, 32 measured) read their prompt's KV from prefill, in whole 16-token blocks of
    # Qwen2.5-VL-7B's 57,344 bytes per token (28 layers × 4 KV heads × 128 × K and V × bf16)
    assert t["kv_check"]["transfers"] == 40
    assert t["kv_check"]["bytes"] == 2_159_804_416
    assert t["kv_check"]["bytes"] % (16 * 57_344) == 0
    assert json.loads((KEPT / f"lane-{config}" / "transport.json").read_text())["verdict"] == "verified"


@pytest.mark.parametrize("config", ["pd-nixl-tcp", "epd", "aggregated"])
def test_every_measured_request_is_seen_at_every_stage_of_the_real_engines(config, tmp_path):
    spec = load_spec("gpu-qwen25vl")
    dep, before, after, records = lane(config, tmp_path)
    want = expected_roles(spec.configuration(config), records)
    stages = verify_stages(want, _role_counts(dep, {"offsets": {}, **before}, {"offsets": {}, **after}), False,
                           _metric_deltas(dep, before, after))
    assert stages["verdict"] == "verified", stages["reasons"]
    assert stages["reasons"][0] == "every measured request was seen at " + ", ".join(sorted(ROLES[config]))


def test_encoder_outputs_through_the_shared_memory_folder_are_verified_from_the_connector_lines(tmp_path):
    spec = load_spec("gpu-qwen25vl")
    dep, _, _, records = lane("epd", tmp_path)
    roles = {p.name: p.role for p in dep.processes if p.role in ("encode", "prefill")}
    pods = {n: ec_files_of_pod(iter_lines(p.log_path)) for p in dep.processes for n in [p.name] if n in roles}
    folder = json.loads((KEPT / "lane-epd" / "ec_transport.json").read_text())["folder"]   # removed after the run
    expected = ec_expected(spec, records)
    assert expected == {"images": 16, "bytes": 16 * 400 * 3584 * 2}     # 400 tokens of a 560-px image, bf16
    ec = verify_ec_files(pods, roles, expected, folder)
    assert ec["verdict"] == "verified", ec["reasons"]
    assert ec["reasons"][0] == ("encode saved 20 images' encoder outputs, prefill loaded 20 of them (20 loads) for 16 "
                                "distinct measured images")
    # a prefill that encoded the images itself logs no loads: the same lines without them are not verified
    alone = {**pods, "prefill-0": ec_files_of_pod([])}
    assert verify_ec_files(alone, roles, expected, folder)["verdict"] != "verified"


def test_the_aggregated_engine_moves_no_kv_and_its_records_are_the_lanes():
    spec = load_spec("gpu-qwen25vl")
    kept = LANES["aggregated"] / "lane-aggregated"
    assert json.loads((kept / "transport.json").read_text())["verdict"] == "not-applicable"
    records = pd.read_parquet(kept / "records.parquet")
    measured = records[records["phase"] == "measured"]
    # 4 cells of 8 measured requests (text 1024 and one 560-px image, at concurrency 1 and 4), every one served
    assert len(measured) == 32 and measured["ok"].all()
    cells = json.loads((kept / "lane.json").read_text())[0]["cells"]
    assert [c["requests_ok"] for c in cells] == [8, 8, 8, 8]
    # the lane's own summary is its records' (the p50 TTFT of each cell, as the product's metrics compute it)
    from epdbench.analysis.metrics import summarize_cell
    for c in cells:
        s = summarize_cell(measured[measured["cell"] == c["cell"]])
        assert s["ttft_p50_ms"] == pytest.approx(c["ttft_p50_ms"])
    assert spec.configuration("aggregated").topology == "aggregated"
