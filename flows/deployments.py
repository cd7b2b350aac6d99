"""Prefect deployments: `nightly-comparison` (cron) and `adhoc-comparison` (run from the UI form).

Both take a RunRequest, so the UI form is generated from it (titles, descriptions, bounds), and both
hold the `epdbench-gpu-node` concurrency slot, so two runs never share the GPU node.
Served by `python -m epdbench.flows.deployments` (started by `epdbench up`), or, with --work-pool, registered
on a Prefect work pool of type kubernetes so that each run executes as a Job in the cluster (the image has
epdbench installed; the entrypoint is this module's flow, by module path). Results go to
$EPDBENCH_RESULTS_DIR (default results/).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path

import pandas as pd
from prefect import deploy, flow, serve
from prefect.artifacts import create_progress_artifact
from prefect.deployments.runner import EntrypointType
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run
from prefect.schedules import Cron

from epdbench.flows.compare import compare
from epdbench.flows.outputs import prefect_summary_artifact
from epdbench.specs.profile import error_bar
from epdbench.specs.request import RunRequest, request_profile, resolve_request, run_name
from epdbench.tasks.services import GPU_NODE_SLOT


def results_dir() -> Path:
    return Path(os.environ.get("EPDBENCH_RESULTS_DIR") or "results")


def _name_from_parameters() -> str:
    req = flow_run.parameters.get("request") or {}
    req = req if isinstance(req, RunRequest) else RunRequest.model_validate(req)
    return run_name(req, dt.date.today().isoformat())


def _run(request: RunRequest, trigger: str) -> dict:
    """The comparison as a sub-flow; its live progress and its summary artifact also on this run, the one the
    UI and `prefect deployment run` show first."""
    profile = request_profile(request)
    spec = resolve_request(request, profile)
    if profile is not None:
        print(f"Simulator constants from profile {request.profile}; {error_bar(profile, spec)}")
    name = run_name(request, dt.date.today().isoformat()) if request.run_key else \
        f"{run_name(request, dt.datetime.now().strftime('%Y-%m-%d-%H%M%S'))}"
    progress = create_progress_artifact(0.0, key="epdbench-progress", description=f"{name}: cells done")
    with concurrency(GPU_NODE_SLOT, occupy=1):
        outcome = compare(spec, out_dir=str(results_dir() / name), trigger=trigger, run_name=name,
                          resume=bool(request.run_key), progress_artifact=str(progress), profile=profile)
    summary_path = Path(outcome["results_dir"]) / "summary.csv"
    prefect_summary_artifact(outcome, pd.read_csv(summary_path) if summary_path.exists() else pd.DataFrame())
    return outcome


@flow(name="nightly-comparison", flow_run_name=_name_from_parameters, log_prints=True)
def nightly_comparison(request: RunRequest = RunRequest()) -> dict:
    """Scheduled comparison of a preset; results in results/<run>/ and MLflow (trigger: nightly)."""
    return _run(request, "nightly")


@flow(name="adhoc-comparison", flow_run_name=_name_from_parameters, log_prints=True)
def adhoc_comparison(request: RunRequest = RunRequest()) -> dict:
    """Comparison started from the UI form; give a run key to resume an interrupted run."""
    return _run(request, "adhoc")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m epdbench.flows.deployments", description="Serve epdbench's deployments.")
    p.add_argument("--nightly-cron", default="0 2 * * *")
    p.add_argument("--timezone", default="UTC")
    p.add_argument("--nightly-preset", default="smoke")
    p.add_argument("--work-pool", default=None, help="register on this kubernetes work pool instead of serving")
    p.add_argument("--image", default=None, help="with --work-pool: the epdbench image the Jobs run")
    p.add_argument("--namespace", default=None, help="with --work-pool: the runs' Kubernetes namespace")
    a = p.parse_args(argv)
    pooled = a.work_pool is not None
    # in the cluster, runs target it by default (the form still offers the simulator)
    default = {"target": "kubernetes", "namespace": a.namespace} if pooled else {}
    options = {"entrypoint_type": EntrypointType.MODULE_PATH} if pooled else {}
    nightly = nightly_comparison.to_deployment(
        name="nightly-comparison", schedule=Cron(a.nightly_cron, timezone=a.timezone),
        parameters={"request": RunRequest(preset=a.nightly_preset, **default).model_dump(mode="json")},
        tags=["nightly"], description="Nightly comparison of a preset on the GPU node (or the simulator).", **options)
    adhoc = adhoc_comparison.to_deployment(
        name="adhoc-comparison", tags=["adhoc"],
        parameters={"request": RunRequest(**default).model_dump(mode="json")} if pooled else None,
        description="Run a comparison now: choose preset, configurations, suites, trials, seed, target.", **options)
    if pooled:
        deploy(nightly, adhoc, work_pool_name=a.work_pool, image=a.image, build=False, push=False,
               print_next_steps_message=False)
        print(f"deployments nightly-comparison, adhoc-comparison registered on work pool {a.work_pool}", flush=True)
        return
    serve(nightly, adhoc, pause_on_shutdown=False)


if __name__ == "__main__":
    # the flows by their importable name, not __main__: a work pool's Jobs import them by module path
    from epdbench.flows.deployments import main as registered_main
    registered_main()
