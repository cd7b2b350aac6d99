"""reports/mlflow_view.py: what the comparison run shows in MLflow without its children."""
from epdbench.analysis.compare import Comparison
from epdbench.reports.mlflow_view import report_note, verdict_tags, verdict_wins


def comparison(metric, verdict, workload="512/64", stream="main"):
    return Comparison("fixed", workload, 8, stream, metric, {}, None, None, None, verdict)


def test_the_note_is_the_report_up_to_its_verdict():
    report = "# epdbench: smoke\n\nheadline\n\n## Verdict\n\n| a | b |\n\n## Summary\n\nlong\n"
    note = report_note(report)
    assert note.startswith("# epdbench: smoke") and "| a | b |" in note and "## Summary" not in note
    assert note.endswith("`report.md` of this run.")
    long = "# t\n" + "".join(f"| row {i} |\n" for i in range(2000)) + "## Summary\n"
    cut = report_note(long, limit=500)
    assert len(cut) <= 500 and "\n…\n" in cut and cut.endswith("of this run.")


def test_one_tag_per_cell_and_metric_with_safe_keys_and_win_counts():
    cs = [comparison("ttft_p50_ms", "pd-tcp"), comparison("itl_p99_ms", "tie"),
          comparison("ttft_p50_ms", "contaminated", workload="1k:560px+624/64", stream="burst"),
          comparison("ttft_p95_ms", "pd-tcp"), comparison("output_tok_s_per_gpu", None)]
    tags = verdict_tags(cs)
    assert tags == {"epdbench.verdict.fixed.512/64.c8.ttft_p50_ms": "pd-tcp",
                    "epdbench.verdict.fixed.512/64.c8.itl_p99_ms": "tie",
                    "epdbench.verdict.fixed.1k_560px_624/64.c8.burst.ttft_p50_ms": "contaminated"}
    wins = verdict_wins(cs, ["aggregated", "pd-tcp"])
    assert wins["wins.ttft_p50_ms.pd-tcp"] == 1 and wins["wins.ttft_p50_ms.aggregated"] == 0
    assert wins["ties.itl_p99_ms"] == 1 and wins["contaminated.ttft_p50_ms"] == 1
