"""report.md of a fixed synthetic run (tiny spec, planted nightly regression) against its golden file.

Regenerate after an intended change: UPDATE_GOLDEN=1 python -m pytest tests/reports/test_golden.py
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from epdbench.analysis.metrics import summarize
from epdbench.analysis.regression import RegressionSettings, check_result, detect
from epdbench.reports.environment import environment
from epdbench.reports.plots import Plot
from epdbench.reports.render import render_html, render_markdown, report_context
from tests.reports.report_checks import parse_html
from tests.reports.synthetic_run import synthetic_meta, synthetic_records, synthetic_verdicts

GOLDEN = Path(__file__).parent / "golden" / "report.md"
PLANTED = ("pd-tcp", "fixed", "4096/32", 4, "main")
PLOT_KINDS = [("itl-cdf", "ITL CDF"), ("latency-vs-concurrency", "Latency versus concurrency"),
              ("throughput-per-gpu", "Throughput per GPU")]


def past_runs(summary: pd.DataFrame, n: int = 6) -> pd.DataFrame:
    """n earlier nights: tonight's values within ±2%, except the planted cell's ITL p99 30% lower."""
    runs = []
    for k in range(n):
        night = summary.copy()
        for m in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms", "output_tok_s", "req_s"):
            night[m] = pd.to_numeric(night[m]) * (1 + 0.01 * ((k % 5) - 2))
        planted = (night[["config", "suite", "workload", "concurrency", "stream"]].apply(tuple, axis=1) == PLANTED)
        night.loc[planted, "itl_p99_ms"] = float(summary.loc[planted.values, "itl_p99_ms"].iloc[0]) / 1.3
        runs.append(night.assign(run_id=f"r{k}", run_name=f"tiny-sim-night-{k}", started=f"2025-12-2{k}T02:00:00"))
    return pd.concat(runs, ignore_index=True)


@pytest.fixture(scope="module")
def context(tiny_spec):
    records = synthetic_records(tiny_spec)
    meta = synthetic_meta(tiny_spec)
    summary = summarize(records, {c["name"]: c["gpus"] for c in meta["configurations"]})
    history = past_runs(summary)
    check = check_result(RegressionSettings(), history, detect(summary, history))
    plots = [Plot(f"{s.name}-{kind}.png", s.name, f"{title}, suite {s.name}", f"{title} of suite {s.name}.",
                  b"\x89PNG\r\n\x1a\n") for s in tiny_spec.suites for kind, title in PLOT_KINDS]
    return report_context(meta, summary, synthetic_verdicts(tiny_spec), environment(tiny_spec), records, check,
                          plots)


def test_markdown_matches_golden(context):
    report = render_markdown(context)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(report)
    assert report == GOLDEN.read_text(), "report.md changed; if intended: UPDATE_GOLDEN=1 pytest " + __file__


def test_the_planted_regression_is_the_only_flag(context):
    report = render_markdown(context)
    flags = report.split("Beyond noise:", 1)[1].split("\n\n", 1)[0].strip().splitlines()
    assert len(flags) == 1
    assert flags[0].startswith("- pd-tcp, suite fixed, 4096/32, concurrency 4: ITL p99 ")
    assert "regression, +30.0%." in flags[0]
    assert "Against the last 6 run(s) of this spec: 1 regression(s) and 0 improvement(s) beyond noise." in report
    row = next(l for l in report.splitlines() if l.startswith("| pd-tcp | fixed | 4096/32, concurrency 4 |"))
    assert "**+30.0% regression**" in row and row.count("**") == 2


def test_html_carries_the_same_content(context):
    html = render_html(context)
    page = parse_html(html)
    assert len(page.images) == len(context["plot_groups"]) * len(PLOT_KINDS)
    assert page.external == [] and "script" not in page.tags and "link" not in page.tags
    assert '<td class="num regression">+30.0% regression</td>' in html
    for line in context["headline"]:
        assert line.replace("'", "&#39;") in html
