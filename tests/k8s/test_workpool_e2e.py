"""`epdbench up --work-pool kubernetes` end to end against the fake cluster: the pool and the flow-run rights
are created, both deployments target the pool, and an adhoc run started through the Prefect API is turned
by the real prefect-kubernetes worker into a Job whose pod (a local process run by the fake kubelet) executes
the flow, which lands in MLflow with its results folder on the pod's results volume."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.k8s.fake_apiserver import FakeApiServer, wait_until
from tests.processes import marked_processes
from tests.test_up import free_port, start_up, stop_up, wait_final

pytestmark = [pytest.mark.e2e, pytest.mark.slow]     # Prefect, MLflow, a worker and a flow-run pod: minutes
ROOT = Path(__file__).parents[2]
ADVERTISED = "epdbench-control.example"


def test_up_with_a_kubernetes_work_pool_runs_an_adhoc_flow_as_a_job(tmp_path):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    pp, mp, mark = free_port(), free_port(), os.urandom(6).hex()
    # The cluster's network: pods reach the advertised address; here that is this machine's loopback.
    fake = FakeApiServer(tmp_path / "cluster", env_overrides={
        "PREFECT_API_URL": f"http://127.0.0.1:{pp}/api", "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{mp}",
        "EPDBENCH_TEST_MARK": mark}).start()
    kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EPDBENCH_TEST_MARK": mark,
           "PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_ENABLED": "false",    # the fake serves no watches
           "PREFECT_WORKER_QUERY_SECONDS": "2"}
    env.pop("PREFECT_API_URL", None)
    data = tmp_path / ".epdbench"
    up, out = start_up(["--prefect-port", str(pp), "--mlflow-port", str(mp), "--data-dir", str(data), "--work-pool",
                        "kubernetes", "--advertise", ADVERTISED, "--image", "registry.example/epdbench:0.1.0",
                        "--kubeconfig", str(kubeconfig)], tmp_path, env)
    try:
        assert "work pool epdbench-kubernetes: created" in out and "worker on this machine" in out, out
        assert {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"} <= \
            {o["kind"] for o in fake.objects() if o["metadata"]["name"].startswith("epdbench-flow")}
        api = f"http://127.0.0.1:{pp}/api"
        with temporary_settings({PREFECT_API_URL: api}):
            with get_client(sync_client=True) as client:
                pool = client.read_work_pool("epdbench-kubernetes")
                assert pool.type == "kubernetes"
                deployments = {d.name: d for d in client.read_deployments()}
                for name in ("nightly-comparison", "adhoc-comparison"):
                    d = deployments[name]
                    assert d.work_pool_name == "epdbench-kubernetes", name
                    assert d.job_variables["image"] == "registry.example/epdbench:0.1.0"
                    assert d.entrypoint == f"epdbench.flows.deployments.{name.replace('-', '_')}"
                    assert d.parameters["request"]["target"] == "kubernetes"     # in the cluster, by default
            run = run_deployment("adhoc-comparison/adhoc-comparison", timeout=0, parameters={"request": {
                "preset": "smoke", "configurations": ["pd-tcp"], "suites": ["mm-context"], "target": "sim"}})
            with get_client(sync_client=True) as client:
                fr = wait_final(client, run.id, 360)
                worker_log = (data / "logs" / "worker.log").read_text(errors="replace")[-3000:]
                assert fr.state_name == "Completed", f"{fr.state}\n{worker_log}"
        jobs = [j for j in fake.objects("Job") if j["metadata"]["labels"].get("prefect.io/flow-run-id") == str(run.id)]
        assert len(jobs) == 1, worker_log
        pod_spec = jobs[0]["spec"]["template"]["spec"]
        assert pod_spec["serviceAccountName"] == "epdbench-flow"
        (container,) = pod_spec["containers"]
        assert container["image"] == "registry.example/epdbench:0.1.0"
        assert {"name": "PREFECT_API_URL", "value": f"http://{ADVERTISED}:{pp}/api"} in container["env"]
        pods = [p for p in fake.objects("Pod") if p["metadata"]["labels"].get("job-name") == jobs[0]["metadata"]["name"]]
        assert len(pods) == 1    # the process ends just after it reported the run Completed
        assert wait_until(lambda: pods[0]["status"]["phase"] == "Succeeded", 60), pods[0]["status"]
        assert jobs[0]["status"]["succeeded"] == 1
        mlflow = MlflowClient(f"http://127.0.0.1:{mp}")
        exp = mlflow.get_experiment_by_name("epdbench")
        runs = mlflow.search_runs([exp.experiment_id], filter_string="tags.`epdbench.kind` = 'comparison'")
        assert len(runs) == 1 and runs[0].data.tags["epdbench.trigger"] == "adhoc"
        results = fake.work_dir / pods[0]["metadata"]["name"] / "results"     # the pod's results volume
        (folder,) = results.iterdir()                                          # <preset>-sim-<date>-<time>
        assert folder.name.startswith(fr.name) and (folder / "summary.csv").exists()
    finally:
        down = stop_up(up, data, tmp_path, env)
        fake.stop()
    assert down.returncode == 0 and up.returncode == 0, down.stdout + down.stderr
    time.sleep(1)
    assert not marked_processes(mark), "a process started by `up` or the flow-run pod is still running"
