"""Report rendering (pure): summary rows, records, evidence verdicts, environment and run history →
one context → Markdown (report.md) and self-contained HTML (report.html, plots inline).

Templates are rendered with the project's one Jinja environment (epdbench.templating.make_env).
"""
from __future__ import annotations

from pathlib import Path

import jinja2
import pandas as pd

from epdbench.analysis.compare import REPORT_METRICS, Comparison, compare, ratio_phrase
from epdbench.analysis.headline import MIN_HEADLINE_FACTOR, baseline_config, changes_vs_baseline, headline, tallies
from epdbench.analysis.labels import cell_label, load_label, shape_label
from epdbench.analysis.pareto import pareto_points
from epdbench.analysis.regression import REGRESSION_METRICS
from epdbench.analysis.samples import early_stops, prompt_fit
from epdbench.analysis.trials import aggregate_trials, low_support
from epdbench.reports.breakdown import breakdown_view
from epdbench.reports.footing import gpu_footing
from epdbench.reports.findings import (benefits, cache_text, headline_sentence, history_view, limitations, reuse_view,
                                       suite_prose)
from epdbench.reports.goodput import throughput_goodput_gaps
from epdbench.reports.pareto import pareto_view
from epdbench.reports.verdict import contamination_line, verdict_view
from epdbench.reports.fmt import fmt, matched_order
from epdbench.templating import make_env

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"

COLUMN_TITLES = {
    "ttft_p50_ms": "TTFT p50 (ms)", "ttft_p95_ms": "TTFT p95 (ms)", "tpot_p50_ms": "TPOT p50 (ms)",
    "itl_p99_ms": "ITL p99 (ms)", "itl_max_ms": "ITL max (ms)", "output_tok_s": "Output tok/s", "req_s": "Req/s",
    "output_tok_s_per_gpu": "tok/s per GPU",
}
RATIO_METRICS = ("ttft_p50_ms", "itl_p99_ms", "output_tok_s")
ROLE_COUNTS = {"completions": "Completions", "renders": "Renders", "errors": "Errors", "request_ids": "Request ids"}


def report_env(html: bool = False) -> jinja2.Environment:
    return make_env(TEMPLATE_DIR, html=html, filters={"cache_text": lambda cache: cache_text(cache or {})})


def _cell(row, metric: str, best: Comparison | None) -> dict:
    """One table cell: text (mean, ± CI, † on low support) and whether it leads the matched cell: the winner, or
    one of the configurations tied within noise ahead of another."""
    text = fmt(row[metric], metric)
    ci = row.get(f"{metric}_ci95")
    if ci is not None and not pd.isna(ci) and text != "—":
        text += f" ± {fmt(ci, metric)}"
    if row["trials"] == 1 and low_support(metric, row["n_ttft_samples"], row["n_itl_samples"]) and text != "—":
        text += " †"
    return {"text": text, "best": bool(best and best.separated and row["config"] in best.leaders)}


def ratio_line(c: Comparison) -> str:
    return (f"{cell_label(c.workload, c.concurrency, c.stream, short=True)}: {COLUMN_TITLES[c.metric]} {c.leader} "
            f"{fmt(c.values[c.leader], c.metric)} vs {c.worst} {fmt(c.values[c.worst], c.metric)} — "
            f"{ratio_phrase(c.metric, c.ratio)}")


def suite_tables(summary: pd.DataFrame, comparisons: list[Comparison]) -> list[dict]:
    """Per suite: rows (one per cell × config; means ± 95% CI over trials), the leading values per matched cell
    (outside the noise of another) flagged `best`, low-support tails marked †, contaminated rows, ratio lines
    (best vs worst, when apart beyond the noise) and generated prose."""
    best = {(c.suite, c.workload, c.concurrency, c.stream, c.metric): c for c in comparisons}
    agg = aggregate_trials(summary)
    out = []
    for suite, sdf in (agg.groupby("suite", sort=False) if not agg.empty else []):
        rows = []
        for _, r in matched_order(sdf).iterrows():      # the rows of one matched cell together
            key = (suite, r["workload"], r["concurrency"], r["stream"])
            rows.append({"config": r["config"], "contaminated": bool(r.get("contaminated")),
                         "workload": r["workload"], "concurrency": int(r["concurrency"]),
                         "shape": shape_label(r["workload"], r["stream"]),
                         "load": load_label(r["workload"], r["concurrency"]),
                         "stream": r["stream"], "requests": f"{int(r['requests_ok'])}/{int(r['requests_total'])}",
                         "cells": [_cell(r, m, best.get((*key, m))) for m in REPORT_METRICS]})
        mine = [c for c in comparisons if c.suite == suite]
        ratios = [ratio_line(c) for c in mine if c.ratio is not None and c.separated and c.metric in RATIO_METRICS]
        out.append({"name": suite, "rows": rows, "ratios": ratios, "prose": suite_prose(mine)})
    return out


def configuration_rows(meta: dict, verdicts: dict, environment: dict | None) -> list[dict]:
    """What was compared, with the environment and evidence of each configuration."""
    env = (environment or {}).get("configurations", {})
    rows = []
    for c in meta["configurations"]:
        v = verdicts.get(c["name"], {})
        e = env.get(c["name"], {})
        rows.append({**c, "transport_verdict": v.get("transport", "not run"), "stages_verdict": v.get("stages", "not run"),
                     "ec_verdict": v.get("ec_transport"),
                     "connectors": e.get("connectors", "—"), "rdma_interfaces": e.get("rdma_interfaces", 0),
                     "role_flags": e.get("role_flags", {})})
    return rows


ROLE_ORDER = ("encode", "prefill", "decode", "server", "router")    # a request's path through a deployment


def _role_rank(name: str) -> tuple:
    """A role, or a pod named after its role (prefill-0), by its place on the path, then by name."""
    role = name.rsplit("-", 1)[0] if name.rsplit("-", 1)[-1].isdigit() else name
    return (ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER), name)


def in_configuration_order(verdicts: dict, configurations: list[dict], suites: list[str] = ()) -> dict:
    """The verdicts in the spec's configuration order, and within each its roles and pods in path order and
    its suites in `suites`' order (the run's): the same report whether the verdicts come from the run or from
    outcome.json (written with sorted keys)."""
    order = [c["name"] for c in configurations if c["name"] in verdicts]

    def by_role(v: dict, keys) -> dict:
        return {**v, **{k: dict(sorted(v[k].items(), key=lambda kv: _role_rank(kv[0])))
                        for k in keys if isinstance(v.get(k), dict)}}

    def ordered(v: dict) -> dict:
        v = by_role(v, ("per_role", "fraction_seen", "observed"))
        if isinstance(v.get("suites"), dict):
            rank = {s: i for i, s in enumerate(suites)}
            v["suites"] = {s: by_role(e, ("cache", "fraction_seen")) if isinstance(e, dict) else e
                           for s, e in sorted(v["suites"].items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))}
        return v
    return {name: ordered(verdicts[name]) for name in order + [n for n in verdicts if n not in order]}


def role_count_rows(verdicts: dict) -> list[dict]:
    return [{"config": name, "role": role, "counts": [counts.get(k, "—") for k in ROLE_COUNTS],
             "seen": v.get("fraction_seen", {}).get(role)}
            for name, v in verdicts.items() for role, counts in v.get("per_role", {}).items()]


def plot_groups(plots) -> list[dict]:
    groups: dict[str, list] = {}
    for p in plots:
        groups.setdefault(p.suite, []).append({"file": f"plots/{p.name}", "data_uri": p.data_uri(), "title": p.title,
                                               "caption": p.caption, "wide": p.wide})
    return [{"suite": suite, "plots": items} for suite, items in groups.items()]


def report_context(meta: dict, summary: pd.DataFrame, verdicts: dict[str, dict], environment: dict | None = None,
                   records: pd.DataFrame | None = None, history: dict | None = None, plots=(),
                   goodput: dict | None = None, breakdown: dict | None = None, pareto: dict | None = None) -> dict:
    """Everything both templates show. `environment` from reports.environment, `records` the raw request
    rows (prompt fit, early stops), `history` a regression check result, `plots` from reports.plots,
    `goodput` from reports.goodput.goodput_view, `breakdown` from reports.breakdown.breakdown_view (None: the
    section says no request was traced), `pareto` from reports.pareto.pareto_view (None: the summary's points
    without a price or plots)."""
    records = records if records is not None else pd.DataFrame()
    comparisons = compare(summary)
    agg = aggregate_trials(summary)
    baseline = baseline_config(meta["configurations"])
    changes = changes_vs_baseline(agg, baseline) if baseline else []
    ordered = in_configuration_order(verdicts, meta["configurations"],
                                     list(dict.fromkeys(summary["suite"])) if "suite" in summary else [])
    return {
        "meta": meta,
        "baseline": baseline,
        "configurations": configuration_rows(meta, verdicts, environment),
        "environment": environment,
        "columns": [COLUMN_TITLES[m] for m in REPORT_METRICS],
        "suites": suite_tables(summary, comparisons),
        "verdict": verdict_view(comparisons),
        "gpu_footing": gpu_footing(meta),
        "contamination": contamination_line(summary, meta),
        "goodput": goodput,
        "breakdown": breakdown or breakdown_view(None, [], None),
        "pareto": pareto or pareto_view(pareto_points(summary), meta),
        "goodput_gaps": throughput_goodput_gaps(comparisons, (goodput or {}).get("table"),
                                                {c["name"]: c["gpus"] for c in meta["configurations"]}),
        "headline": [headline_sentence(f) for f in headline(changes, comparisons)],
        "headline_min_factor": f"{MIN_HEADLINE_FACTOR:g}×",
        "n_compared": int(summary["config"].nunique()) if not summary.empty else 0,
        "benefits": benefits(tallies(changes)),
        "reuse": reuse_view(meta, agg, verdicts),
        "limitations": limitations(meta, summary, agg, verdicts, prompt_fit(records), early_stops(records)),
        "plot_groups": plot_groups(plots),
        "verdicts": ordered,
        "role_columns": list(ROLE_COUNTS.values()),
        "role_counts": role_count_rows(ordered),
        "history": history_view(history, meta, REGRESSION_METRICS),
    }


def render_markdown(context: dict) -> str:
    """report.md from the context; plots referenced as files under plots/."""
    return report_env().get_template("report.md.j2").render(**context)


def render_report(meta: dict, summary: pd.DataFrame, verdicts: dict[str, dict], environment: dict | None = None,
                  records: pd.DataFrame | None = None, history: dict | None = None, plots=(),
                  goodput: dict | None = None, breakdown: dict | None = None, pareto: dict | None = None) -> str:
    """report.md straight from the data."""
    return render_markdown(report_context(meta, summary, verdicts, environment, records, history, plots, goodput,
                                          breakdown, pareto))


def render_html(context: dict) -> str:
    """report.html from the same context: self-contained, plots as data URIs, autoescaped."""
    return report_env(html=True).get_template("report.html.j2").render(**context)
