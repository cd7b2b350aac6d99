"""Spans in virtual time (tasks.sim.vrun with a span sink, sim.vcluster): the traced requests a run samples get the
HTTP simulator's span trees, on the virtual clock from the anchor, and a lone request's TTFT breakdown is the cost
model's own figures: its prefill step, its KV bytes over the configuration's transport, its encoder time."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from epdbench.analysis.breakdown import request_parts
from epdbench.physics.costmodel import CostModel, PrefillChunk, image_tokens, kv_descriptors, transfer_seconds
from epdbench.specs.models import load_spec
from epdbench.specs.tracing import traced_indices
from epdbench.specs.workload import plan_cells
from epdbench.tasks.load.otlp_receiver import TraceCollector
from epdbench.tasks.rundir.traces import read_spans
from epdbench.tasks.sim.vrun import prompt_calibration, serve_configuration, simulate_configuration

DATA = Path(__file__).parents[2] / "data"
ANCHOR = 1_800_000_000_000_000_000


@pytest.fixture(scope="module")
def traced_spec():
    return load_spec(str(DATA / "traced.yaml"))


def serve_traced(spec, tmp: Path) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """Every configuration served with a span sink, spans joined and written as flows.virtual does; returns each
    configuration's span rows and all records."""
    calibration = prompt_calibration(spec)
    spans, rows = {}, []
    for config in spec.configurations:
        collector = TraceCollector(tmp / f"{config.name}.parquet")

        def keep(cell, trial, cell_rows):
            rows.extend(cell_rows)
            collector.add_records(cell_rows)
            collector.flush(0)
        serve_configuration(spec, config, calibration, keep, "test", spans=collector.receive, anchor_ns=ANCHOR)
        spans[config.name] = read_spans(tmp / f"{config.name}.parquet")
    return spans, pd.DataFrame(rows)


def test_the_sampled_requests_get_the_http_simulator_s_trees_on_the_virtual_clock(traced_spec, tmp_path):
    spans, records = serve_traced(traced_spec, tmp_path)
    measured = records[records["phase"] == "measured"]
    for cell in plan_cells(traced_spec):     # the same requests a real-clock run traces
        mine = measured[measured["cell"] == cell.cell_id]
        for config, rows in mine.groupby("config"):
            assert set(rows[rows["trace"].notna()]["index"]) == {
                cell.n_warmup + k for k in traced_indices(cell.n_measured, traced_spec.tracing.per_cell)}, config
    for config in traced_spec.configurations:
        df = spans[config.name]
        assert not df.duplicated(["trace_id", "span_id"]).any()
        assert df["trace_id"].nunique() == measured[measured["config"] == config.name]["trace"].notna().sum()
        for _, trace in df.groupby("trace_id"):
            (root,) = trace[trace["parent_span_id"] == ""].itertuples()
            assert root.name == "client.request" and root.role == "client"
            proxy = trace[trace["name"] == "router.request"]
            legs_parent = proxy["span_id"].iloc[0] if config.topology == "epd" else root.span_id
            assert list(proxy["parent_span_id"]) == ([root.span_id] if config.topology == "epd" else [])
            engines = trace[trace["name"].isin(["llm_request", "kv_transfer"])]
            assert (engines["parent_span_id"] == legs_parent).all()
            want = {"aggregated": {"aggregated"}, "pd": {"prefill", "decode", "kv"},
                    "epd": {"prefill", "decode", "kv"}}[config.topology]
            assert want <= set(engines["role"]) <= want | {"encode"}
            assert trace["emulated"][trace["role"] != "client"].all() and not trace["emulated"][root.Index]
            for r in trace.itertuples():
                assert root.start_ns <= r.start_ns <= r.end_ns <= root.end_ns, (config.name, r.name)
            for attrs in map(json.loads, engines["attributes"]):
                assert attrs["epdbench.clock"] == "virtual" and attrs["epdbench.clock.anchor_ns"] == ANCHOR
        rec = measured[measured["request_id"].isin(df["request_id"])]   # client spans: send → end, virtual ns
        starts = df[df["name"] == "client.request"].set_index("request_id")["start_ns"]
        assert (starts[rec["request_id"]].to_numpy() == ANCHOR + rec["send_ns"].to_numpy()).all()


def test_without_a_span_sink_nothing_is_traced(traced_spec):
    rows = simulate_configuration(traced_spec, traced_spec.configurations[0], prompt_calibration(traced_spec))
    assert not any(r["trace"] for r in rows)


def lone(spec):
    """The spec with one measured request per cell at concurrency 1 and no warm-up: nothing queues or shares a link."""
    return spec.model_copy(update={"suites": [s.model_copy(update={"concurrencies": [1], "n_warmup": 0,
                                                                   "n_measured": 1}) for s in spec.suites]})


def test_a_lone_request_s_parts_are_the_cost_model_s_own_figures(traced_spec, tmp_path):
    spec = lone(traced_spec)
    spans, records = serve_traced(spec, tmp_path)
    topology = {c.name: c.topology for c in spec.configurations}
    parts = request_parts(pd.concat(spans.values(), ignore_index=True), records, topology).set_index("request_id")
    assert len(parts) == len(spec.configurations) * len(plan_cells(spec)) and (parts["status"] == "ok").all()
    hw = spec.hardware
    for rec in records[records["phase"] == "measured"].itertuples():
        config = next(c for c in spec.configurations if c.name == rec.config)
        got = parts.loc[rec.request_id]
        n, img = int(rec.prompt_tokens), 0 if pd.isna(rec.image_px) else int(rec.image_px)
        assert rec.cached_tokens == 0
        cost = CostModel(spec.model, hw, 1)
        in_step = [image_tokens(spec.model, img, img)] if img and config.topology != "epd" else []
        want = {"queue": 0.0, "prefill": cost.step_seconds([], [PrefillChunk(0, n)], in_step),
                "encode": 0.0, "kv_transfer": 0.0, "first_decode": 0.0}
        if config.topology != "aggregated":
            prefill_role = config.role("prefill")
            want["kv_transfer"] = hw.request_hop_ms / 1e3 + transfer_seconds(
                hw, config.kv_transport, cost.kv_bytes(n), prefill_role.rdma_interfaces,
                kv_descriptors(cost, config.kv_connector, n), config.kv_connector)
            want["first_decode"] = cost.step_seconds([], [PrefillChunk(n - 1, 1)])
        if config.topology == "epd" and img:
            want["encode"] = cost.encode_seconds([image_tokens(spec.model, img, img)]) + hw.step_overhead_ms / 1e3
        for part, seconds in want.items():
            assert got[f"{part}_ms"] == pytest.approx(seconds * 1e3, abs=1e-6), (rec.config, rec.cell, part)
        assert got["rest_ms"] > 0 and got["ttft_ms"] == pytest.approx(rec.ttft_ms)
