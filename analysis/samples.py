"""Facts of the raw request records beyond the per-cell summary (pure): the pooled ITL samples behind
a CDF, how far measured prompt lengths stray from their targets, and requests that stopped before
max_tokens. Measured, successful requests only."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from epdbench.analysis.compare import MATCH_KEYS
from epdbench.analysis.metrics import pooled_itl_ms


def measured_ok(records: pd.DataFrame) -> pd.DataFrame:
    return records[(records["phase"] == "measured") & records["ok"].astype(bool)]


def cdf_cell(summary: pd.DataFrame, suite: str) -> tuple | None:
    """(suite, workload, concurrency, stream) of the suite's longest shape at its highest concurrency."""
    s = summary[summary["suite"] == suite]
    if s.empty:
        return None
    s = s.assign(_prompt=pd.to_numeric(s["target_prompt_tokens"], errors="coerce").fillna(0))
    top = s[s["concurrency"] == s["concurrency"].max()].sort_values("_prompt", ascending=False, kind="stable")
    return tuple(top.iloc[0][MATCH_KEYS])


def itl_samples_ms(records: pd.DataFrame, cell: tuple) -> dict[str, list[float]]:
    """config → every inter-token gap (ms) of the cell's measured requests, all trials pooled."""
    if records.empty:
        return {}
    ok = measured_ok(records)
    mask = pd.Series(True, index=ok.index)
    for key, value in zip(MATCH_KEYS, cell):
        mask &= ok[key] == value
    return {config: pooled_itl_ms(g["chunk_offsets_ns"]) for config, g in ok[mask].groupby("config", sort=False)}


@dataclass(frozen=True)
class PromptFit:
    requests: int
    max_abs_tokens: int             # largest |measured − target| prompt tokens
    max_rel: float                  # the same, relative to the target
    ranged_cells: list[tuple]       # (suite, workload, min, max): cells whose targets span a range by design


def prompt_fit(records: pd.DataFrame) -> PromptFit | None:
    if records.empty:
        return None
    ok = measured_ok(records).dropna(subset=["prompt_tokens", "target_prompt_tokens"])
    if ok.empty:
        return None
    measured = ok["prompt_tokens"].astype(float)
    target = ok["target_prompt_tokens"].astype(float)
    gap = (measured - target).abs()
    ranged = []
    for (suite, workload), g in ok.groupby(["suite", "workload"], sort=False):
        if g["target_prompt_tokens"].nunique() > 1:
            ranged.append((suite, workload, int(g["prompt_tokens"].min()), int(g["prompt_tokens"].max())))
    return PromptFit(len(ok), int(gap.max()), float((gap / target.where(target > 0)).max()), ranged)


@dataclass(frozen=True)
class EarlyStops:
    requests: int                   # measured successful requests with a max_tokens
    stopped_early: int              # of which generated fewer tokens than max_tokens
    where: list[tuple]              # (config, suite, workload, concurrency, n stopped, n requests)


def early_stops(records: pd.DataFrame) -> EarlyStops | None:
    if records.empty:
        return None
    ok = measured_ok(records).dropna(subset=["output_tokens", "max_tokens"])
    if ok.empty:
        return None
    short = ok["output_tokens"].astype(int) < ok["max_tokens"].astype(int)
    where = []
    for key, g in ok.assign(_short=short).groupby(["config", "suite", "workload", "concurrency"], sort=False):
        if g["_short"].any():
            where.append((*key, int(g["_short"].sum()), len(g)))
    return EarlyStops(len(ok), int(short.sum()), where)
