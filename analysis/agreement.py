"""Do the virtual-time core and the HTTP simulator agree? (pure)

Per matched cell and metric, the virtual figure agrees with the HTTP one when their difference lies within
the HTTP cell's own noise band (analysis.noise.band: its sample CI, floored by the run-to-run spread, and its
lag) plus, for TTFT, what remains of the host path: the HTTP simulator's client, router and API-server hops run
on the host in real time, which the virtual core models as hardware.request_hop_ms per exchange (HOST_PATH_MS:
benchmarks/simulator/vtime_agreement.py on the smoke preset left −2 to +2.5 ms at concurrency 1 with it, 3–13 ms
without). The virtual core has no
measurement noise of its own (one seeded run is the answer). An HTTP cell contaminated by host load
(analysis.noise.is_contaminated: its lag p99 above a share of what it reports) is no reference: its rows are
shown but not judged (`judged` False), as such a cell names no winner in a comparison.
"""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.noise import band, finite

KEYS = ["config", "suite", "workload", "concurrency", "stream"]
METRICS = ["ttft_p50_ms", "tpot_p50_ms", "itl_p99_ms", "output_tok_s"]
# Shown beside them, not judged: an upper percentile of a few requests (the smoke preset's mixed streams have 16
# and 8) has no sample CI to judge by, and where the two streams' requests meet depends on the host path.
INFORMATIVE = ["ttft_p95_ms"]
HOST_PATH_MS = 10.0      # allowance for TTFT: the host path's jitter and what request_hop_ms leaves (see above)
THROUGHPUT_SHARE = 0.05  # throughput also carries the host path once per request: 5% beyond its band
COLUMNS = KEYS + ["metric", "http", "virtual", "ratio", "allowed", "agrees", "judged"]


def allowance(row: dict, metric: str) -> float:
    """How far the virtual figure may lie from the HTTP `row[metric]`."""
    value = finite(row.get(metric)) or 0.0
    extra = HOST_PATH_MS if metric.startswith("ttft") else THROUGHPUT_SHARE * value if metric == "output_tok_s" else 0
    return band({**row, "trials": 1}, metric) + extra


def _contaminated(row: dict) -> bool:
    flag = row.get("contaminated")
    return bool(flag) and not (isinstance(flag, float) and flag != flag)   # NaN: not known, so judged


def agreement(http: pd.DataFrame, virtual: pd.DataFrame, metrics: list[str] | None = None) -> pd.DataFrame:
    """One row per matched cell (first trial) and metric: both figures, their ratio, the allowance, whether they
    agree and whether the pair is judged (the HTTP cell not contaminated). Cells only one side has are left out."""
    metrics = [m for m in (metrics or METRICS) if m in http.columns and m in virtual.columns]
    h = http[http["trial"] == http["trial"].min()] if "trial" in http else http
    v = virtual[virtual["trial"] == virtual["trial"].min()] if "trial" in virtual else virtual
    merged = h.merge(v[KEYS + metrics], on=KEYS, suffixes=("", "__virtual"))
    rows = []
    for r in merged.to_dict("records"):
        for m in metrics:
            hv, vv = finite(r.get(m)), finite(r.get(f"{m}__virtual"))
            if hv is None or vv is None:
                continue
            allowed = allowance(r, m)
            rows.append({**{k: r[k] for k in KEYS}, "metric": m, "http": hv, "virtual": vv,
                         "ratio": vv / hv if hv else None, "allowed": allowed, "agrees": abs(vv - hv) <= allowed,
                         "judged": not _contaminated(r)})
    return pd.DataFrame(rows, columns=COLUMNS)
