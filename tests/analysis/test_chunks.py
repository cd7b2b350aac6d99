"""analysis/chunks.py: list columns laid end to end, whichever way the records hold them."""
from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pyarrow as pa

from epdbench.analysis.chunks import Lists, gaps, largest_gap

LISTS = [[5, 7, 12], None, [], [3], [1, 2, 4, 8], float("nan"), [9, 9]]


def arrow_series(values, pieces=3) -> pd.Series:
    """Arrow-backed, in sliced chunks of one array (as a filtered or iloc'd frame of read_records has them)."""
    whole = pa.array([None if v is not None and not isinstance(v, list) else v for v in values],
                     type=pa.list_(pa.int64()))
    bounds = np.linspace(0, len(values), pieces + 1).astype(int)
    return pd.Series(pd.arrays.ArrowExtensionArray(
        pa.chunked_array([whole.slice(a, b - a) for a, b in zip(bounds, bounds[1:])], type=whole.type)))


def expected_flat(values, rows):
    return [x for i in rows for x in (values[i] if isinstance(values[i], list) else [])]


def test_python_lists_and_arrow_chunks_flatten_alike():
    for col in (pd.Series(LISTS, dtype=object), LISTS, arrow_series(LISTS)):
        lists = Lists(col)
        assert lists.lengths.tolist() == [3, 0, 0, 1, 4, 0, 2]
        assert lists.flat().tolist() == expected_flat(LISTS, range(len(LISTS)))
        assert lists.flat(np.array([0, 3, 4, 6])).tolist() == [5, 7, 12, 3, 1, 2, 4, 8, 9, 9]
        assert lists.flat(np.array([], dtype=np.int64)).tolist() == []


def test_random_rows_of_many_chunks():
    rnd = random.Random(3)
    values = [rnd.choice([None, [], [rnd.randrange(100) for _ in range(rnd.randrange(1, 6))]]) for _ in range(200)]
    lists = Lists(arrow_series(values, pieces=7))
    for _ in range(20):
        rows = sorted(rnd.sample(range(200), rnd.randrange(200)))
        assert lists.flat(np.array(rows, dtype=np.int64)).tolist() == expected_flat(values, rows)


def test_float_offsets_are_kept_as_floats():
    lists = Lists([[1.5, 2.0], [3.25]])
    assert lists.flat().tolist() == [1.5, 2.0, 3.25]


def test_gaps_stay_inside_each_row():
    lengths = np.array([3, 0, 1, 4, 2])
    flat = np.array([5, 7, 12, 100, 1, 2, 4, 8, 9, 9])
    assert gaps(flat, lengths).tolist() == [2, 5, 1, 2, 4, 0]
    assert gaps(np.array([], dtype=np.int64), np.array([0, 0])).tolist() == []
    assert gaps(np.array([4]), np.array([1])).tolist() == []


def test_largest_gap_per_row():
    lengths = np.array([3, 0, 1, 4, 2, 1])
    flat = np.array([5, 7, 12, 100, 1, 2, 4, 8, 9, 9, 50])
    assert largest_gap(flat, lengths).tolist() == [5, 0, 0, 4, 0, 0]
    assert largest_gap(np.array([1.0, 3.5]), np.array([2])).tolist() == [2.5]
    assert largest_gap(np.array([7]), np.array([0, 1])).tolist() == [0, 0]


def test_null_lists_that_still_span_values_are_skipped():
    values = pa.array([1, 2, 3, 4, 5, 6], type=pa.int64())
    arr = pa.ListArray.from_arrays(pa.array([0, 2, 4, 6], type=pa.int32()), values,
                                   mask=pa.array([False, True, False]))       # the null row spans 3, 4
    lists = Lists(pd.Series(pd.arrays.ArrowExtensionArray(pa.chunked_array([arr]))))
    assert lists.lengths.tolist() == [2, 0, 2]
    assert lists.flat().tolist() == [1, 2, 5, 6]
    assert lists.flat(np.array([1, 2])).tolist() == [5, 6]
