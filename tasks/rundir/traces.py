"""The results folder's spans: traces/<config>.parquet, one row per span of a traced request (the contract the
breakdown reads: client, router/proxy, engine `llm_request` and `kv_transfer` spans, each with the load generator
record's request id and the cell's columns as records have them). Appended per cell like records (atomic rewrite);
a re-measured cell's spans are dropped with its records."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from epdbench.otlp import EMULATED_ATTR, POD_ATTR, ROLE_ATTR

TRACES_DIR = "traces"
CELL_COLUMNS = ("config", "suite", "cell", "workload", "stream", "concurrency", "trial")
SPAN_SCHEMA = pa.schema([
    ("trace_id", pa.string()), ("span_id", pa.string()), ("parent_span_id", pa.string()), ("name", pa.string()),
    ("role", pa.string()), ("pod", pa.string()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
    ("request_id", pa.string()), ("config", pa.string()), ("suite", pa.string()), ("cell", pa.string()),
    ("workload", pa.string()), ("stream", pa.string()), ("concurrency", pa.int32()), ("trial", pa.int32()),
    ("attributes", pa.string()), ("emulated", pa.bool_()),
])


def traces_path(rdir: Path, config: str) -> Path:
    return Path(rdir) / TRACES_DIR / f"{config}.parquet"


def client_span(record: dict) -> dict | None:
    """The load generator's span of a traced record (its `trace`: [trace id, span id, start ns, end ns])."""
    t = record.get("trace")
    if not t:
        return None
    return {"trace_id": t[0], "span_id": t[1], "parent_span_id": "", "name": "client.request", "start_ns": t[2],
            "end_ns": t[3], "attributes": {"gen_ai.request.id": record["request_id"], "http.status_code":
                                           record.get("status"), "epdbench.ok": record.get("ok"),
                                           "epdbench.phase": record.get("phase")},
            "resource": {ROLE_ATTR: "client", POD_ATTR: ""}}


def span_row(span: dict, record: dict) -> dict:
    """A contract row: `span` (epdbench.otlp's form) with the request id and cell columns of its trace's record.
    Role and pod from the exporting process's resource (service.name when no pod is named); a `kv_transfer`
    span's role is kv, its pod the one that reported it."""
    resource = span.get("resource") or {}
    attrs = {k: v for k, v in (span.get("attributes") or {}).items() if v is not None}
    return {"trace_id": span["trace_id"], "span_id": span["span_id"], "parent_span_id": span.get("parent_span_id") or "",
            "name": span["name"],
            "role": "kv" if span["name"] == "kv_transfer" else str(resource.get(ROLE_ATTR) or "unknown"),
            "pod": str(resource.get(POD_ATTR, resource.get("service.name", ""))),
            "start_ns": int(span["start_ns"]), "end_ns": int(span["end_ns"]), "request_id": record["request_id"],
            **{c: record.get(c) for c in CELL_COLUMNS},
            "attributes": json.dumps(attrs, sort_keys=True, default=str), "emulated": bool(attrs.get(EMULATED_ATTR))}


def _write(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def append_spans(path: Path, rows: list[dict]) -> None:
    """Append rows; a span already in the file (same trace and span id) is not written again."""
    if not rows:
        return
    old = pq.read_table(path, schema=SPAN_SCHEMA) if path.exists() else None
    have = set(zip(old.column("trace_id").to_pylist(), old.column("span_id").to_pylist())) if old else set()
    rows = [r for r in rows if (r["trace_id"], r["span_id"]) not in have]
    if not rows:
        return
    new = pa.Table.from_pylist(rows, schema=SPAN_SCHEMA)
    _write(path, pa.concat_tables([old, new]) if old is not None else new)


def drop_spans(path: Path, cells: set[tuple[str, int]]) -> int:
    """Remove the spans of (cell id, trial) pairs about to be measured again; returns how many went."""
    if not path.exists() or not cells:
        return 0
    df = read_spans(path)
    gone = pd.Series([(c, int(t)) in cells for c, t in zip(df["cell"], df["trial"])], index=df.index, dtype=bool)
    if gone.any():
        _write(path, pa.Table.from_pandas(df[~gone], schema=SPAN_SCHEMA, preserve_index=False))
    return int(gone.sum())


def read_spans(path: Path) -> pd.DataFrame:
    if not Path(path).exists():
        return SPAN_SCHEMA.empty_table().to_pandas()
    return pq.read_table(path, schema=SPAN_SCHEMA).to_pandas()
