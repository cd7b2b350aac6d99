"""What the MLflow comparison run shows on its own (pure): the report's opening (title, headline, verdict) as the
run's description, each matched cell's verdict as a tag, and how many cells each configuration wins per metric as
metrics — so the parent run answers "which one wins?" without opening its children. Every key is made valid for
MLflow by reports.mlflow_names (a workload label such as `1k:560px+624/128` reads `1k_560px_624/128`)."""
from __future__ import annotations

from epdbench.analysis.compare import CONTAMINATED, TIE, VERDICT_METRICS, Comparison
from epdbench.reports.mlflow_names import valid_keys

NOTE_LIMIT = 7000          # MLflow keeps tag values up to 8000 characters


def report_note(report_md: str, limit: int = NOTE_LIMIT) -> str:
    """report.md up to the end of its Verdict section (where the Summary begins), cut to `limit` characters,
    with where the rest is."""
    head = report_md.split("\n## Summary", 1)[0].rstrip()
    tail = "\n\nThe whole report: artifacts `report.html` (plots inline) and `report.md` of this run."
    if len(head) + len(tail) > limit:
        head = head[: limit - len(tail) - 2].rsplit("\n", 1)[0] + "\n…"
    return head + tail


def verdict_tags(comparisons: list[Comparison]) -> dict[str, str]:
    """epdbench.verdict.<suite>.<workload>.c<concurrency>[.<stream>].<metric> → winner, tie or contaminated."""
    tags = {}
    for c in comparisons:
        if c.metric not in VERDICT_METRICS or c.verdict is None:
            continue
        stream = "" if c.stream == "main" else f".{c.stream}"
        tags[f"epdbench.verdict.{c.suite}.{c.workload}.c{c.concurrency}{stream}.{c.metric}"] = c.verdict
    return valid_keys(tags)


def verdict_wins(comparisons: list[Comparison], configs: list[str]) -> dict[str, float]:
    """wins.<metric>.<config>: matched cells the configuration wins outside the noise (0 when none), and
    ties.<metric> / contaminated.<metric>: cells without a winner."""
    out: dict[str, float] = {}
    for metric in VERDICT_METRICS:
        mine = [c for c in comparisons if c.metric == metric and c.verdict is not None]
        for config in configs:
            out[f"wins.{metric}.{config}"] = float(sum(c.verdict == config for c in mine))
        out[f"ties.{metric}"] = float(sum(c.verdict == TIE for c in mine))
        out[f"contaminated.{metric}"] = float(sum(c.verdict == CONTAMINATED for c in mine))
    return valid_keys(out)
