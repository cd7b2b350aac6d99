"""Synthetic span rows (the traces/<config>.parquet contract) and the records they join, for breakdown tests:
one traced request at a time, each engine's attributes in seconds as vLLM reports them."""
from __future__ import annotations

import itertools
import json

import pandas as pd

CELL = {"config": "pd", "suite": "fixed", "cell": "fixed/512/64/c1", "workload": "512/64", "stream": "main",
        "concurrency": 1, "trial": 0}
_ids = itertools.count(1)


def engine(role: str, queue_s: float | None, model_s: float | None, **extra) -> dict:
    """An engine span's figures: role, time_in_queue and time_in_model_prefill (seconds; None leaves it out)."""
    attrs = {"gen_ai.latency.time_in_queue": queue_s, "gen_ai.latency.time_in_model_prefill": model_s, **extra}
    return {"role": role, "attrs": {k: v for k, v in attrs.items() if v is not None}}


def trace(request_id: str, engines: list[dict], kv_s: float | None = None, cell: dict | None = None,
          emulated: bool = False, start_ns: int = 1_700_000_000_000_000_000) -> list[dict]:
    """A traced request's rows: the client span, one `llm_request` per engine (in path order, each starting after
    the one before) and a `kv_transfer` span of kv_s seconds when given."""
    cell = {**CELL, **(cell or {})}
    tid = f"{next(_ids):032x}"
    root = f"{next(_ids):016x}"

    def row(name, role, start, end, attrs, parent):
        return {"trace_id": tid, "span_id": f"{next(_ids):016x}", "parent_span_id": parent, "name": name,
                "role": role, "pod": "" if role == "client" else f"{role}-0", "start_ns": start, "end_ns": end,
                "request_id": request_id, **cell, "attributes": json.dumps(attrs), "emulated": emulated}

    rows = [{**row("client.request", "client", start_ns, start_ns + 10**9, {}, ""), "span_id": root}]
    t = start_ns + 10**6
    for e in engines:
        if e["role"] == "decode" and kv_s is not None:
            rows.append(row("kv_transfer", "kv", t, t + int(kv_s * 1e9), {"epdbench.kv.seconds": kv_s}, root))
            t += int(kv_s * 1e9)
        rows.append(row("llm_request", e["role"], t, t + 10**7, e["attrs"], root))
        t += 10**7
    return rows


def record(request_id: str, ttft_ms: float | None, ok: bool = True, cell: dict | None = None, image_px: int = 0,
           phase: str = "measured") -> dict:
    return {**CELL, **(cell or {}), "request_id": request_id, "phase": phase, "ok": ok, "ttft_ms": ttft_ms,
            "image_px": image_px, "error": None if ok else "HTTP 500"}


def frames(traces: list[list[dict]], records: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    return pd.DataFrame([r for t in traces for r in t]), pd.DataFrame(records)


def tree_problems(spans: pd.DataFrame) -> list[str]:
    """Why the spans of one trace (traces/<config>.parquet rows) are not one tree rooted at the client span ([] when
    they are)."""
    roots = spans[spans["parent_span_id"] == ""]
    if len(roots) != 1 or roots.iloc[0]["name"] != "client.request":
        return [f"roots: {list(roots['name'])}"]
    ids = set(spans["span_id"])
    return [f"{r.name} ({r.role}) has no parent in the trace" for r in spans.itertuples()
            if r.parent_span_id and r.parent_span_id not in ids]
