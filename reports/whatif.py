"""What-if plots (pure: tables in, PNGs out): goodput per GPU of every variant tried, grouped by configuration,
and SLO attainment against rate for each configuration's best variant."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from epdbench.reports.plots import MAX_WIDTH_IN, PALETTE, Plot, attainment_vs_rate, png_of


def capacity_per_gpu(allv: pd.DataFrame, best: pd.DataFrame) -> Plot:
    """One bar per variant (goodput per GPU), coloured by configuration, with its noise range as an error bar
    (analysis.whatif: highest rate surely held to lowest surely failed; no upper whisker when none surely
    failed); the best of each is outlined."""
    configs = list(dict.fromkeys(allv["configuration"]))
    colors = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(configs)}
    width_in = min(MAX_WIDTH_IN, max(6.0, 0.32 * len(allv) + 2))
    fig = Figure(figsize=(width_in, 4.6))
    ax = fig.subplots()
    chosen = set(best["variant"])
    x = np.arange(len(allv))
    values = pd.to_numeric(allv["goodput_req_s_per_gpu"], errors="coerce").fillna(0.0).to_numpy()
    for i, (_, r) in enumerate(allv.iterrows()):
        ax.bar(x[i], values[i], color=colors[r["configuration"]], edgecolor="black" if r["variant"] in chosen else
               "none", linewidth=1.5, label=r["configuration"] if r["configuration"] not in
               ax.get_legend_handles_labels()[1] else None)
    gpus = allv["gpus"].astype(float).to_numpy()
    low = pd.to_numeric(allv["holds_surely_req_s"], errors="coerce").fillna(0.0).to_numpy() / gpus
    high = pd.to_numeric(allv["fails_surely_req_s"], errors="coerce").to_numpy() / gpus
    high = np.where(np.isnan(high), values, high)
    ax.errorbar(x, values, yerr=[np.clip(values - low, 0, None), np.clip(high - values, 0, None)], fmt="none",
                ecolor="black", elinewidth=0.8, capsize=2)
    ax.set_xticks(x, [f"{r['roles']} ({r['gpus']})" for _, r in allv.iterrows()], rotation=70, ha="right",
                  fontsize=7)
    ax.set_ylabel("goodput per GPU (requests/s)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return Plot("whatif-goodput-per-gpu.png", "whatif", "Goodput per GPU of every variant",
                "The highest Poisson rate each variant sustains within the SLO, per GPU (GPUs in brackets), "
                "with its noise range (highest rate surely held to lowest surely failed); outlined: the best "
                "variant of each configuration.", png_of(fig), width_in > 8)


def best_attainment(points: pd.DataFrame, best: pd.DataFrame, suite: str) -> Plot:
    """SLO attainment against rate of each configuration's best variant (analysis.goodput's plot)."""
    mine = points[points["variant"].isin(best["variant"]) & (points["suite"] == suite)]
    att = mine.assign(config=[f"{c}: {v}" for c, v in zip(mine["configuration"], mine["variant"])])
    labels = list(dict.fromkeys(att["config"]))
    return attainment_vs_rate(f"whatif-{suite}", att, {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(labels)})
