"""tasks/publishing/traces.py against a real MLflow SQLite store: a cell's traces published in one batch hold the
folder's tree (names, parents, times, attributes), are tagged and linked to the cell run, carry the token usage
MLflow derives from the engines' attributes, and match what the span-by-span path (a store that takes no spans)
writes; publishing again creates nothing, a trace gone from the folder is deleted, and a failure half-way leaves
nothing a run shows."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from epdbench.tasks.publishing import traces
from epdbench.tasks.publishing.mlflow_quiet import QuietClient
from epdbench.tasks.publishing.traces import REQUEST_TAG, TRACE_TAG, existing_traces, flush_traces, publish_cell_traces


def span(trace, sid, parent, name, role, start, end, request="req-1", **attrs):
    return {"trace_id": trace, "span_id": sid, "parent_span_id": parent, "name": name, "role": role,
            "pod": "" if role == "client" else f"{role}-0", "start_ns": start, "end_ns": end,
            "request_id": request, "attributes": json.dumps(attrs), "emulated": role != "client"}


T0 = 1_796_000_000_000_000_000


def cell() -> pd.DataFrame:
    """Two traced requests: client → router → prefill and decode `llm_request`s (the decode's parent a span
    outside the trace: it hangs under the root), and client → server."""
    a, b = "a" * 32, "b" * 32
    return pd.DataFrame([
        span(a, "01" * 8, "", "client.request", "client", T0, T0 + 90_000_000, ok=True),
        span(a, "02" * 8, "01" * 8, "router.request", "router", T0 + 1_000_000, T0 + 89_000_000),
        span(a, "03" * 8, "02" * 8, "llm_request", "prefill", T0 + 2_000_000, T0 + 30_000_000,
             **{"gen_ai.usage.prompt_tokens": 512, "gen_ai.usage.completion_tokens": 1}),
        span(a, "04" * 8, "ff" * 8, "llm_request", "decode", T0 + 31_000_000, T0 + 88_000_000,
             **{"gen_ai.usage.prompt_tokens": 512, "gen_ai.usage.completion_tokens": 16}),
        span(b, "05" * 8, "", "client.request", "client", T0 + 5_000_000, T0 + 50_000_000, request="req-2"),
        span(b, "06" * 8, "05" * 8, "llm_request", "server", T0 + 6_000_000, T0 + 49_000_000, request="req-2"),
    ])


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A SQLite store, set as MLflow's tracking URI as tasks.publishing.tracking.Tracker sets it (MLflow's span
    exporter writes there), with synchronous trace logging as Tracker has it."""
    import mlflow
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    client = QuietClient(MlflowClient(uri))
    exp = client.create_experiment("traces", artifact_location=str(tmp_path / "artifacts"))
    yield client, exp, client.create_run(exp).info.run_id
    mlflow.set_tracking_uri(previous)


def tree(client, exp: str, run: str) -> dict[str, dict]:
    """W3C trace id → what MLflow holds of it, ids left out: tags, source run, token usage and every span as
    (name, parent's name, start, end, role)."""
    out = {}
    for tid, mid in existing_traces(client, exp, run).items():
        t = client.get_trace(mid)
        names = {s.span_id: s.name for s in t.data.spans}
        out[tid] = {"tags": {k: t.info.tags[k] for k in (TRACE_TAG, REQUEST_TAG, "mlflow.traceName")},
                    "run": t.info.trace_metadata["mlflow.sourceRun"],
                    "tokens": t.info.trace_metadata.get("mlflow.trace.tokenUsage"),
                    "state": t.info.state.value, "duration_ms": t.info.execution_duration,
                    "spans": sorted((s.name, names.get(s.parent_id), s.start_time_ns, s.end_time_ns,
                                     s.attributes["epdbench.role"]) for s in t.data.spans)}
    return out


def test_a_cells_traces_in_one_batch_hold_the_folders_tree(store):
    client, exp, run = store
    assert publish_cell_traces(client, exp, run, cell()) == 2
    got = tree(client, exp, run)
    a = got["a" * 32]
    assert a["tags"] == {TRACE_TAG: "a" * 32, REQUEST_TAG: "req-1", "mlflow.traceName": "client.request"}
    assert a["run"] == run and a["state"] == "OK" and a["duration_ms"] == 90
    assert a["spans"] == sorted([
        ("client.request", None, T0, T0 + 90_000_000, "client"),
        ("router.request", "client.request", T0 + 1_000_000, T0 + 89_000_000, "router"),
        ("llm_request", "router.request", T0 + 2_000_000, T0 + 30_000_000, "prefill"),
        ("llm_request", "client.request", T0 + 31_000_000, T0 + 88_000_000, "decode")])
    assert json.loads(a["tokens"]) == {"input_tokens": 1024, "output_tokens": 17, "total_tokens": 1041}
    assert [s[0] for s in got["b" * 32]["spans"]] == ["client.request", "llm_request"]


def test_publishing_again_creates_nothing_and_a_trace_gone_from_the_folder_is_deleted(store):
    client, exp, run = store
    publish_cell_traces(client, exp, run, cell())
    before = existing_traces(client, exp, run)
    assert publish_cell_traces(client, exp, run, cell()) == 0
    assert existing_traces(client, exp, run) == before
    only_b = cell()[lambda f: f["trace_id"] == "b" * 32]
    assert publish_cell_traces(client, exp, run, only_b) == 0
    assert existing_traces(client, exp, run) == {"b" * 32: before["b" * 32]}


def test_a_failure_half_way_leaves_no_trace_and_publishing_again_makes_them_all(store, monkeypatch):
    from mlflow.tracing.client import TracingClient
    client, exp, run = store
    real, calls = TracingClient.start_trace, []

    def fails_second(self, info):
        calls.append(info.trace_id)
        if len(calls) == 2:
            raise ConnectionError("MLflow went away")
        return real(self, info)
    monkeypatch.setattr(TracingClient, "start_trace", fails_second)
    with pytest.raises(ConnectionError):
        publish_cell_traces(client, exp, run, cell())
    assert existing_traces(client, exp, run) == {}
    assert client.search_traces(locations=[exp]) == []       # the spans written first went with their traces
    monkeypatch.setattr(TracingClient, "start_trace", real)
    assert publish_cell_traces(client, exp, run, cell()) == 2
    assert set(tree(client, exp, run)) == {"a" * 32, "b" * 32}


def test_a_store_that_takes_no_spans_gets_the_same_traces_span_by_span(store, monkeypatch):
    from mlflow.tracing.client import TracingClient
    client, exp, run = store
    other = client.create_run(exp).info.run_id
    publish_cell_traces(client, exp, run, cell())

    def refuses(self, location, spans):
        raise NotImplementedError("log_spans is not supported")
    monkeypatch.setattr(TracingClient, "log_spans", refuses)      # as MLflow's file store, or a server before 3.4
    try:
        assert publish_cell_traces(client, exp, other, cell()) == 2
        flush_traces()
    finally:
        import mlflow.tracing
        mlflow.tracing.reset()       # the exporter now holds that the store takes no spans: not for later tests
    batched, by_span = tree(client, exp, run), tree(client, exp, other)
    for got in (batched, by_span):
        for t in got.values():
            t.pop("run")
            t.pop("tokens")          # derived by the store from spans it takes; the file store derives none
    assert by_span == batched


@pytest.mark.slow         # an MLflow server (about 10 s to start on 2 cores)
def test_through_an_mlflow_server_the_batch_goes_over_its_otlp_endpoint(tmp_path, store, monkeypatch):
    """`epdbench up`'s MLflow (a server on a SQLite store): the spans go through its OTLP endpoint, then each
    trace's info; the traces equal those written straight to a SQL store."""
    import mlflow
    from mlflow import MlflowClient

    from tests.mlflow_ui import mlflow_server
    direct, direct_exp, direct_run = store

    def not_span_by_span(*args):
        raise AssertionError("the server took no batch")
    monkeypatch.setattr(traces, "_span_by_span", not_span_by_span)
    publish_cell_traces(direct, direct_exp, direct_run, cell())
    with mlflow_server(tmp_path / "server.db", tmp_path / "server-artifacts") as url:
        mlflow.set_tracking_uri(url)
        client = QuietClient(MlflowClient(url))
        exp = client.create_experiment("traces")
        run = client.create_run(exp).info.run_id
        assert publish_cell_traces(client, exp, run, cell()) == 2
        assert publish_cell_traces(client, exp, run, cell()) == 0
        over_http, straight = tree(client, exp, run), tree(direct, direct_exp, direct_run)
        for got in (over_http, straight):
            for t in got.values():
                t.pop("run")
        assert over_http == straight
