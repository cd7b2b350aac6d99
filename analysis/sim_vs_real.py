"""The simulator against a real engine, cell by cell (pure): sim / real per figure, and per metric the median
error |sim / real − 1| (how far) and the median sim / real (which way: under 1, the simulator is faster or, for
throughput, slower), then past the median the 90th percentile of the error and the worst cell with its sim / real
(analysis.error_tail, which says how the percentile is taken). `overall` pools every figure of every compared
metric. A table of several configurations names each cell's configuration.

The compared metrics are analysis.truth.COMPARED: the client's TTFT p50 and p99, TPOT p50, ITL p99 and output
throughput, and the engine's own prefill time and decode time per output token.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from epdbench.analysis.engine_steps import MATCH_KEYS
from epdbench.analysis.error_tail import cell_text, tail
from epdbench.analysis.truth import COMPARED
from epdbench.specs.models import ExperimentSpec
from epdbench.specs.workload import plan_cells

OVERALL = "overall"
SHORT = {"ttft_p50_ms": "TTFT p50", "ttft_p99_ms": "TTFT p99", "tpot_p50_ms": "TPOT p50", "itl_p99_ms": "ITL p99",
         "output_tok_s": "out tok/s", "engine_prefill_ms": "eng prefill", "engine_decode_ms_per_token": "eng decode/tok",
         "engine_preprocess_ms": "eng preproc"}
PROMPT_TOLERANCE = 0.02    # prompts whose mean length differs more than this are not the same cells


def ratios(real: pd.DataFrame, sim: pd.DataFrame, metrics: list[str] = COMPARED) -> pd.DataFrame:
    """sim / real per cell of `real` (its index) and metric; NaN where either figure is missing or not positive."""
    r = real.reindex(columns=metrics).astype(float)
    s = sim.reindex(index=real.index, columns=metrics).astype(float)
    return (s / r).where((r > 0) & (s > 0))


def summary(ratio: pd.DataFrame) -> pd.DataFrame:
    """Per metric (and `overall`, every figure pooled): cells compared, median |sim / real − 1| and median
    sim / real, the 90th percentile of |sim / real − 1| (`p90_error`: numpy's linear interpolation,
    analysis.error_tail) and the worst figure: its cell (`worst_cell`, an index key of `ratio`), its metric
    (`worst_metric`) and its sim / real (`worst_ratio`). NaN figures and None cells where no cell has both figures."""
    series = {m: ratio[m] for m in ratio.columns}
    pooled = [ratio[m].rename(m) for m in ratio.columns]
    series[OVERALL] = (pd.concat([s.set_axis([(k, s.name) for k in s.index]) for s in pooled])
                       if pooled else pd.Series(dtype=float))
    rows = {}
    for m, values in series.items():
        t = tail(values)
        cell, metric = (t.worst if m == OVERALL else (t.worst, m)) if t.worst is not None else (None, None)
        rows[m] = {"cells": t.cells, "median_error": t.median_error,
                   "median_ratio": float(np.median(values.dropna())) if t.cells else np.nan,
                   "p90_error": t.p90_error, "worst_cell": cell, "worst_metric": metric, "worst_ratio": t.worst_ratio}
    return pd.DataFrame.from_dict(rows, orient="index")


def in_plan_order(frame: pd.DataFrame, spec: ExperimentSpec) -> pd.DataFrame:
    """The cells of `frame` (index MATCH_KEYS) in the order the spec runs them; any other cells after them."""
    order = [(c.name, cell.suite, cell.workload, cell.concurrency, cell.stream)
             for c in spec.configurations for cell in plan_cells(spec)]
    rank = {key: i for i, key in enumerate(order)}
    keys = sorted(frame.index, key=lambda k: rank.get(k, len(rank)))
    return frame.loc[keys]


def prompt_mismatches(real: pd.DataFrame, sim: pd.DataFrame, tolerance: float = PROMPT_TOLERANCE) -> list[str]:
    """Cells whose mean prompt length (prompt_tokens_mean, as the server counted) differs between the two by more
    than `tolerance`, as 'cell: sim N, real M' — their figures are of other prompts."""
    out, configs = [], several_configs(real)
    for key in real.index:
        a = sim["prompt_tokens_mean"].get(key, np.nan) if "prompt_tokens_mean" in sim else np.nan
        b = real["prompt_tokens_mean"].get(key, np.nan) if "prompt_tokens_mean" in real else np.nan
        if a == a and b == b and b > 0 and abs(a / b - 1) > tolerance:
            out.append(f"{_label(key, configs)}: sim {a:.0f}, real {b:.0f} tokens")
    return out


def _label(key: tuple, configs: bool = False) -> str:
    return cell_text(key, MATCH_KEYS, configs)


def several_configs(frame: pd.DataFrame) -> bool:
    """Whether the cells (index MATCH_KEYS) are of more than one configuration: then each label names its own."""
    return frame.index.get_level_values("config").nunique() > 1


def _ratio_text(before: float, after: float | None) -> str:
    return _num(before) if after is None else f"{_num(before)}→{_num(after)}"


def cell_lines(before: pd.DataFrame, after: pd.DataFrame | None = None) -> list[str]:
    """A table of sim / real per cell (rows) and metric (columns); with `after` (the same with a profile), each
    figure as before→after."""
    metrics = list(before.columns)
    widths = [max(5 if after is None else 11, len(SHORT.get(m, m))) for m in metrics]
    configs = several_configs(before)
    labels = [_label(k, configs) for k in before.index]
    first = max([len("cell")] + [len(s) for s in labels])
    lines = [f"{'cell':<{first}}  " + "  ".join(f"{SHORT.get(m, m):>{w}}" for m, w in zip(metrics, widths))]
    for key, label in zip(before.index, labels):
        lines.append(f"{label:<{first}}  " + "  ".join(
            f"{_ratio_text(before.at[key, m], None if after is None else after.at[key, m]):>{w}}"
            for m, w in zip(metrics, widths)))
    return lines


def summary_lines(before: pd.DataFrame, after: pd.DataFrame | None = None) -> list[str]:
    """Per metric and overall: the cells compared, median error and median sim / real (summary()); with `after`
    (the same with a profile), its two beside them."""
    heads = ["error", "sim/real"] if after is None else ["error before", "sim/real before", "error after",
                                                          "sim/real after"]
    width = max(len(h) for h in heads)
    lines = [f"{'metric':<26}  {'cells':>5}  " + "  ".join(f"{h:>{width}}" for h in heads)]
    for m in before.index:
        figures = [before] if after is None else [before, after]
        parts = [text for s in figures for text in (_pct(s.at[m, "median_error"]), _num(s.at[m, "median_ratio"]))]
        lines.append(f"{m:<26}  {int(before.at[m, 'cells']):>5}  " + "  ".join(f"{p:>{width}}" for p in parts))
    return lines


def tail_lines(before: pd.DataFrame, after: pd.DataFrame | None = None, configs: bool = False) -> list[str]:
    """Per metric and overall: the cells compared, the 90th percentile of |sim / real − 1| and the worst cell with
    its sim / real (summary()); with `after` (the same with a profile), its two beside them. The overall line's
    worst cell names its metric; `configs`: each cell names its configuration."""
    figures = [before] if after is None else [before, after]
    heads = ["p90 error"] if after is None else ["p90 before", "p90 after"]
    names = ["worst cell (sim/real)"] if after is None else ["worst before", "worst after"]
    worst = {m: [_worst_text(s, m, configs) for s in figures] for m in before.index}
    width = max(len(h) for h in heads)
    widths = [max([len(n)] + [len(w[i]) for w in worst.values()]) for i, n in enumerate(names)]
    lines = [f"{'metric':<26}  {'cells':>5}  " + "  ".join(f"{h:>{width}}" for h in heads) + "  "
             + "  ".join(f"{n:<{w}}" for n, w in zip(names, widths)).rstrip()]
    for m in before.index:
        p90 = "  ".join(f"{_pct(s.at[m, 'p90_error']):>{width}}" for s in figures)
        shown = "  ".join(f"{text:<{w}}" for text, w in zip(worst[m], widths)).rstrip()
        lines.append(f"{m:<26}  {int(before.at[m, 'cells']):>5}  {p90}  {shown}")
    return lines


def _worst_text(s: pd.DataFrame, metric: str, configs: bool) -> str:
    cell = s.at[metric, "worst_cell"]
    if cell is None or cell != cell:
        return "—"
    which = f" {SHORT.get(s.at[metric, 'worst_metric'], s.at[metric, 'worst_metric'])}" if metric == OVERALL else ""
    return f"{_label(cell, configs)}{which} ({_num(s.at[metric, 'worst_ratio'])})"


def _pct(v: float) -> str:
    return "—" if v != v else f"{v:.1%}"


def _num(v: float) -> str:
    return "—" if v != v else f"{v:.3f}"
