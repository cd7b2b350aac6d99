"""reports/breakdown.py: the report's "Where TTFT goes" section from span rows (tables, stacked bars, the
emulated note, the tolerance), without spans (tracing off), and the terminal's lines."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.breakdown import PARTS, cell_breakdown
from epdbench.reports.breakdown import breakdown_lines, breakdown_plots, breakdown_view
from epdbench.reports.render import render_html, render_markdown, report_context
from tests.reports.test_render import SUMMARY, VERDICTS, meta
from tests.spanrows import engine, frames, record, trace

CELL = {"suite": "fixed", "workload": "4096/64", "concurrency": 8, "stream": "main", "trial": 0}


def table(emulated: bool = True) -> pd.DataFrame:
    traces, records = [], []
    for i in range(9):
        agg = {**CELL, "config": "aggregated"}
        traces.append(trace(f"a{i}", [engine("aggregated", i / 1e3, 0.100)], cell=agg, emulated=emulated))
        records.append(record(f"a{i}", 110.0 + i, cell=agg))
        pd_ = {**CELL, "config": "pd-rdma"}
        traces.append(trace(f"p{i}", [engine("prefill", 0.0, 0.100), engine("decode", 0.0, 0.009)], kv_s=0.004,
                            cell=pd_, emulated=emulated))
        records.append(record(f"p{i}", 125.0, cell=pd_))
    traces.append(trace("lost", [engine("decode", 0.0, 0.009)], cell={**CELL, "config": "pd-rdma"}))
    records.append(record("lost", 125.0, cell={**CELL, "config": "pd-rdma"}))
    spans, recs = frames(traces, records)
    return cell_breakdown(spans, recs, {"aggregated": "aggregated", "pd-rdma": "pd"})


def render(breakdown: dict | None) -> tuple[str, str]:
    ctx = report_context(meta(), SUMMARY, VERDICTS, breakdown=breakdown)
    return render_markdown(ctx), render_html(ctx)


def section(md: str) -> str:
    return md[md.index("## Where TTFT goes"):md.index("## Plots")]


def test_section_with_spans_tables_bars_tolerance_and_emulated_note():
    t = table()
    configs = ["aggregated", "pd-rdma"]
    plots = breakdown_plots(t, configs, "note")
    assert [p.name for p in plots] == ["fixed-ttft-breakdown.png"] and plots[0].png.startswith(b"\x89PNG")
    md, html = render(breakdown_view(t, configs, True, plots))
    text = section(md)
    assert "**Emulated spans.**" in text and "within 5% (at least 1 ms) of the median TTFT" in text
    assert "| queue | encode | prefill | KV transfer | first decode | rest |" in text
    agg = next(line for line in text.splitlines() if line.startswith("| aggregated"))
    assert "| 9/9 |" in agg and "| 100.0 / 100.0 |" in agg and "yes (114.0 vs 114.0)" in agg
    pd_line = next(line for line in text.splitlines() if line.startswith("| pd-rdma"))
    assert "9/10 (1 incomplete: no prefill span ×1)" in pd_line and "| 4.00 / 4.00 |" in pd_line
    assert "![Where TTFT goes, suite fixed](plots/fixed-ttft-breakdown.png)" in text
    assert 'id="ttft-breakdown"' in html and plots[0].data_uri() in html and "**" not in html.split("ttft-breakdown")[1]


def test_real_engine_spans_carry_no_emulated_note():
    md, _ = render(breakdown_view(table(emulated=False), ["aggregated", "pd-rdma"], True, []))
    assert "Emulated spans" not in section(md)


def test_without_spans_the_section_says_tracing_was_off():
    md, html = render(breakdown_view(None, ["aggregated"], False, []))
    assert "Request tracing was off" in section(md) and "Request tracing was off" in html
    md, _ = render(None)
    assert "No span of a traced request was collected" in section(md)
    md, _ = render(breakdown_view(None, ["aggregated"], True, [], virtual=True))
    assert "No span of a traced request was collected" in section(md) and "virtual time" not in section(md)


def test_spans_made_in_virtual_time_say_on_which_clock():
    md, html = render(breakdown_view(table(), ["aggregated", "pd-rdma"], True, [], virtual=True))
    assert "Made in virtual time" in section(md) and "Made in virtual time" in html
    md, _ = render(breakdown_view(table(), ["aggregated", "pd-rdma"], True, []))
    assert "Made in virtual time" not in section(md)


def test_terminal_lines_name_each_cell_and_its_parts():
    lines = breakdown_lines(table())
    assert len(lines) == 2
    pd_line = next(line for line in lines if line.startswith("TTFT pd-rdma"))
    assert "125.0 ms p50 = prefill 100.0 + KV transfer 4.00 + first decode 9.00 + rest 12.0 ms" in pd_line
    assert breakdown_lines(None) == [] and set(PARTS) >= {"rest"}


def test_terminal_lines_show_each_cell_once_from_its_first_trial():
    first = table()
    again = first.assign(trial=1, ttft_p50_ms=first["ttft_p50_ms"] + 50.0)
    lines = breakdown_lines(pd.concat([again, first], ignore_index=True))
    assert lines == breakdown_lines(first) and len(lines) == 2
