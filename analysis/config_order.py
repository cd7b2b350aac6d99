"""Does the simulator order configurations as the real engines do? (pure)

A truth table of several configurations (benchmarks/simulator/truth_from_run.py: aggregated, PD and EPD on one GPU)
holds each cell (suite, workload, concurrency, stream) once per configuration. Per cell and ranked metric, with the
configurations that have the figure on both sides:

- the winner: the best figure (lowest latency, highest output tok/s) on the real engines and on the simulator;
- every pair of configurations: which of the two is better, on each side.

A real difference inside the noise is a tie, not a finding: a judgement is counted only where the real difference
lies outside the metric's tie band — the winner's over the runner-up's, or the pair's — the larger figure over
the smaller one minus 1 above the band. A truth table carries no spread of its own (one trial per cell, no
interval), so the band is relative, TIE_BAND. The simulator, deterministic in virtual time (every configuration
served the same seeded requests), needs no noise band: its order is its figures' order, save that two figures under
EVEN (0.1 %) apart it calls even and orders neither way, a margin that thin being no prediction of which is better
— such a judgement disagrees with a real order outside the band.

Ranked: the client's figures (RANKED), what a configuration is chosen by. The engine's own figures are left out:
they time different engines in different topologies (the aggregated engine encodes and prefills, EPD's prefill
engine loads the encoder's outputs), so which configuration's engine is faster is not a choice a user makes; the
simulator's engine figures are checked per cell against the real ones (analysis.sim_vs_real).
"""
from __future__ import annotations

from itertools import combinations

import pandas as pd

from epdbench.analysis.labels import cell_label
from epdbench.analysis.metrics import HIGHER_IS_BETTER

RANKED = ["ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "output_tok_s"]
# The tie bands: benchmarks/data/README.md, "Machine to machine" — the same cells on two H100 80GB HBM3 machines,
# median |ratio − 1| TTFT p50 4.5 %, TTFT p99 4.3 %, TPOT 2.9 %, ITL p99 5.4 %, output tok/s 2.8 %: 5 % for the
# latencies, 6 % for ITL p99 (its spread is above 5 %), 3 % for throughput.
TIE_BAND = {"ttft_p50_ms": 0.05, "ttft_p99_ms": 0.05, "tpot_p50_ms": 0.05, "itl_p99_ms": 0.06, "output_tok_s": 0.03}
EVEN = 0.001
CELL = ["suite", "workload", "concurrency", "stream"]
SHORT = {"ttft_p50_ms": "TTFT p50", "ttft_p99_ms": "TTFT p99", "tpot_p50_ms": "TPOT p50", "itl_p99_ms": "ITL p99",
         "output_tok_s": "out tok/s"}


def apart(a: float, b: float) -> float:
    """How far apart two positive figures are: the larger over the smaller, minus 1."""
    return max(a, b) / min(a, b) - 1


def _better(metric: str, a: float, b: float) -> bool:
    return a > b if metric in HIGHER_IS_BETTER else a < b


def _ranked(metric: str, figures: dict[str, float]) -> list[str]:
    """The configurations best first (ties in the given order)."""
    return sorted(figures, key=lambda c: -figures[c] if metric in HIGHER_IS_BETTER else figures[c])


def _side(metric: str, figures: dict[str, float]) -> tuple[str, str, float]:
    """(the best configuration, the runner-up, how far apart their figures are)."""
    first, second = _ranked(metric, figures)[:2]
    return first, second, apart(figures[first], figures[second])


def judgements(real: pd.DataFrame, sim: pd.DataFrame, metrics: list[str] = RANKED,
               bands: dict[str, float] = TIE_BAND) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(winners, pairs) of the cells of `real` (index MATCH_KEYS) and `sim` (the same cells simulated).

    winners: one row per cell and metric where at least two configurations have a positive figure on both sides:
    the real best and runner-up and how far apart (`real_best`, `real_next`, `real_apart`), the same on the
    simulator, how far the simulator's best is ahead of the real best there (`sim_over_real_best`, 0 when they are
    one), `judged` (the real gap outside the band) and `agrees` (the simulator's best is the real one, ahead of its
    own runner-up).
    pairs: one row per such cell, metric and pair of configurations (`a`, `b` in the table's order): each side's
    better one (`real_better`, `sim_better`: None where the simulator's two are under EVEN apart), how far apart,
    `judged` and `agrees`."""
    winners, pairs = [], []
    metrics = [m for m in metrics if m in real.columns and m in sim.columns]
    both = real[metrics].join(sim.reindex(index=real.index, columns=metrics).add_suffix("__sim"))
    for cell, group in both.groupby(level=CELL, sort=False):
        configs = list(group.index.get_level_values("config"))
        for m in metrics:
            r, s = group[m].astype(float).to_numpy(), group[f"{m}__sim"].astype(float).to_numpy()
            have = [i for i in range(len(configs)) if r[i] > 0 and s[i] > 0]   # NaN compares False
            if len(have) < 2:
                continue
            rf, sf = {configs[i]: float(r[i]) for i in have}, {configs[i]: float(s[i]) for i in have}
            band, key = bands[m], dict(zip(CELL, cell))
            rb, rn, ra = _side(m, rf)
            sb, sn, sa = _side(m, sf)
            winners.append({**key, "metric": m, "configs": len(have), "real_best": rb, "real_next": rn,
                            "real_apart": ra, "sim_best": sb, "sim_next": sn, "sim_apart": sa,
                            "sim_over_real_best": apart(sf[sb], sf[rb]), "band": band,
                            "judged": ra > band, "agrees": sb == rb and sa > EVEN})
            for a, b in combinations(rf, 2):
                ra, sa = apart(rf[a], rf[b]), apart(sf[a], sf[b])
                real_better = a if _better(m, rf[a], rf[b]) else b
                sim_better = None if sa <= EVEN else a if _better(m, sf[a], sf[b]) else b
                pairs.append({**key, "metric": m, "a": a, "b": b, "real_better": real_better, "real_apart": ra,
                              "sim_better": sim_better, "sim_apart": sa, "band": band, "judged": ra > band,
                              "agrees": sim_better == real_better})
    columns = [*CELL, "metric"]
    return (pd.DataFrame(winners, columns=[*columns, "configs", "real_best", "real_next", "real_apart", "sim_best",
                                           "sim_next", "sim_apart", "sim_over_real_best", "band", "judged",
                                           "agrees"]),
            pd.DataFrame(pairs, columns=[*columns, "a", "b", "real_better", "real_apart", "sim_better", "sim_apart",
                                         "band", "judged", "agrees"]))


def agreement(rows: pd.DataFrame) -> tuple[int, int, int]:
    """(judgements the simulator agrees with, judgements: the real difference outside the band, ties: inside)."""
    judged = rows[rows["judged"].astype(bool)]
    return int(judged["agrees"].astype(bool).sum()), len(judged), len(rows) - len(judged)


def _share(k: int, n: int) -> str:
    return f"{k} of {n} judgements ({k / n:.1%})" if n else "0 of 0 judgements (—)"


def _cell(row: dict) -> str:
    cell = cell_label(row["workload"], row["concurrency"], row["stream"], short=True)
    return f"{row['suite']} {cell} {SHORT.get(row['metric'], row['metric'])}"


def _lead(who: str, other: str, gap: float) -> str:
    """'a 12.0% ahead of b', or where the two are under EVEN apart 'a and b even'."""
    return f"{who} {gap:.1%} ahead of {other}" if gap > EVEN else f"{who} and {other} even"


def band_text(bands: dict[str, float] = TIE_BAND, metrics: list[str] = RANKED) -> str:
    """The tie bands in words: 'TTFT p50 5%, …'."""
    return ", ".join(f"{SHORT.get(m, m)} {bands[m]:.0%}" for m in metrics)


def lines(winners: pd.DataFrame, pairs: pd.DataFrame) -> list[str]:
    """The agreement figures (winners, pairwise orders, and each metric's), then every judgement the simulator
    disagrees with: a cell and metric per line, both sides' order and how far apart."""
    wk, wn, wt = agreement(winners)
    pk, pn, pt = agreement(pairs)
    out = [f"winner agreement: {_share(wk, wn)}; {wt} cell-metrics a tie on the real engines, not counted",
           f"pairwise-order agreement: {_share(pk, pn)}; {pt} pairs a tie on the real engines, not counted"]
    per_metric = []
    for m, g in winners.groupby("metric", sort=False):
        (w, wj, _), (p, pj, _) = agreement(g), agreement(pairs[pairs["metric"] == m])
        per_metric.append(f"{SHORT.get(m, m)} {w}/{wj} winners, {p}/{pj} pairs")
    if per_metric:
        out.append("per metric: " + "; ".join(per_metric))
    wrong = [r for r in winners.to_dict("records") if r["judged"] and not r["agrees"]]
    out.append(f"winner disagreements ({len(wrong)}):" if wrong else "winner disagreements: none")
    out += [f"  {_cell(r)}: real {_lead(r['real_best'], r['real_next'], r['real_apart'])}; sim {_sim_winner(r)}"
            for r in wrong]
    wrong = [r for r in pairs.to_dict("records") if r["judged"] and not r["agrees"]]
    out.append(f"pairwise disagreements ({len(wrong)}):" if wrong else "pairwise disagreements: none")
    for r in wrong:
        sim_better = r["sim_better"] if isinstance(r["sim_better"], str) else r["a"]     # None or NaN: even
        out.append(f"  {_cell(r)}: real {_lead(r['real_better'], _other(r, r['real_better']), r['real_apart'])}; "
                   f"sim {_lead(sim_better, _other(r, sim_better), r['sim_apart'])}")
    return out


def _sim_winner(row: dict) -> str:
    """The simulator's winner against the real one: 'b first, 8.0% ahead of a', or 'a and b even'."""
    if row["sim_best"] == row["real_best"]:
        return _lead(row["sim_best"], row["sim_next"], row["sim_apart"])
    if row["sim_over_real_best"] <= EVEN:
        return _lead(row["real_best"], row["sim_best"], 0.0)
    return f"{row['sim_best']} first, {row['sim_over_real_best']:.1%} ahead of {row['real_best']}"


def _other(pair: dict, who: str) -> str:
    return pair["b"] if who == pair["a"] else pair["a"]
