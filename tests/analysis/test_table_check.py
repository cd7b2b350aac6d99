"""analysis.table_check: what a fit cannot read is named, what it should not fit is left out and said."""
from __future__ import annotations

import pandas as pd
import pytest

from epdbench.analysis import fit, table_check

KEYS = fit.MATCH_KEYS


def table(**columns) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    base = {"config": ["pd-tcp"] * n, "suite": ["fixed"] * n, "workload": [f"w{i}" for i in range(n)],
            "concurrency": [4] * n, "stream": ["main"] * n}
    return pd.DataFrame({**base, **columns})


@pytest.mark.parametrize("value", ["1,234", "12.3 ms", "n/a", "inf", True])
def test_a_figure_that_is_not_a_plain_number_is_named_with_its_row(value):
    frame = table(ttft_p50_ms=["950", value, "3"])
    problem = table_check.unreadable(frame, KEYS, ["ttft_p50_ms"])
    assert problem.startswith("row 2 (config pd-tcp, suite fixed, workload w1, concurrency 4, stream main): "
                              f"ttft_p50_ms {str(value)!r} is not a plain number")
    with pytest.raises(fit.FitInputError, match="row 2 "):
        fit.observed_cells(frame)


def test_plain_numbers_as_text_blank_figures_and_whole_float_concurrencies_are_read():
    frame = table(ttft_p50_ms=[" 1234.5 ", None, ""], req_s=[1, 2.5, "3"], concurrency=[4.0, "4", 8])
    assert table_check.unreadable(frame, KEYS, ["ttft_p50_ms", "req_s"]) is None
    cells = fit.observed_cells(frame)
    assert cells["ttft_p50_ms"].tolist()[0] == 1234.5 and cells["req_s"].tolist() == [1.0, 2.5, 3.0]


@pytest.mark.parametrize("column, value, message", [
    ("concurrency", 4.5, "row 3 (config pd-tcp, suite fixed, workload w2, stream main): concurrency '4.5' is not a "
                         "whole number"),
    ("concurrency", "four", "concurrency 'four' is not a whole number"),
    ("stream", None, "row 3 (config pd-tcp, suite fixed, workload w2, concurrency 4) has no stream"),
    ("workload", "  ", "row 3 (config pd-tcp, suite fixed, concurrency 4, stream main) has no workload"),
])
def test_a_row_without_a_readable_key_is_named(column, value, message):
    frame = table(ttft_p50_ms=[1.0, 2.0, 3.0])
    frame[column] = frame[column].astype(object)
    frame.loc[2, column] = value
    assert message in table_check.unreadable(frame, KEYS, ["ttft_p50_ms"])


def test_rows_are_numbered_as_the_table_has_them_after_rows_are_left_out():
    frame = table(ttft_p50_ms=[1.0, 2.0, "x"], contaminated=[True, False, False])
    rows, notes = table_check.usable(frame)
    assert list(rows.index) == [1, 2] and notes == ["1 row flagged contaminated left out (bent by host load)"]
    assert table_check.unreadable(rows, KEYS, ["ttft_p50_ms"]).startswith("row 3 ")


def test_failed_and_contaminated_rows_are_left_out_and_counted_once():
    frame = table(ttft_p50_ms=[1.0] * 5, contaminated=["True", "false", False, "1", None],
                  requests_failed=[2, 3, 0, None, 1])
    rows, notes = table_check.usable(frame)
    assert list(rows.index) == [2]
    assert notes == ["2 rows flagged contaminated left out (bent by host load)",
                     "2 rows with failed requests left out (their figures count only the requests that succeeded; "
                     "the simulator serves every request)"]
    assert table_check.usable(table(ttft_p50_ms=[1.0]))[1] == []        # a published table has neither column


def test_figures_that_are_not_positive_are_left_out_and_counted():
    frame = table(ttft_p50_ms=[0.0, -3, 5], req_s=[1, 0, None])
    notes: list[str] = []
    cells = fit.observed_cells(frame, None, notes)
    assert notes == ["3 figures not positive left out (ttft_p50_ms 2, req_s 1): a log ratio needs a positive figure"]
    assert cells["ttft_p50_ms"].isna().tolist() == [True, False]    # w1 had no positive figure: no cell
    assert table_check.non_positive(table(ttft_p50_ms=[1.0]), ["ttft_p50_ms"]) is None


def test_rows_that_repeat_a_cell_are_said_and_trials_are_not():
    frame = table(ttft_p50_ms=[1.0, 2.0, 3.0, 5.0])
    frame.loc[1, "workload"] = "w0"
    frame.loc[3, ["workload", "concurrency"]] = ["w0", 4.0]
    assert table_check.repeated(frame, KEYS) == (
        "2 rows repeat the cell of another row (1 cell; the first: row 2 (config pd-tcp, suite fixed, workload w0, "
        "concurrency 4, stream main)): averaged with it as trials are")
    notes: list[str] = []
    assert fit.observed_cells(frame, None, notes)["ttft_p50_ms"].tolist() == [8.0 / 3, 3.0]
    assert notes == [table_check.repeated(frame, KEYS)]
    assert table_check.repeated(frame.assign(trial=[0, 1, 0, 2]), KEYS) is None           # trials of one cell
    assert table_check.repeated(frame.assign(trial=[0, 1, 0, 1]), KEYS).startswith(
        "1 row repeats the cell and trial of another row (1 cell; the first: row 4 ")
