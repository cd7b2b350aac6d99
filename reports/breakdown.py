"""The report's "Where TTFT goes" (pure): per suite a table of each part's p50 / p95 per configuration and cell
and a stacked horizontal bar of the typical request's parts (analysis.breakdown), with the median TTFT marked;
the terminal's lines; the tolerance the parts are checked against, and whether the spans were emulated."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from epdbench.analysis.breakdown import (CLOCK_TOLERANCE_MS, MIDDLE_SHARE, PART_TITLES, PARTS, SUM_TOLERANCE,
                                         SUM_TOLERANCE_MIN_MS)
from epdbench.analysis.labels import cell_label
from epdbench.reports.fmt import fmt, matched_order
from epdbench.reports.plots import MAX_WIDTH_IN, Plot, png_of

PART_COLORS = {"queue": "#9ca3af", "encode": "#9467bd", "prefill": "#1f77b4", "kv_transfer": "#d62728",
               "first_decode": "#2ca02c", "rest": "#fbbf24"}
SHORT_TITLES = {**PART_TITLES, "rest": "rest"}


def _ms(v) -> str:
    return fmt(None if v is None or pd.isna(v) else float(v))


def _counts(r: dict) -> str:
    """'24/24', with what is not in the figures: untraced, incomplete (why), failed, disagreeing (ids)."""
    text = f"{r['complete']}/{r['traced']}"
    notes = [f"{r['untraced']} untraced"] if r["untraced"] else []
    if r["incomplete"]:
        notes.append(f"{r['incomplete']} incomplete: {r['missing']}")
    for key, what in (("failed", "failed"), ("unmatched", "without a record"), ("clock", "within clock tolerance")):
        if r[key]:
            notes.append(f"{r[key]} {what}")
    if r["disagree"]:
        notes.append(f"{r['disagree']} disagree with their records ({r['disagreeing']})")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _check(r: dict) -> dict:
    """Whether the typical request's parts add up to the median TTFT: {ok, text}."""
    if r["adds_up"] is None or pd.isna(r["adds_up"]):
        return {"ok": True, "text": "—"}
    typical = f"{_ms(r['typical_ttft_ms'])} vs {_ms(r['ttft_p50_ms'])}"
    return {"ok": bool(r["adds_up"]), "text": f"yes ({typical})" if r["adds_up"] else
            f"no ({typical}: TTFTs spread about the median)"}


def breakdown_rows(table: pd.DataFrame, configs: list[str]) -> list[dict]:
    """Per suite: rows of one matched cell together, configurations in the run's order."""
    if table is None or table.empty:
        return []
    rank = {c: i for i, c in enumerate(configs)}
    table = table.assign(_rank=[rank.get(c, len(rank)) for c in table["config"]])
    out = []
    for suite, sdf in table.groupby("suite", sort=False):
        rows = []
        for _, r in matched_order(sdf.sort_values("_rank", kind="stable")).iterrows():
            r = r.to_dict()
            label = cell_label(r["workload"], r["concurrency"], r["stream"], short=True)
            sources = (_kv_source(r["kv_source"]), _encode_source(r["encode_source"]))
            rows.append({"config": r["config"], "cell": label + (f" t{r['trial']}" if r["trial"] else ""),
                         "requests": _counts(r), "ttft": _ms(r["ttft_p50_ms"]),
                         "parts": [f"{_ms(r[f'{p}_p50_ms'])} / {_ms(r[f'{p}_p95_ms'])}" for p in PARTS],
                         "typical": [_ms(r[f"typical_{p}_ms"]) for p in PARTS], "adds_up": _check(r),
                         "medians_gap": _ms(r["medians_gap_ms"]),
                         "sources": "; ".join(s for s in sources if s)})
        out.append({"name": suite, "rows": rows})
    return out


def _kv_source(source: str) -> str:
    return {"decode-queue": "KV transfer = the decode's remote-KV wait (vLLM's time_in_queue on the decode)",
            "mixed": "KV transfer from kv_transfer spans for some requests, the decode's wait for others",
            }.get(source, "")


def _encode_source(source: str) -> str:
    return {"span": "encode = the encode engine's whole leg (its span: API server included)",
            "mixed": "encode from model time for some requests, the whole leg for others"}.get(source, "")


def breakdown_plot(suite: str, sdf: pd.DataFrame, configs: list[str], note: str = "") -> Plot | None:
    """One bar per configuration and cell of `suite`: the typical request's parts stacked, the median TTFT ticked."""
    sdf = sdf.dropna(subset=["typical_ttft_ms"])
    if sdf.empty:
        return None
    rank = {c: i for i, c in enumerate(configs)}
    sdf = matched_order(sdf.assign(_rank=[rank.get(c, len(rank)) for c in sdf["config"]]).sort_values("_rank",
                                                                                                      kind="stable"))
    labels = [f"{c} · {cell_label(w, n, s, short=True)}"
              for c, w, n, s in zip(sdf["config"], sdf["workload"], sdf["concurrency"], sdf["stream"])]
    y = np.arange(len(sdf))[::-1]
    width_in = min(MAX_WIDTH_IN, 8.0)
    fig = Figure(figsize=(width_in, max(2.8, 1.2 + 0.32 * len(sdf))), layout="constrained")
    ax = fig.add_subplot()
    left = np.zeros(len(sdf))
    for p in PARTS:
        values = sdf[f"typical_{p}_ms"].astype(float).fillna(0.0).to_numpy()
        if values.any():
            ax.barh(y, values, left=left, color=PART_COLORS[p], label=SHORT_TITLES[p], height=0.7)
        left += values
    ax.scatter(sdf["ttft_p50_ms"].astype(float), y, marker="|", s=200, color="black", zorder=3, label="TTFT p50")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel("ms (the typical request: the middle fifth by TTFT)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"Where TTFT goes — {suite}", fontsize=10)
    return Plot(f"{suite}-ttft-breakdown.png", suite, f"Where TTFT goes, suite {suite}",
                f"The typical traced request's TTFT by part, per configuration and cell of suite {suite}: the mean "
                f"parts of the middle {MIDDLE_SHARE:.0%} of requests ranked by TTFT, which add up to their TTFT; the "
                "tick is the median TTFT of the same requests.", png_of(fig, note), False)


def breakdown_plots(table: pd.DataFrame | None, configs: list[str], note: str = "") -> list[Plot]:
    if table is None or table.empty:
        return []
    found = [breakdown_plot(suite, sdf, configs, note) for suite, sdf in table.groupby("suite", sort=False)]
    return [p for p in found if p is not None]


def breakdown_view(table: pd.DataFrame | None, configs: list[str], tracing: bool | None, plots=(),
                   virtual: bool = False) -> dict:
    """What the section shows: `tracing` whether the spec traced requests (None: not known; `absent` says why
    there is nothing when there is nothing), the tables, the plots (breakdown_plots), the tolerances in words,
    whether any span was the simulator's, and whether they were made in virtual time (`virtual`: the run's clock)."""
    has = table is not None and not table.empty
    absent = ("Request tracing was off (the spec's `tracing.enabled: false`): no TTFT breakdown." if tracing is False
              else "No span of a traced request was collected: no TTFT breakdown.")
    return {"has_data": has, "absent": absent, "parts": [SHORT_TITLES[p] for p in PARTS],
            "suites": breakdown_rows(table, configs),
            "plots": [{"file": f"plots/{p.name}", "data_uri": p.data_uri(), "title": p.title, "caption": p.caption}
                      for p in plots],
            "emulated": bool(has and table["emulated"].astype(bool).any()), "virtual": bool(has and virtual),
            "tolerance": f"{SUM_TOLERANCE:.0%} (at least {SUM_TOLERANCE_MIN_MS:g} ms)",
            "clock_tolerance": f"{CLOCK_TOLERANCE_MS:g} ms", "middle": f"{MIDDLE_SHARE:.0%}",
            "flagged": int(table["disagree"].sum() + table["incomplete"].sum()) if has else 0}


def breakdown_lines(table: pd.DataFrame | None) -> list[str]:
    """One terminal line per configuration and cell: the typical request's parts and whether they add up to the
    median TTFT, from the cell's first trial with spans (the report's section has every trial)."""
    if table is None or table.empty:
        return []
    lines = []
    seen: set[tuple] = set()
    rows = table.sort_values("trial", kind="stable") if "trial" in table else table
    for r in rows.to_dict("records"):
        if r["typical_ttft_ms"] is None or pd.isna(r["typical_ttft_ms"]):
            continue
        key = (r["config"], r["suite"], r["workload"], r["concurrency"], r["stream"])
        if key in seen:
            continue
        seen.add(key)
        parts = " + ".join(f"{SHORT_TITLES[p]} {_ms(r[f'typical_{p}_ms'])}" for p in PARTS
                           if r[f"typical_{p}_ms"] and not pd.isna(r[f"typical_{p}_ms"]))
        where = f"{r['config']} {r['suite']} {cell_label(r['workload'], r['concurrency'], r['stream'], short=True)}"
        verdict = "" if r["adds_up"] else " — does not add up to the median TTFT"
        lines.append(f"TTFT {where}: {_ms(r['ttft_p50_ms'])} ms p50 = {parts} ms{verdict}")
    return lines
