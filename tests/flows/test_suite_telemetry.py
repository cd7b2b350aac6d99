"""A suite measured with a GPU sampler (tasks/local/nvml.py reading a stand-in NVML whose GPU draws 250 W): each
cell's figures over its measured window land in its ledger entry, and from there in the summary the report, the
Pareto points and MLflow read — against one simulator replica over loopback, with the real load generator."""
from __future__ import annotations

import time

import pytest
import yaml

from epdbench.analysis.metrics import RECORD_COLUMNS, summarize
from epdbench.analysis.pareto import pareto_points
from epdbench.flows.suite import run_suite
from epdbench.specs.models import load_spec
from epdbench.tasks.local.nvml import start_sampler
from epdbench.tasks.rundir.resume import noise_of, read_ledger
from epdbench.tasks.rundir.results import read_records
from epdbench.tasks.sim import target as sim_target
from tests.tasks.local.test_nvml import FakeNvml

pytestmark = pytest.mark.timeout(180)


def test_each_cells_gpu_figures_go_to_its_ledger_entry_and_the_summary(tmp_path, tiny_spec_path):
    data = yaml.safe_load(tiny_spec_path.read_text())
    data["suites"] = [{"kind": "fixed", "name": "text", "concurrencies": [1, 2], "n_warmup": 1, "n_measured": 3,
                       "shapes": [{"input_tokens": 128, "output_tokens": 16}]}]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(str(path))
    config = spec.configuration("aggregated")
    dep = sim_target.start(spec, config, path, tmp_path / "sim")
    nv = FakeNvml(gpus=1)
    nv.nvmlDeviceGetPowerUsage = lambda h: 250_000
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: 1e6 + (time.time() - nv.t0) * 250_000
    sampler, why = start_sampler([0], tmp_path / "evidence" / "gpu-telemetry.csv", nvml=nv, interval_s=0.05)
    assert why is None
    try:
        items = run_suite.fn(dep.endpoint, spec, "text", "aggregated", "run-1", str(tmp_path / "records.parquet"),
                             {}, telemetry=sampler)
    finally:
        sampler.stop()
        sim_target.stop(dep)
    assert [i["status"] for i in items] == ["ok", "ok"]
    ledger = read_ledger(tmp_path, "aggregated")
    assert len(ledger) == 2
    for entry in ledger.values():
        noise = entry["noise"]
        assert noise["gpu_samples"] > 0 and noise["gpu_power_w_mean"] == pytest.approx(250)
    summary = summarize(read_records(tmp_path / "records.parquet", RECORD_COLUMNS), {"aggregated": 1},
                        noise_of(tmp_path, ["aggregated"]))
    for r in summary.to_dict("records"):
        # 250 W over the measured window, by the counter: energy = 250 × window; per token over its output tokens
        assert r["gpu_energy_j"] == pytest.approx(250 * r["window_s"], rel=0.05)
        assert r["energy_j_per_token"] == pytest.approx(r["gpu_energy_j"] / r["output_tokens"])
    points = pareto_points(summary)
    assert points["energy_j_per_token"].notna().all()
