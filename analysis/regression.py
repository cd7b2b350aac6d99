"""Nightly regression detection (pure): does tonight's value of a metric in a cell lie outside the
band that the recent history of the same spec, target, configuration and cell supports?

History: one value per past run (the mean over its trials), newest last, the last `last_n` runs.
- band (at least `min_history` past runs): median ± half-width, half-width = max(k·σ, min_change)·|median|,
  σ = 1.4826·MAD relative to the median — the larger of this cell's own and the metric's pooled value
  over every configuration and cell (leave-one-out: each past value against the median of the others),
  so a cell with a few quiet nights cannot make a band narrower than the metric's real noise. With
  trials > 1 tonight, its whole 95% CI must lie outside the band.
- ci (fewer past runs, at least two, trials > 1 tonight): flagged when tonight's 95% CI and the 95% CI
  of the past runs' values (one per run: the trials of one run are not independent samples of the
  run-to-run noise) are disjoint and the change is at least `min_change`.
- otherwise: insufficient history, never a flag.
`itl_max_ms` is one extreme sample: the report shows it, the check never judges it. The history itself
(tasks/publishing/history.py) holds only past runs of the same resolved spec whose evidence held.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import median

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from epdbench.analysis.labels import cell_label
from epdbench.analysis.metrics import LOWER_IS_BETTER
from epdbench.analysis.noise import finite
from epdbench.analysis.trials import mean_ci

MAD_TO_SIGMA = 1.4826
CELL = ["config", "suite", "workload", "concurrency", "stream"]
# Judged metrics; itl_max_ms, a single extreme sample, is reported in the tables but never judged.
REGRESSION_METRICS = ["ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "itl_p99_ms", "output_tok_s", "req_s"]
FLAGGED = ("regression", "improvement")


class RegressionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    last_n: int = Field(10, ge=1, le=365, title="History runs",
                        description="How many past runs of the same spec and target form the history.")
    min_history: int = Field(5, ge=2, le=365, title="Runs needed for a band",
                             description="Past runs needed before the median ± k·MAD band is used.")
    k: float = Field(4.0, gt=0, le=50, title="Band half-width (robust σ)",
                     description="Half-width of the noise band in robust standard deviations (1.4826 × MAD). "
                                 "4 keeps pure noise from flagging across ~100 metric-cells a night.")
    min_change: float = Field(0.05, ge=0, le=10, title="Smallest flagged change",
                              description="Relative change never flagged, whatever the band (0.05 = 5%).")

    @model_validator(mode="after")
    def _band_reachable(self) -> "RegressionSettings":
        if self.min_history > self.last_n:
            raise ValueError(f"min_history ({self.min_history}) must not exceed last_n ({self.last_n})")
        return self


@dataclass(frozen=True)
class Judgement:
    """Tonight's value of one metric in one cell of one configuration against its history."""
    config: str
    suite: str
    workload: str
    concurrency: int
    stream: str
    metric: str
    value: float                 # tonight, mean over trials
    value_ci95: float | None     # half-width, trials > 1
    previous: float | None       # the most recent past run
    previous_run: str | None
    baseline: float | None       # median of the history (band) or its trial mean (ci)
    band_low: float | None
    band_high: float | None
    n_history: int
    method: str                  # band | band+ci | ci | none
    status: str                  # regression | improvement | within-noise | insufficient-history

    @property
    def delta_pct(self) -> float | None:
        """Change against the previous run, in percent."""
        if self.previous is None or self.previous == 0:
            return None
        return 100.0 * (self.value / self.previous - 1.0)

    @property
    def change_pct(self) -> float | None:
        """Change against the history's baseline, in percent."""
        if self.baseline is None or self.baseline == 0:
            return None
        return 100.0 * (self.value / self.baseline - 1.0)

    def as_dict(self) -> dict:
        return {**asdict(self), "delta_pct": self.delta_pct, "change_pct": self.change_pct}


def relative_sigma(values: list[float]) -> float:
    """1.4826 · median |x / median − 1|: the robust relative standard deviation."""
    med = float(median(values))
    if med == 0:
        return 0.0
    return MAD_TO_SIGMA * float(median([abs(v / med - 1.0) for v in values]))


def prediction_sigma(per_cell: list[list[float]]) -> float:
    """Robust relative σ of a new value against the median of the others, pooled over cells:
    1.4826 · median over every cell and value of |x_i / median(x_−i) − 1|. Leaving x_i out measures
    exactly what a night is judged by, the median's own uncertainty included."""
    devs = []
    for values in per_cell:
        for i, v in enumerate(values):
            rest = values[:i] + values[i + 1:]
            med = float(median(rest)) if len(rest) >= 2 else 0.0
            if med != 0:
                devs.append(abs(v / med - 1.0))
    return MAD_TO_SIGMA * float(median(devs)) if devs else 0.0


def status_of(metric: str, low: float, high: float, band_low: float, band_high: float) -> str:
    """Where the interval [low, high] (tonight) lies against the band."""
    if low > band_high:
        return "regression" if metric in LOWER_IS_BETTER else "improvement"
    if high < band_low:
        return "improvement" if metric in LOWER_IS_BETTER else "regression"
    return "within-noise"


def band_judgement(metric: str, tonight: list[float], nightly: list[float], sigma_pooled: float,
                   s: RegressionSettings) -> tuple[str, float, float, float, str]:
    """(status, median, low, high, method) of the median ± max(k·σ, min_change) band."""
    med = float(median(nightly))
    half = max(s.k * max(relative_sigma(nightly), sigma_pooled), s.min_change) * abs(med)
    mean, ci, _ = mean_ci(tonight)
    ci = ci or 0.0
    method = "band+ci" if len(tonight) > 1 else "band"
    return status_of(metric, mean - ci, mean + ci, med - half, med + half), med, med - half, med + half, method


def ci_judgement(metric: str, tonight: list[float], past_values: list[float],
                 s: RegressionSettings) -> tuple[str, float, float, float, str]:
    """(status, history mean, its CI low, its CI high, "ci"): disjoint 95% CIs (tonight's trials; one value
    per past run) and a large enough change."""
    mean, ci, _ = mean_ci(tonight)
    base, base_ci, _ = mean_ci(past_values)
    low, high = base - base_ci, base + base_ci
    status = status_of(metric, mean - ci, mean + ci, low, high)
    if base == 0 or abs(mean / base - 1.0) < s.min_change:
        status = "within-noise"
    return status, base, low, high, "ci"


@dataclass(frozen=True)
class PastRun:
    """One past run's values of one metric in one cell (one per trial)."""
    run_id: str
    run_name: str
    started: str
    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)


def judge_cell(metric: str, tonight: list[float], past: list[PastRun], sigma_pooled: float,
               s: RegressionSettings) -> tuple[str, float | None, float | None, float | None, str]:
    """(status, baseline, band low, band high, method) of one cell against its past runs."""
    if len(past) >= s.min_history:
        return band_judgement(metric, tonight, [r.mean for r in past], sigma_pooled, s)
    if len(tonight) > 1 and len(past) > 1:   # one value per past run: its trials share that run's noise
        return ci_judgement(metric, tonight, [r.mean for r in past], s)
    return "insufficient-history", None, None, None, "none"


def past_runs(history: pd.DataFrame, metric: str, last_n: int) -> dict[tuple, list[PastRun]]:
    """cell key → its last `last_n` past runs with a value of `metric`, oldest first."""
    if history.empty or metric not in history:
        return {}
    grouped: dict[tuple, dict[str, tuple[str, str, list[float]]]] = {}
    for row in history[CELL + ["run_id", "run_name", "started", metric]].to_dict("records"):
        value = finite(row[metric])
        if value is None:
            continue
        runs = grouped.setdefault(tuple(row[k] for k in CELL), {})
        runs.setdefault(row["run_id"], (str(row["started"]), str(row["run_name"]), []))[2].append(value)
    out = {}
    for key, runs in grouped.items():
        ordered = sorted(runs.items(), key=lambda kv: kv[1][0])[-last_n:]
        out[key] = [PastRun(rid, name, started, tuple(vals)) for rid, (started, name, vals) in ordered]
    return out


def pooled_sigma(by_cell: dict[tuple, list[PastRun]]) -> float:
    """The metric's pooled prediction σ over every configuration and cell of the history."""
    return prediction_sigma([[r.mean for r in runs] for runs in by_cell.values()])


def tonight_values(tonight: pd.DataFrame, metric: str) -> dict[tuple, list[float]]:
    """cell key → tonight's trial values of `metric` (cells without data left out)."""
    out: dict[tuple, list[float]] = {}
    if metric not in tonight:
        return out
    for row in tonight[CELL + [metric]].to_dict("records"):
        value = finite(row[metric])
        if value is not None:
            out.setdefault(tuple(row[k] for k in CELL), []).append(value)
    return out


def detect(tonight: pd.DataFrame, history: pd.DataFrame, settings: RegressionSettings | None = None,
           metrics: list[str] = REGRESSION_METRICS) -> list[Judgement]:
    """Judge every (configuration, cell, metric) of tonight's summary against the history of cell runs
    (columns: run_id, run_name, started, the cell keys, trial and metric columns)."""
    s = settings or RegressionSettings()
    out: list[Judgement] = []
    for metric in metrics:
        by_cell = past_runs(history, metric, s.last_n)
        sigma = pooled_sigma(by_cell)
        for key, values in tonight_values(tonight, metric).items():
            past = by_cell.get(key, [])
            status, base, low, high, method = judge_cell(metric, values, past, sigma, s)
            mean, ci, _ = mean_ci(values)
            out.append(Judgement(*key, metric=metric, value=mean, value_ci95=ci,
                                 previous=past[-1].mean if past else None,
                                 previous_run=past[-1].run_name if past else None, baseline=base, band_low=low,
                                 band_high=high, n_history=len(past), method=method, status=status))
    return out


def flag_text(j: Judgement) -> str:
    """One flagged metric as a short line (MLflow tag, Prefect artifact)."""
    against = f"median of {j.n_history} runs" if j.method.startswith("band") else f"{j.n_history} past runs"
    change = "from zero" if j.change_pct is None else f"{j.change_pct:+.1f}%"
    cell = cell_label(j.workload, j.concurrency, j.stream, short=True)
    return f"{j.config} {j.suite} {cell} {j.metric} {j.status} {change} vs {against}"


def verdict_of(judgements: list[Judgement]) -> dict:
    """Worst status of a set of judgements, counts and the flagged lines."""
    flagged = [j for j in judgements if j.status in FLAGGED]
    n_reg = sum(j.status == "regression" for j in flagged)
    statuses = {j.status for j in judgements}
    status = next((st for st in ("regression", "improvement", "within-noise") if st in statuses),
                  "insufficient-history")
    return {"status": status, "regressions": n_reg, "improvements": len(flagged) - n_reg,
            "flagged": [flag_text(j) for j in sorted(flagged, key=lambda j: j.status != "regression")]}


def check_result(settings: RegressionSettings, history: pd.DataFrame, judgements: list[Judgement]) -> dict:
    """The JSON-able result of a night's check: settings, past runs (newest first), every judgement,
    and the verdict per configuration and overall."""
    runs = (history[["run_id", "run_name", "started"]].drop_duplicates("run_id")
            .sort_values("started", ascending=False).to_dict("records")) if not history.empty else []
    configs = sorted({j.config for j in judgements})
    return {"status": verdict_of(judgements)["status"] if runs else "no-history",
            "settings": settings.model_dump(), "runs": runs, "judgements": [j.as_dict() for j in judgements],
            "per_config": {c: verdict_of([j for j in judgements if j.config == c]) for c in configs},
            "overall": verdict_of(judgements)}
