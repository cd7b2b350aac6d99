"""The records' per-chunk list columns (chunk_offsets_ns, chunk_tokens, chunk_arrival_ns) as flat arrays (pure).

tasks.rundir.results.read_records keeps them Arrow-backed (pd.ArrowDtype); records built in memory hold Python lists
or NumPy arrays. Either way the lists of a set of rows come out laid end to end, with each row's length; a
missing list (None, NaN, null) counts as empty.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


def _arrow(col) -> pa.ChunkedArray:
    if isinstance(getattr(col, "dtype", None), pd.ArrowDtype):
        return col.array.__arrow_array__()           # zero-copy
    arr = pa.array([None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in col])
    floats = pa.types.is_list(arr.type) and pa.types.is_floating(arr.type.value_type)
    return pa.chunked_array([arr.cast(pa.list_(pa.float64() if floats else pa.int64()))])


class Lists:
    """One list column: `lengths` of every row (0 when missing) and `flat(rows)`, those rows' lists end to end."""

    def __init__(self, col):
        arrow = _arrow(col)
        self.lengths = pc.fill_null(pc.list_value_length(arrow), 0).to_numpy().astype(np.int64)
        self._dtype = arrow.type.value_type.to_pandas_dtype()
        self._chunks = []             # (first row, each row's start in values, values, rows stored back to back)
        first = 0
        for chunk in arrow.chunks:
            if len(chunk):
                starts = chunk.offsets.to_numpy()[:-1].astype(np.int64)
                dense = bool((np.diff(starts) == self.lengths[first:first + len(chunk) - 1]).all())
                self._chunks.append((first, starts, chunk.values.to_numpy(zero_copy_only=False), dense))
            first += len(chunk)

    def flat(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The lists of `rows` (ascending positions; None: every row) laid end to end."""
        rows = np.arange(len(self.lengths)) if rows is None else np.asarray(rows, dtype=np.int64)
        parts = []
        for first, starts, values, dense in self._chunks:
            lo, hi = np.searchsorted(rows, [first, first + len(starts)])
            if lo == hi:
                continue
            local = rows[lo:hi] - first
            n = self.lengths[first + local]
            if dense:                 # the stretch of values from the first row's list to the last's
                a, b = local[0], local[-1] + 1
                span = self.lengths[first + a:first + b]
                stretch = values[starts[a]:starts[b - 1] + span[-1]]
                if b - a == len(local):
                    parts.append(stretch)
                    continue
                if len(stretch) <= 4 * n.sum():                  # mostly wanted: mask out the other rows
                    pick = np.zeros(b - a, dtype=bool)
                    pick[local - a] = True
                    parts.append(stretch[np.repeat(pick, span)])
                    continue
            parts.append(values[np.repeat(starts[local], n) + _ranks(n)])
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, dtype=self._dtype)


def gaps(flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Differences between consecutive values inside each row, rows laid end to end (see Lists.flat)."""
    keep = np.ones(max(len(flat) - 1, 0), dtype=bool)
    keep[_boundaries(lengths, len(flat))] = False
    return np.diff(flat)[keep]


def largest_gap(flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per row, the largest difference between its consecutive values; 0 for rows of fewer than two."""
    out = np.zeros(len(lengths), dtype=np.float64 if flat.dtype.kind == "f" else np.int64)
    multi = lengths > 1
    if multi.any():
        d = np.diff(flat)
        d[_boundaries(lengths, len(flat))] = np.finfo(d.dtype).min if d.dtype.kind == "f" else np.iinfo(d.dtype).min
        out[multi] = np.maximum.reduceat(d, (np.cumsum(lengths) - lengths)[multi])
    return out


def _boundaries(lengths: np.ndarray, n: int) -> np.ndarray:
    """Positions in np.diff of the flat values that span two rows."""
    cut = np.cumsum(lengths)[:-1]                      # where each following row starts
    return cut[(cut > 0) & (cut < n)] - 1


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0, 1, …, c−1 for each count c, end to end."""
    return np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
