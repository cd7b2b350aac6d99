"""MLflow logging: comparison run → configuration runs → cell runs, with identical metric keys.

Uses MlflowClient with explicit run ids (no global active-run state), so a configuration or a
cell can be logged from anywhere in the flow and retried safely.

Find-or-create. A run logged with a `key` carries the tag `epdbench.key` (the keys are built by
`epdbench.tasks.publishing.publish`:
`<run>`, `<run>/<config>`, `<run>/<config>/<suite>/<workload>/c<n>/<stream>/t<trial>`)
and is looked up by that tag before anything is created, so a Prefect task retry, `--resume` or
`epdbench sync` updates the run it finds instead of adding a second one:
- metrics are logged again with a later timestamp (MLflow shows the latest value);
- tags are overwritten (values that may change between attempts — status, verdicts, error, router — are tags);
- a param already logged with the same value is skipped; MLflow refuses to change a param, so a param whose
  value changed is written as the tag `epdbench.param.<name>` instead (the param keeps the first value);
- the terminal status is set again (a FAILED run becomes FINISHED when its data now exists);
- artifacts are uploaded again to the same paths (same path overwrites);
- a deleted run with the key is restored; when several active runs carry one key (two writers raced),
  the oldest is kept and the others are deleted.
Without `key` (tests seeding a history, old callers) a new run is created each time, as before.

Never left RUNNING by a failure. A run whose logging fails once it exists (a refused name, a server error) is set
FAILED with the whole reason as its tag `epdbench.publish_error` before the error goes on (`Tracker.failing`; not
tried when the server cannot be reached); publishing it again later sets its status anew and removes that tag.

MLflow unreachable, quietly: tasks.publishing.mlflow_quiet.
"""
from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

from epdbench.analysis.metrics import METRIC_KEYS
from epdbench.reports.mlflow_names import valid_keys
from epdbench.tasks.publishing.mlflow_quiet import (QuietClient, failure_reason, is_unreachable, probe, quiet_mlflow,
                                                    silence_mlflow_retries)

DEFAULT_STORE_DIR = Path(".epdbench")
KEY_TAG = "epdbench.key"
PARENT_TAG = "mlflow.parentRunId"
CHANGED_PARAM_TAG = "epdbench.param."
PUBLISH_ERROR_TAG = "epdbench.publish_error"
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"   # MLflow 3's UI mode
# MLflow 3.17's UI picks GenAI or "Model training" per browser, not per experiment: the URL's `workflowType`, else
# the sidebar switch remembered in the browser's local storage (`mlflow.workflowType`), else GenAI, whose landing
# tab is Overview and whose runs sit under "Evaluations"; the experiment's kind tag is no longer read there
# (WorkflowTypeContext and useExperimentKind in MLflow's UI source). Every link epdbench prints carries the parameter.
MODEL_TRAINING = "workflowType=machine_learning"
LOCAL_UI = "http://127.0.0.1:5000"        # where `mlflow ui` serves a local store by default


def default_tracking_uri(base: Path | None = None) -> str:
    d = (base or Path.cwd()) / DEFAULT_STORE_DIR
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(d / 'mlflow.db').resolve()}"


def ui_url(base: str, experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI's address of an experiment (its runs table) or of one run, opening in Model training."""
    page = f"{base.rstrip('/')}/#/experiments/{experiment_id}"
    return f"{page}/runs/{run_id}?{MODEL_TRAINING}" if run_id else f"{page}/runs?{MODEL_TRAINING}"


def _num(v) -> float:
    if v is None:
        return math.nan
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _quoted(value: str) -> str | None:
    """A filter-string literal for value, or None when it holds both quote kinds."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    return None


# --- tracker -------------------------------------------------------------------------------------------

class Tracker:
    def __init__(self, tracking_uri: str, experiment: str, create: bool = True):
        """Connect; the experiment is created when missing (with `create=False`: LookupError instead)."""
        import mlflow
        from mlflow.tracking import MlflowClient

        silence_mlflow_retries()
        probe(tracking_uri)
        # traces (tasks.publishing.traces) written as each is ended, not queued for a background exporter whose
        # every flush costs about a second: read before MLflow's first trace, unless the user set it
        os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
        self.tracking_uri = tracking_uri
        self._last_ms = 0
        with quiet_mlflow():
            mlflow.set_tracking_uri(tracking_uri)
        self.client = QuietClient(MlflowClient(tracking_uri=tracking_uri))
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None and not create:
            raise LookupError(f"experiment {experiment!r} is not in {tracking_uri}")
        if exp is None:
            artifact_location = None
            if tracking_uri.startswith("sqlite:///"):
                db = Path(tracking_uri[len("sqlite:///"):])
                artifact_location = (db.parent / "mlartifacts").resolve().as_uri()
            # the kind: model-serving measurements, the classic runs table. Earlier MLflow 3 releases open an
            # experiment by this tag; 3.17 by the browser's mode (MODEL_TRAINING, in the links epdbench prints)
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=artifact_location,
                                                               tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        else:
            self.experiment_id = exp.experiment_id
            if exp.tags.get(EXPERIMENT_KIND_TAG) is None:   # made before the kind was set, or by someone else
                self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)

    # lookup ---------------------------------------------------------------------------------------

    def search(self, filter_string: str, deleted: bool = False) -> list:
        """Every run of the experiment matching the filter (paged), oldest first."""
        from mlflow.entities import ViewType

        runs, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string,
                                           run_view_type=ViewType.ALL if deleted else ViewType.ACTIVE_ONLY,
                                           max_results=1000, order_by=["attributes.start_time ASC"],
                                           page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                return runs

    def find(self, key: str, deleted: bool = True) -> list:
        """Runs tagged with `key` (active first, then deleted ones), oldest first within each group."""
        lit = _quoted(key)
        if lit is not None:
            runs = self.search(f"tags.`{KEY_TAG}` = {lit}", deleted)
        else:
            runs = [r for r in self.search("", deleted) if r.data.tags.get(KEY_TAG) == key]
        return sorted(runs, key=lambda r: (r.info.lifecycle_stage != "active", r.info.start_time or 0))

    def children(self, parent: str, kind: str | None = None) -> list:
        """Active runs whose parent is `parent` (optionally of one epdbench kind)."""
        where = f"tags.`{PARENT_TAG}` = '{parent}'"
        if kind:
            where += f" and tags.`epdbench.kind` = '{kind}'"
        return self.search(where)

    def ensure_run(self, key: str, name: str, tags: dict, parent: str | None = None, adopt=None):
        """The run carrying `key`, created when there is none: (run id, the Run found or None when created).

        `adopt`, when given, is a run without a key (logged before keys existed) that stands for this key, or a
        callable returning one or None (called only when no run has the key): it is tagged and reused instead
        of creating a new one. Tags (and the parent) are set either way."""
        tags = {k: str(v) for k, v in tags.items()}
        tags[KEY_TAG] = key
        if parent:
            tags[PARENT_TAG] = parent
        found = self.find(key)
        active = [r for r in found if r.info.lifecycle_stage == "active"]
        run = None
        if active:
            run = active[0]
            for dup in active[1:]:
                self.client.delete_run(dup.info.run_id)
        elif found:
            run = found[0]
            self.client.restore_run(run.info.run_id)
        elif adopt is not None:
            run = adopt() if callable(adopt) else adopt
        if run is None:
            return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id, None
        self._log(run.info.run_id, tags=tags)
        return run.info.run_id, run

    # logging --------------------------------------------------------------------------------------

    def _now_ms(self) -> int:
        """Strictly increasing per tracker, so the value logged last is the one MLflow shows."""
        self._last_ms = max(int(time.time() * 1000), self._last_ms + 1)
        return self._last_ms

    def _run(self, name: str, tags: dict, parent: str | None = None) -> str:
        tags = {k: str(v) for k, v in tags.items()}
        if parent:
            tags[PARENT_TAG] = parent
        return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def _log(self, run_id: str, params: dict | None = None, metrics: dict | None = None,
             tags: dict | None = None, logged_params: dict | None = None) -> None:
        """One batch. Params already logged with the same value are skipped; a changed value goes to the tag
        `epdbench.param.<name>` (MLflow refuses to change a param). Every key is made valid for MLflow
        (reports.mlflow_names: a valid key is left as it is)."""
        from mlflow.entities import Metric, Param, RunTag

        tags = dict(tags or {})
        new_params = {}
        for k, v in valid_keys(params or {}).items():
            value = str(v)[:6000]
            if logged_params is None or k not in logged_params:
                new_params[k] = value
            elif logged_params[k] != value:
                tags[CHANGED_PARAM_TAG + k] = value
        now = self._now_ms()
        metric_list = [Metric(k, _num(v), now, 0) for k, v in valid_keys(metrics or {}).items()]
        param_list = [Param(k, v) for k, v in new_params.items()]
        tag_list = [RunTag(k, str(v)) for k, v in valid_keys(tags).items()]
        for i in range(0, max(len(metric_list), len(param_list), len(tag_list), 1), 100):
            if metric_list[i:i + 100] or param_list[i:i + 100] or tag_list[i:i + 100]:
                self.client.log_batch(run_id, metrics=metric_list[i:i + 100], params=param_list[i:i + 100],
                                      tags=tag_list[i:i + 100])

    def start_comparison(self, name: str, tags: dict, params: dict, key: str | None = None,
                         adopt=None) -> str:
        tags = {"epdbench.kind": "comparison", **tags}
        if key is None:
            run_id = self._run(name, tags)
            self._log(run_id, params=params)
            return run_id
        run_id, run = self.ensure_run(key, name, tags, adopt=adopt)
        with self.failing(run_id):
            self._log(run_id, params=params, logged_params=run.data.params if run else None)
        return run_id

    def log_configuration(self, parent: str, config: str, tags: dict, params: dict, metrics: dict,
                          key: str | None = None, adopt=None) -> str:
        tags = {"epdbench.kind": "configuration", "epdbench.config": config, **tags}
        if key is None:
            run_id = self._run(config, tags, parent)
            self._log(run_id, params=params, metrics=metrics)
            return run_id
        run_id, run = self.ensure_run(key, config, tags, parent, adopt=adopt)
        with self.failing(run_id):
            self._log(run_id, params=params, metrics=metrics, logged_params=run.data.params if run else None)
        return run_id

    def log_cell(self, parent: str, name: str, tags: dict, params: dict, summary: dict,
                 key: str | None = None, existing=None) -> str:
        """A finished cell run. With `key`, `existing` is the run already holding it (or one to adopt),
        when the caller looked it up already; otherwise the run is searched for by its key."""
        tags = {"epdbench.kind": "cell", **tags}
        metrics = {k: summary.get(k) for k in METRIC_KEYS}
        if key is None:
            run_id = self._run(name, tags, parent)
            self._log(run_id, params=params, metrics=metrics)
        else:
            found = existing is not None and existing.info.lifecycle_stage == "active"
            run_id, run = (existing.info.run_id, existing) if found else self.ensure_run(key, name, tags, parent)
            with self.failing(run_id):
                self._log(run_id, params=params, metrics=metrics, logged_params=run.data.params if run else None,
                          tags={**{k: str(v) for k, v in tags.items()}, KEY_TAG: key, PARENT_TAG: parent}
                          if found else None)
                if run is not None and PUBLISH_ERROR_TAG in run.data.tags:
                    self.client.delete_tag(run_id, PUBLISH_ERROR_TAG)
        self.finish(run_id)
        return run_id

    def log_artifacts(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path)
        elif path.exists():
            self.client.log_artifact(run_id, str(path), artifact_path)

    def set_tags(self, run_id: str, tags: dict) -> None:
        self._log(run_id, tags=tags)

    def log_metrics(self, run_id: str, metrics: dict) -> None:
        self._log(run_id, metrics=metrics)

    def finish(self, run_id: str, ok: bool = True) -> None:
        self.client.set_terminated(run_id, "FINISHED" if ok else "FAILED")

    def close(self, run_id: str, ok: bool = True) -> None:
        """finish, and the tag of an earlier failure to publish removed."""
        if PUBLISH_ERROR_TAG in self.client.get_run(run_id).data.tags:
            self.client.delete_tag(run_id, PUBLISH_ERROR_TAG)
        self.finish(run_id, ok)

    def fail(self, run_id: str, reason: str) -> None:
        """FAILED, with `reason` as the tag `epdbench.publish_error`; best effort (this is already a failure)."""
        for step in (lambda: self._log(run_id, tags={PUBLISH_ERROR_TAG: reason}),
                     lambda: self.client.set_terminated(run_id, "FAILED")):
            try:
                step()
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass

    @contextmanager
    def failing(self, run_id: str):
        """An error inside leaves `run_id` FAILED with its reason (not tried when the server is unreachable:
        it would only wait), then goes on."""
        try:
            yield
        except Exception as e:
            if not is_unreachable(e):
                self.fail(run_id, failure_reason(e))
            raise

    def delete(self, run_id: str) -> None:
        """Soft delete (MLflow's lifecycle stage `deleted`): hidden from searches and the UI, restorable."""
        self.client.delete_run(run_id)

    def run_url(self, run_id: str) -> str:
        """Where a person opens the run: its page in the UI, or for a local store the `mlflow ui` command first."""
        if self.tracking_uri.startswith("http"):
            return ui_url(self.tracking_uri, self.experiment_id, run_id)
        where = f"{self.tracking_uri} (experiment {self.experiment_id}, run {run_id})"
        if self.tracking_uri.startswith("sqlite:///"):
            return (f"{where}; to browse it run mlflow ui --backend-store-uri {self.tracking_uri} --port 5000 and "
                    f"open {ui_url(LOCAL_UI, self.experiment_id, run_id)}")
        return where
