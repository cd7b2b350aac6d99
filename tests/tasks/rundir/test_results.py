"""tasks/rundir/results.py: records read back as they were written —
scalars as Python objects, chunk lists Arrow-backed."""
from __future__ import annotations

import math

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from epdbench.analysis.metrics import RECORD_COLUMNS, summarize
from epdbench.tasks.rundir import results
from epdbench.tasks.rundir.results import RECORD_SCHEMA, append_records, drop_records, read_records


def row(i: int, **kw) -> dict:
    return {"run": "r", "trial": 0, "config": "agg", "suite": "fixed", "cell": "c0", "workload": "512/64",
            "stream": "main", "concurrency": 4, "request_id": f"q{i}", "index": i, "phase": "measured", "ok": True,
            "send_ns": 10 ** 15 + i * 10 ** 7, "scheduled_ns": 10 ** 15 + i * 10 ** 7 - 3, "ttft_ms": 10.0 + i,
            "e2e_ms": 40.0 + i, "done_ms": 41.0 + i, "output_tokens": 4, "prompt_tokens": 512,
            "target_prompt_tokens": 512, "chunk_offsets_ns": [10 ** 7, 2 * 10 ** 7, 3 * 10 ** 7 + i, 4 * 10 ** 7],
            "chunk_tokens": [1, 1, 1, 1], "timing": "arrival", "chunk_arrival_ns": [], **kw}


ROWS = [row(i) for i in range(9)] + [
    row(9, ok=False, output_tokens=None, prompt_tokens=None, ttft_ms=None, chunk_offsets_ns=[], chunk_tokens=[],
        error="HTTP 503", status=503),
    row(10, cell="c1", concurrency=8, ttft_ms=float("nan"), timing="modelled",
        chunk_arrival_ns=[10 ** 7 + 5, 2 * 10 ** 7, 3 * 10 ** 7 + 10, 4 * 10 ** 7 + 1])]


def test_scalars_come_back_as_python_objects_and_lists_arrow_backed(tmp_path):
    path = tmp_path / "records.parquet"
    append_records(path, ROWS[:6])
    append_records(path, ROWS[6:])
    df = read_records(path)
    assert list(df.columns) == RECORD_SCHEMA.names and len(df) == len(ROWS)
    scalars = [f.name for f in RECORD_SCHEMA if not pa.types.is_list(f.type)]
    assert all(df[c].dtype == object for c in scalars)
    assert all(isinstance(df[c].dtype, pd.ArrowDtype) for c in ("chunk_offsets_ns", "chunk_tokens", "chunk_arrival_ns"))
    first, failed, nan = df.iloc[0], df.iloc[9], df.iloc[10]
    assert type(first["send_ns"]) is int and first["config"] == "agg" and first["ok"] is True
    assert type(first["output_tokens"]) is float and first["output_tokens"] == 4.0   # integers with nulls: floats
    assert failed["output_tokens"] is None and failed["error"] == "HTTP 503" and first["error"] is None
    assert nan["ttft_ms"] is None and first["image_px"] is None
    assert df["chunk_offsets_ns"].iloc[2] == ROWS[2]["chunk_offsets_ns"]
    assert df["chunk_arrival_ns"].iloc[10] == ROWS[10]["chunk_arrival_ns"]


def test_read_a_batch_at_a_time_gives_the_same_records_and_summary(tmp_path, monkeypatch):
    path = tmp_path / "records.parquet"
    append_records(path, ROWS)
    whole = read_records(path)
    monkeypatch.setattr(results, "READ_BATCH_ROWS", 2)
    batched = read_records(path)
    assert batched["chunk_offsets_ns"].array.__arrow_array__().num_chunks > 1
    assert batched.astype(str).equals(whole.astype(str))
    assert summarize(batched).astype(str).equals(summarize(whole).astype(str))
    assert summarize(batched).iloc[0]["itl_max_ms"] == pytest.approx(10.000008)   # 10 ms + 8 ns


def test_the_summary_reads_only_its_columns_and_summarises_the_same(tmp_path):
    path = tmp_path / "records.parquet"
    append_records(path, ROWS)
    few = read_records(path, list(reversed(RECORD_COLUMNS)))
    assert list(few.columns) == [n for n in RECORD_SCHEMA.names if n in RECORD_COLUMNS]   # the schema's order
    assert "request_id" not in few.columns and "prompt_hash" not in few.columns
    assert summarize(few).astype(str).equals(summarize(read_records(path)).astype(str))
    assert list(read_records(tmp_path / "none.parquet", ["ok", "send_ns"]).columns) == ["send_ns", "ok"]
    with pytest.raises(ValueError, match="not a record column: latency"):
        read_records(path, ["ok", "latency"])


def test_an_older_file_without_later_columns_reads_them_as_null(tmp_path):
    path = tmp_path / "records.parquet"
    older = pa.schema([f for f in RECORD_SCHEMA if f.name not in ("timing", "chunk_arrival_ns")])
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k in older.names} for r in ROWS],
                                        schema=older), path)
    df = read_records(path)
    assert list(df.columns) == RECORD_SCHEMA.names
    assert df["timing"].isna().all() and df["chunk_arrival_ns"].isna().all()
    assert summarize(df).iloc[0]["delivery_lag_p99_ms"] is None
    assert read_records(path, ["ok", "timing"])["timing"].isna().all()


def test_dropping_cells_rewrites_the_arrow_backed_lists(tmp_path):
    path = tmp_path / "records.parquet"
    append_records(path, ROWS)
    assert drop_records(path, "agg", {("c1", 0)}) == 1
    df = read_records(path)
    assert len(df) == len(ROWS) - 1 and df["chunk_offsets_ns"].iloc[3] == ROWS[3]["chunk_offsets_ns"]
    assert not any(isinstance(v, float) and math.isnan(v) for v in df["ttft_ms"])
