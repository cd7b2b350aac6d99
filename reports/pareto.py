"""The report's "Throughput per GPU against interactivity" section, the terminal's frontier lines and the
comparison run's cost and frontier metrics, from analysis.pareto's points (pure)."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.labels import load_label, shape_label
from epdbench.analysis.noise import finite
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


SOURCES = {"local": "NVML on this host", "kubernetes": "the cluster's DCGM exporter"}


def has_energy(points: pd.DataFrame) -> bool:
    return not points.empty and points["energy_j_per_token"].notna().any()


def energy_text(meta: dict, measured: bool = False) -> str:
    """Where energy per token comes from, or why the report has none: nothing read GPU power, and none is ever
    estimated."""
    if meta.get("target") == "sim":
        return ("unavailable — the simulator has no GPU whose power could be read, and epdbench never estimates "
                "one")
    source = SOURCES.get(meta.get("target"), "the target")
    if measured:
        return (f"the energy the configuration's GPUs drew over each cell's measured window (read by {source}: "
                "the driver's energy counter, else its power readings integrated) over the output tokens of its "
                "measured requests, idle draw included; per load in the GPU table below")
    if meta.get("target") == "local" and meta.get("device") != "cuda":
        return "unavailable — the engines ran on CPU, and epdbench never estimates GPU energy"
    return (f"unavailable — no GPU power was read on this run ({source}: see the run's log for why), and "
            "epdbench never estimates it")


def joules(value) -> str:
    """Joules to three significant figures ('0.412 J'); '—' when unknown."""
    if value is None or pd.isna(value):
        return "—"
    return f"{value:.3g} J"


def _gpu_rows(mine: pd.DataFrame) -> list[dict]:
    """Per configuration, shape and load where the GPUs were read: utilisation, memory, power, SM clock (the means
    over trials the points carry) and energy per output token."""
    rows = []
    for shape, stream in _shape_order(mine):
        cells = mine[(mine["shape"] == shape) & (mine["stream"] == stream)]
        for r in cells.to_dict("records"):
            if not (finite(r.get("gpu_samples")) or 0) > 0:
                continue
            mem = finite(r.get("gpu_mem_used_mib_max"))
            rows.append({"config": r["config"], "shape": shape_label(shape, stream),
                         "load": load_label(r["workload"], r["concurrency"], short=True),
                         "util": fmt_or_dash(r.get("gpu_util_pct_mean"), "{:.0f} %"),
                         "mem": fmt_or_dash(None if mem is None else mem / 1024, "{:.1f} GiB"),
                         "power": fmt_or_dash(r.get("gpu_power_w_mean"), "{:.0f} W"),
                         "clock": fmt_or_dash(r.get("gpu_sm_clock_mhz_mean"), "{:.0f} MHz"),
                         "energy": joules(r["energy_j_per_token"])})
    return rows


def fmt_or_dash(value, pattern: str) -> str:
    return "—" if value is None or pd.isna(value) else pattern.format(value)


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
    """What the section shows: per suite the frontier points (most interactive first, with their cost when priced
    and their energy per token when measured), the configurations on no frontier of the suite, cost per load and
    configuration, the GPUs' figures per cell where the target read them; the price or how to give one, where
    energy per token comes from or why it is absent, and whether the figures are the simulator's."""
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
                                 "cost": usd(r["cost_usd_per_mtok"]), "energy": joules(r["energy_j_per_token"])})
        on = {c for names in frontier_configs(mine).get(suite, {}).values() for c in names}
        suites.append({"name": suite, "frontier": frontier,
                       "off": [c for c in dict.fromkeys(mine["config"]) if c not in on],
                       "costs": _cost_rows(mine) if gpu_hour_usd is not None else [],
                       "gpu": _gpu_rows(mine)})
    return {"has_data": bool(suites), "suites": suites, "note": plot_note(meta),
            "price": f"${gpu_hour_usd:g} per GPU-hour" if gpu_hour_usd is not None else None,
            "how_to_price": HOW_TO_PRICE, "energy": energy_text(meta, has_energy(points)),
            "has_energy": has_energy(points),
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
            read = mine[(mine["shape"] == shape) & (mine["stream"] == stream)].dropna(subset=["energy_j_per_token"])
            if len(read):
                low = read.loc[pd.to_numeric(read["energy_j_per_token"]).idxmin()]
                text += (f" (least energy {low['config']} {joules(low['energy_j_per_token'])}/output token at "
                         f"{load_label(low['workload'], low['concurrency'], short=True)})")
            parts.append(text)
        lines.append(f"Pareto frontier, suite {suite} (output tok/s per GPU against tok/s per user){where}: "
                     + "; ".join(parts))
    return lines


def pareto_metrics(points: pd.DataFrame, configs: list[str]) -> dict[str, float]:
    """The comparison run's metrics: cost_usd_per_mtok.<suite>.<workload>.c<N>[.<stream>].<config> per priced
    cell, energy_j_per_token.<same> per cell whose GPUs were read, and frontier_points.<suite>.<config>, how many
    of the suite's cells of a configuration lie on their
    shape's frontier (0 when none); keys made valid by reports.mlflow_names."""
    out: dict[str, float] = {}
    for r in points.to_dict("records"):
        stream = "" if r["stream"] == "main" else f".{r['stream']}"
        if r["cost_usd_per_mtok"] is not None and not pd.isna(r["cost_usd_per_mtok"]):
            out[f"cost_usd_per_mtok.{r['suite']}.{r['workload']}.c{r['concurrency']}{stream}.{r['config']}"] = float(
                r["cost_usd_per_mtok"])
        if r["energy_j_per_token"] is not None and not pd.isna(r["energy_j_per_token"]):
            out[f"energy_j_per_token.{r['suite']}.{r['workload']}.c{r['concurrency']}{stream}.{r['config']}"] = float(
                r["energy_j_per_token"])
    for suite in dict.fromkeys(points["suite"]) if not points.empty else []:
        mine = points[points["suite"] == suite]
        for config in dict.fromkeys([*configs, *mine["config"]]):
            out[f"frontier_points.{suite}.{config}"] = float(((mine["config"] == config)
                                                              & (mine["status"] == FRONTIER)).sum())
    return valid_keys(out)
