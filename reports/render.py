"""Report rendering (pure): summary rows + comparisons + evidence verdicts → Markdown / terminal text.

One Jinja environment factory serves reports and (later) manifests: StrictUndefined, trimmed
blocks, a toyaml filter, autoescape only for HTML.
"""
from __future__ import annotations

from pathlib import Path

import jinja2
import pandas as pd
import yaml

from analysis.compare import REPORT_METRICS, Comparison, compare, ratio_phrase, wins
from analysis.metrics import LOWER_IS_BETTER
from analysis.trials import aggregate_trials, low_support

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"

COLUMN_TITLES = {
    "ttft_p50_ms": "TTFT p50 (ms)", "ttft_p95_ms": "TTFT p95 (ms)", "tpot_p50_ms": "TPOT p50 (ms)",
    "itl_p99_ms": "ITL p99 (ms)", "itl_max_ms": "ITL max (ms)", "output_tok_s": "Output tok/s", "req_s": "Req/s",
    "output_tok_s_per_gpu": "tok/s per GPU",
}


def make_env(template_dir: Path = TEMPLATE_DIR, html: bool = False) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=html)
    env.filters["toyaml"] = lambda v: yaml.safe_dump(v, sort_keys=False).rstrip()
    return env


def fmt(value, metric: str = "") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "—"
    if metric in ("output_tok_s", "output_tok_s_per_gpu"):
        return f"{value:,.1f}"
    if metric == "req_s":
        return f"{value:.2f}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _cell_text(row, metric: str, best: Comparison | None) -> str:
    text = fmt(row[metric], metric)
    ci = row.get(f"{metric}_ci95")
    if ci is not None and not pd.isna(ci) and text != "—":
        text += f" ± {fmt(ci, metric)}"
    if row["trials"] == 1 and low_support(metric, row["n_ttft_samples"], row["n_itl_samples"]) and text != "—":
        text += " †"
    if best and best.best == row["config"]:
        text = f"**{text}**"
    return text


def suite_tables(summary: pd.DataFrame, comparisons: list[Comparison]) -> list[dict]:
    """Per suite: rows (one per cell × config; means ± 95% CI over trials), the better value per
    matched cell in bold, low-support tails marked †, and ratio lines."""
    best = {(c.suite, c.workload, c.concurrency, c.stream, c.metric): c for c in comparisons}
    agg = aggregate_trials(summary)
    if agg.empty:          # every configuration failed: no table, the failures section says why
        return []
    out = []
    for suite, sdf in agg.groupby("suite", sort=False):
        rows = []
        for _, r in sdf.iterrows():
            key = (suite, r["workload"], r["concurrency"], r["stream"])
            rows.append({"config": r["config"], "workload": r["workload"], "concurrency": int(r["concurrency"]),
                         "stream": r["stream"], "requests": f"{int(r['requests_ok'])}/{int(r['requests_total'])}",
                         "cells": [_cell_text(r, m, best.get((*key, m))) for m in REPORT_METRICS]})
        ratios = []
        for c in comparisons:
            if (c.suite != suite or c.ratio is None or c.best is None
                    or c.metric not in ("ttft_p50_ms", "itl_p99_ms", "output_tok_s")):
                continue
            ratios.append(f"{c.workload} @ c={c.concurrency}{'' if c.stream == 'main' else ' ' + c.stream}: "
                          f"{COLUMN_TITLES[c.metric]} {c.best} {fmt(c.values[c.best], c.metric)} vs {c.worst} "
                          f"{fmt(c.values[c.worst], c.metric)} — {ratio_phrase(c.metric, c.ratio)}")
        out.append({"name": suite, "rows": rows, "ratios": ratios})
    return out


def headline(comparisons: list[Comparison], n: int = 3) -> list[str]:
    """The largest matched ratios of the report's key metrics, as sentences."""
    key = [c for c in comparisons if c.ratio is not None and c.best is not None
           and c.metric in ("ttft_p50_ms", "itl_p99_ms", "output_tok_s")]
    key.sort(key=lambda c: c.ratio, reverse=True)
    lines = []
    for c in key[:n]:
        verb = "lower" if c.metric in LOWER_IS_BETTER else "higher"
        lines.append(f"At {c.workload}, concurrency {c.concurrency}, {COLUMN_TITLES[c.metric]} was "
                     f"{fmt(c.values[c.best], c.metric)} on {c.best} vs {fmt(c.values[c.worst], c.metric)} on "
                     f"{c.worst}: {c.ratio:.1f}× {verb}.")
    return lines


def report_context(meta: dict, summary: pd.DataFrame, verdicts: dict[str, dict]) -> dict:
    comparisons = compare(summary)
    return {
        "meta": meta,
        "columns": [COLUMN_TITLES[m] for m in REPORT_METRICS],
        "suites": suite_tables(summary, comparisons),
        "headline": headline(comparisons),
        "wins": {COLUMN_TITLES[m]: w for m, w in wins(comparisons).items()},
        "verdicts": verdicts,
    }


def render_report(meta: dict, summary: pd.DataFrame, verdicts: dict[str, dict]) -> str:
    return make_env().get_template("report.md.j2").render(**report_context(meta, summary, verdicts))
