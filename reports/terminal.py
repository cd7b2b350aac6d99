"""Compact terminal summary of a finished comparison (rich table), ending with the Verdict in a few lines per
suite and where the report is."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from epdbench.analysis.labels import load_label, shape_label
from epdbench.analysis.trials import aggregate_trials
from epdbench.reports.findings import regression_line
from epdbench.reports.verdict import contamination_line
from epdbench.reports.fmt import fmt, matched_order

TERMINAL_METRICS = [("ttft_p50_ms", "TTFT p50"), ("tpot_p50_ms", "TPOT p50"), ("itl_p99_ms", "ITL p99"),
                    ("itl_max_ms", "ITL max"), ("output_tok_s", "tok/s")]


def print_summary(outcome: dict, console: Console | None = None) -> None:
    console = console or Console(width=140)
    rdir = Path(outcome["results_dir"])
    summary = pd.read_csv(rdir / "summary.csv") if (rdir / "summary.csv").exists() else pd.DataFrame()
    virtual = (outcome.get("meta") or {}).get("clock") == "virtual"
    clock = " — virtual time: the simulator's cost model, not a measurement" if virtual else ""
    trials = int(summary["trial"].nunique()) if "trial" in summary and not summary.empty else 1
    # one row per configuration and cell: with several trials their means, as the report's tables
    table = aggregate_trials(summary) if trials > 1 else summary
    mean = f", mean of {trials} trials" if trials > 1 else ""
    if not table.empty:
        for suite, sdf in table.groupby("suite", sort=False):
            t = Table(title=f"suite {suite} (ms unless noted{mean}){clock}", show_lines=False)
            for col in ["config", "workload", "load", "ok"] + [t_ for _, t_ in TERMINAL_METRICS]:
                t.add_column(col, justify="left" if col in ("config", "workload", "load") else "right")
            for _, r in matched_order(sdf).iterrows():
                t.add_row(r["config"], shape_label(r["workload"], r["stream"]),
                          load_label(r["workload"], r["concurrency"]), f"{r['requests_ok']}/{r['requests_total']}",
                          *[fmt(None if pd.isna(r[m]) else r[m], m) for m, _ in TERMINAL_METRICS])
            console.print(t)
    for line in outcome.get("goodput") or []:
        console.print(Text(line))
    for line in outcome.get("ttft_breakdown") or []:
        console.print(Text(line), soft_wrap=True)
    for line in outcome.get("pareto") or []:       # one per suite: who is on the frontier, the cheapest when priced
        console.print(Text(line), soft_wrap=True)
    for name, c in outcome["configs"].items():
        state = "ok" if c["ok"] else f"{c.get('status', 'failed').upper()}: {c['error']}"
        ec = f", encoder outputs {c['ec_transport']}" if c.get("ec_transport") else ""
        console.print(Text(f"{name}: {state}; transport {c['transport']}{ec}, stages {c['stages']}"))
    spoilt = contamination_line(summary, outcome.get("meta") or {})
    if spoilt:
        console.print(Text(spoilt))
    console.print(Text(regression_line(outcome.get("regression"))))
    pending = outcome.get("mlflow_pending")
    if pending:
        what = ", ".join(pending) if isinstance(pending, list) else "some of it"
        console.print(f"MLflow:  not published yet ({what}); publish with: epdbench sync {rdir}")
    else:
        console.print(Text(f"MLflow:  {outcome['mlflow_url']}"), soft_wrap=True)    # its address whole
    console.print(Text(f"results: {rdir}/ (summary.csv, records.parquet, evidence/)"), soft_wrap=True)
    for line in outcome.get("winners") or []:      # the terminal wraps them, whole words and paths intact
        console.print(Text(line), soft_wrap=True)
    console.print(Text(f"report:  {rdir / 'report.md'} · {rdir / 'report.html'}"), soft_wrap=True)
