"""Where a request's TTFT goes (pure pandas; no I/O): the client-measured TTFT of each traced request (records)
split into parts from its spans (traces/<config>.parquet rows), then each part's median and p95 per cell.

The parts, from vLLM's own timestamps (vllm/v1/engine/output_processor.py `do_tracing`, RequestStateStats of
vllm/v1/metrics/stats.py): an engine's `llm_request` span carries `time_in_queue` = scheduled_ts − queued_ts (its
engine core's waiting queue: received from the API server → first scheduled) and `time_in_model_prefill` =
first_token_ts − scheduled_ts (first scheduled → the step that produced its first token). Each part is engine-core
time on the request's path; what is outside every engine core is `rest`:

- queue: the engines' time_in_queue (encode, prefill, aggregated; the decode's when its KV wait is a span of its own).
- encode: the encode engine's time_in_model_prefill (EPD, requests with images). The simulator's encode role sets
  it to its encoder's modelled time (and time_in_queue to its wait for the encoder). A span without it gives its
  whole leg, gen_ai.latency.e2e (receipt → response end, its API server included), and the cell says so
  (`encode_source` span).
- prefill: the prefill engine's time_in_model_prefill (PD, EPD), or the aggregated engine's (which samples the
  first token in that same step: an aggregated request has no separate first decode).
- kv_transfer: a `kv_transfer` span (role kv) where one came: its `epdbench.kv.seconds`, else its length. Without
  one (vLLM with NIXL), the decode's time_in_queue: vLLM keeps a request in WAITING_FOR_REMOTE_KVS and records it
  SCHEDULED only once the remote KV arrived (v1/core/sched/scheduler.py), so the decode's queue is its KV wait, with
  any queueing behind it (`kv_source` decode-queue). A kv_transfer span is taken to lie before the decode's queue
  (the simulator pulls before it queues).
- first_decode: the decode engine's time_in_model_prefill (PD, EPD): the step computing the one prompt token the
  connector leaves to it and sampling the first token.
- rest: client TTFT − the parts above: the client, router and network, and the engines' API servers (parsing,
  tokenizing, image preprocessing, a non-streamed leg's response) and the hand-offs no span reports (the encoder
  outputs' transfer to the prefill engine).

A part the path does not have (encode on PD, kv_transfer and first_decode on aggregated) is 0 ms. Every attribute
is seconds as the engine reports it: the simulator's are modelled seconds, as its records' TTFT (client clock ÷ time
scale), so the two agree under a dilated clock.

Per request the parts sum to its TTFT exactly (rest makes them). A request whose engine parts exceed its TTFT is one
where spans and records disagree: within CLOCK_TOLERANCE_MS (clock and rounding) it is kept with rest 0 and counted
(`clock`); beyond, it is flagged (`disagree`), counted and left out of the statistics, never hidden. A traced request
missing an expected role's span (or that span missing the attribute its part needs) is `incomplete`: counted per
role and left out, never zero.

Per cell: each part's p50 and p95 over the complete requests. The medians need not add up: the median of a sum is
not the sum of the medians (where queueing and prefill vary against each other, as at high concurrency, Σ medians
falls short of the median TTFT); `medians_gap_ms` says by how much. What the report draws is the typical request:
the mean parts of the requests ranked in the middle MIDDLE_SHARE by TTFT (the median one, or the two of an even
count, at least), which add up exactly to those requests' mean TTFT; `adds_up` checks that total against the median
TTFT within SUM_TOLERANCE (of it, at least SUM_TOLERANCE_MIN_MS): a band around the median whose mean strays further
means the TTFTs there are too spread for one bar to stand for the cell, and the report says so.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from epdbench.analysis.metrics import CELL_KEYS, percentile

PARTS = ("queue", "encode", "prefill", "kv_transfer", "first_decode", "rest")
ENGINE_PARTS = PARTS[:-1]
PART_TITLES = {"queue": "queue", "encode": "encode", "prefill": "prefill", "kv_transfer": "KV transfer",
               "first_decode": "first decode", "rest": "rest (client, router, network, API servers)"}
EXPECTED_ROLES = {"aggregated": ("aggregated",), "pd": ("prefill", "decode"), "epd": ("encode", "prefill", "decode")}
ENGINE_ROLES = ("aggregated", "encode", "prefill", "decode")
CLOCK_TOLERANCE_MS = 1.0      # engine parts may exceed a request's TTFT by this (clocks, rounding) before it is flagged
MIDDLE_SHARE = 0.2            # the typical request: the mean of the middle fifth of requests ranked by TTFT
SUM_TOLERANCE = 0.05          # its parts' total within this share of the median TTFT ...
SUM_TOLERANCE_MIN_MS = 1.0    # ... or of this many ms, whichever is larger
QUEUE, PREFILL, E2E, TTFT = ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_in_model_prefill",
                             "gen_ai.latency.e2e", "gen_ai.latency.time_to_first_token")
KV_SECONDS = "epdbench.kv.seconds"
STATUSES = ("ok", "clock", "disagree", "incomplete", "failed", "unmatched")
REQUEST_COLUMNS = [*CELL_KEYS, "request_id", "status", "reason", "ttft_ms", *(f"{p}_ms" for p in PARTS),
                   "kv_source", "encode_source", "emulated"]
CELL_COLUMNS = [*CELL_KEYS, "traced", "untraced", "complete", "clock", "disagree", "incomplete", "failed",
                "unmatched", "missing", "disagreeing", "ttft_p50_ms", *(f"{p}_{q}_ms" for p in PARTS
                                                                         for q in ("p50", "p95")),
                "medians_gap_ms", "typical_n", *(f"typical_{p}_ms" for p in PARTS), "typical_ttft_ms",
                "tolerance_ms", "adds_up", "kv_source", "encode_source", "emulated"]
FLAGGED_IDS = 5               # request ids named per cell for disagreeing requests


def _ms(seconds) -> float:
    try:
        v = float(seconds)
    except (TypeError, ValueError):
        return math.nan
    return v * 1e3 if math.isfinite(v) and v >= 0 else math.nan


def engine_figures(spans: pd.DataFrame) -> pd.DataFrame:
    """One row per engine (`llm_request`) or `kv_transfer` span: request id, role, and in ms its queue, model
    (time_in_model_prefill), e2e and engine TTFT, or a kv span's transfer; nan where the span lacks one."""
    rows = []
    for r in spans.sort_values(["start_ns", "span_id"]).itertuples(index=False):
        if r.name not in ("llm_request", "kv_transfer"):
            continue
        attrs = json.loads(r.attributes or "{}") if isinstance(r.attributes, str) else dict(r.attributes or {})
        length = _ms((int(r.end_ns) - int(r.start_ns)) / 1e9) if r.end_ns is not None else math.nan
        kv = _ms(attrs.get(KV_SECONDS)) if r.name == "kv_transfer" else math.nan
        rows.append({"request_id": r.request_id, "role": "kv" if r.name == "kv_transfer" else r.role,
                     "queue_ms": _ms(attrs.get(QUEUE)), "model_ms": _ms(attrs.get(PREFILL)),
                     "e2e_ms": _ms(attrs.get(E2E)) if E2E in attrs else length, "engine_ttft_ms": _ms(attrs.get(TTFT)),
                     "kv_ms": kv if not math.isnan(kv) else length, "emulated": bool(r.emulated)})
    return pd.DataFrame(rows, columns=["request_id", "role", "queue_ms", "model_ms", "e2e_ms", "engine_ttft_ms",
                                       "kv_ms", "emulated"])


def parts_of(engines: dict[str, dict], kv_ms: float | None, topology: str, has_image: bool | None,
             ttft_ms: float) -> dict:
    """The parts of one request from its engines' figures (role → engine_figures row; the first span of each
    role), its kv_transfer span's ms (None without one), its configuration's topology, whether it carries an
    image (None: unknown) and its client TTFT. Returns the parts (ms), status, reason and sources."""
    want = list(EXPECTED_ROLES.get(topology, ()))
    if topology == "epd" and not has_image and "encode" not in engines:
        want.remove("encode")                                      # text requests skip the encode leg
    need = {"aggregated": ("queue_ms", "model_ms"), "encode": ("queue_ms", "model_ms"),
            "prefill": ("queue_ms", "model_ms"), "decode": ("queue_ms", "model_ms")}
    missing = [r for r in want if r not in engines]
    if missing:
        return _incomplete(f"no {', '.join(missing)} span")
    encode_source = ""
    lacking = []
    for role in want:
        for field in need[role]:
            if math.isnan(engines[role][field]) and not (role == "encode" and field in ("queue_ms", "model_ms")):
                lacking.append(f"{role} {field[:-3]}")
    if lacking:
        return _incomplete(f"span lacks {', '.join(lacking)}")
    parts = dict.fromkeys(ENGINE_PARTS, 0.0)
    kv_source = ""
    if topology == "aggregated":
        parts["queue"], parts["prefill"] = engines["aggregated"]["queue_ms"], engines["aggregated"]["model_ms"]
    else:
        p, d = engines["prefill"], engines["decode"]
        parts["prefill"], parts["first_decode"] = p["model_ms"], d["model_ms"]
        parts["queue"] = p["queue_ms"]
        if kv_ms is not None and not math.isnan(kv_ms):
            parts["kv_transfer"], kv_source = kv_ms, "span"
            parts["queue"] += d["queue_ms"]
        else:
            parts["kv_transfer"], kv_source = d["queue_ms"], "decode-queue"
        if "encode" in want:
            e = engines["encode"]
            if not math.isnan(e["model_ms"]):
                parts["encode"], encode_source = e["model_ms"], "model"
                parts["queue"] += e["queue_ms"] if not math.isnan(e["queue_ms"]) else 0.0
            elif not math.isnan(e["e2e_ms"]):
                parts["encode"], encode_source = e["e2e_ms"], "span"
            else:
                return _incomplete("encode span lacks model and e2e")
    engine_ms = sum(parts.values())
    rest = ttft_ms - engine_ms
    status, reason = "ok", ""
    if rest < 0:
        status = "clock" if -rest <= CLOCK_TOLERANCE_MS else "disagree"
        reason = f"engine parts {engine_ms:.3f} ms > TTFT {ttft_ms:.3f} ms"
        if status == "disagree":
            return {**_incomplete(reason), "status": "disagree", "kv_source": kv_source,
                    "encode_source": encode_source}
        rest = 0.0
    return {**{f"{k}_ms": v for k, v in parts.items()}, "rest_ms": rest, "status": status, "reason": reason,
            "kv_source": kv_source, "encode_source": encode_source}


def _incomplete(reason: str) -> dict:
    return {**{f"{p}_ms": math.nan for p in PARTS}, "status": "incomplete", "reason": reason, "kv_source": "",
            "encode_source": ""}


def infer_topology(roles) -> str:
    roles = set(roles)
    return "aggregated" if "aggregated" in roles else "epd" if "encode" in roles else "pd"


def request_parts(spans: pd.DataFrame, records: pd.DataFrame, topology: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per traced request (a request id on a span) of `records`' measured requests, with its parts
    (REQUEST_COLUMNS). `topology`: configuration → aggregated | pd | epd (the spec's); a configuration not in it
    is inferred from the roles of its spans. Failed requests (no TTFT) are `failed`, spans with no measured
    record `unmatched`."""
    if spans is None or not len(spans):
        return pd.DataFrame(columns=REQUEST_COLUMNS)
    figures = engine_figures(spans)
    by_request = {rid: g for rid, g in figures.groupby("request_id", sort=False)}
    measured = records[records["phase"] == "measured"] if "phase" in records else records.iloc[:0]
    recs = {r["request_id"]: r for r in measured.to_dict("records")}
    topology = dict(topology or {})
    for config, g in spans.groupby("config", sort=False):
        topology.setdefault(config, infer_topology(g["role"]))
    emulated = spans.groupby("request_id", sort=False)["emulated"].any().to_dict()
    rows = []
    for rid, first in spans.drop_duplicates("request_id").set_index("request_id").iterrows():
        rec = recs.get(rid)
        base = {k: rec[k] if rec is not None else first[k] for k in CELL_KEYS}
        base.update(concurrency=int(base["concurrency"]), trial=int(base["trial"]))
        base.update(request_id=rid, emulated=bool(emulated.get(rid)))
        if rec is None:
            rows.append({**base, **_incomplete("no measured record"), "status": "unmatched", "ttft_ms": math.nan})
            continue
        ttft = rec.get("ttft_ms")
        if not rec.get("ok") or ttft is None or not math.isfinite(float(ttft)):
            rows.append({**base, **_incomplete(str(rec.get("error") or "request failed")), "status": "failed",
                         "ttft_ms": math.nan})
            continue
        g = by_request.get(rid)
        engines, kv = {}, None
        for f in (g.to_dict("records") if g is not None else []):
            if f["role"] == "kv":
                kv = f["kv_ms"] if kv is None else kv
            elif f["role"] in ENGINE_ROLES:
                engines.setdefault(f["role"], f)
        px = rec.get("image_px")
        has_image = None if "image_px" not in rec else bool(px and not pd.isna(px) and px > 0)
        rows.append({**base, "ttft_ms": float(ttft),
                     **parts_of(engines, kv, topology.get(base["config"], ""), has_image, float(ttft))})
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def _tolerance_ms(ttft_p50: float | None) -> float:
    return max(SUM_TOLERANCE_MIN_MS, SUM_TOLERANCE * ttft_p50) if ttft_p50 is not None else SUM_TOLERANCE_MIN_MS


def _source(values) -> str:
    got = sorted({v for v in values if v})
    return "mixed" if len(got) > 1 else got[0] if got else ""


def middle_band(kept: pd.DataFrame) -> pd.DataFrame:
    """The requests ranked in the middle MIDDLE_SHARE by TTFT, symmetric about the median: the middle one of an odd
    count, the middle two of an even one, at least (whose mean TTFT is then the median itself)."""
    n = len(kept)
    k = min(n, max(2 - n % 2, round(MIDDLE_SHARE * n)))
    k += (n - k) % 2                                   # as many below as above
    lo = (n - k) // 2
    return kept.iloc[np.argsort(kept["ttft_ms"].to_numpy(dtype=float), kind="stable")[lo:lo + k]]


def summarize_cell_parts(parts: pd.DataFrame, untraced: int = 0) -> dict:
    """One cell's breakdown from its request_parts rows: counts by status, the incomplete requests' missing roles,
    each part's p50 and p95 over the complete ones (ok and clock), and whether the medians add up."""
    kept = parts[parts["status"].isin(("ok", "clock"))]
    counts = parts["status"].value_counts().to_dict()
    out: dict = {"traced": int(len(parts)), "untraced": int(untraced), "complete": int(len(kept)),
                 **{s: int(counts.get(s, 0)) for s in STATUSES if s != "ok"}}
    reasons = parts.loc[parts["status"] == "incomplete", "reason"].value_counts()
    out["missing"] = "; ".join(f"{why} ×{n}" for why, n in reasons.items())
    out["disagreeing"] = ", ".join(parts.loc[parts["status"] == "disagree", "request_id"].astype(str)[:FLAGGED_IDS])
    ttft = percentile(kept["ttft_ms"], 50)
    out["ttft_p50_ms"] = ttft
    for p in PARTS:
        out[f"{p}_p50_ms"], out[f"{p}_p95_ms"] = percentile(kept[f"{p}_ms"], 50), percentile(kept[f"{p}_ms"], 95)
    out["medians_gap_ms"] = float(sum(out[f"{p}_p50_ms"] for p in PARTS)) - ttft if ttft is not None else None
    band = middle_band(kept)
    out["typical_n"] = int(len(band))
    for p in PARTS:
        out[f"typical_{p}_ms"] = float(band[f"{p}_ms"].mean()) if len(band) else None
    out["typical_ttft_ms"] = float(band["ttft_ms"].mean()) if len(band) else None
    out["tolerance_ms"] = _tolerance_ms(ttft)
    out["adds_up"] = (bool(abs(out["typical_ttft_ms"] - ttft) <= out["tolerance_ms"]) if ttft is not None
                      else None)
    out["kv_source"], out["encode_source"] = _source(kept["kv_source"]), _source(kept["encode_source"])
    out["emulated"] = bool(parts["emulated"].any())
    return out


def cell_breakdown(spans: pd.DataFrame, records: pd.DataFrame, topology: dict[str, str] | None = None) -> pd.DataFrame:
    """CELL_COLUMNS per cell with traced requests: `untraced` the measured successful requests without a span."""
    parts = request_parts(spans, records, topology)
    if parts.empty or "phase" not in records:
        return pd.DataFrame(columns=CELL_COLUMNS)
    traced = set(parts["request_id"])
    rows = []
    for key, g in parts.groupby(CELL_KEYS, sort=False, dropna=False):
        mine = records
        for k, v in zip(CELL_KEYS, key):
            mine = mine[mine[k] == v]
        ok = mine[(mine["phase"] == "measured") & mine["ok"].astype(bool)]
        rows.append({**dict(zip(CELL_KEYS, key)),
                     **summarize_cell_parts(g, int((~ok["request_id"].isin(traced)).sum()))})
    return pd.DataFrame(rows, columns=CELL_COLUMNS)


def breakdown_metrics(row: dict | None) -> dict[str, float]:
    """A cell's MLflow metrics (`ttft_breakdown.<part>.p50_ms` / `.p95_ms` / `.typical_ms`, request counts, how
    far the medians' sum is from the median TTFT and whether the typical request's parts add up to it): empty
    without traced requests, so an untraced cell logs none rather than zeros."""
    if not row or not row.get("traced"):
        return {}
    out = {f"ttft_breakdown.{p}.{q}_ms": row.get(f"{p}_{q}_ms") for p in PARTS for q in ("p50", "p95")}
    out.update({"ttft_breakdown.requests": row["complete"], "ttft_breakdown.incomplete": row["incomplete"],
                "ttft_breakdown.disagree": row["disagree"], "ttft_breakdown.ttft_p50_ms": row.get("ttft_p50_ms"),
                "ttft_breakdown.medians_gap_ms": row.get("medians_gap_ms"),
                **{f"ttft_breakdown.{p}.typical_ms": row.get(f"typical_{p}_ms") for p in PARTS},
                "ttft_breakdown.adds_up": None if row.get("adds_up") is None else float(bool(row["adds_up"]))})
    return {k: (None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)) for k, v in out.items()}


def cell_metrics(spans: pd.DataFrame, records: pd.DataFrame, topology: str | None = None) -> dict[str, float]:
    """breakdown_metrics of one configuration's cell from its spans and records (publishing's hook)."""
    if spans is None or not len(spans):
        return {}
    table = cell_breakdown(spans, records, {spans["config"].iloc[0]: topology} if topology else None)
    return breakdown_metrics(table.iloc[0].to_dict()) if len(table) == 1 else {}
