"""reports/terminal.py: the summary `epdbench compare` prints ends with the Verdict, per suite, and where the report
is; rate cells are labelled by their rate and in-flight cap."""
from __future__ import annotations

import io

from rich.console import Console

from epdbench.analysis.compare import compare
from epdbench.reports.goodput import throughput_goodput_gaps
from epdbench.reports.terminal import print_summary
from epdbench.reports.verdict import verdict_lines
from tests.reports.rate_run import CAP, GPUS, RATES, goodput_table, rate_summary


def printed(tmp_path, winners: list[str]) -> list[str]:
    rate_summary().to_csv(tmp_path / "summary.csv", index=False)
    outcome = {"results_dir": str(tmp_path), "mlflow_url": "http://127.0.0.1:5000/#/runs/x", "winners": winners,
               "configs": {n: {"ok": True, "transport": "emulated", "stages": "emulated"} for n in GPUS}}
    out = io.StringIO()
    print_summary(outcome, Console(file=out, width=140))
    return out.getvalue().splitlines()


def test_the_last_lines_name_the_winners_then_the_report(tmp_path):
    comparisons = compare(rate_summary())      # as the flow does, on the summary the report is rendered from
    winners = verdict_lines(comparisons) + throughput_goodput_gaps(comparisons, goodput_table(), GPUS)
    lines = printed(tmp_path, winners)
    assert lines[-1] == f"report:  {tmp_path / 'report.md'} · {tmp_path / 'report.html'}"
    assert lines[-1 - len(winners):-1] == winners
    assert f"    tok/s per GPU: aggregated {len(RATES)}" in winners
    assert any("yet pd-rdma has the higher goodput" in line for line in winners)


def test_rate_cells_show_their_rate_and_cap_not_a_concurrency(tmp_path):
    text = "\n".join(printed(tmp_path, []))
    for rate in RATES:
        assert f"{rate:g} req/s (≤{CAP} in flight)" in text
    assert f"concurrency {CAP}" not in text and "@" not in text.split("MLflow:")[0]


def test_repeated_trials_print_one_row_per_configuration_and_cell_with_their_means(tmp_path):
    import pandas as pd
    one = rate_summary()
    two = one.assign(trial=1, ttft_p50_ms=one["ttft_p50_ms"] + 10.0)
    pd.concat([one, two], ignore_index=True).to_csv(tmp_path / "summary.csv", index=False)
    outcome = {"results_dir": str(tmp_path), "mlflow_url": "http://127.0.0.1:5000/#/runs/x", "winners": [],
               "configs": {n: {"ok": True, "transport": "emulated", "stages": "emulated"} for n in GPUS}}
    out = io.StringIO()
    print_summary(outcome, Console(file=out, width=200))
    text = out.getvalue()
    assert "(ms unless noted, mean of 2 trials)" in text
    rows = [line for line in text.splitlines() if line.startswith("│ ")]
    assert len(rows) == len(one)                                       # not one row per trial
    first = one.iloc[0]
    ok = f"{2 * int(first['requests_ok'])}/{2 * int(first['requests_total'])}"
    assert any(ok in line and f"{first['ttft_p50_ms'] + 5.0:.1f}" in line for line in rows), rows
