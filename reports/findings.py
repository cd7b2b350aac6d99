"""The report's generated prose (pure): headline sentences, per-suite wins, benefits and trade-offs
against the baseline, limitations, and the comparison with previous runs. Every number is formatted
from data with reports.fmt.fmt; nothing is hand-written.
"""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.compare import CONTAMINATED, NOT_JUDGED, REPORT_METRICS, TIE, Comparison, wins
from epdbench.analysis.headline import Change, Finding, Tally
from epdbench.analysis.labels import cell_label
from epdbench.analysis.metrics import LOWER_IS_BETTER
from epdbench.analysis.regression import FLAGGED
from epdbench.analysis.samples import EarlyStops, PromptFit
from epdbench.analysis.trials import low_support
from epdbench.reports.fmt import METRIC_NAMES, fmt  # noqa: F401 - METRIC_NAMES re-exported
from epdbench.reports.verdict import contamination_line

GOOD_VERDICTS = {"verified", "emulated", "not-applicable"}


def value_text(metric: str, value: float | None) -> str:
    return f"{fmt(value, metric)} {METRIC_NAMES[metric][1]}"


def factor_text(factor: float) -> str:
    return f"{factor:.1f}×"


def movement(c: Change) -> str:
    """'fell from A on X to B on Y' with the direction of the numbers."""
    verb = "fell" if c.value < c.baseline_value else "rose"
    return (f"{METRIC_NAMES[c.metric][0]} {verb} from {value_text(c.metric, c.baseline_value)} on {c.baseline_config} "
            f"to {value_text(c.metric, c.value)} on {c.config}")


def size(c: Change) -> str:
    if c.better and c.metric in LOWER_IS_BETTER:
        return f"a {factor_text(c.factor)} reduction"
    return f"{factor_text(c.factor)} {'lower' if c.value < c.baseline_value else 'higher'}"


def short_movement(c: Change) -> str:
    verb = "fell" if c.value < c.baseline_value else "rose"
    return (f"{METRIC_NAMES[c.metric][0]} {verb} from {value_text(c.metric, c.baseline_value)} to "
            f"{value_text(c.metric, c.value)} ({factor_text(c.factor)} {'lower' if verb == 'fell' else 'higher'})")


def tied_text(f: Finding) -> str:
    """', tied within the noise with B (value)[ and C (value)]' for an improvement the Verdict calls a tie."""
    if not f.tied:
        return ""
    names = [f"{config} ({value_text(f.change.metric, value)})" for config, value in f.tied]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
    return f", tied within the noise with {listed}"


def headline_sentence(f: Finding) -> str:
    c = f.change
    text = (f"In suite {c.suite}, at {cell_label(c.workload, c.concurrency, c.stream)}, {movement(c)}, {size(c)}"
            f"{tied_text(f)}")
    if c.better:
        tail = (f"; the trade-off: {short_movement(f.counterpart)}" if f.counterpart
                else "; no other headline metric got worse in that cell")
    else:
        tail = f"; in exchange {short_movement(f.counterpart)}" if f.counterpart else "; nothing improved in exchange"
    return f"{text}{tail}."


def suite_prose(comparisons: list[Comparison]) -> list[str]:
    """Per metric: which configuration has the better value in how many of the suite's matched cells."""
    lines = []
    table = wins(comparisons)
    for metric in REPORT_METRICS:
        decided = [c for c in comparisons if c.metric == metric and sum(v is not None for v in c.values.values()) >= 2]
        if not decided:
            continue
        per = sorted(table.get(metric, {}).items(), key=lambda kv: -kv[1])
        best = "lowest" if metric in LOWER_IS_BETTER else "highest"
        name = METRIC_NAMES[metric][0]
        if metric in NOT_JUDGED:
            lines.append(f"{name}: one extreme sample per cell, shown but never judged.")
            continue
        if not per and not any(c.verdict == TIE and c.separated for c in decided):
            lines.append(f"{name}: no winner outside the noise in any of {len(decided)} matched cells.")
            continue
        for c in decided:   # a group tied ahead of the others counts as one entry
            if c.verdict == TIE and c.separated:
                label = " ≈ ".join(c.leaders) + " (tied ahead)"
                per_d = dict(per)
                per_d[label] = per_d.get(label, 0) + 1
                per = sorted(per_d.items(), key=lambda kv: -kv[1])
        counts = ", ".join(f"{cfg} in {n}" for cfg, n in per)
        ties = sum(c.verdict == TIE and not c.separated for c in decided)
        spoilt = sum(c.verdict == CONTAMINATED for c in decided)
        lines.append(f"{name} ({best} wins): {counts} of {len(decided)} matched cells"
                     + (f"; tie within noise in {ties}" if ties else "")
                     + (f"; contaminated by host load in {spoilt}" if spoilt else "") + ".")
    return lines


def typical_factor(n: int, factor: float) -> str:
    return f"median {factor_text(factor)}" if n > 1 else factor_text(factor)


def tally_sentence(t: Tally) -> str:
    parts = []
    if t.better:
        parts.append(f"better in {t.better} ({typical_factor(t.better, t.median_better)})")
    if t.worse:
        parts.append(f"worse in {t.worse} ({typical_factor(t.worse, t.median_worse)})")
    return f"{METRIC_NAMES[t.metric][0]} {' and '.join(parts)} of {t.cells} comparable cell{'s' * (t.cells != 1)}"


def benefits(tallies: list[Tally]) -> list[dict]:
    """Per configuration: its record against the baseline, metric by metric."""
    out: dict[str, list[str]] = {}
    for t in tallies:
        out.setdefault(t.config, []).append(tally_sentence(t))
    return [{"config": config, "lines": lines} for config, lines in out.items()]


def gpu_budget_line(configurations: list[dict]) -> str:
    gpus = {c["name"]: c["gpus"] for c in configurations}
    listing = ", ".join(f"{n} {g}" for n, g in gpus.items())
    if len(set(gpus.values())) > 1:
        return (f"Unequal GPU budgets ({listing} GPUs): absolute throughput favours the larger budgets; "
                "compare output tok/s per GPU.")
    return f"Equal GPU budgets ({listing} GPUs): absolute numbers compare directly."


def trials_line(trials: int) -> str:
    if trials > 1:
        return (f"{trials} trials per cell: tables show the mean ± the 95% confidence interval (Student t); a "
                "configuration wins a cell only when its interval and the runner-up's do not overlap.")
    return ("A single trial per cell: run-to-run noise is not measured, so a configuration wins a cell only when its "
            "value and the runner-up's lie apart by more than their bands — each percentile's 95% CI from the cell's "
            "own samples, at least the metric's documented run-to-run spread (and the cell's lag); repeat with "
            "trials > 1 to measure it.")


def low_support_line(agg: pd.DataFrame) -> str | None:
    if agg.empty:
        return None
    n = sum(1 for _, r in agg.iterrows() for m in REPORT_METRICS
            if r["trials"] == 1 and not pd.isna(r.get(m)) and low_support(m, r["n_ttft_samples"], r["n_itl_samples"]))
    if not n:
        return None
    return (f"{n} tail percentile values rest on too few samples for that percentile (marked †); "
            "they never make a headline.")


def prompt_line(fit: PromptFit | None) -> list[str]:
    if fit is None:
        return []
    if fit.max_abs_tokens == 0:
        lines = [f"Measured prompt lengths match their targets exactly over {fit.requests:,} measured requests."]
    else:
        lines = [f"Measured prompt lengths are within {fit.max_abs_tokens:,} tokens ({100 * fit.max_rel:.1f}%) of "
                 f"their targets over {fit.requests:,} measured requests."]
    lines += [f"By design, prompts of {w} (suite {s}) span {lo:,}–{hi:,} tokens." for s, w, lo, hi in fit.ranged_cells]
    return lines


def early_stop_line(stops: EarlyStops | None) -> str | None:
    if stops is None:
        return None
    if not stops.stopped_early:
        return (f"All {stops.requests:,} measured requests generated their full max_tokens, so output throughput "
                "compares like with like.")
    where = "; ".join(f"{cfg} {suite} {cell_label(w, c, short=True)}: {k}/{n}"
                      for cfg, suite, w, c, k, n in stops.where[:6])
    more = f" and {len(stops.where) - 6} more cells" if len(stops.where) > 6 else ""
    return (f"{stops.stopped_early:,} of {stops.requests:,} measured requests stopped before max_tokens ({where}{more}): "
            "their cells count fewer output tokens.")


def target_line(meta: dict) -> str:
    if meta.get("clock") == "virtual":
        return ("Simulator run in virtual time: every figure is the cost model's on a virtual clock (no process, no "
                "HTTP, no host noise), verdicts are emulated; it shows the shape of the trade-offs, never a "
                "hardware measurement.")
    if meta["target"] == "sim":
        return ("Simulator run: timings come from the cost model of the hardware figures, transport verdicts are "
                "emulated; it shows the shape of the trade-offs, never a hardware measurement.")
    if meta["target"] == "local":
        line = (f"Local run: real vLLM engines on this host's {(meta.get('device') or 'cpu').upper()}, a router in "
                "front, the load generator on loopback; transport verdicts come from the engines' own UCX, NIXL and "
                "encoder-cache connector lines and /metrics. Results hold for this host and these engine flags.")
        if meta.get("tiny_model"):
            line += (" The model is a tiny one made at run time with random weights: its timings show the serving "
                     "path's overheads, never a real model's.")
        elif meta.get("model_files") == "real-shapes":
            line += (f" The model has {meta.get('model')}'s real shapes, made at run time with random weights: its "
                     "timings are that model's compute and memory traffic, its outputs are noise.")
        if meta.get("gpu_share"):
            line += (" Every engine of a configuration shared one GPU (each with its share of its memory): PD and "
                     "EPD ran their roles side by side on one GPU's compute, not a GPU per role.")
        return line
    line = f"Hardware run on {meta['target']}: results hold for this node, image and engine flags."
    if meta.get("client") == "in-cluster":
        where = {"router-node": "on the router's node", "other-node": "on another node than the router's",
                 "any": "where the scheduler put it"}.get(meta.get("client_placement"), "")
        line += f" The load generator ran inside the cluster as a Job {where}, reaching the router by its Service."
    if meta.get("client") in ("service-proxy", "port-forward"):
        hop = "the API server's service proxy" if meta["client"] == "service-proxy" else "a port-forward"
        line += (f" The load generator ran outside the cluster and reached the router through {hop}: that hop "
                 "(and any coalescing of streamed chunks on it) is in every TTFT and ITL figure.")
    return line


def evidence_lines(meta: dict, verdicts: dict) -> list[str]:
    lines = [f"{name} failed ({why}): it is missing from the tables." for name, why in meta["failures"].items()]
    for name, v in verdicts.items():
        bad = [f"{kind} {v[kind]}" for kind in ("transport", "stages") if v[kind] not in GOOD_VERDICTS | {"not run"}]
        if bad:
            lines.append(f"{name}: {' and '.join(bad)} — its numbers do not show the deployment it was meant to be.")
    return lines


def failed_requests_line(summary: pd.DataFrame) -> str | None:
    if summary.empty:
        return None
    failed = pd.to_numeric(summary["requests_failed"], errors="coerce").fillna(0)
    if not failed.sum():
        return None
    return (f"{int(failed.sum()):,} measured requests failed; statistics use the successful ones "
            "(failures are counted in the Requests column).")


def limitations(meta: dict, summary: pd.DataFrame, agg: pd.DataFrame, verdicts: dict, fit: PromptFit | None,
                stops: EarlyStops | None) -> list[str]:
    lines = [gpu_budget_line(meta["configurations"]), trials_line(meta["trials"]), contamination_line(summary, meta),
             low_support_line(agg),
             *prompt_line(fit), early_stop_line(stops), failed_requests_line(summary), target_line(meta),
             *evidence_lines(meta, verdicts)]
    return [line for line in lines if line]


def flag_sentence(j: dict) -> str:
    name, unit = METRIC_NAMES[j["metric"]]
    against = "median" if j["method"].startswith("band") else "mean"
    cell = cell_label(j["workload"], j["concurrency"], j["stream"])
    return (f"{j['config']}, suite {j['suite']}, {cell}: {name} "
            f"{value_text(j['metric'], j['value'])} against a {against} of {value_text(j['metric'], j['baseline'])} "
            f"(band {fmt(j['band_low'], j['metric'])}–{fmt(j['band_high'], j['metric'])} {unit}) over "
            f"{j['n_history']} runs — {j['status']}"
            + ("." if j["change_pct"] is None else f", {j['change_pct']:+.1f}%."))


def method_line(s: dict) -> str:
    return (f"A metric is flagged when tonight's value lies outside median ± max({s['k']:g}·σ, "
            f"{100 * s['min_change']:g}%) of its last {s['last_n']} runs, σ = 1.4826·MAD (the larger of the cell's "
            f"own and the metric's pooled leave-one-out value; with trials > 1 tonight's whole 95% CI must lie "
            f"outside). Below {s['min_history']} runs, only repeated trials are compared (disjoint 95% CIs); "
            "otherwise nothing is flagged.")


def delta_table(judgements: list[dict], metrics: list[str]) -> list[dict]:
    """Rows per configuration × cell: per metric the change against its previous run and the status."""
    rows: dict[tuple, dict] = {}
    for j in judgements:
        key = (j["config"], j["suite"], j["workload"], j["concurrency"], j["stream"])
        row = rows.setdefault(key, {"config": j["config"], "suite": j["suite"],
                                    "cell": cell_label(j["workload"], j["concurrency"], j["stream"]), "cells": {}})
        delta = j["delta_pct"]
        row["cells"][j["metric"]] = {"text": "—" if delta is None else f"{delta:+.1f}%", "status": j["status"],
                                     "flagged": j["status"] in FLAGGED}
    blank = {"text": "—", "status": "", "flagged": False}
    return [{**r, "cells": [r["cells"].get(m, blank) for m in metrics]} for r in rows.values()]


def summary_line(check: dict | None) -> str | None:
    """One line for the report's summary: tonight against the run history."""
    if check is None or check["status"] in ("unavailable", "no-history"):
        return None
    o = check["overall"]
    return (f"Against the last {len(check['runs'])} run(s) of this spec: {o['regressions']} regression(s) and "
            f"{o['improvements']} improvement(s) beyond noise.")


def regression_line(check: dict | None) -> str:
    """One line for the Prefect artifact and the terminal."""
    if check is None:
        return "Regression check: not run."
    if check["status"] == "unavailable":
        return f"Regression check: history unavailable ({check['error']})."
    if check["status"] == "no-history":
        return "Regression check: no earlier run of this spec on this target yet."
    o = check["overall"]
    flagged = "; ".join(o["flagged"][:5]) + (f"; and {len(o['flagged']) - 5} more" if len(o["flagged"]) > 5 else "")
    return (f"Regression check against the last {len(check['runs'])} run(s): {o['regressions']} regression(s), "
            f"{o['improvements']} improvement(s) beyond noise" + (f": {flagged}." if flagged else "."))


def history_view(check: dict | None, meta: dict, metrics: list[str]) -> dict:
    """Section 'Comparison with previous runs': lines, flagged sentences and the change table."""
    view = {"lines": [], "flags": [], "columns": [METRIC_NAMES[m][0] for m in metrics], "rows": [],
            "summary": summary_line(check)}
    if check is None:
        view["lines"] = ["No history was read for this report, so tonight is not compared with earlier runs."]
    elif check["status"] == "unavailable":
        view["lines"] = [f"The run history could not be read from MLflow ({check['error']}): no comparison."]
    elif check["status"] == "no-history":
        view["lines"] = [f"No earlier run of spec {meta['spec']} on target {meta['target']} in this tracking store: "
                         "nothing to compare with yet."]
    else:
        newest = check["runs"][0]
        o = check["overall"]
        counts = {st: sum(j["status"] == st for j in check["judgements"])
                  for st in ("within-noise", "insufficient-history")}
        view["lines"] = [
            f"Compared with the last {len(check['runs'])} run(s) of spec {meta['spec']} on target "
            f"{meta['target']}; the newest is {newest['run_name']} ({newest['started']}).",
            method_line(check["settings"]),
            f"This run: {o['regressions']} regression(s) and {o['improvements']} improvement(s) beyond noise; "
            f"{counts['within-noise']} metric-cells within noise, {counts['insufficient-history']} without enough "
            "history."]
        view["flags"] = [flag_sentence(j) for j in check["judgements"] if j["status"] in FLAGGED]
        view["rows"] = delta_table(check["judgements"], metrics)
    return view


# Where each cache saves compute: the encoder cache on the role that runs the vision encoder, the prefix
# cache on the role that prefills (first role present wins).
ENCODER_ROLES = ("encode", "server", "prefill")
PREFILL_ROLES = ("server", "prefill")


def percent(rate: float | None) -> str:
    return "—" if rate is None else f"{100 * rate:.0f}%"


def cache_text(cache: dict[str, dict]) -> str | None:
    """One role after the other: what its prefix and encoder caches served, and the prompt tokens it
    received by KV transfer, over a suite's window."""
    parts = []
    for role, c in cache.items():
        bits = []
        if c.get("prefix_queries"):
            bits.append(f"prefix-cache hits {percent(c['prefix_hit_rate'])} of {c['prefix_queries']:,.0f} prompt tokens")
        if c.get("mm_queries"):
            bits.append(f"encoder-cache hits {percent(c['mm_hit_rate'])} of {c['mm_queries']:,.0f} images")
        if c.get("kv_transfer_tokens"):
            bits.append(f"{c['kv_transfer_tokens']:,.0f} prompt tokens received by KV transfer")
        if bits:
            parts.append(f"{role}: {', '.join(bits)}")
    return "; ".join(parts) or None


def role_rate(cache: dict[str, dict], roles: tuple[str, ...], key: str) -> tuple[str | None, float | None]:
    """(role, hit rate) of the first role in `roles` that queried that cache."""
    queries = "mm_queries" if key == "mm_hit_rate" else "prefix_queries"
    for role in roles:
        if cache.get(role, {}).get(queries):
            return role, cache[role][key]
    return None, None


def reuse_view(meta: dict, agg: pd.DataFrame, verdicts: dict) -> dict | None:
    """What reusing one image bought, per configuration. Each cell of a reuse suite is paired with the
    same workload and concurrency in a suite with unique images (the control), when the spec has one;
    the cache-hit rates of both suites say which cache served the reuse."""
    reuse = [s for s in meta.get("reuse_suites", []) if not agg.empty and s in set(agg["suite"])]
    if not reuse:
        return None
    unique = agg[~agg["suite"].isin(meta.get("reuse_suites", []))]
    rows = []
    for _, r in agg[agg["suite"].isin(reuse)].iterrows():
        ctrl = unique[(unique["config"] == r["config"]) & (unique["workload"] == r["workload"])
                      & (unique["concurrency"] == r["concurrency"]) & (unique["stream"] == r["stream"])]
        c = ctrl.iloc[0] if len(ctrl) else None
        caches = {s: verdicts.get(r["config"], {}).get("suites", {}).get(s, {}).get("cache", {})
                  for s in (r["suite"], c["suite"] if c is not None else None) if s}
        enc_role, enc = role_rate(caches[r["suite"]], ENCODER_ROLES, "mm_hit_rate")
        pre_role, pre = role_rate(caches[r["suite"]], PREFILL_ROLES, "prefix_hit_rate")
        row = {"config": r["config"], "suite": r["suite"], "workload": r["workload"],
               "concurrency": int(r["concurrency"]), "ttft": fmt(r.get("ttft_p50_ms"), "ttft_p50_ms"),
               "control_suite": None, "control_ttft": "—", "gain": "—",
               "encoder": f"{percent(enc)} ({enc_role})" if enc_role else "—",
               "prefix": f"{percent(pre)} ({pre_role})" if pre_role else "—"}
        if c is not None:
            row["control_suite"] = c["suite"]
            row["control_ttft"] = fmt(c.get("ttft_p50_ms"), "ttft_p50_ms")
            a, b = r.get("ttft_p50_ms"), c.get("ttft_p50_ms")
            if a and b and not (pd.isna(a) or pd.isna(b)):
                row["gain"] = f"{factor_text(b / a)} {'lower' if a < b else 'higher'}"
            cc = caches[c["suite"]]
            row["encoder"] += f" vs {percent(role_rate(cc, ENCODER_ROLES, 'mm_hit_rate')[1])}" if enc_role else ""
            row["prefix"] += f" vs {percent(role_rate(cc, PREFILL_ROLES, 'prefix_hit_rate')[1])}" if pre_role else ""
        rows.append(row)
    controlled = any(row["control_suite"] for row in rows)
    return {"rows": rows, "controlled": controlled, "suites": reuse,
            "controls": sorted({row["control_suite"] for row in rows if row["control_suite"]})}
