"""Headline findings (pure): in every matched cell, each configuration against a baseline (the
aggregated configuration, else the first), the largest improvements and regressions, and what each
traded for it.

Values are trial means (analysis.trials.aggregate_trials); a tail percentile resting on too few
samples of a single trial (†) is never a headline. A headline says what the Verdict (analysis.compare) says: no
cell host load contaminated, and an improvement only of the configuration with the best value of its cell and
metric, with the others within its noise named beside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median

import pandas as pd

from epdbench.analysis.compare import CONTAMINATED, MATCH_KEYS, Comparison
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
    tied: tuple = ()               # an improvement's (config, value) within its noise in the Verdict: no winner


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
    their noise (analysis.noise.distinct); a cell host load contaminated in any configuration is left out, as the
    Verdict leaves it (analysis.compare)."""
    out: list[Change] = []
    if agg.empty or baseline not in set(agg["config"]):
        return out
    for key, cell in agg.groupby(MATCH_KEYS, sort=False):
        base = cell[cell["config"] == baseline]
        if base.empty or ("contaminated" in cell and cell["contaminated"].fillna(False).astype(bool).any()):
            continue
        base = base.iloc[0]
        for _, row in cell[cell["config"] != baseline].iterrows():
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


def _verdict_of(comparisons: list[Comparison]) -> dict[tuple, Comparison]:
    return {(c.suite, c.workload, c.concurrency, c.stream, c.metric): c for c in comparisons}


def stands(change: Change, verdict: Comparison | None) -> bool:
    """Whether the Verdict's comparison of the change's cell and metric lets a headline say it: a judged cell (not
    contaminated); for an improvement, the configuration has the best value there and the baseline is beyond its
    noise (a configuration that others beat, inside the noise or beyond it, is no headline improvement)."""
    if verdict is None or verdict.verdict in (None, CONTAMINATED):
        return False
    if not change.better:
        return True
    leaders = verdict.leaders
    return bool(leaders) and leaders[0] == change.config and change.baseline_config not in leaders


def headline(changes: list[Change], comparisons: list[Comparison], n_improvements: int = 3,
             n_regressions: int = 2) -> list[Finding]:
    """The largest improvements (one per metric), then the largest regressions, each with its trade-off; only
    changes the Verdict (`comparisons`, analysis.compare over the same summary) stands behind (`stands`). An
    improvement whose configuration leads inside the noise of others names them (Finding.tied)."""
    verdict = _verdict_of(comparisons)
    kept = [c for c in changes if stands(c, verdict.get((*c.cell, c.metric)))]
    picks = (_largest_per_metric([c for c in kept if c.better], n_improvements)
             + _largest_per_metric([c for c in kept if not c.better], n_regressions))
    out = []
    for c in picks:
        tied = ()
        if c.better:
            v = verdict[(*c.cell, c.metric)]
            tied = tuple((other, v.values[other]) for other in v.leaders[1:])
        out.append(Finding(c, counterpart(c, changes), tied))
    return out


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
