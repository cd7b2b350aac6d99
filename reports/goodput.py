"""The report's Goodput section (pure): the goodput table and each rate suite's SLO in words."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.goodput import slo_text
from epdbench.specs.models import Slo


def goodput_view(table: pd.DataFrame | None, slos: dict[str, Slo]) -> dict | None:
    """Rows for the Goodput table, and per suite its SLO; None when no rate suite had an SLO."""
    if table is None or table.empty:
        return None

    def num(v, fmt="{:g}"):
        return "—" if v is None or pd.isna(v) else fmt.format(v)
    rows = [{"suite": r["suite"], "shape": r["shape"], "config": r["config"],
             "goodput": num(r["goodput_req_s"]) if not pd.isna(r["goodput_req_s"]) else f"< {r['upper_req_s']:g}",
             "per_gpu": num(r["goodput_req_s_per_gpu"], "{:.3g}"), "upper": num(r["upper_req_s"]),
             "note": r["note"] if isinstance(r["note"], str) else ""}
            for _, r in table.iterrows()]
    return {"rows": rows, "slos": [{"suite": s, "text": slo_text(slo)} for s, slo in slos.items()
                                   if s in set(table["suite"])]}
