"""Run history in MLflow for the nightly regression check, and its verdicts logged back.

Reads the last N comparison runs of a spec on a target (tags `epdbench.kind`, `epdbench.spec`,
`epdbench.target`), their configuration runs and those runs' cell runs: one row per cell run, keyed
like the summary (config, suite, workload, concurrency, stream, trial). Writes, per configuration run
of tonight's comparison, the tags `epdbench.regression` (worst status) and `epdbench.regressions`
(what regressed) and the metrics `regressions` / `improvements`; the totals on the comparison run.
"""
from __future__ import annotations

import datetime as dt

import pandas as pd

from epdbench.analysis.metrics import METRIC_KEYS
from epdbench.analysis.regression import CELL, RegressionSettings, check_result, detect

HISTORY_COLUMNS = ["run_id", "run_name", "started"] + CELL + ["trial"] + METRIC_KEYS
PAGE = 5000


def mlflow_client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def experiment_id(client, name: str) -> str | None:
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp else None


def search_all(client, exp_id: str, filter_string: str, order_by: list[str] | None = None,
               limit: int | None = None) -> list:
    """Every run matching the filter (paged), or the first `limit`."""
    runs, token = [], None
    while True:
        page = client.search_runs([exp_id], filter_string, order_by=order_by, page_token=token,
                                  max_results=min(PAGE, limit - len(runs)) if limit else PAGE)
        runs += list(page)
        token = page.token
        if not token or (limit and len(runs) >= limit):
            return runs


LATEST_SEARCH = 200    # newest comparisons searched for one on the asked clock


def comparison_runs(client, exp_id: str, spec: str, target: str, last_n: int,
                    before_ms: int | None = None, fingerprint: str | None = None,
                    verified_only: bool = False) -> list:
    """The last `last_n` comparison runs of `spec` on `target` started before `before_ms`, newest first;
    with `fingerprint`, only runs of that very resolved spec; with `verified_only`, only runs whose
    evidence held in every configuration."""
    where = (f"tags.`epdbench.kind` = 'comparison' and tags.`epdbench.spec` = '{spec}' "
             f"and tags.`epdbench.target` = '{target}'")
    if fingerprint:
        where += f" and tags.`epdbench.spec_fingerprint` = '{fingerprint}'"
    if verified_only:
        where += " and tags.`epdbench.all_verified` = 'True'"
    if before_ms is not None:
        where += f" and attributes.start_time < {int(before_ms)}"
    return search_all(client, exp_id, where, ["attributes.start_time DESC"], last_n)


def latest_fingerprint(client, exp_id: str, spec: str, target: str, clock: str = "real") -> str | None:
    """The resolved-spec fingerprint of the newest comparison of `spec` on `target` on that simulator clock (runs
    from before the clock tag are real-clock runs) whose evidence held."""
    for run in comparison_runs(client, exp_id, spec, target, LATEST_SEARCH, verified_only=True):
        if run.data.tags.get("epdbench.clock", "real") == clock:
            return run.data.tags.get("epdbench.spec_fingerprint")
    return None


def started_iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat(timespec="milliseconds")


def children(client, exp_id: str, kind: str, parents: set[str], since_ms: int) -> list:
    """Runs of `kind` whose parent run is in `parents` (MLflow cannot filter tags with IN)."""
    runs = search_all(client, exp_id, f"tags.`epdbench.kind` = '{kind}' and attributes.start_time >= {since_ms}")
    return [r for r in runs if r.data.tags.get("mlflow.parentRunId") in parents]


def cell_row(cell, comparison) -> dict:
    p = cell.data.params
    return {"run_id": comparison.info.run_id, "run_name": comparison.info.run_name,
            "started": started_iso(comparison.info.start_time), "config": cell.data.tags.get("epdbench.config"),
            "suite": p.get("suite"), "workload": p.get("cell"), "concurrency": int(p.get("concurrency", 0)),
            "stream": p.get("stream", "main"), "trial": int(p.get("trial", 0)),
            **{k: cell.data.metrics.get(k) for k in METRIC_KEYS}}


def cell_history(client, exp_id: str, spec: str, target: str, last_n: int, before_ms: int | None = None,
                 fingerprint: str | None = None, verified_only: bool = False) -> pd.DataFrame:
    """One row per cell run of the last `last_n` comparisons of `spec` on `target` (HISTORY_COLUMNS)."""
    comparisons = {r.info.run_id: r for r in comparison_runs(client, exp_id, spec, target, last_n, before_ms,
                                                             fingerprint, verified_only)}
    if not comparisons:
        return pd.DataFrame(columns=HISTORY_COLUMNS)
    since = min(r.info.start_time for r in comparisons.values())
    configs = {r.info.run_id: r.data.tags["mlflow.parentRunId"]
               for r in children(client, exp_id, "configuration", set(comparisons), since)}
    cells = children(client, exp_id, "cell", set(configs), since)
    rows = [cell_row(c, comparisons[configs[c.data.tags["mlflow.parentRunId"]]]) for c in cells]
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def history_before(tracking_uri: str, experiment: str, spec: str, target: str, last_n: int,
                   comparison_run_id: str) -> pd.DataFrame:
    """The cell history of the comparisons that started before `comparison_run_id`, of the same resolved
    spec (its fingerprint tag, when it has one) and whose evidence held."""
    client = mlflow_client(tracking_uri)
    this = client.get_run(comparison_run_id)
    exp_id = experiment_id(client, experiment)
    return cell_history(client, exp_id, spec, target, last_n, before_ms=this.info.start_time,
                        fingerprint=this.data.tags.get("epdbench.spec_fingerprint"), verified_only=True)


def configuration_runs(client, comparison_run_id: str) -> dict[str, str]:
    """config name → run id of the configuration runs of one comparison."""
    exp_id = client.get_run(comparison_run_id).info.experiment_id
    runs = search_all(client, exp_id, f"tags.`mlflow.parentRunId` = '{comparison_run_id}' "
                                      "and tags.`epdbench.kind` = 'configuration'")
    return {r.data.tags["epdbench.config"]: r.info.run_id for r in runs}


def log_regression_check(tracking_uri: str, comparison_run_id: str, check: dict) -> None:
    """Per configuration run and on the comparison run: worst status tag, what regressed, counts."""
    from mlflow.entities import Metric, RunTag

    client = mlflow_client(tracking_uri)
    now = int(dt.datetime.now().timestamp() * 1000)
    per_config = check.get("per_config", {})
    targets = {**{run_id: per_config.get(name) for name, run_id in configuration_runs(client, comparison_run_id).items()},
               comparison_run_id: check.get("overall")}
    for run_id, verdict in targets.items():
        if verdict is None:
            continue
        client.log_batch(run_id, metrics=[Metric("regressions", verdict["regressions"], now, 0),
                                          Metric("improvements", verdict["improvements"], now, 0)],
                         tags=[RunTag("epdbench.regression", verdict["status"]),
                               RunTag("epdbench.regressions", "; ".join(verdict["flagged"])[:5000] or "none")])


def check_history(tracking_uri: str, experiment: str, spec: str, target: str, comparison_run_id: str | None,
                  tonight: pd.DataFrame, settings: RegressionSettings) -> dict:
    """Tonight's summary judged against the comparisons that started before this one; on any MLflow
    failure a result with status `unavailable` (the run itself is never lost to it)."""
    if not comparison_run_id:
        return {"status": "unavailable", "error": "no MLflow comparison run"}
    try:
        history = history_before(tracking_uri, experiment, spec, target, settings.last_n, comparison_run_id)
    except Exception as e:  # noqa: BLE001 - MLflow down or unreadable: report it, keep the run
        return {"status": "unavailable", "error": f"{type(e).__name__}: {str(e)[:200]}"}
    return check_result(settings, history, detect(tonight, history, settings))
