"""`epdbench history` text (pure): one metric over the past runs of a spec, one line per configuration
and cell (oldest run first), and where the newest run stands against the runs before it."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.labels import cell_label
from epdbench.analysis.regression import CELL, RegressionSettings, detect
from epdbench.reports.findings import METRIC_NAMES
from epdbench.reports.fmt import fmt

COLUMN_WIDTH = 9


def select(history: pd.DataFrame, config: str | None = None, workload: str | None = None,
           concurrency: int | None = None) -> pd.DataFrame:
    """The rows of the chosen configuration / workload / concurrency (None: all)."""
    h = history
    for column, value in (("config", config), ("workload", workload), ("concurrency", concurrency)):
        if value is not None:
            h = h[h[column] == value]
    return h


def verdict_text(history: pd.DataFrame, metric: str, newest: str, settings: RegressionSettings) -> dict[tuple, str]:
    """cell key → how the newest run's value stands against the runs before it."""
    before = history[history["run_id"] != newest]
    out = {}
    for j in detect(history[history["run_id"] == newest], before, settings, [metric]):
        if j.status == "insufficient-history":
            text = f"insufficient history ({j.n_history} of {settings.min_history} runs)"
        else:
            change = "from zero" if j.change_pct is None else f"{j.change_pct:+.1f}%"
            text = f"{j.status} ({change} vs {j.n_history} runs)"
        out[(j.config, j.suite, j.workload, j.concurrency, j.stream)] = text
    return out


def trend_lines(history: pd.DataFrame, metric: str, settings: RegressionSettings) -> list[str]:
    """Runs (oldest first), then per configuration × cell the metric per run and the newest run's verdict."""
    if history.empty:
        return ["no runs match"]
    history = history.assign(**{metric: pd.to_numeric(history[metric], errors="coerce")})
    runs = history[["run_id", "run_name", "started"]].drop_duplicates("run_id").sort_values("started")
    name, unit = METRIC_NAMES.get(metric, (metric, ""))
    lines = [f"{name} ({unit}) over {len(runs)} run(s), oldest first:"]
    lines += [f"  #{i} {r.started} {r.run_name}" for i, r in enumerate(runs.itertuples(), 1)]
    verdicts = verdict_text(history, metric, runs["run_id"].iloc[-1], settings)
    header = "".join(f"{'#' + str(i):>{COLUMN_WIDTH}}" for i in range(1, len(runs) + 1))
    lines.append(f"{'configuration / cell':<44}{header}  newest run")
    means = history.groupby(CELL + ["run_id"], sort=False)[metric].mean()
    for key, per_run in means.groupby(level=CELL):
        values = per_run.droplevel(CELL)
        cells = "".join(f"{fmt(values.get(rid), metric):>{COLUMN_WIDTH}}" for rid in runs["run_id"])
        config, suite, workload, concurrency, stream = key
        label = f"{config} {suite} {cell_label(workload, concurrency, stream, short=True)}"
        lines.append(f"{label:<44}{cells}  {verdicts.get(key, 'not in the newest run')}")
    return lines
