"""Number formatting shared by every report surface: null stays "—", never 0."""
from __future__ import annotations

import pandas as pd

THROUGHPUT_METRICS = ("output_tok_s", "output_tok_s_per_gpu")


def fmt(value, metric: str = "") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "—"
    if metric in THROUGHPUT_METRICS:
        return f"{value:,.1f}"
    if metric == "req_s":
        return f"{value:.2f}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
