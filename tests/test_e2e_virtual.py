"""`epdbench compare --clock virtual`: a spec on the simulator in virtual time, through the same flow, results folder,
report and MLflow runs as a real-clock run (real Prefect, real MLflow store), labelled virtual wherever its figures
are shown; every shipped preset end to end, publishing included."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

from epdbench.specs.models import PRESET_DIR, load_spec
from epdbench.specs.tracing import traced_indices
from epdbench.specs.workload import plan_cells
from epdbench.tasks.rundir.resume import ledger_key, ledger_path, read_ledger
from tests.spanrows import tree_problems
from tests.test_operations import mlflow_runs

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[1]
PRESETS = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def epdbench(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "epdbench.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=400, env={**os.environ, "PYTHONPATH": str(ROOT)})


def compare_virtually(spec: str, work: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path, float]:
    out = work / "results"
    start = time.monotonic()
    proc = epdbench("compare", "--clock", "virtual", "--spec", spec, "--out", str(out),
                    "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", *extra, cwd=work)
    return proc, out, time.monotonic() - start


def assert_published_virtual_run(proc, out: Path, db: Path, spec_path: str) -> None:
    """Exit 0; every planned cell recorded once; emulated verdicts; the report and the MLflow comparison run
    (FINISHED, tagged virtual, one cell run per recorded cell) say it ran in virtual time."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    spec = load_spec(spec_path)
    rec = pd.read_parquet(out / "records.parquet")
    measured = rec[rec["phase"] == "measured"].groupby(["config", "cell", "trial"]).size().to_dict()
    assert measured == {(c.name, cell.cell_id, t): cell.n_measured for c in spec.configurations
                        for cell in plan_cells(spec) for t in range(spec.trials)}
    assert rec["request_id"].is_unique
    outcome = json.loads((out / "outcome.json").read_text())
    assert outcome["all_verified"] and not outcome["mlflow_pending"]
    for name, c in outcome["configs"].items():
        assert c["transport"] in ("emulated", "not-applicable") and c["stages"] == "emulated", (name, c)
    assert "in virtual time: every figure is the cost model's, no process runs" in proc.stdout
    trials = "" if spec.trials == 1 else f", mean of {spec.trials} trials"    # one row per cell over its trials
    assert (f"(ms unless noted{trials}) — virtual time: the simulator's cost model, not a measurement"
            in " ".join(proc.stdout.split())), proc.stdout[-3000:]
    report = (out / "report.md").read_text()
    assert "on simulator in virtual time (emulated hardware)" in report.splitlines()[0]
    assert "> **Simulator run in virtual time.**" in report and "clock **virtual**" in report
    assert "no process ran, no request crossed HTTP" in (out / "report.html").read_text()
    runs = mlflow_runs(db)
    (parent,) = runs["comparison"]
    assert parent.info.status == "FINISHED" and parent.data.tags["epdbench.clock"] == "virtual"
    assert len(runs["configuration"]) == len(spec.configurations)
    assert len(runs["cell"]) == len(measured)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_spec_path):
    work = tmp_path_factory.mktemp("virtual")
    return (*compare_virtually(str(tiny_spec_path), work), work)


@pytest.mark.slow     # the tiny spec's comparison in virtual time, published: about 40 s
def test_a_spec_runs_in_virtual_time_through_the_whole_pipeline(tiny_run, tiny_spec_path):
    proc, out, _, work = tiny_run
    assert_published_virtual_run(proc, out, work / "mlflow.db", str(tiny_spec_path))
    stages = json.loads((out / "evidence" / "epd" / "stages.json").read_text())
    assert stages["fraction_seen"] == {"decode": 1.0, "encode": 1.0, "prefill": 1.0}
    transport = json.loads((out / "evidence" / "pd-tcp" / "transport.json").read_text())
    assert transport["clock"] == "virtual" and transport["kv_check"]["transfers"] >= \
        transport["kv_check"]["measured_requests"]
    assert not list((out / "evidence").glob("*/*.log")), "no process ran, so no process log"


@pytest.mark.slow     # the tiny spec's comparison in virtual time, published: about 40 s
def test_the_virtual_comparison_records_what_the_virtual_core_serves(tiny_run, tiny_spec_path):
    """The flow adds nothing of its own to the figures: its records are tasks.sim.vrun's for the same spec."""
    from epdbench.tasks.sim.vrun import simulate_records
    _, out, _, _ = tiny_run
    spec = load_spec(str(out / "spec.yaml"))
    key = ["config", "cell", "trial", "phase", "index"]
    ran = pd.read_parquet(out / "records.parquet").sort_values(key).reset_index(drop=True)
    core = simulate_records(spec).sort_values(key).reset_index(drop=True)
    for column in ("prompt_hash", "prompt_tokens", "output_tokens", "ttft_ms", "e2e_ms"):
        pd.testing.assert_series_equal(ran[column], core[column], check_dtype=False, obj=column)


@pytest.mark.slow     # the tiny spec's comparison in virtual time, published: about 40 s
def test_a_virtual_run_traces_its_requests_and_breaks_their_ttft_down(tiny_run, tiny_spec_path):
    """Tracing on (the spec's default): one span tree per traced request in traces/<config>.parquet, as a
    real-clock run makes them (client → the EPD proxy's router.request → each engine's llm_request and the
    kv_transfer), the same traces in MLflow under their cell runs with the ttft_breakdown metrics, the breakdown in
    the report and the terminal."""
    proc, out, _, work = tiny_run
    spec = load_spec(str(tiny_spec_path))
    records = pd.read_parquet(out / "records.parquet")
    want = sum(len(traced_indices(c.n_measured, spec.tracing.per_cell)) for c in plan_cells(spec))
    for config in spec.configurations:
        spans = pd.read_parquet(out / "traces" / f"{config.name}.parquet")
        assert spans["trace_id"].nunique() == want and not spans.duplicated(["trace_id", "span_id"]).any()
        assert set(spans["request_id"]) <= set(records[records["config"] == config.name]["request_id"])
        for tid, trace in spans.groupby("trace_id"):
            assert tree_problems(trace) == [], (config.name, tid)
            engines = set(trace[trace["name"] == "llm_request"]["role"])
            assert engines >= ({"aggregated"} if config.topology == "aggregated" else {"prefill", "decode"})
            assert (trace["name"] == "kv_transfer").sum() == (config.topology != "aggregated")
            assert (trace["role"] == "proxy").sum() == (config.topology == "epd")
            assert trace["emulated"][trace["role"] != "client"].all()
    from epdbench.tasks.publishing.mlflow_check import mlflow_matches_results
    assert mlflow_matches_results(f"sqlite:///{work / 'mlflow.db'}", out) == []
    for run in mlflow_runs(work / "mlflow.db")["cell"]:
        assert run.data.metrics["ttft_breakdown.requests"] > 0 and "ttft_breakdown.prefill.p50_ms" in run.data.metrics
    section = (out / "report.md").read_text().split("## Where TTFT goes")[1].split("\n## ")[0]
    assert "Made in virtual time" in section and "no TTFT breakdown" not in section
    assert all(f"TTFT {c.name} fixed" in proc.stdout for c in spec.configurations), proc.stdout[-3000:]


class PresetRuns:
    """Each shipped preset's virtual comparison, two at a time: asking for one also starts the next in PRESETS, so
    the next test's run goes on while this one's is checked. A virtual run keeps about one core busy and takes none
    of its figures from the wall clock, so on 2 cores two of them cost little more than one."""

    def __init__(self, root: Path):
        self.root, self.pool, self.runs = root, ThreadPoolExecutor(max_workers=2), {}

    def _start(self, preset: str) -> Future:
        if preset not in self.runs:
            work = self.root / preset
            work.mkdir()
            # a local target's preset (cpu-tiny: real engines) is put on the simulator, whose clock this is
            on_sim = ["--target", "sim"] if load_spec(preset).target.kind == "local" else []
            self.runs[preset] = self.pool.submit(compare_virtually, preset, work, *on_sim)
        return self.runs[preset]

    def result(self, preset: str) -> tuple[subprocess.CompletedProcess, Path, float, Path]:
        run = self._start(preset)
        following = PRESETS[PRESETS.index(preset) + 1:]
        if following:
            self._start(following[0])
        return (*run.result(timeout=450), self.root / preset)


@pytest.fixture(scope="module")
def preset_runs(tmp_path_factory):
    runs = PresetRuns(tmp_path_factory.mktemp("presets"))
    yield runs
    runs.pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow     # every shipped preset, about 30-80 s each on 2 cores (two at a time)
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_and_publishes_in_virtual_time(preset_runs, preset):
    proc, out, seconds, work = preset_runs.result(preset)
    print(f"{preset}: compare --clock virtual took {seconds:.1f} s (beside another preset's)")
    assert_published_virtual_run(proc, out, work / "mlflow.db", preset)


@pytest.mark.slow     # two comparisons
def test_a_resumed_virtual_run_records_the_missing_cells_once_and_as_before(tmp_path, tiny_spec_path):
    proc, out, _ = compare_virtually(str(tiny_spec_path), tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    before = pd.read_parquet(out / "records.parquet")
    cell = plan_cells(load_spec(str(tiny_spec_path)))[0].cell_id
    kept = before[~((before["config"] == "pd-tcp") & (before["cell"] == cell))]   # as if killed before that cell
    kept.to_parquet(out / "records.parquet", index=False)
    ledger = read_ledger(out, "pd-tcp")
    del ledger[ledger_key(cell, 0)]
    ledger_path(out, "pd-tcp").write_text(json.dumps(ledger))
    outcome = json.loads((out / "outcome.json").read_text())
    (out / "evidence" / "pd-tcp" / "outcome.json").write_text(json.dumps({"ok": False, "status": "failed"}))
    proc = epdbench("compare", "--resume", str(out), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[aggregated] already finished in this run, skipped (resume)" in proc.stdout, proc.stdout
    after = pd.read_parquet(out / "records.parquet")
    assert after["request_id"].is_unique and len(after) == len(before)
    key = ["config", "cell", "trial", "phase", "index"]
    for frame in (before, after):
        frame.sort_values(key, inplace=True, ignore_index=True)
    for column in ("request_id", "prompt_hash", "ttft_ms", "e2e_ms", "output_tokens"):
        pd.testing.assert_series_equal(after[column], before[column], check_dtype=False, obj=column)
    assert json.loads((out / "outcome.json").read_text())["all_verified"] == outcome["all_verified"]
    spec = load_spec(str(tiny_spec_path))        # the cell served again has its spans once, of its new records
    spans = pd.read_parquet(out / "traces" / "pd-tcp.parquet")
    assert spans["trace_id"].nunique() == sum(len(traced_indices(c.n_measured, spec.tracing.per_cell))
                                              for c in plan_cells(spec))
    assert not spans.duplicated(["trace_id", "span_id"]).any()
    assert set(spans["request_id"]) <= set(after[after["config"] == "pd-tcp"]["request_id"])
    assert all(tree_problems(trace) == [] for _, trace in spans.groupby("trace_id"))
