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

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"

COLUMN_TITLES = {
    "ttft_p50_ms": "TTFT p50 (ms)", "ttft_p95_ms": "TTFT p95 (ms)", "tpot_p50_ms": "TPOT p50 (ms)",
    "itl_p99_ms": "ITL p99 (ms)", "itl_max_ms": "ITL max (ms)", "output_tok_s": "Output tok/s", "req_s": "Req/s",
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
    if metric in ("output_tok_s",):
        return f"{value:,.1f}"
    if metric == "req_s":
        return f"{value:.2f}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"


def suite_tables(summary: pd.DataFrame, comparisons: list[Comparison]) -> list[dict]:
    """Per suite: rows (one per cell × config) with formatted, bold-where-best cells, and ratio lines."""
    best = {(c.suite, c.workload, c.concurrency, c.stream, c.metric): c for c in comparisons}
    agg = (summary.groupby(["suite", "workload", "concurrency", "stream", "config"], sort=False)
           .agg({**{m: (lambda s: s.dropna().astype(float).mean() if s.notna().any() else None)
                    for m in REPORT_METRICS},
                 "requests_ok": "sum", "requests_total": "sum"}).reset_index())
    out = []
    for suite, sdf in agg.groupby("suite", sort=False):
        rows = []
        for _, r in sdf.iterrows():
            cells = []
            for m in REPORT_METRICS:
                c = best.get((suite, r["workload"], r["concurrency"], r["stream"], m))
                text = fmt(r[m], m)
                if c and c.best == r["config"] and c.worst is not None:
                    text = f"**{text}**"
                cells.append(text)
            rows.append({"config": r["config"], "workload": r["workload"], "concurrency": int(r["concurrency"]),
                         "stream": r["stream"], "requests": f"{int(r['requests_ok'])}/{int(r['requests_total'])}",
                         "cells": cells})
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
