"""Operations: resume an interrupted run without duplicate or missing cells; nothing lost when MLflow
is down (`epdbench sync` publishes later)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from epdbench.specs.models import load_spec
from epdbench.specs.workload import plan_cells
from epdbench.tasks.rundir.resume import cells_done, ledger_key, read_ledger

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
       "MLFLOW_HTTP_REQUEST_TIMEOUT": "3"}


def epdbench(*args, cwd):
    return subprocess.run([sys.executable, "-m", "epdbench.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=400, env=ENV)


def mlflow_runs(db: Path) -> dict[str, list]:
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("epdbench")
    kinds: dict[str, list] = {}
    for r in client.search_runs([exp.experiment_id], max_results=1000):
        kinds.setdefault(r.data.tags["epdbench.kind"], []).append(r)
    return kinds


def assert_exact_cells(out: Path, spec_path: Path):
    spec = load_spec(str(spec_path))
    rec = pd.read_parquet(out / "records.parquet")
    measured = rec[rec["phase"] == "measured"].groupby(["config", "cell", "trial"]).size()
    expected = {(c.name, cell.cell_id, 0): cell.n_measured for c in spec.configurations for cell in plan_cells(spec)}
    assert measured.to_dict() == expected
    assert rec["request_id"].is_unique


@pytest.mark.slow      # three comparisons, about a minute
def test_interrupted_run_resumes_to_exactly_the_cells_of_an_uninterrupted_run(tmp_path, tiny_spec_path):
    out, db = tmp_path / "results", tmp_path / "mlflow.db"
    proc = subprocess.Popen([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(tiny_spec_path),
                             "--out", str(out), "--tracking-uri", f"sqlite:///{db}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    seen = []
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:       # stop in the middle of pd-tcp, after one of its cells
            line = proc.stdout.readline()
            seen.append(line)
            if not line or line.lstrip().startswith("[pd-tcp] fixed"):
                break
        assert any("[pd-tcp] fixed" in line for line in seen), "".join(seen)[-2000:]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        seen.append(proc.stdout.read())
    finally:
        if proc.poll() is None:
            proc.kill()
    before = pd.read_parquet(out / "records.parquet")
    assert set(before["config"]) == {"aggregated", "pd-tcp"}
    # what the interrupted run left of pd-tcp: its cells recorded ok (on disk before their line is printed);
    # a cell that ended degraded on a loaded host is not among them and must be measured again
    spec = load_spec(str(out / "spec.yaml"))
    done = cells_done(out, spec, "pd-tcp")
    ledger = read_ledger(out, "pd-tcp")
    fixed = {(c.cell_id, 0) for c in plan_cells(spec) if c.suite == "fixed"}
    assert fixed <= done or any(ledger.get(ledger_key(*key), {}).get("status") != "ok" for key in fixed), ledger
    kept = set(before[(before["config"] == "pd-tcp") & before["cell"].isin({c for c, _ in done})]["request_id"])
    # on a loaded host the interrupt can land after pd-tcp's last cell and teardown: then it finished in full
    outcome = out / "evidence" / "pd-tcp" / "outcome.json"
    finished = outcome.exists() and json.loads(outcome.read_text())["ok"]
    resumed = epdbench("compare", "--resume", str(out), "--tracking-uri", f"sqlite:///{db}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
    assert "[aggregated] already finished in this run, skipped (resume)" in resumed.stdout
    whole = "[pd-tcp] already finished in this run, skipped (resume)" in resumed.stdout
    skipped = "[pd-tcp] fixed trial 0: already recorded, skipped (resume)" in resumed.stdout
    interrupted = "".join(seen)[-2000:]
    assert whole == finished, (finished, interrupted, resumed.stdout[-3000:])
    assert finished or skipped == (fixed <= done), (ledger, interrupted, resumed.stdout[-3000:])
    after = pd.read_parquet(out / "records.parquet")
    assert kept <= set(after["request_id"]), ledger                  # recorded cells kept, not measured again
    assert_exact_cells(out, tiny_spec_path)
    kinds = mlflow_runs(db)
    assert len(kinds["comparison"]) == 1 and len(kinds["configuration"]) == 4
    assert len(kinds["cell"]) == 4 * len(plan_cells(load_spec(str(tiny_spec_path))))


@pytest.mark.faults   # a fault injected into a whole comparison: in the faults lane for time
def test_mlflow_down_loses_nothing_and_sync_publishes_later(tmp_path, tiny_spec_path):
    import yaml
    spec = yaml.safe_load(tiny_spec_path.read_text())
    spec["configurations"] = [c for c in spec["configurations"] if c["name"] == "pd-tcp"]
    spec["suites"] = [s for s in spec["suites"] if s["kind"] == "fixed"]
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(spec))
    out, db = tmp_path / "results", tmp_path / "mlflow.db"
    down = epdbench("compare", "--spec", str(tmp_path / "one.yaml"), "--out", str(out),
                    "--tracking-uri", "http://127.0.0.1:9", cwd=tmp_path)          # nothing listens there
    assert down.returncode == 5, down.stdout[-2000:] + down.stderr[-2000:]     # kept, not published
    assert "epdbench sync" in down.stdout
    assert json.loads((out / "outcome.json").read_text())["mlflow_pending"] == ["comparison", "pd-tcp"]
    assert (out / "records.parquet").exists() and (out / "report.md").exists()
    synced = epdbench("sync", str(out), "--tracking-uri", f"sqlite:///{db}", cwd=tmp_path)
    assert synced.returncode == 0, synced.stderr
    assert "published pd-tcp, comparison" in synced.stdout
    again = epdbench("sync", str(out), "--tracking-uri", f"sqlite:///{db}", cwd=tmp_path)
    assert "already in MLflow" in again.stdout                                       # idempotent
    kinds = mlflow_runs(db)
    assert len(kinds["comparison"]) == 1 and len(kinds["configuration"]) == 1 and len(kinds["cell"]) == 1


@pytest.mark.faults   # a fault injected into a whole comparison: in the faults lane for time
def test_a_cell_past_its_timeout_fails_that_configuration_only(tmp_path, tiny_spec_path):
    import yaml
    spec = yaml.safe_load(tiny_spec_path.read_text())
    spec["configurations"] = [c for c in spec["configurations"] if c["name"] in ("aggregated", "pd-tcp")]
    spec["suites"] = [s for s in spec["suites"] if s["kind"] == "fixed"]
    spec["cell_timeout_s"] = 1          # 4096/32 at concurrency 4, 9 requests: about 2 s on the simulator
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "results"
    proc = epdbench("compare", "--spec", str(tmp_path / "slow.yaml"), "--out", str(out),
                    "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    outcome = json.loads((out / "outcome.json").read_text())
    for name in ("aggregated", "pd-tcp"):                       # the second still ran after the first failed
        assert not outcome["configs"][name]["ok"]
        assert "did not finish within 1 s" in outcome["configs"][name]["error"]
    kept = pd.read_parquet(out / "records.parquet")             # the requests that finished are kept ...
    assert 0 < len(kept) < 2 * 9 and kept["request_id"].is_unique
    ledger = json.loads((out / "evidence" / "aggregated" / "cells.json").read_text())
    assert [v["status"] for v in ledger.values()] == ["failed"]  # ... and resume measures the cell again
    assert "timed out" in (out / "report.md").read_text()
