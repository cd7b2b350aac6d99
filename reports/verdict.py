"""The report's verdict (pure): the opening table of who wins each deployment metric per cell, or tie, or
contaminated, and the line that says which cells host load contaminated."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.compare import CONTAMINATED, TIE, VERDICT_METRICS, Comparison, verdict_table
from epdbench.analysis.metrics import LOWER_IS_BETTER
from epdbench.analysis.noise import CONTAMINATION_FRACTION
from epdbench.reports.fmt import METRIC_NAMES, cell_text

def contamination_line(summary: pd.DataFrame, meta: dict) -> str | None:
    """How many cells host load contaminated, and what to do about it (None when none)."""
    if summary.empty or "contaminated" not in summary:
        return None
    bad = summary[summary["contaminated"].fillna(False).astype(bool)]
    if bad.empty:
        return None
    where = "; ".join(f"{r['config']} {r['suite']} {r['workload']} c={r['concurrency']}" for _, r in bad.head(4).iterrows())
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    fix = (f"; raise target.sim.time_scale (now {meta.get('time_scale', 1):g}) or run on a quieter host"
           if meta.get("target") == "sim" else "; run the load generator on a quieter host")
    return (f"{len(bad)} of {len(summary)} cells contaminated by host load (emulation or client lag p99 above "
            f"{100 * CONTAMINATION_FRACTION:g}% of a latency it reports, or over {100 * CONTAMINATION_FRACTION:g}% of "
            f"tokens read together with the one before: {where}{more}): they name no winner{fix}.")


VERDICT_TEXT = {TIE: "tie", CONTAMINATED: "contaminated", None: "—"}


def verdict_view(comparisons: list[Comparison]) -> dict:
    """The report's opening table: per suite and matched cell, who wins TTFT p50, ITL p99 and throughput per GPU
    (by how much against the runner-up), or tie / contaminated."""
    rows = []
    for r in verdict_table(comparisons):
        cells = []
        for m in VERDICT_METRICS:
            v = r["verdicts"].get(m)
            margin = r["margins"].get(m)
            leaders = r["leaders"].get(m) or ()
            if v == TIE and leaders:
                cells.append({"text": f"tie: {', '.join(leaders)}", "winner": False})
            elif v in VERDICT_TEXT:
                cells.append({"text": VERDICT_TEXT[v], "winner": False})
            else:
                cells.append({"text": f"{v} ({margin:.1f}× {'lower' if m in LOWER_IS_BETTER else 'higher'})"
                              if margin else v, "winner": True})
        rows.append({"suite": r["suite"], "cell": cell_text(r["workload"], r["concurrency"], r["stream"]),
                     "cells": cells})
    decided = sum(c["winner"] for r in rows for c in r["cells"])
    total = sum(c["text"] != "—" for r in rows for c in r["cells"])
    return {"columns": [METRIC_NAMES[m][0] for m in VERDICT_METRICS], "rows": rows, "decided": decided, "total": total}
