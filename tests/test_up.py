"""`epdbench up` end to end: Prefect server, MLflow server and both deployments on free loopback ports;
an adhoc run triggered through the Prefect API lands in MLflow; `epdbench down` leaves nothing behind."""
import datetime as dt
import os
import socket
import subprocess
import sys
import shutil
import time
from pathlib import Path

import pytest
import yaml

from epdbench.specs.models import load_spec
from epdbench.specs.profile import profile_to_yaml
from tests.processes import marked_processes
from tests.specs.test_profile import a_profile

pytestmark = [pytest.mark.e2e, pytest.mark.slow]     # a Prefect and an MLflow server: over a minute
ROOT = Path(__file__).parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def browse(url: str, tmp: Path, screenshot: Path) -> str:
    """Headless Chromium: the page's DOM after its scripts ran, and a screenshot kept as a test artifact."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--disable-sync", "--virtual-time-budget=15000",
             "--window-size=1400,1000"]
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([*flags, f"--user-data-dir={tmp / 'shot'}", f"--screenshot={screenshot}", url],
                   capture_output=True, timeout=120)
    return subprocess.run([*flags, f"--user-data-dir={tmp / 'dom'}", "--dump-dom", url], capture_output=True,
                          text=True, timeout=120).stdout


def start_up(args: list[str], cwd: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """`epdbench up ARGS` started; its output up to the MLflow UI line (bounded wait)."""
    up = subprocess.Popen([sys.executable, "-m", "epdbench.cli", "up", *args], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines, deadline = [], time.monotonic() + 240
    while time.monotonic() < deadline:
        line = up.stdout.readline()
        lines.append(line)
        if not line or line.startswith("MLflow UI:"):
            break
    return up, "".join(lines)


def wait_final(client, run_id, timeout_s: float):
    """The flow run once it reached a final state (or as it stands at the deadline), polled every 2 s."""
    deadline = time.monotonic() + timeout_s
    while True:
        fr = client.read_flow_run(run_id)
        if (fr.state and fr.state.is_final()) or time.monotonic() >= deadline:
            return fr
        time.sleep(2)


def stop_up(up: subprocess.Popen, data: Path, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """`epdbench down`, then `up` awaited (killed past a minute); returns down's result."""
    down = subprocess.run([sys.executable, "-m", "epdbench.cli", "down", "--data-dir", str(data)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)
    try:
        up.wait(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    return down


def test_up_adhoc_run_from_the_prefect_api_and_down(tmp_path):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    pp, mp, mark = free_port(), free_port(), os.urandom(6).hex()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EPDBENCH_TEST_MARK": mark}
    env.pop("PREFECT_API_URL", None)
    data = tmp_path / ".epdbench"
    up, out = start_up(["--prefect-port", str(pp), "--mlflow-port", str(mp), "--data-dir", str(data)], tmp_path, env)
    try:
        assert f"http://127.0.0.1:{mp}" in out, out
        api = f"http://127.0.0.1:{pp}/api"
        with temporary_settings({PREFECT_API_URL: api}):
            with get_client(sync_client=True) as client:
                deployments = {d.name: d for d in client.read_deployments()}
                assert {"nightly-comparison", "adhoc-comparison"} <= set(deployments)
                nightly = deployments["nightly-comparison"]
                assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
                upcoming, deadline = [], time.monotonic() + 90       # the scheduler loop fills them in
                while not upcoming and time.monotonic() < deadline:
                    upcoming = [r for r in client.read_flow_runs() if r.deployment_id == nightly.id
                                and r.state_name == "Scheduled"]
                    time.sleep(2)
                assert upcoming, "the nightly deployment shows no next run"
                form = deployments["adhoc-comparison"].parameter_openapi_schema["definitions"]["RunRequest"]
                assert form["properties"]["trials"]["anyOf"][0]["maximum"] == 20     # bounds reach the UI form
            profile = tmp_path / "h100.yaml"        # a calibration profile named in the form: its constants run
            profile.write_text(profile_to_yaml(a_profile()))
            run = run_deployment("adhoc-comparison/adhoc-comparison", timeout=0, parameters={
                "request": {"preset": "smoke", "configurations": ["pd-tcp"], "suites": ["mm-context"],
                            "clock": "real", "trials": 1, "profile": str(profile)}})
            with get_client(sync_client=True) as client:
                fr = wait_final(client, run.id, 300)
                assert fr.state_name == "Completed", fr.state
                assert fr.name == f"smoke-sim-{dt.date.today().isoformat()}"
                keys = {a.key for a in client.read_artifacts()}
                assert {"epdbench-progress", "epdbench-report"} <= keys
                # the run `prefect deployment run` and the UI show first carries them too, not only its sub-flow
                own = client.read_artifacts(artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[fr.id])))
                assert {"epdbench-progress", "epdbench-report"} <= {a.key for a in own}
                report = next(a for a in own if a.key == "epdbench-report")
                assert "| pd-tcp |" in report.data and f"Results: `{data / 'results'}" in report.data
                progress = next(a for a in own if a.key == "epdbench-progress")
                assert float(progress.data) == 100.0
        # under --data-dir: the folder the report names (an ad hoc run without a run key is stamped to the second)
        folder = Path(report.data.split("Results: `", 1)[1].split("`", 1)[0])
        assert folder.parent == data / "results" and folder.name.startswith(fr.name)
        assert (folder / "summary.csv").exists()
        assert load_spec(str(folder / "spec.yaml")).hardware.tcp_gb_s == 1.7            # the profile's constants
        assert yaml.safe_load((folder / "profile.yaml").read_text())["hardware"] == a_profile()["hardware"]
        mlflow = MlflowClient(f"http://127.0.0.1:{mp}")
        exp = mlflow.get_experiment_by_name("epdbench")
        runs = mlflow.search_runs([exp.experiment_id], filter_string="tags.`epdbench.kind` = 'comparison'")
        assert len(runs) == 1 and runs[0].data.tags["epdbench.trigger"] == "adhoc"
        assert {"report.md", "profile.yaml"} <= {a.path for a in mlflow.list_artifacts(runs[0].info.run_id)}
        if CHROMIUM:   # what a person sees: both deployments in the Prefect UI, the run in the MLflow UI
            dom = browse(f"http://127.0.0.1:{pp}/deployments", tmp_path, ARTIFACTS / "prefect-deployments.png")
            assert "nightly-comparison" in dom and "adhoc-comparison" in dom
            run_page = f"http://127.0.0.1:{mp}/#/experiments/{exp.experiment_id}/runs/{runs[0].info.run_id}"
            dom = browse(run_page, tmp_path, ARTIFACTS / "mlflow-comparison-run.png")
            assert runs[0].info.run_name in dom
    finally:
        down = stop_up(up, data, tmp_path, env)
    assert down.returncode == 0 and up.returncode == 0, down.stdout + down.stderr
    time.sleep(1)
    assert not marked_processes(mark), "a process started by `up` is still running"
