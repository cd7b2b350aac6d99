"""Matched comparison of configurations: per cell and metric, the winner when the difference is outside the
noise (analysis.noise), else a tie; contaminated cells name no winner."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from epdbench.analysis.metrics import HIGHER_IS_BETTER, LOWER_IS_BETTER
from epdbench.analysis.noise import distinct
from epdbench.analysis.trials import MATCH_KEYS, aggregate_trials

__all__ = ["MATCH_KEYS", "NOT_JUDGED", "REPORT_METRICS", "VERDICT_METRICS", "Comparison", "compare", "ratio_phrase", "verdict_table", "wins"]

REPORT_METRICS = ["ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms", "output_tok_s", "req_s",
                  "output_tok_s_per_gpu"]
VERDICT_METRICS = ["ttft_p50_ms", "itl_p99_ms", "output_tok_s_per_gpu"]   # "which one should I deploy?"
# Shown, never judged: one extreme sample per cell has no CI, and where a long prefill meets a decode in a
# closed loop moves from run to run (two idle smoke runs: aggregated's burst-stream ITL max 6.8 ms, then 71.7 ms).
NOT_JUDGED = ("itl_max_ms",)
TIE, CONTAMINATED = "tie", "contaminated"


@dataclass(frozen=True)
class Comparison:
    suite: str
    workload: str
    concurrency: int
    stream: str
    metric: str
    values: dict            # config -> value (None when no data)
    best: str | None        # the winner: best value, outside the noise of the runner-up (else None)
    worst: str | None       # a config with the worst value (None when all are equal)
    ratio: float | None     # worst/best for lower-is-better, best/worst for higher-is-better (>= 1)
    verdict: str | None = None   # the winner's name, "tie", "contaminated", or None (fewer than two values)
    margin: float | None = None  # the winner against the runner-up, as a ratio >= 1
    leaders: tuple = ()          # best value first, then every configuration within its noise (not contaminated)

    @property
    def leader(self) -> str | None:
        return self.leaders[0] if self.leaders else None

    @property
    def separated(self) -> bool:
        """Some configuration is worse than the leaders beyond the noise."""
        return bool(self.leaders) and self.worst is not None and self.worst not in self.leaders


def ratio_phrase(metric: str, ratio: float | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio:.1f}× {'lower' if metric in LOWER_IS_BETTER else 'higher'}"


def _value(row, metric: str) -> float | None:
    v = row.get(metric)
    return None if v is None or pd.isna(v) else float(v)


def compare(summary: pd.DataFrame, metrics: list[str] = REPORT_METRICS) -> list[Comparison]:
    """Compare every matched cell (same suite, workload, concurrency, stream) across configurations on the
    trial means. The best value wins only when it lies outside the noise of the runner-up (disjoint 95%
    CIs with trials > 1, else each percentile's sample CI bounds floored by the run-to-run spread and the
    cells' lag: analysis.noise.distinct); a cell where host load contaminated any configuration has no
    winner, nor has a metric in NOT_JUDGED."""
    if summary.empty:
        return []
    agg = aggregate_trials(summary)
    out: list[Comparison] = []
    for key, cell in agg.groupby(MATCH_KEYS, sort=False):
        rows = {r["config"]: r for _, r in cell.iterrows()}
        contaminated = any(bool(r.get("contaminated")) for r in rows.values())
        for metric in metrics:
            values = {c: _value(r, metric) for c, r in rows.items()}
            present = {c: v for c, v in values.items() if v is not None}
            best = worst = ratio = verdict = margin = None
            leaders: tuple = ()
            if len(present) >= 2:
                ordered = sorted(present, key=lambda c: present[c], reverse=metric in HIGHER_IS_BETTER)
                b, w = present[ordered[0]], present[ordered[-1]]
                if contaminated:
                    verdict = CONTAMINATED
                elif metric not in NOT_JUDGED:
                    leaders = tuple(c for c in ordered if c == ordered[0] or not distinct(rows[ordered[0]], rows[c], metric))
                    if len(leaders) == 1:
                        best = verdict = ordered[0]
                        lo, hi = sorted((b, present[ordered[1]]))
                        margin = hi / lo if lo > 0 else None
                    else:
                        verdict = TIE
                if b != w:
                    worst = ordered[-1]
                    if metric in LOWER_IS_BETTER:
                        ratio = (w / b) if b > 0 else None
                    else:
                        ratio = (b / w) if w > 0 else None
            out.append(Comparison(*key, metric=metric, values=values, best=best, worst=worst, ratio=ratio,
                                  verdict=verdict, margin=margin, leaders=leaders))
    return out


def wins(comparisons: list[Comparison]) -> dict[str, dict[str, int]]:
    """metric -> config -> number of matched cells it wins (outside the noise)."""
    table: dict[str, dict[str, int]] = {}
    for c in comparisons:
        if c.best is None or c.worst is None:
            continue
        table.setdefault(c.metric, {})
        table[c.metric][c.best] = table[c.metric].get(c.best, 0) + 1
    return table


def verdict_table(comparisons: list[Comparison], metrics: list[str] = VERDICT_METRICS) -> list[dict]:
    """Per matched cell, in order: its keys and, per metric, the winner, "tie", "contaminated" or None (`verdicts`),
    the winner's margin over the runner-up (`margins`), the configurations tied ahead of the rest (`leaders`, when
    some configuration is worse beyond the noise), every configuration of a tie (`tied`: the best value's and
    those within its noise) and whether that is every configuration with a value (`all_tied`)."""
    rows: dict[tuple, dict] = {}
    for c in comparisons:
        if c.metric not in metrics:
            continue
        row = rows.setdefault((c.suite, c.workload, c.concurrency, c.stream),
                              {"suite": c.suite, "workload": c.workload, "concurrency": c.concurrency,
                               "stream": c.stream, "verdicts": {}})
        row["verdicts"][c.metric] = c.verdict
        row.setdefault("margins", {})[c.metric] = c.margin
        row.setdefault("leaders", {})[c.metric] = c.leaders if c.separated else ()
        present = {name for name, v in c.values.items() if v is not None}
        row.setdefault("tied", {})[c.metric] = c.leaders if c.verdict == TIE else ()
        row.setdefault("all_tied", {})[c.metric] = c.verdict == TIE and bool(c.leaders) and set(c.leaders) >= present
    return list(rows.values())
