"""`epdbench up --work-pool kubernetes` against the real control plane: the pool's objects applied to the real API
server, an adhoc run started through the Prefect API turned by the real prefect-kubernetes worker into a Job (its
observer watching the Job's pods through real watches), the Job controller making its pod, the pod player running
it, the flow landing in MLflow, the Job controller marking the Job complete from the pod's exit."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.cluster.kubelet import PodPlayer
from tests.processes import marked_processes
from tests.test_up import free_port, start_up, stop_up, wait_final

pytestmark = pytest.mark.cluster      # the tier runs apart (-m cluster), in its network namespace
ROOT = Path(__file__).parents[2]
ADVERTISED = "epdbench-control.example"     # as pods would reach it; the player maps it to loopback
NAMESPACE = "epdbench"


def test_up_with_a_kubernetes_work_pool_runs_an_adhoc_flow_as_a_job(control_plane, tmp_path):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    cp = control_plane
    cp.ensure_namespace(NAMESPACE)
    pp, mp, mark = free_port(), free_port(), os.urandom(6).hex()
    player = PodPlayer(cp, tmp_path / "pods", None, NAMESPACE, env_overrides={
        "PREFECT_API_URL": f"http://127.0.0.1:{pp}/api", "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{mp}",
        "EPDBENCH_TEST_MARK": mark}).start()
    kubeconfig = cp.kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EPDBENCH_TEST_MARK": mark, "PREFECT_WORKER_QUERY_SECONDS": "2"}
    env.pop("PREFECT_API_URL", None)
    data = tmp_path / ".epdbench"
    up, out = start_up(["--prefect-port", str(pp), "--mlflow-port", str(mp), "--data-dir", str(data), "--work-pool",
                        "kubernetes", "--advertise", ADVERTISED, "--image", "registry.example/epdbench:0.1.0",
                        "--kubeconfig", str(kubeconfig)], tmp_path, env)
    try:
        assert "work pool epdbench-kubernetes: created" in out and "worker on this machine" in out, out
        status, body = cp.request("GET", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles/epdbench-flow")
        assert status == 200, body
        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{pp}/api"}):
            run = run_deployment("adhoc-comparison/adhoc-comparison", timeout=0, parameters={"request": {
                "preset": "smoke", "configurations": ["pd-tcp"], "suites": ["mm-context"], "target": "sim",
                "clock": "real", "trials": 1}})
            with get_client(sync_client=True) as client:
                fr = wait_final(client, run.id, 360)
                worker_log = (data / "logs" / "worker.log").read_text(errors="replace")[-3000:]
                assert fr.state_name == "Completed", f"{fr.state}\n{worker_log}\n{player.errors[-5:]}"
        status, body = cp.request("GET", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs?labelSelector="
                                         f"prefect.io/flow-run-id%3D{run.id}")
        (job,) = body["items"]
        pod_spec = job["spec"]["template"]["spec"]
        assert pod_spec["serviceAccountName"] == "epdbench-flow"
        (container,) = pod_spec["containers"]
        assert {"name": "PREFECT_API_URL", "value": f"http://{ADVERTISED}:{pp}/api"} in container["env"]
        job_name = job["metadata"]["name"]

        def job_complete() -> bool:
            _, j = cp.request("GET", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{job_name}")
            return any(c["type"] == "Complete" and c["status"] == "True" for c in j.get("status", {}).get("conditions", []))
        assert player.wait(job_complete, 60), "the Job controller did not mark the flow-run Job Complete"
        _, pods = cp.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=job-name%3D{job_name}")
        assert [p["status"]["phase"] for p in pods["items"]] == ["Succeeded"]
        mlflow = MlflowClient(f"http://127.0.0.1:{mp}")
        exp = mlflow.get_experiment_by_name("epdbench")
        runs = mlflow.search_runs([exp.experiment_id], filter_string="tags.`epdbench.kind` = 'comparison'")
        assert len(runs) == 1 and runs[0].data.tags["epdbench.trigger"] == "adhoc"
        results = player.work_dir / pods["items"][0]["metadata"]["name"] / "results"   # the pod's results volume
        (folder,) = results.iterdir()
        assert folder.name.startswith(fr.name) and (folder / "summary.csv").exists()
    finally:
        down = stop_up(up, data, tmp_path, env)
        player.stop()
    assert down.returncode == 0 and up.returncode == 0, down.stdout + down.stderr
    time.sleep(1)
    assert not marked_processes(mark), "a process started by `up` or the flow-run pod is still running"
