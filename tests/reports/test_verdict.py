"""reports/verdict.py: the Verdict in a few lines per suite for the terminal, counted from the same comparison as
the report's Verdict table, and a few lines still for five configurations over eighty cells."""
from __future__ import annotations

from collections import Counter

import pytest

from epdbench.analysis.compare import CONTAMINATED, TIE, VERDICT_METRICS, Comparison, compare
from epdbench.analysis.metrics import summarize
from epdbench.reports.verdict import TERMINAL_NAMES, verdict_lines, verdict_view
from epdbench.specs.models import load_spec
from tests.reports.synthetic_run import synthetic_records


@pytest.fixture(scope="module", params=["pd-text", "epd-multimodal"])
def comparisons(request) -> list[Comparison]:
    spec = load_spec(request.param)
    return compare(summarize(synthetic_records(spec), {c.name: c.gpus for c in spec.configurations}))


def suite_block(lines: list[str], suite: str) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  suite {suite}, "))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("  suite ")), len(lines))
    return lines[start:end]


def expected_parts(texts: list[str]) -> dict:
    """What a metric line must count, read off the report's Verdict cells of one suite and metric."""
    wins = Counter(t.split(" (")[0] for t in texts
                   if t not in ("tie", "contaminated", "—") and not t.startswith("tie: "))
    everyone = sum(t.startswith("tie: ") and t.endswith(" (all)") for t in texts)
    return {"wins": wins, "tied ahead": sum(t.startswith("tie: ") for t in texts) - everyone,
            "all tied": everyone, "tie": texts.count("tie"), "contaminated": texts.count("contaminated")}


def parsed_parts(line: str) -> dict:
    parts = line.split(": ", 1)[1].split("; ")
    wins = Counter({e.rsplit(" ", 1)[0]: int(e.rsplit(" ", 1)[1]) for e in parts[0].split(", ") if e != "no winner"})
    rest = {p.split(" (")[0].rsplit(" ", 1)[0]: int(p.split(" (")[0].rsplit(" ", 1)[1]) for p in parts[1:]}
    return {"wins": wins, **{k: rest.get(k, 0) for k in ("tied ahead", "all tied", "tie", "contaminated")}}


def test_the_lines_count_what_the_report_verdict_shows(comparisons):
    view, lines = verdict_view(comparisons), verdict_lines(comparisons)
    suites = list(dict.fromkeys(r["suite"] for r in view["rows"]))
    assert len(lines) == 1 + len(suites) * (1 + len(VERDICT_METRICS))
    for suite in suites:
        rows = [r for r in view["rows"] if r["suite"] == suite]
        block = suite_block(lines, suite)
        assert block[0] == f"  suite {suite}, {len(rows)} matched cell{'s' * (len(rows) != 1)}:"
        for j, metric in enumerate(VERDICT_METRICS):
            line = next(x for x in block if x.startswith(f"    {TERMINAL_NAMES[metric]}: "))
            assert parsed_parts(line) == expected_parts([r["cells"][j]["text"] for r in rows]), line


PAIRS = [(a, b) for i, a in enumerate(["aggregated", "pd-tcp", "pd-rdma", "epd"])
         for b in ["aggregated", "pd-tcp", "pd-rdma", "epd"][i + 1:]]


def synthetic_cell(i: int, metric: str, configs: list[str]) -> Comparison:
    """Cell i of a wide run: a winner, a pair tied ahead of epd-rdma, a tie or host load, in turn."""
    kind = i % 4
    verdict = {0: configs[i % 5], 1: TIE, 2: TIE, 3: CONTAMINATED}[kind]
    return Comparison("wide", f"{512 * (1 + i // 8)}/64", 1 + i % 8, "main", metric,
                      values={c: float(k + 1) for k, c in enumerate(configs)}, best=verdict if kind == 0 else None,
                      worst="epd-rdma", ratio=None, verdict=verdict, leaders=PAIRS[i % len(PAIRS)] if kind == 1 else ())


def test_five_configurations_over_eighty_cells_still_take_a_few_lines():
    configs = ["aggregated", "pd-tcp", "pd-rdma", "epd", "epd-rdma"]
    comparisons = [synthetic_cell(i, m, configs) for i in range(80) for m in VERDICT_METRICS]
    lines = verdict_lines(comparisons)
    assert len(lines) == 1 + 1 + len(VERDICT_METRICS)
    assert lines[1] == "  suite wide, 80 matched cells:"
    for line in lines[2:]:     # one entry per configuration, then tied ahead, tie and contaminated
        assert line.count(", ") == len(configs) - 1 and line.count("; ") == 3, line
        assert parsed_parts(line) == {"wins": Counter({c: 4 for c in configs}), "tied ahead": 20, "all tied": 0,
                                      "tie": 20, "contaminated": 20}, line


def test_no_matched_cell_says_so():
    assert verdict_lines([]) == ["Verdict: fewer than two configurations produced data in any cell, nothing to decide."]


def cell_row(config: str, **metrics) -> dict:
    base = {"config": config, "suite": "fixed", "workload": "512/64", "concurrency": 8, "stream": "main", "trial": 0,
            "requests_ok": 24, "requests_total": 24, "n_ttft_samples": 24, "n_itl_samples": 24 * 63,
            "ttft_p50_ms": 50.0, "itl_p99_ms": 9.0, "output_tok_s_per_gpu": 400.0}
    return {**base, **metrics}


def test_a_tie_names_who_tied_and_a_tie_of_everyone_says_all():
    import pandas as pd
    summary = pd.DataFrame([cell_row("aggregated", ttft_p50_ms=20.0, itl_p99_ms=14.5),
                            cell_row("pd-tcp", ttft_p50_ms=50.0, itl_p99_ms=9.1),
                            cell_row("pd-rdma", ttft_p50_ms=40.0, itl_p99_ms=9.15, output_tok_s_per_gpu=404.0),
                            cell_row("epd", ttft_p50_ms=50.0, itl_p99_ms=9.1, output_tok_s_per_gpu=398.0)])
    texts = [c["text"] for c in verdict_view(compare(summary))["rows"][0]["cells"]]
    assert texts == ["aggregated (2.0× lower)",                  # a sole winner
                     "tie: pd-tcp, epd, pd-rdma",                # ahead of aggregated beyond the noise
                     "tie: pd-rdma, aggregated, pd-tcp, epd (all)"]   # 1 % apart inside an 8 % run-to-run floor
    lines = verdict_lines(compare(summary))
    assert lines[-3:] == ["    TTFT p50: aggregated 1",
                          "    ITL p99: no winner; tied ahead 1 (epd ≈ pd-rdma ≈ pd-tcp)",
                          "    tok/s per GPU: no winner; all tied 1"]


def test_a_narrow_win_shows_its_margin_to_two_decimals():
    from epdbench.reports.verdict import margin_text, tie_text
    assert [margin_text(m) for m in (1.034, 1.0999, 1.1, 2.04)] == ["1.03×", "1.10×", "1.1×", "2.0×"]
    assert tie_text((), False) == "tie" and tie_text(("a", "b"), True) == "tie: a, b (all)"
