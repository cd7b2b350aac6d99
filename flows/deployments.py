"""Prefect deployments: `nightly-comparison` (cron) and `adhoc-comparison` (run from the UI form).

Both take a RunRequest, so the UI form is generated from it (titles, descriptions, bounds), and both
hold the `epdbench-gpu-node` concurrency slot, so two runs never share the GPU node.
Served by `python -m epdbench.flows.deployments` (started by `epdbench up`).
"""
from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from prefect import flow, serve
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run
from prefect.schedules import Cron

from epdbench.flows.compare import compare
from epdbench.specs.request import RunRequest, resolve_request, run_name
from epdbench.tasks.services import GPU_NODE_SLOT

RESULTS_DIR = Path("results")


def _name_from_parameters() -> str:
    req = flow_run.parameters.get("request") or {}
    req = req if isinstance(req, RunRequest) else RunRequest.model_validate(req)
    return run_name(req, dt.date.today().isoformat())


def _run(request: RunRequest, trigger: str) -> dict:
    spec = resolve_request(request)
    name = run_name(request, dt.date.today().isoformat()) if request.run_key else \
        f"{run_name(request, dt.datetime.now().strftime('%Y-%m-%d-%H%M%S'))}"
    with concurrency(GPU_NODE_SLOT, occupy=1):
        return compare(spec, out_dir=str(RESULTS_DIR / name), trigger=trigger, run_name=name,
                       resume=bool(request.run_key))


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
    a = p.parse_args(argv)
    nightly = nightly_comparison.to_deployment(
        name="nightly-comparison", schedule=Cron(a.nightly_cron, timezone=a.timezone),
        parameters={"request": RunRequest(preset=a.nightly_preset).model_dump(mode="json")},
        tags=["nightly"], description="Nightly comparison of a preset on the GPU node (or the simulator).")
    adhoc = adhoc_comparison.to_deployment(
        name="adhoc-comparison", tags=["adhoc"],
        description="Run a comparison now: choose preset, configurations, suites, trials, seed, target.")
    serve(nightly, adhoc, pause_on_shutdown=False)


if __name__ == "__main__":
    main()
