"""Report plots (pure: data in, PNG bytes out). matplotlib's object API without pyplot, so no global
state or display backend; the same PNGs go to plots/ (Markdown) and inline into report.html.

Per suite: the ITL CDF of every configuration at the longest shape and highest concurrency; TTFT p50
and ITL p99 versus concurrency per shape (open-loop rate suites: SLO attainment versus offered rate);
output throughput per GPU per matched cell; throughput per GPU against interactivity with the Pareto frontier
(analysis.pareto), per shape.
"""
from __future__ import annotations

import base64
import io
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib import ticker
from matplotlib.figure import Figure

from epdbench.analysis.labels import cell_label, load_label, shape_label
from epdbench.analysis.pareto import CONTAMINATED, FRONTIER, PER_GPU, PER_USER, UNPLACED
from epdbench.analysis.samples import cdf_cell, itl_samples_ms
from epdbench.analysis.trials import aggregate_trials
from epdbench.specs.workload import split_rate

DPI = 100
WIDE_IN = 8.0          # figures wider than this take a whole row in report.html
MAX_WIDTH_IN = 14.0
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


@dataclass(frozen=True)
class Plot:
    name: str          # file name under plots/
    suite: str
    title: str
    caption: str
    png: bytes
    wide: bool = False

    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


def png_of(fig: Figure, note: str = "") -> bytes:
    """The figure as PNG; `note` (e.g. that its figures are a virtual-time simulation) printed under it, so the
    picture says so wherever it is shown on its own (plots/, MLflow's artifact viewer)."""
    if note:
        fig.text(0.0, -0.02, note, fontsize=8, color="#9a3412", ha="left", va="top", transform=fig.transFigure)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def plain_log_axis(axis) -> None:
    """Log scale labelled in plain numbers (12, 20, 150), minor ticks labelled when the range is narrow."""
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1.2, 0.6)))


def itl_cdf(suite: str, cell: tuple, samples: dict[str, list[float]], colors: dict[str, str],
            note: str = "") -> Plot | None:
    samples = {c: s for c, s in samples.items() if s}
    if not samples:
        return None
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    for config, gaps in samples.items():
        xs = np.sort(np.asarray(gaps, dtype=float))
        ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", color=colors[config],
                label=f"{config} (n={xs.size}, p99 {np.percentile(xs, 99):.1f} ms)")
    ax.set_xscale("log")
    plain_log_axis(ax.xaxis)
    ax.set_xlabel("inter-token latency (ms, log scale)")
    ax.set_ylabel("fraction of gaps ≤ x")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    _, workload, concurrency, stream = cell
    where = cell_label(workload, concurrency, stream)
    ax.set_title(f"ITL CDF — {suite}: {where}")
    counts = ", ".join(f"{c} {len(s)}" for c, s in samples.items())
    return Plot(f"{suite}-itl-cdf.png", suite, f"ITL CDF, suite {suite}",
                f"Every inter-token gap of the measured requests at {where} — the longest shape at the "
                f"highest concurrency of suite {suite}. Gaps per configuration: {counts}.", png_of(fig, note))


def latency_vs_concurrency(suite: str, agg: pd.DataFrame, colors: dict[str, str], note: str = "") -> Plot:
    shapes = list(dict.fromkeys(zip(agg["workload"], agg["stream"])))
    metrics = [("ttft_p50_ms", "TTFT p50 (ms)"), ("itl_p99_ms", "ITL p99 (ms)")]
    width_in = min(MAX_WIDTH_IN, max(4.0, 3.3 * len(shapes)))
    fig = Figure(figsize=(width_in, 6.0))
    axes = fig.subplots(len(metrics), len(shapes), squeeze=False)
    for col, (workload, stream) in enumerate(shapes):
        shape = agg[(agg["workload"] == workload) & (agg["stream"] == stream)]
        for row, (metric, label) in enumerate(metrics):
            ax = axes[row][col]
            for config, g in shape.groupby("config", sort=False):
                g = g.sort_values("concurrency").dropna(subset=[metric])
                ax.plot(g["concurrency"], g[metric].astype(float), marker="o", color=colors[config], label=config)
            ax.set_yscale("log")
            plain_log_axis(ax.yaxis)
            ax.set_xticks(sorted(shape["concurrency"].unique()))
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(shape_label(workload, stream) if row == 0 else "", fontsize=9)
            ax.set_xlabel("concurrency" if row == len(metrics) - 1 else "")
            ax.set_ylabel(label if col == 0 else "")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, bbox_to_anchor=(0.5, 1.02))
    return Plot(f"{suite}-latency-vs-concurrency.png", suite, f"Latency versus concurrency, suite {suite}",
                f"TTFT p50 (top) and ITL p99 (bottom), log scale, per shape of suite {suite}; "
                f"{'means over trials' if agg['trials'].max() > 1 else 'one trial'}.", png_of(fig, note),
                width_in > WIDE_IN)


def throughput_per_gpu(suite: str, agg: pd.DataFrame, colors: dict[str, str], note: str = "") -> Plot | None:
    agg = agg.dropna(subset=["output_tok_s_per_gpu"])
    if agg.empty:
        return None
    cells = list(dict.fromkeys(zip(agg["workload"], agg["stream"], agg["concurrency"])))
    configs = list(dict.fromkeys(agg["config"]))
    width = 0.8 / len(configs)
    width_in = min(MAX_WIDTH_IN, max(6.0, 0.55 * len(cells) * len(configs) + 2))
    fig = Figure(figsize=(width_in, 4.2))
    ax = fig.add_subplot()
    for i, config in enumerate(configs):
        mine = agg[agg["config"] == config].set_index(["workload", "stream", "concurrency"])
        heights = [float(mine.loc[c, "output_tok_s_per_gpu"]) if c in mine.index else np.nan for c in cells]
        ax.bar(np.arange(len(cells)) + (i - (len(configs) - 1) / 2) * width, heights, width, color=colors[config],
               label=config)
    ticks = [f"{shape_label(w, s)}\n{load_label(w, c, short=True)}" for w, s, c in cells]
    ax.set_xticks(np.arange(len(cells)), ticks, fontsize=7,
                  rotation=30 if len(cells) > 6 else 0, ha="right" if len(cells) > 6 else "center")
    ax.set_ylabel("output tok/s per GPU")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Output throughput per GPU — {suite}")
    return Plot(f"{suite}-throughput-per-gpu.png", suite, f"Throughput per GPU, suite {suite}",
                f"Output tokens per second divided by the configuration's GPUs, per matched cell of suite {suite}.",
                png_of(fig, note), width_in > WIDE_IN)


def attainment_vs_rate(suite: str, att: pd.DataFrame, colors: dict[str, str], note: str = "") -> Plot:
    """SLO attainment (with its 95% interval) against the offered rate, per shape, with the target."""
    shapes = list(dict.fromkeys(att["shape"]))
    width_in = min(MAX_WIDTH_IN, max(5.0, 4.2 * len(shapes)))
    fig = Figure(figsize=(width_in, 4.2))
    axes = fig.subplots(1, len(shapes), squeeze=False)[0]
    for ax, shape in zip(axes, shapes):
        mine = att[att["shape"] == shape]
        for config, g in mine.groupby("config", sort=False):
            g = g.sort_values("rate")
            y = g["attainment"].astype(float).to_numpy()
            err = np.maximum(0.0, np.vstack([y - g["attainment_low"].astype(float),
                                             g["attainment_high"].astype(float) - y]))   # rounding at 0 and 1
            ax.errorbar(g["rate"].astype(float), y, yerr=err, marker="o", capsize=3, color=colors[config],
                        label=config)
        ax.axhline(float(mine["target"].iloc[0]), color="black", linestyle="--", linewidth=1,
                   label=f"target {float(mine['target'].iloc[0]):.0%}")
        ax.set_xscale("log")
        plain_log_axis(ax.xaxis)
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())     # the swept rates are the labels
        ax.set_xticks(sorted(mine["rate"].astype(float).unique()))
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(shape, fontsize=9)
        ax.set_xlabel("offered rate (requests/s, log scale)")
        ax.set_ylabel("share of requests meeting the SLO")
    axes[0].legend(fontsize=8, loc="lower left")
    return Plot(f"{suite}-attainment-vs-rate.png", suite, f"SLO attainment versus rate, suite {suite}",
                f"Share of measured requests meeting every SLO bound of suite {suite} at each offered rate, with "
                "95% Wilson intervals; the goodput is the highest rate at or above the dashed target.",
                png_of(fig, note), width_in > WIDE_IN)


def _spread(values: pd.Series, bound: pd.Series) -> np.ndarray:
    """Distance from each value to its noise bound (0 where either is unknown), for error bars."""
    return np.nan_to_num(np.abs(pd.to_numeric(bound, errors="coerce").to_numpy(dtype=float)
                                - pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)), nan=0.0)


def _load_tag(workload: str, concurrency: int) -> str:
    """A point's load, short: 'c=8', or the offered rate '4/s'."""
    _, rate = split_rate(workload)
    return f"{rate:g}/s" if rate is not None else f"c={int(concurrency)}"


def _envelope(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points no other point matches or beats on both axes, by x ascending (y then descends): the staircase
    drawn through a frontier whose other points are behind it only within the noise."""
    best, keep = -np.inf, []
    for i in sorted(range(len(x)), key=lambda i: (x[i], y[i]), reverse=True):
        if y[i] > best:
            keep.append(i)
            best = y[i]
    keep.reverse()
    return x[keep], y[keep]


def pareto_plot(suite: str, points: pd.DataFrame, colors: dict[str, str], note: str = "") -> Plot | None:
    """Output tok/s per GPU against tok/s per user, a panel per shape: a line per configuration over its loads
    with its noise bands, the frontier's points ringed under a dashed staircase, contaminated cells hollow."""
    placed = points[points["status"] != UNPLACED]
    if placed.empty:
        return None
    shapes = list(dict.fromkeys(zip(placed["shape"], placed["stream"])))
    width_in = min(MAX_WIDTH_IN, max(7.0, 5.2 * len(shapes)))
    fig = Figure(figsize=(width_in, 4.8))
    axes = fig.subplots(1, len(shapes), squeeze=False)[0]
    handles: dict[str, object] = {}
    for ax, (shape, stream) in zip(axes, shapes):
        mine = placed[(placed["shape"] == shape) & (placed["stream"] == stream)]
        for config, g in mine.groupby("config", sort=False):
            g = g.sort_values(PER_USER)
            x, y = g[PER_USER].astype(float).to_numpy(), g[PER_GPU].astype(float).to_numpy()
            ax.errorbar(x, y, xerr=[_spread(g[PER_USER], g[f"{PER_USER}_{s}"]) for s in ("lo", "hi")],
                        yerr=[_spread(g[PER_GPU], g[f"{PER_GPU}_{s}"]) for s in ("lo", "hi")],
                        fmt="none", ecolor=colors[config], alpha=0.35, linewidth=1)
            hollow = (g["status"] == CONTAMINATED).to_numpy()
            (line,) = ax.plot(x, y, color=colors[config], linewidth=1.2, alpha=0.8, label=config)
            ax.scatter(x[~hollow], y[~hollow], color=colors[config], s=28, zorder=3)
            ax.scatter(x[hollow], y[hollow], facecolors="white", edgecolors=colors[config], s=28, zorder=3)
            handles.setdefault(config, line)
            for xi, yi, w, c in zip(x, y, g["workload"], g["concurrency"]):
                ax.annotate(_load_tag(w, c), (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7,
                            color=colors[config])
        ax.margins(x=0.12, y=0.08)
        ax.set_ylim(bottom=0)
        left, right = ax.get_xlim()         # the points' own range: interactivity of one shape varies little
        front = mine[mine["status"] == FRONTIER]
        if len(front):
            fx, fy = front[PER_USER].astype(float).to_numpy(), front[PER_GPU].astype(float).to_numpy()
            ax.scatter(fx, fy, s=150, facecolors="none", edgecolors="black", linewidths=1.4, zorder=4)
            ex, ey = _envelope(fx, fy)
            (step,) = ax.step(np.r_[left, ex], np.r_[ey[0], ey], where="pre", color="black", linestyle="--",
                              linewidth=1.1, zorder=2, label="Pareto frontier")
            handles.setdefault("Pareto frontier", step)
        ax.set_xlim(left, right)
        ax.grid(True, alpha=0.3)
        ax.set_title(shape_label(shape, stream), fontsize=9)
        ax.set_xlabel("interactivity: output tok/s per user (1000 / TPOT p50)")
        ax.set_ylabel("output tok/s per GPU" if ax is axes[0] else "")
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=len(handles), fontsize=8,
               bbox_to_anchor=(0.5, 1.06))
    fig.suptitle(f"Throughput per GPU against interactivity — {suite}", y=1.12, fontsize=11)
    trials = int(pd.to_numeric(points["trials"]).max())
    over = f"means over {trials} trials" if trials > 1 else "one trial"
    return Plot(f"{suite}-pareto.png", suite, f"Throughput per GPU against interactivity, suite {suite}",
                f"Each cell of suite {suite} as a point ({over}), one line per configuration over its loads "
                "(labelled), bars its noise band. Ringed: the Pareto frontier of its shape, where no other point is "
                "better beyond the noise on one axis without being worse beyond it on the other; the dashed staircase "
                "bounds it (a ringed point under it is behind only within the noise). Hollow: contaminated by host "
                "load, not judged.", png_of(fig, note), width_in > WIDE_IN)


def config_colors(configs: list[str], summary: pd.DataFrame) -> dict[str, str]:
    """One color per configuration, the spec's order first, the same on every plot of a run."""
    ordered = list(dict.fromkeys([*configs, *(summary["config"] if "config" in summary else [])]))
    return {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(ordered)}


def pareto_plots(points: pd.DataFrame, configs: list[str], note: str = "") -> list[Plot]:
    """A Pareto plot per suite (pareto_plot) from analysis.pareto.pareto_points, colors as suite_plots'."""
    if points.empty:
        return []
    colors = config_colors(configs, points)
    found = [pareto_plot(suite, points[points["suite"] == suite], colors, note)
             for suite in dict.fromkeys(points["suite"])]
    return [p for p in found if p is not None]


def plot_note(meta: dict) -> str:
    """What every plot of a run says under it about where its figures come from: the simulator's clock."""
    if meta.get("clock") == "virtual":
        return "Simulator in virtual time: the cost model's figures, not a measurement."
    if meta.get("target") == "sim":
        return "Simulator: the cost model's figures on emulated hardware, not a measurement."
    return ""


def suite_plots(summary: pd.DataFrame, records: pd.DataFrame, configs: list[str],
                attainment: pd.DataFrame | None = None, note: str = "") -> list[Plot]:
    """Every plot of the report, suite by suite, one color per configuration throughout. A suite with SLO
    attainment rows (open-loop rates, analysis.goodput) gets attainment versus rate instead of latency
    versus concurrency, and a suite run at one concurrency has no plot versus concurrency. `note` is printed
    under every plot (png_of)."""
    if summary.empty:
        return []
    colors = config_colors(configs, summary)
    agg = aggregate_trials(summary)
    rated = set(attainment["suite"]) if attainment is not None and len(attainment) else set()
    plots: list[Plot] = []
    for suite in dict.fromkeys(summary["suite"]):
        cell = cdf_cell(summary, suite)
        mine = agg[agg["suite"] == suite]
        middle = (attainment_vs_rate(suite, attainment[attainment["suite"] == suite], colors, note) if suite in rated
                  else latency_vs_concurrency(suite, mine, colors, note) if mine["concurrency"].nunique() > 1
                  else None)    # one concurrency: a plot "versus concurrency" would show single points
        found = [itl_cdf(suite, cell, itl_samples_ms(records, cell), colors, note), middle,
                 throughput_per_gpu(suite, mine, colors, note)]
        plots += [p for p in found if p is not None]
    return plots
