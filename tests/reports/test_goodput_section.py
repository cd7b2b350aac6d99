"""reports/goodput.py and the report's rate cells: a rate cell named by its rate and in-flight cap, and the one
sentence that says why the Verdict's throughput per GPU and the goodput can name different configurations —
only where they do."""
from __future__ import annotations

import html

from epdbench.analysis.compare import compare
from epdbench.reports.goodput import goodput_view, throughput_goodput_gaps
from epdbench.reports.render import render_html, render_markdown, report_context
from tests.reports.rate_run import CAP, GPUS, RATES, SHAPE, SLOS, VERDICTS, goodput_table, rate_meta, rate_summary

WHY = ("throughput per GPU at an offered rate counts every request that completed, whether or not it met the SLO, "
       "while goodput counts only the rates at which SLO attainment held")


def section(report: str, heading: str) -> str:
    return report.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_a_per_gpu_winner_with_the_lower_goodput_is_explained():
    comparisons = compare(rate_summary())
    (line,) = throughput_goodput_gaps(comparisons, goodput_table(), GPUS)
    assert line.startswith(f"Suite capacity ({SHAPE}): aggregated wins output throughput per GPU in {len(RATES)} of "
                           f"{len(RATES)} rate cells, yet pd-rdma has the higher goodput, {RATES[-1]:g} req/s "
                           f"({RATES[-1] / GPUS['pd-rdma']:.3g} per GPU) against aggregated's < {RATES[0]:g} req/s: ")
    assert WHY in line
    # the same tokens per second at every rate: the lead per GPU is the budget, and the sentence says so
    assert line.endswith(f"so its lead per GPU is its {GPUS['aggregated']} GPU against pd-rdma's {GPUS['pd-rdma']}.")


def test_nothing_is_said_where_verdict_and_goodput_agree():
    comparisons = compare(rate_summary())
    assert throughput_goodput_gaps(comparisons, goodput_table(aggregated_sustains=RATES[-1]), GPUS) == []
    assert throughput_goodput_gaps(comparisons, None, GPUS) == []
    closed = compare(rate_summary().assign(workload=SHAPE).drop_duplicates("config"))   # no rate cell to set against
    assert throughput_goodput_gaps(closed, goodput_table(), GPUS) == []


def test_the_budget_clause_needs_an_equal_absolute_throughput():
    summary = rate_summary()
    ahead = summary["config"] == "aggregated"
    summary.loc[ahead, "output_tok_s"] = summary.loc[ahead, "output_tok_s"] * 3     # aggregated ahead outright
    (line,) = throughput_goodput_gaps(compare(summary), goodput_table(), GPUS)
    assert line.endswith(f"{WHY}.")


def test_the_report_names_rate_cells_by_rate_and_explains_the_gap_in_its_goodput_section():
    context = report_context(rate_meta(), rate_summary(), VERDICTS, goodput=goodput_view(goodput_table(), SLOS))
    report = render_markdown(context)
    labels = [f"{SHAPE}, {rate:g} req/s (≤{CAP} in flight)" for rate in RATES]
    verdict = section(report, "Verdict")
    assert all(f"| capacity | {label} |" in verdict for label in labels)
    rows = [line for line in section(report, "Suite `capacity`").splitlines() if line.startswith("| aggregated |")]
    assert [row.split(" | ")[2] for row in rows] == [f"{rate:g} req/s (≤{CAP} in flight)" for rate in RATES]
    assert f"concurrency {CAP}" not in report and "@" not in verdict
    gaps = [line for line in section(report, "Goodput").splitlines() if WHY in line]
    assert gaps == context["goodput_gaps"] and len(gaps) == 1
    assert gaps[0] in html.unescape(render_html(context))
    agreed = report_context(rate_meta(), rate_summary(), VERDICTS,
                            goodput=goodput_view(goodput_table(aggregated_sustains=RATES[-1]), SLOS))
    assert agreed["goodput_gaps"] == [] and WHY not in render_markdown(agreed)
