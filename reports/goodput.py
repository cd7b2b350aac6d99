"""The report's Goodput section (pure): the goodput table, each rate suite's SLO in words, and why the Verdict and
the goodput can name different configurations for the same rate cells."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.compare import CONTAMINATED, TIE, Comparison
from epdbench.analysis.goodput import slo_text
from epdbench.specs.models import Slo
from epdbench.specs.workload import split_rate

THROUGHPUT_METRIC = "output_tok_s_per_gpu"     # the Verdict's throughput column


def goodput_view(table: pd.DataFrame | None, slos: dict[str, Slo]) -> dict | None:
    """Rows for the Goodput table, and per suite its SLO; None when no rate suite had an SLO. `table` (the
    goodput table itself) goes along for what is computed against the Verdict (throughput_goodput_gaps)."""
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
                                   if s in set(table["suite"])], "table": table}


def _known(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def _goodput_text(r) -> str:
    value, per_gpu = _known(r["goodput_req_s"]), _known(r["goodput_req_s_per_gpu"])
    if value is None:
        return f"< {r['upper_req_s']:g} req/s"
    return f"{value:g} req/s" + (f" ({per_gpu:.3g} per GPU)" if per_gpu is not None else "")


def _higher(a, b) -> bool:
    """Whether goodput row `a` is higher than `b`: per GPU where both have it (the Verdict's throughput is per
    GPU), else in req/s; a goodput beats none (no swept rate sustained)."""
    a_val, b_val = _known(a["goodput_req_s"]), _known(b["goodput_req_s"])
    if a_val is None:
        return False
    if b_val is None:
        return True
    a_gpu, b_gpu = _known(a["goodput_req_s_per_gpu"]), _known(b["goodput_req_s_per_gpu"])
    return a_gpu > b_gpu if a_gpu is not None and b_gpu is not None else a_val > b_val


def _in_rate_cell(c: Comparison, suite: str, shape: str) -> bool:
    cell_shape, rate = split_rate(c.workload)
    return c.suite == suite and cell_shape == shape and rate is not None


def throughput_goodput_gaps(comparisons: list[Comparison], table: pd.DataFrame | None,
                            gpus: dict[str, int] | None = None) -> list[str]:
    """One sentence per rate suite and shape where the Verdict and the goodput seem to disagree: a configuration
    wins throughput per GPU in some of the rate cells while another has the higher goodput (per GPU where known).
    When the winner leads in none of those cells on absolute throughput and has fewer GPUs (`gpus`), the sentence
    says its lead is its budget. Empty when they agree."""
    if table is None or table.empty:
        return []
    lines = []
    for (suite, shape), g in table.groupby(["suite", "shape"], sort=False):
        mine = [c for c in comparisons if _in_rate_cell(c, suite, shape)]
        judged = [c for c in mine if c.metric == THROUGHPUT_METRIC and c.verdict is not None]
        wins: dict[str, int] = {}
        for c in judged:
            if c.verdict not in (TIE, CONTAMINATED):
                wins[c.verdict] = wins.get(c.verdict, 0) + 1
        rows = {r["config"]: r for _, r in g.iterrows()}
        for winner, n in sorted(wins.items(), key=lambda kv: -kv[1]):
            better = [r for cfg, r in rows.items() if cfg != winner and _higher(r, rows[winner])] if winner in rows else []
            if not better:
                continue
            best = next(r for r in better if not any(_higher(o, r) for o in better))
            lines.append(f"Suite {suite} ({shape}): {winner} wins output throughput per GPU in {n} of {len(judged)} "
                         f"rate cells, yet {best['config']} has the higher goodput, {_goodput_text(best)} against "
                         f"{winner}'s {_goodput_text(rows[winner])}: throughput per GPU at an offered rate counts "
                         "every request that completed, whether or not it met the SLO, while goodput counts only the "
                         f"rates at which SLO attainment held{_budget(winner, best['config'], mine, gpus)}.")
            break
    return lines


def _where(c: Comparison) -> tuple:
    return c.workload, c.concurrency, c.stream


def _beats(c: Comparison, a: str, b: str) -> bool:
    """Whether `a` is better than `b` beyond the noise in comparison `c`: its winner, or tied ahead of `b`."""
    return c.verdict == a or (c.separated and a in c.leaders and b not in c.leaders)


def _budget(winner: str, other: str, cells: list[Comparison], gpus: dict[str, int] | None) -> str:
    """The clause that puts a per-GPU lead down to the GPU budget: the winner has fewer GPUs and beats the other on
    absolute output throughput in none of the cells where it leads per GPU ('' otherwise)."""
    mine, theirs = (gpus or {}).get(winner), (gpus or {}).get(other)
    led = {_where(c) for c in cells if c.metric == THROUGHPUT_METRIC and c.verdict == winner}
    absolute = [c for c in cells if c.metric == "output_tok_s" and _where(c) in led]
    if not (mine and theirs and mine < theirs and absolute) or any(_beats(c, winner, other) for c in absolute):
        return ""
    return (f" — and {winner}'s absolute output throughput beats {other}'s in none of those cells (at an offered "
            "rate, completing the same requests makes the same tokens per second), so its lead per GPU is its "
            f"{mine} GPU{'s' * (mine != 1)} against {other}'s {theirs}")
