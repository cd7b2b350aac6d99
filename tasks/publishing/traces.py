"""A cell's traced requests as MLflow traces linked to its cell run (the trace's source run), so the run's
Traces tab holds one trace per traced request: the client span at the root, the router's or proxy's under it
and the engines' (`llm_request`, `kv_transfer`) under what they named as parent, each with its own start and
end times and attributes. Idempotent: a trace is keyed by its W3C trace id (tag epdbench.trace_id); one already
in MLflow is left alone, one no longer in the folder is deleted."""
from __future__ import annotations

import json

import pandas as pd

TRACE_TAG = "epdbench.trace_id"
REQUEST_TAG = "epdbench.request_id"
PAGE = 500


def ordered(spans: pd.DataFrame) -> list[dict]:
    """A trace's spans, each after its parent (the root first); a span whose parent is not in the trace hangs
    under the root (its `parent` then the root's span id)."""
    rows = sorted(spans.to_dict("records"), key=lambda r: (r["start_ns"], r["span_id"]))
    ids = {r["span_id"] for r in rows}
    root = next((r for r in rows if not r["parent_span_id"]), rows[0])
    for r in rows:
        r["parent"] = r["parent_span_id"] if r["parent_span_id"] in ids else (None if r is root else root["span_id"])
    out, placed = [root], {root["span_id"]}
    rest = [r for r in rows if r is not root]
    while rest:
        ready = [r for r in rest if r["parent"] in placed] or rest[:1]   # a cycle: take the earliest
        for r in ready:
            out.append(r)
            placed.add(r["span_id"])
        rest = [r for r in rest if r["span_id"] not in placed]
    return out


def _attrs(row: dict) -> dict:
    return {**json.loads(row["attributes"] or "{}"), "epdbench.role": row["role"], "epdbench.pod": row["pod"],
            "epdbench.span_id": row["span_id"], "epdbench.emulated": bool(row["emulated"])}


def existing_traces(client, experiment_id: str, run_id: str) -> dict[str, str]:
    """W3C trace id → MLflow trace id of the traces already linked to `run_id`."""
    out, token = {}, None
    for _ in range(10_000):
        page = client.search_traces(locations=[experiment_id], run_id=run_id, max_results=PAGE,
                                    include_spans=False, page_token=token)
        for t in page:
            out[t.info.tags.get(TRACE_TAG, t.info.trace_id)] = t.info.trace_id
        token = page.token
        if not token:
            break
    return out


def publish_cell_traces(client, experiment_id: str, run_id: str, spans: pd.DataFrame) -> int:
    """The cell's traces in MLflow under `run_id`, as the folder has them; returns how many were created (handed to
    MLflow's exporter: flush_traces() once after the last cell writes them)."""
    have = existing_traces(client, experiment_id, run_id)
    want = set(spans["trace_id"]) if len(spans) else set()
    stale = [mid for tid, mid in have.items() if tid not in want]
    if stale:
        client.delete_traces(experiment_id, trace_ids=stale)
    made = 0
    for tid, group in (spans.groupby("trace_id", sort=True) if len(spans) else []):
        if tid in have:
            continue
        rows = ordered(group)
        root = rows[0]
        top = client.start_trace(root["name"], attributes=_attrs(root), experiment_id=experiment_id,
                                 start_time_ns=int(root["start_ns"]), run_id=run_id,
                                 tags={TRACE_TAG: tid, REQUEST_TAG: root["request_id"]})
        mid = top.trace_id
        made_spans = {root["span_id"]: top.span_id}
        for r in rows[1:]:
            span = client.start_span(r["name"], trace_id=mid, parent_id=made_spans[r["parent"]],
                                     attributes=_attrs(r), start_time_ns=int(r["start_ns"]))
            made_spans[r["span_id"]] = span.span_id
        for r in reversed(rows[1:]):
            client.end_span(mid, made_spans[r["span_id"]], end_time_ns=int(r["end_ns"]))
        client.end_trace(mid, end_time_ns=int(root["end_ns"]))
        made += 1
    return made


def flush_traces() -> None:
    """Wait until MLflow's exporter has written every trace handed to it (with async trace logging, which
    tasks.publishing.tracking.Tracker turns off unless the user set it). Once per configuration, not per cell:
    each flush restarts the exporter's threads (about a second however little it holds)."""
    import mlflow
    mlflow.flush_trace_async_logging()


def mlflow_trace_counts(client, experiment_id: str, run_id: str) -> int:
    return len(existing_traces(client, experiment_id, run_id))
