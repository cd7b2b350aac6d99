"""The report's verdict (pure): the opening table of who wins each deployment metric per cell, or tie, or
contaminated; the line that says which cells host load contaminated; and the same verdict in a few lines per
suite, the terminal's last word."""
from __future__ import annotations

from collections import Counter

import pandas as pd

from epdbench.analysis.compare import CONTAMINATED, TIE, VERDICT_METRICS, Comparison, verdict_table
from epdbench.analysis.labels import cell_label
from epdbench.analysis.metrics import LOWER_IS_BETTER
from epdbench.analysis.noise import CONTAMINATION_FRACTION
from epdbench.reports.fmt import METRIC_NAMES

def contamination_line(summary: pd.DataFrame, meta: dict) -> str | None:
    """How many cells host load contaminated, and what to do about it (None when none)."""
    if summary.empty or "contaminated" not in summary:
        return None
    bad = summary[summary["contaminated"].fillna(False).astype(bool)]
    if bad.empty:
        return None
    where = "; ".join(f"{r['config']} {r['suite']} "
                      f"{cell_label(r['workload'], r['concurrency'], r.get('stream', 'main'), short=True)}"
                      for _, r in bad.head(4).iterrows())
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    fix = (f"; raise target.sim.time_scale (now {meta.get('time_scale', 1):g}) or run on a quieter host"
           if meta.get("target") == "sim" else "; run the load generator on a quieter host")
    return (f"{len(bad)} of {len(summary)} cells contaminated by host load (emulation or client lag p99 above "
            f"{100 * CONTAMINATION_FRACTION:g}% of a latency it reports, or over {100 * CONTAMINATION_FRACTION:g}% of "
            f"tokens read together with the one before: {where}{more}): they name no winner{fix}.")


VERDICT_TEXT = {TIE: "tie", CONTAMINATED: "contaminated", None: "—"}


def margin_text(margin: float) -> str:
    """A winner's margin over the runner-up: two decimals below 1.1× (a 3 % win is no "1.0×"), else one."""
    return f"{margin:.2f}×" if margin < 1.1 else f"{margin:.1f}×"


def tie_text(tied: tuple, everyone: bool) -> str:
    """Who tied: the best value's configuration first, then those within its noise; `(all)` when that is every
    configuration with a value; plain "tie" when not known."""
    if not tied:
        return VERDICT_TEXT[TIE]
    return f"tie: {', '.join(tied)}" + (" (all)" if everyone else "")


def verdict_view(comparisons: list[Comparison]) -> dict:
    """The report's opening table: per suite and matched cell, who wins TTFT p50, ITL p99 and throughput per GPU
    (by how much against the runner-up), or who tied (tie_text), or contaminated."""
    rows = []
    for r in verdict_table(comparisons):
        cells = []
        for m in VERDICT_METRICS:
            v = r["verdicts"].get(m)
            margin = r["margins"].get(m)
            if v == TIE:
                cells.append({"text": tie_text(r["tied"].get(m) or (), r["all_tied"].get(m, False)), "winner": False})
            elif v in VERDICT_TEXT:
                cells.append({"text": VERDICT_TEXT[v], "winner": False})
            else:
                cells.append({"text": f"{v} ({margin_text(margin)} {'lower' if m in LOWER_IS_BETTER else 'higher'})"
                              if margin else v, "winner": True})
        rows.append({"suite": r["suite"], "cell": cell_label(r["workload"], r["concurrency"], r["stream"]),
                     "cells": cells})
    decided = sum(c["winner"] for r in rows for c in r["cells"])
    total = sum(c["text"] != "—" for r in rows for c in r["cells"])
    return {"columns": [METRIC_NAMES[m][0] for m in VERDICT_METRICS], "rows": rows, "decided": decided, "total": total}


TERMINAL_NAMES = {"ttft_p50_ms": "TTFT p50", "itl_p99_ms": "ITL p99", "output_tok_s_per_gpu": "tok/s per GPU"}


def metric_tally(rows: list[dict], metric: str) -> str | None:
    """One metric over a suite's Verdict rows: each configuration that wins it and in how many cells, then the
    cells where a group tied ahead of the rest (the group seen most often named), the cells where every
    configuration tied, other ties and contaminated cells; None when no cell judged it. At most one entry per
    configuration and five more, however many cells."""
    wins: Counter = Counter()
    groups: Counter = Counter()
    ties = everyone = spoilt = judged = 0
    for r in rows:
        v = r["verdicts"].get(metric)
        tied = r.get("tied", {}).get(metric) or ()
        judged += v is not None
        if v == TIE and r.get("all_tied", {}).get(metric):
            everyone += 1
        elif v == TIE and tied:
            groups[" ≈ ".join(sorted(tied))] += 1      # the same group, whichever of it led by a hair
        elif v == TIE:
            ties += 1
        elif v == CONTAMINATED:
            spoilt += 1
        elif v is not None:
            wins[v] += 1
    if not judged:
        return None
    parts = [", ".join(f"{who} {n}" for who, n in wins.most_common()) or "no winner"]
    if groups:
        group, n = groups.most_common(1)[0]
        often = f" ({group} in {n})" if len(groups) > 1 else f" ({group})"
        parts.append(f"tied ahead {sum(groups.values())}{often}")
    parts += [f"all tied {everyone}"] * bool(everyone) + [f"tie {ties}"] * bool(ties)
    parts += [f"contaminated {spoilt}"] * bool(spoilt)
    parts += [f"no data {len(rows) - judged}"] * (len(rows) > judged)
    return f"{TERMINAL_NAMES.get(metric, METRIC_NAMES[metric][0])}: " + "; ".join(parts)


def verdict_lines(comparisons: list[Comparison], footing: str | None = None) -> list[str]:
    """The Verdict in a few lines per suite, from the same rows as the report's table: per metric, which
    configuration wins in how many of the suite's matched cells, ties, contaminated (the terminal's last word);
    `footing`, the GPU footing it stands on (reports.footing), under its first line."""
    rows = verdict_table(comparisons)
    if not rows:
        return ["Verdict: fewer than two configurations produced data in any cell, nothing to decide."]
    lines = ["Verdict (report.md opens with it): per metric, who is better outside the noise in how many matched cells"]
    lines += [f"  {footing}"] * bool(footing)
    for suite in dict.fromkeys(r["suite"] for r in rows):
        mine = [r for r in rows if r["suite"] == suite]
        lines.append(f"  suite {suite}, {len(mine)} matched cell{'s' * (len(mine) != 1)}:")
        lines += [f"    {t}" for m in VERDICT_METRICS if (t := metric_tally(mine, m))]
    return lines
