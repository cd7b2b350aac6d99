"""reports/trend.py: the `epdbench history` table of one metric over past runs."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.regression import RegressionSettings
from epdbench.reports.trend import select, trend_lines


def history(values: dict[str, list[float | None]]) -> pd.DataFrame:
    rows = []
    for config, series in values.items():
        for i, v in enumerate(series):
            rows.append({"run_id": f"r{i}", "run_name": f"night-{i}", "started": f"2026-01-0{i + 1}T02:00:00",
                         "config": config, "suite": "fixed", "workload": "8192/128", "concurrency": 16,
                         "stream": "main", "trial": 0, "itl_p99_ms": v})
    return pd.DataFrame(rows)


def test_one_line_per_cell_with_the_newest_verdict():
    h = history({"pd-tcp": [18.0, 18.2, 17.9, 18.1, 18.0, 23.6], "aggregated": [500.0, None, 505.0, 498.0, 502.0, 501.0]})
    lines = trend_lines(h, "itl_p99_ms", RegressionSettings())
    assert lines[0] == "ITL p99 (ms) over 6 run(s), oldest first:"
    assert lines[1] == "  #1 2026-01-01T02:00:00 night-0"
    pd_line = next(l for l in lines if l.startswith("pd-tcp fixed 8192/128 c=16"))
    assert pd_line.split()[4:10] == ["18.0", "18.2", "17.9", "18.1", "18.0", "23.6"]
    assert "regression (+31.1% vs 5 runs)" in pd_line
    agg_line = next(l for l in lines if l.startswith("aggregated"))
    assert agg_line.split()[5] == "—" and "insufficient history (4 of 5 runs)" in agg_line


def test_select_and_empty():
    h = history({"pd-tcp": [1.0], "epd": [2.0]})
    assert set(select(h, config="epd")["config"]) == {"epd"}
    assert select(h, workload="512/256").empty
    assert trend_lines(select(h, concurrency=1), "itl_p99_ms", RegressionSettings()) == ["no runs match"]
