"""Checks shared by report tests: sections present, winners bold, every number of the headline and of
the ratio lines equal to the summary's (formatted), every ratio recomputed from the summary."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pandas as pd

from epdbench.analysis.compare import MATCH_KEYS, REPORT_METRICS
from epdbench.analysis.metrics import LOWER_IS_BETTER
from epdbench.analysis.trials import aggregate_trials
from epdbench.reports.findings import METRIC_NAMES
from epdbench.reports.fmt import fmt
from epdbench.reports.render import COLUMN_TITLES
from epdbench.specs.workload import rate_workload

SECTIONS = ["## Summary", "### What was compared", "### Headline findings", "## Environment", "## Plots",
            "## Transport and stage verification", "## Benefits, trade-offs and limitations",
            "## Comparison with previous runs"]
RATE_LOAD = r"(?P<rate>[\d.e+-]+) req/s \(≤(?P<cap>\d+) in flight\)"      # analysis.labels.load_label
HEADLINE = re.compile(r"In suite (?P<suite>\S+), at (?P<shape>.+?), (?:concurrency (?P<c>\d+)|" + RATE_LOAD + r"), "
                      r"(?P<label>.+?) (?:fell|rose) from (?P<a>[\d,.]+) \S+ "
                      r"on (?P<base>\S+) to (?P<b>[\d,.]+) \S+ on (?P<cfg>\S+), (?:a )?(?P<f>[\d.]+)×")
RATIO = re.compile(r"^- (?P<shape>\S+(?: \(\S+\))?) (?:c=(?P<c>\d+)|at " + RATE_LOAD + r"): (?P<title>.+?) "
                   r"(?P<best>\S+) (?P<a>[\d,.]+) vs (?P<worst>\S+) (?P<b>[\d,.]+) — (?P<f>[\d.]+)× (lower|higher)$")
LABEL_TO_METRIC = {label: m for m, (label, _) in METRIC_NAMES.items()}
TITLE_TO_METRIC = {t: m for m, t in COLUMN_TITLES.items()}


def trial_means(summary: pd.DataFrame) -> pd.DataFrame:
    return aggregate_trials(summary).set_index(["config"] + MATCH_KEYS)


def value(means: pd.DataFrame, config: str, suite: str, workload: str, concurrency: int, stream: str, metric: str):
    return float(means.loc[(config, suite, workload, concurrency, stream), metric])


def cell_of(m: re.Match) -> tuple[str, int, str]:
    """(workload, concurrency, stream) of a cell named as analysis.labels names it: 'shape (stream)' and
    'concurrency N' / 'c=N', or a rate cell's shape and 'R req/s (≤N in flight)' (its workload shape@R/s)."""
    parts = re.fullmatch(r"(.+?)(?: \((.+)\))?", m["shape"])
    shape, stream = parts.group(1), parts.group(2) or "main"
    if m["rate"] is not None:
        return rate_workload(shape, float(m["rate"])), int(m["cap"]), stream
    return shape, int(m["c"]), stream


def check_headline_matches_summary(report: str, summary: pd.DataFrame) -> int:
    """Every headline number is the summary's (trial mean) value, every factor their exact ratio."""
    means = trial_means(summary)
    found = 0
    for line in report.splitlines():
        m = HEADLINE.search(line)
        if not m:
            continue
        metric = LABEL_TO_METRIC[m["label"]]
        suite = m["suite"]
        workload, concurrency, stream = cell_of(m)
        base = value(means, m["base"], suite, workload, concurrency, stream, metric)
        other = value(means, m["cfg"], suite, workload, concurrency, stream, metric)
        assert m["a"] == fmt(base, metric) and m["b"] == fmt(other, metric), line
        assert m["f"] == f"{max(base, other) / min(base, other):.1f}", line
        found += 1
    return found


def check_ratio_lines_match_summary(report: str, summary: pd.DataFrame) -> int:
    means = trial_means(summary)
    suites = {}
    found = 0
    for line in report.splitlines():
        if line.startswith("## Suite `"):
            suite = line.split("`")[1]
        m = RATIO.match(line)
        if not m:
            continue
        metric = TITLE_TO_METRIC[m["title"]]
        key = (suite, *cell_of(m))
        best, worst = value(means, m["best"], *key, metric), value(means, m["worst"], *key, metric)
        assert (m["a"], m["b"]) == (fmt(best, metric), fmt(worst, metric)), line
        assert m["f"] == f"{max(best, worst) / min(best, worst):.1f}", line
        suites[suite] = True
        found += 1
    return found


def table_rows(report: str, suite: str) -> list[list[str]]:
    block = report.split(f"## Suite `{suite}`", 1)[1].split("\n## ", 1)[0]
    lines = [l for l in block.splitlines() if l.startswith("| ") and not l.startswith("| Config")]
    return [[c.strip() for c in l.strip("|").split("|")] for l in lines]


def number(text: str) -> float | None:
    text = text.strip("*").split(" ")[0].replace(",", "")
    return None if text == "—" else float(text)


def check_bold_winners(report: str, suite: str) -> int:
    """In every matched cell and column, the bold values are the leading group: the best value and those within
    its noise, bold only when some other value is worse beyond it (analysis.compare) — so never every value,
    and when any is bold, the best is, and every bold value beats every plain one; the Verdict table agrees."""
    rows = table_rows(report, suite)
    groups: dict[tuple, list[list[str]]] = {}
    for r in rows:
        groups.setdefault((r[1], r[2]), []).append(r)
    bold = 0
    for group in groups.values():
        for j, metric in enumerate(REPORT_METRICS, start=4):
            texts = [r[j] for r in group]
            values = [number(t) for t in texts if number(t) is not None]
            if len(values) < 2:
                continue
            best = min(values) if metric in LOWER_IS_BETTER else max(values)
            strong = [number(t) for t in texts if t.startswith("**") and number(t) is not None]
            plain = [number(t) for t in texts if not t.startswith("**") and number(t) is not None]
            if strong:
                assert best in strong and plain, (metric, texts)
                worst_strong = max(strong) if metric in LOWER_IS_BETTER else min(strong)
                assert all((worst_strong <= p) if metric in LOWER_IS_BETTER else (worst_strong >= p) for p in plain), \
                    (metric, texts)
            bold += len(strong)
    check_verdict_agrees(report, suite, groups)
    return bold


def verdict_rows(report: str) -> list[list[str]]:
    block = report.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    lines = [l for l in block.splitlines() if l.startswith("| ") and not l.startswith("| Suite")]
    return [[c.strip() for c in l.strip("|").split("|")] for l in lines]


def check_verdict_agrees(report: str, suite: str, groups: dict) -> None:
    """Each Verdict row of the suite names as winner the configuration bold in the suite's table (a tie of every
    configuration and contaminated: no bold; a tie of some: they are bold), for TTFT p50, ITL p99 and throughput per
    GPU."""
    columns = {"ttft_p50_ms": 1, "itl_p99_ms": 2, "output_tok_s_per_gpu": 3}
    for row in verdict_rows(report):
        if row[0] != suite:
            continue
        group = next(g for (shape, load), g in groups.items() if row[1] == f"{shape}, {load}")
        for metric, col in columns.items():
            j = 4 + REPORT_METRICS.index(metric)
            bold = [r[0].rstrip(" ‡") for r in group if r[j].startswith("**")]
            verdict = row[1 + col].strip("*")
            if verdict in ("tie", "contaminated", "—") or (verdict.startswith("tie: ") and verdict.endswith(" (all)")):
                assert not bold, (suite, row, metric, bold)
            elif verdict.startswith("tie: "):
                assert sorted(bold) == sorted(verdict[5:].split(", ")), (suite, row, metric, bold)
            else:
                assert bold == [verdict.split(" (")[0]], (suite, row, metric, bold)


class Images(HTMLParser):
    """Every <img src>, and every external reference (src/href that is not inline or in-page)."""

    def __init__(self):
        super().__init__()
        self.images: list[str] = []
        self.external: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, val in attrs:
            if name == "src" and tag == "img":
                self.images.append(val)
            if name in ("src", "href") and not (val.startswith("data:") or val.startswith("#")):
                self.external.append(val)


def parse_html(html: str) -> Images:
    parser = Images()
    parser.feed(html)
    parser.close()
    return parser
