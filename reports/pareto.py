"""The report's "Throughput per GPU against interactivity" section, the terminal's frontier lines and the
comparison run's cost and frontier metrics, from analysis.pareto's points (pure)."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.labels import load_label, shape_label
from epdbench.analysis.pareto import FRONTIER, PER_GPU, PER_USER, frontier_configs
from epdbench.reports.fmt import fmt, workload_key
from epdbench.reports.mlflow_names import valid_keys
from epdbench.reports.plots import plot_note

HOW_TO_PRICE = {"field": "cost: {gpu_hour_usd: 2.5}", "flag": "epdbench compare --gpu-hour-usd 2.5"}


def usd(value) -> str:
    """Dollars: cents from $1 up, three significant digits below ('$0.0412'); '—' when unknown."""
    if value is None or pd.isna(value):
        return "—"
    return f"${value:,.2f}" if value >= 1 or value == 0 else f"${value:.3g}"


def energy_text(meta: dict) -> str:
    """Why the report has no energy per token: nothing on this target reads GPU power, and none is estimated."""
    if meta.get("target") == "sim":
        return ("unavailable — the simulator has no GPU whose power could be read, and epdbench never estimates "
                "one")
    return (f"unavailable — epdbench reads no GPU power (NVML or DCGM) on the {meta.get('target')} target yet, "
            "and never estimates it")


def _shape_order(points: pd.DataFrame) -> list[tuple[str, str]]:
    """(shape, stream) pairs: streams in order of first appearance, shapes in numeric order."""
    streams = {s: i for i, s in enumerate(dict.fromkeys(points["stream"]))}
    return sorted(dict.fromkeys(zip(points["shape"], points["stream"])),
                  key=lambda k: (streams[k[1]], workload_key(k[0])))


def _cost_rows(mine: pd.DataFrame) -> list[dict]:
    """Per configuration and shape: its cost per million output tokens at each load, in load order."""
    rows = []
    for shape, stream in _shape_order(mine):
        cells = mine[(mine["shape"] == shape) & (mine["stream"] == stream)]
        for config, g in cells.groupby("config", sort=False):
            g = g.assign(_rate=[workload_key(w) for w in g["workload"]]).sort_values(["_rate", "concurrency"])
            rows.append({"config": config, "shape": shape_label(shape, stream),
                         "costs": " · ".join(f"{load_label(w, c, short=True)}: {usd(v)}"
                                             for w, c, v in zip(g["workload"], g["concurrency"],
                                                                g["cost_usd_per_mtok"]))})
    return rows


def pareto_view(points: pd.DataFrame, meta: dict, gpu_hour_usd: float | None = None, plots=()) -> dict:
    """What the section shows: per suite the frontier points (most interactive first, with their cost when priced),
    the configurations on no frontier of the suite, cost per load and configuration; the price or how to give one,
    why energy per token is absent, and whether the figures are the simulator's (plot_note)."""
    suites = []
    for suite in dict.fromkeys(points["suite"]) if not points.empty else []:
        mine = points[points["suite"] == suite]
        frontier = []
        for shape, stream in _shape_order(mine):
            front = mine[(mine["shape"] == shape) & (mine["stream"] == stream) & (mine["status"] == FRONTIER)]
            for r in front.sort_values(PER_USER, ascending=False).to_dict("records"):
                frontier.append({"shape": shape_label(shape, stream), "config": r["config"],
                                 "load": load_label(r["workload"], r["concurrency"], short=True),
                                 "per_user": fmt(r[PER_USER], PER_GPU), "per_gpu": fmt(r[PER_GPU], PER_GPU),
                                 "cost": usd(r["cost_usd_per_mtok"])})
        on = {c for names in frontier_configs(mine).get(suite, {}).values() for c in names}
        suites.append({"name": suite, "frontier": frontier,
                       "off": [c for c in dict.fromkeys(mine["config"]) if c not in on],
                       "costs": _cost_rows(mine) if gpu_hour_usd is not None else []})
    return {"has_data": bool(suites), "suites": suites, "note": plot_note(meta),
            "price": f"${gpu_hour_usd:g} per GPU-hour" if gpu_hour_usd is not None else None,
            "how_to_price": HOW_TO_PRICE, "energy": energy_text(meta),
            "plots": [{"file": f"plots/{p.name}", "data_uri": p.data_uri(), "title": p.title, "caption": p.caption,
                       "suite": p.suite, "wide": p.wide} for p in plots]}


def pareto_lines(points: pd.DataFrame, meta: dict) -> list[str]:
    """One terminal line per suite: the configurations on each shape's frontier and, when priced, the cheapest
    configuration per million output tokens of each shape."""
    lines = []
    where = " — simulated" if meta.get("target") == "sim" else ""
    for suite, shapes in frontier_configs(points).items():
        mine = points[points["suite"] == suite]
        parts = []
        for shape, stream in _shape_order(mine):
            names = shapes.get((shape, stream)) or ["none placed"]
            text = f"{shape_label(shape, stream)}: {', '.join(names)}"
            priced = mine[(mine["shape"] == shape) & (mine["stream"] == stream)].dropna(subset=["cost_usd_per_mtok"])
            if len(priced):
                low = priced.loc[pd.to_numeric(priced["cost_usd_per_mtok"]).idxmin()]
                text += (f" (cheapest {low['config']} {usd(low['cost_usd_per_mtok'])}/M output tokens at "
                         f"{load_label(low['workload'], low['concurrency'], short=True)})")
            parts.append(text)
        lines.append(f"Pareto frontier, suite {suite} (output tok/s per GPU against tok/s per user){where}: "
                     + "; ".join(parts))
    return lines


def pareto_metrics(points: pd.DataFrame, configs: list[str]) -> dict[str, float]:
    """The comparison run's metrics: cost_usd_per_mtok.<suite>.<workload>.c<N>[.<stream>].<config> per priced
    cell, and frontier_points.<suite>.<config>, how many of the suite's cells of a configuration lie on their
    shape's frontier (0 when none); keys made valid by reports.mlflow_names."""
    out: dict[str, float] = {}
    for r in points.to_dict("records"):
        stream = "" if r["stream"] == "main" else f".{r['stream']}"
        if r["cost_usd_per_mtok"] is not None and not pd.isna(r["cost_usd_per_mtok"]):
            out[f"cost_usd_per_mtok.{r['suite']}.{r['workload']}.c{r['concurrency']}{stream}.{r['config']}"] = float(
                r["cost_usd_per_mtok"])
    for suite in dict.fromkeys(points["suite"]) if not points.empty else []:
        mine = points[points["suite"] == suite]
        for config in dict.fromkeys([*configs, *mine["config"]]):
            out[f"frontier_points.{suite}.{config}"] = float(((mine["config"] == config)
                                                              & (mine["status"] == FRONTIER)).sum())
    return valid_keys(out)
