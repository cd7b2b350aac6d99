"""MLflow logging: comparison run → configuration runs → cell runs, with identical metric keys.

Uses MlflowClient with explicit run ids (no global active-run state), so a configuration or a
cell can be logged from anywhere in the flow and retried safely.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from epdbench.analysis.metrics import METRIC_KEYS

DEFAULT_STORE_DIR = Path(".epdbench")


def default_tracking_uri(base: Path | None = None) -> str:
    d = (base or Path.cwd()) / DEFAULT_STORE_DIR
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(d / 'mlflow.db').resolve()}"


def _num(v) -> float:
    if v is None:
        return math.nan
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str):
        import mlflow
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        mlflow.set_tracking_uri(tracking_uri)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            artifact_location = None
            if tracking_uri.startswith("sqlite:///"):
                db = Path(tracking_uri[len("sqlite:///"):])
                artifact_location = (db.parent / "mlartifacts").resolve().as_uri()
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=artifact_location)
        else:
            self.experiment_id = exp.experiment_id

    def _run(self, name: str, tags: dict, parent: str | None = None) -> str:
        tags = {k: str(v) for k, v in tags.items()}
        if parent:
            tags["mlflow.parentRunId"] = parent
        return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def _log(self, run_id: str, params: dict | None = None, metrics: dict | None = None,
             tags: dict | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, _num(v), now, 0) for k, v in (metrics or {}).items()],
            params=[Param(k, str(v)[:6000]) for k, v in (params or {}).items()],
            tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
        )

    def start_comparison(self, name: str, tags: dict, params: dict) -> str:
        run_id = self._run(name, {"epdbench.kind": "comparison", **tags})
        self._log(run_id, params=params)
        return run_id

    def log_configuration(self, parent: str, config: str, tags: dict, params: dict, metrics: dict) -> str:
        run_id = self._run(config, {"epdbench.kind": "configuration", "epdbench.config": config, **tags}, parent)
        self._log(run_id, params=params, metrics=metrics)
        return run_id

    def log_cell(self, parent: str, name: str, tags: dict, params: dict, summary: dict) -> str:
        run_id = self._run(name, {"epdbench.kind": "cell", **tags}, parent)
        self._log(run_id, params=params, metrics={k: summary.get(k) for k in METRIC_KEYS})
        self.finish(run_id)
        return run_id

    def log_artifacts(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path)
        elif path.exists():
            self.client.log_artifact(run_id, str(path), artifact_path)

    def set_tags(self, run_id: str, tags: dict) -> None:
        self._log(run_id, tags=tags)

    def finish(self, run_id: str, ok: bool = True) -> None:
        self.client.set_terminated(run_id, "FINISHED" if ok else "FAILED")

    def run_url(self, run_id: str) -> str:
        if self.tracking_uri.startswith("http"):
            return f"{self.tracking_uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}"
        return f"{self.tracking_uri} (experiment {self.experiment_id}, run {run_id})"
