"""Headline findings (pure): in every matched cell, each configuration against a baseline (the
aggregated configuration, else the first), the largest improvements and regressions, and what each
traded for it.

Values are trial means (analysis.trials.aggregate_trials); a tail percentile resting on too few
samples of a single trial (†) is never a headline.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median

import pandas as pd

from epdbench.analysis.compare import MATCH_KEYS
from epdbench.analysis.metrics import LOWER_IS_BETTER
from epdbench.analysis.noise import distinct
from epdbench.analysis.trials import low_support

HEADLINE_METRICS = ["ttft_p50_ms", "tpot_p50_ms", "itl_p99_ms", "output_tok_s", "output_tok_s_per_gpu"]
MIN_HEADLINE_FACTOR = 1.1     # smaller changes are not headlines


@dataclass(frozen=True)
class Change:
    """One metric of one configuration against the baseline in one matched cell."""
    suite: str
    workload: str
    concurrency: int
    stream: str
    metric: str
    config: str
    baseline_config: str
    baseline_value: float
    value: float

    @property
    def better(self) -> bool:
        if self.metric in LOWER_IS_BETTER:
            return self.value < self.baseline_value
        return self.value > self.baseline_value

    @property
    def factor(self) -> float:
        """How many times better or worse (>= 1)."""
        return max(self.value, self.baseline_value) / min(self.value, self.baseline_value)

    @property
    def cell(self) -> tuple:
        return self.suite, self.workload, self.concurrency, self.stream


@dataclass(frozen=True)
class Finding:
    change: Change
    counterpart: Change | None     # an improvement's worst regression, or a regression's best improvement


def baseline_config(configurations: list[dict]) -> str | None:
    """The aggregated configuration, else the first one."""
    names = [c["name"] for c in configurations]
    return next((c["name"] for c in configurations if c["topology"] == "aggregated"), names[0] if names else None)


def _usable(row, metric: str) -> float | None:
    value = row.get(metric)
    if value is None or pd.isna(value) or value <= 0:
        return None
    if row["trials"] == 1 and low_support(metric, row["n_ttft_samples"], row["n_itl_samples"]):
        return None
    return float(value)


def changes_vs_baseline(agg: pd.DataFrame, baseline: str, metrics: list[str] = HEADLINE_METRICS) -> list[Change]:
    """Every (cell, configuration, metric) whose value differs from the baseline's in that cell by more than
    their noise (analysis.noise.distinct); cells contaminated by host load on either side are left out."""
    out: list[Change] = []
    if agg.empty or baseline not in set(agg["config"]):
        return out
    for key, cell in agg.groupby(MATCH_KEYS, sort=False):
        base = cell[cell["config"] == baseline]
        if base.empty:
            continue
        base = base.iloc[0]
        if base.get("contaminated"):
            continue
        for _, row in cell[cell["config"] != baseline].iterrows():
            if row.get("contaminated"):
                continue
            for metric in metrics:
                b, v = _usable(base, metric), _usable(row, metric)
                if b is not None and v is not None and b != v and distinct(base, row, metric):
                    out.append(Change(key[0], key[1], int(key[2]), key[3], metric, row["config"], baseline, b, v))
    return out


def _largest_per_metric(changes: list[Change], n: int) -> list[Change]:
    best: dict[str, Change] = {}
    for c in changes:
        if c.factor >= MIN_HEADLINE_FACTOR and (c.metric not in best or c.factor > best[c.metric].factor):
            best[c.metric] = c
    return sorted(best.values(), key=lambda c: c.factor, reverse=True)[:n]


def counterpart(change: Change, changes: list[Change]) -> Change | None:
    """Same configuration and cell, other metric, opposite direction, largest factor."""
    others = [c for c in changes if c.config == change.config and c.cell == change.cell
              and c.metric != change.metric and c.better != change.better]
    return max(others, key=lambda c: c.factor, default=None)


def headline(changes: list[Change], n_improvements: int = 3, n_regressions: int = 2) -> list[Finding]:
    """The largest improvements (one per metric), then the largest regressions, each with its trade-off."""
    picks = (_largest_per_metric([c for c in changes if c.better], n_improvements)
             + _largest_per_metric([c for c in changes if not c.better], n_regressions))
    return [Finding(c, counterpart(c, changes)) for c in picks]


@dataclass(frozen=True)
class Tally:
    """One configuration's record against the baseline on one metric over the comparable cells."""
    config: str
    metric: str
    better: int
    worse: int
    median_better: float | None     # median factor of the cells where it is better
    median_worse: float | None

    @property
    def cells(self) -> int:
        return self.better + self.worse


def tallies(changes: list[Change]) -> list[Tally]:
    """Per configuration and metric: cells better / worse than the baseline and the median factors."""
    out = []
    for config in dict.fromkeys(c.config for c in changes):
        for metric in dict.fromkeys(c.metric for c in changes):
            up = [c.factor for c in changes if c.config == config and c.metric == metric and c.better]
            down = [c.factor for c in changes if c.config == config and c.metric == metric and not c.better]
            if up or down:
                out.append(Tally(config, metric, len(up), len(down), median(up) if up else None,
                                 median(down) if down else None))
    return out
