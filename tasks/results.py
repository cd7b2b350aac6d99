"""The results folder: resolved spec, records appended per cell (atomic rewrite), summary files."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
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


def read_records(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame({f.name: pd.Series(dtype="object") for f in RECORD_SCHEMA})
    df = pq.read_table(path, schema=RECORD_SCHEMA).to_pandas()
    return df.astype(object).where(df.notna(), None)


def write_summary(run_dir: Path, summary: pd.DataFrame) -> None:
    summary.to_csv(run_dir / "summary.csv", index=False)
    _atomic_write_parquet(pa.Table.from_pandas(summary, preserve_index=False), run_dir / "summary.parquet")


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)
