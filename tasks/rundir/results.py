"""The results folder: resolved spec, records appended per cell (atomic rewrite), summary files."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

RECORD_SCHEMA = pa.schema([
    ("run", pa.string()), ("trial", pa.int32()), ("config", pa.string()), ("suite", pa.string()),
    ("cell", pa.string()), ("workload", pa.string()), ("stream", pa.string()), ("concurrency", pa.int32()),
    ("request_id", pa.string()), ("index", pa.int32()), ("phase", pa.string()), ("api", pa.string()),
    ("target_prompt_tokens", pa.int32()), ("prompt_tokens", pa.int32()), ("max_tokens", pa.int32()),
    ("output_tokens", pa.int32()), ("cached_tokens", pa.int32()), ("prompt_hash", pa.string()),
    ("image_px", pa.int32()), ("image_hash", pa.string()), ("scheduled_ns", pa.int64()), ("send_ns", pa.int64()),
    ("send_wall_s", pa.float64()), ("ttft_ms", pa.float64()), ("e2e_ms", pa.float64()), ("done_ms", pa.float64()),
    ("chunk_offsets_ns", pa.list_(pa.int64())), ("chunk_tokens", pa.list_(pa.int32())),
    ("status", pa.int32()), ("ok", pa.bool_()), ("error", pa.string()),
    ("timing", pa.string()), ("chunk_arrival_ns", pa.list_(pa.int64())),
])
READ_BATCH_ROWS = 65_536
READ_BUFFER = 1 << 20        # bytes read from the file at a time, rather than whole column chunks


def _atomic_write_parquet(table: pa.Table, path: Path) -> None:
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def append_records(path: Path, rows: list[dict]) -> None:
    """Append one cell's rows. The file is rewritten atomically, so a crash loses at most that cell."""
    new = pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)
    if path.exists():
        new = pa.concat_tables([pq.read_table(path, schema=RECORD_SCHEMA), new])
    _atomic_write_parquet(new, path)


def drop_records(path: Path, config: str, cells: set[tuple[str, int]]) -> int:
    """Remove the rows of `config`'s (cell id, trial) pairs, before those cells are measured again, so no
    request is ever recorded twice; returns how many rows went."""
    if not path.exists() or not cells:
        return 0
    df = read_records(path)
    gone = (df["config"] == config) & pd.Series([(c, int(t)) in cells for c, t in zip(df["cell"], df["trial"])],
                                                index=df.index)
    if gone.any():
        kept = df[~gone]
        _atomic_write_parquet(pa.Table.from_pandas(kept, schema=RECORD_SCHEMA, preserve_index=False), path)
    return int(gone.sum())


def read_records(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    """The records: scalar columns as the Python objects pandas makes of them (None for null); the per-chunk
    list columns Arrow-backed (pd.ArrowDtype: a list per row on access, <NA> for a missing one), not an array
    per request. Read a batch at a time, so memory stays near the records' own size. `columns` (names of
    RECORD_SCHEMA, in its order whatever order they are given in) reads only those: a reader that needs few
    of them (the summary: analysis.metrics.RECORD_COLUMNS) leaves the ids and hashes on disk."""
    fields = _fields(columns)
    if not path.exists():
        return pd.DataFrame({f.name: pd.Series(dtype="object") for f in fields})
    columns = _read_columns(path, fields)
    for name, col in columns.items():           # one at a time: a scalar column's Arrow copy goes as it converts
        columns[name] = (pd.Series(pd.arrays.ArrowExtensionArray(col), copy=False) if pa.types.is_list(col.type)
                         else pd.Series(_objects(col), dtype=object))
    pa.default_memory_pool().release_unused()   # the reader's buffers, kept by the allocator otherwise
    return pd.DataFrame(columns, copy=False)


def _objects(col: pa.ChunkedArray) -> np.ndarray:
    """A scalar column as the Python objects pandas makes of it (integers with nulls as floats; None for null
    and NaN); a column of few distinct values with one object per value."""
    head = col.slice(0, 4096)
    if len(head) and pc.count_distinct(head, mode="all").as_py() * 8 > len(head):    # stamps, ids: as they are
        s = col.to_pandas().astype(object)
        return s.where(s.notna(), None).to_numpy(dtype=object)
    enc = pc.dictionary_encode(col).combine_chunks()
    distinct = enc.dictionary
    if col.null_count and pa.types.is_integer(col.type):
        distinct = distinct.cast(pa.float64(), safe=False)   # as pandas does
    values = distinct.to_pandas().astype(object)
    values = np.append(values.where(values.notna(), None).to_numpy(dtype=object), None)
    return values[pc.fill_null(enc.indices, -1).to_numpy()]


def _fields(columns: list[str] | None) -> list[pa.Field]:
    if columns is None:
        return list(RECORD_SCHEMA)
    unknown = sorted(set(columns) - set(RECORD_SCHEMA.names))
    if unknown:
        raise ValueError(f"not a record column: {', '.join(unknown)}")
    return [f for f in RECORD_SCHEMA if f.name in set(columns)]


def _read_columns(path: Path, fields: list[pa.Field]) -> dict[str, pa.ChunkedArray]:
    """The file's columns as RECORD_SCHEMA has them: null where the file lacks one, else of the schema's type."""
    with pq.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False) as f:
        present = [x.name for x in fields if x.name in f.schema_arrow.names]
        schema = pa.schema([f.schema_arrow.field(n) for n in present])
        table = pa.Table.from_batches(f.iter_batches(batch_size=READ_BATCH_ROWS, columns=present), schema=schema)
    out = {}
    for field in fields:
        col = table.column(field.name) if field.name in table.column_names else None
        out[field.name] = (pa.chunked_array([pa.nulls(len(table), field.type)]) if col is None
                           else col if col.type.equals(field.type) else col.cast(field.type))
    return out


def write_summary(run_dir: Path, summary: pd.DataFrame) -> None:
    summary.to_csv(run_dir / "summary.csv", index=False)
    _atomic_write_parquet(pa.Table.from_pandas(summary, preserve_index=False), run_dir / "summary.parquet")


def write_json(path: Path, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str))


def append_text(path: Path, text_of) -> None:
    """Append text_of(header) to `path` (made with its folder when new), `header` True only when the file is new or
    empty: a CSV that samplers extend as they read, its header written once."""
    header = not path.exists() or path.stat().st_size == 0
    text = text_of(header)
    if text:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)


def write_text_atomic(path: Path, text: str) -> None:
    """`text` into `path` whole or not at all (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
