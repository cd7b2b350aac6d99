"""Checking an observed table before a fit reads it (pure).

A fit reads a run's summary or a published table typed by hand. A figure it cannot read ("1,234", "12 ms", a
concurrency of 4.5, a blank key) must stop it with the row named: read as missing, such figures left the fit
with a subset of the table (every TTFT over a second, say, when those were written with a thousands separator)
and nothing said so. Rows and figures it may read but should not fit are left out, and the notes say which:

- a cell flagged `contaminated` (bent by host load);
- a cell with failed requests: its figures count only the requests that succeeded (a timed-out request
  leaves the tail out, a failed one lowers req/s), and the simulator serves every request;
- a figure that is not positive: a log ratio needs one, and no latency or rate of a served cell is zero.

Rows that repeat a cell (and trial, when the table has a `trial` column) are averaged as trials are, and said:
two tables pasted together, or one row written twice, would otherwise pass unseen.
"""
from __future__ import annotations

import math
import numbers

import pandas as pd


def blank(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and not value.strip())


def row_text(row: pd.Series, label, keys: list[str]) -> str:
    """`row N (config a, suite s, …)`: N counts data rows from 1 (a CSV's line N + 1), keys that are there."""
    shown = ", ".join(f"{k} {_shown(row[k])}" for k in keys if k in row.index and not blank(row[k]))
    where = f"row {label + 1}" if isinstance(label, numbers.Integral) else f"row {label}"
    return f"{where} ({shown})" if shown else where


def _shown(value) -> str:
    """A key as the table has it (a whole float as an integer: pandas reads a column with a blank as floats)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _number(value) -> float | None:
    """The value as a float, or None when it is not a plain number (what pandas.to_numeric reads)."""
    if isinstance(value, bool):
        return None
    try:
        return float(pd.to_numeric(value.strip() if isinstance(value, str) else value))
    except (ValueError, TypeError):
        return None


def unreadable(frame: pd.DataFrame, keys: list[str], metrics: list[str]) -> str | None:
    """The first thing a fit cannot read, as one line naming the row and the value; None when every key is
    there (a whole concurrency) and every figure given is a finite number."""
    for pos, label in enumerate(frame.index):
        row = frame.iloc[pos]
        for k in keys:
            if blank(row[k]):
                return f"{row_text(row, label, keys)} has no {k}: every row needs {', '.join(keys)}"
        c = _number(row["concurrency"]) if "concurrency" in keys else 1.0
        if c is None or not math.isfinite(c) or c != round(c):
            return (f"{row_text(row, label, [k for k in keys if k != 'concurrency'])}: concurrency "
                    f"{str(row['concurrency']).strip()!r} is not a whole number")
        for m in metrics:
            value = row[m]
            if blank(value):
                continue
            x = _number(value)
            if x is None or not math.isfinite(x):
                return (f"{row_text(row, label, keys)}: {m} {str(value).strip()!r} is not a plain number; write "
                        "figures in the column's unit without separators or units (1234.5), and leave a figure "
                        "not known empty")
    return None


def _flag(value) -> bool:
    return str(value).strip().lower() in ("true", "1", "1.0")


def _rows(n) -> str:
    return f"{int(n)} row{'s' if n != 1 else ''}"


def usable(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(the rows a fit may read, one note per kind of row left out): rows flagged `contaminated`, and rows with
    failed requests (`requests_failed` > 0), when the table has those columns."""
    keep = pd.Series(True, index=frame.index)
    notes = []
    if "contaminated" in frame.columns:
        bent = frame["contaminated"].map(_flag)
        if bent.any():
            notes.append(f"{_rows(bent.sum())} flagged contaminated left out (bent by host load)")
        keep &= ~bent
    if "requests_failed" in frame.columns:
        failed = (pd.to_numeric(frame["requests_failed"], errors="coerce").fillna(0) > 0) & keep
        if failed.any():
            notes.append(f"{_rows(failed.sum())} with failed requests left out (their figures count only the "
                         "requests that succeeded; the simulator serves every request)")
        keep &= ~failed
    return frame[keep], notes


def non_positive(frame: pd.DataFrame, metrics: list[str]) -> str | None:
    """A note on the figures that are numbers but not positive (left out: a log ratio needs a positive
    figure), naming the metrics; None when there are none."""
    counts = {}
    for m in metrics:
        values = pd.to_numeric(frame[m], errors="coerce")
        if n := int((values <= 0).sum()):
            counts[m] = n
    if not counts:
        return None
    total = sum(counts.values())
    return (f"{total} figure{'s' if total > 1 else ''} not positive left out "
            f"({', '.join(f'{m} {n}' for m, n in counts.items())}): a log ratio needs a positive figure")


def repeated(frame: pd.DataFrame, keys: list[str]) -> str | None:
    """A note on rows that repeat a cell another row has (the same trial, or either without a `trial` column):
    a run's trials differ in `trial`, so these are not trials. None when there are none."""
    by = keys + (["trial"] if "trial" in frame.columns else [])
    names = frame[by].map(_shown)
    dup = names.duplicated(keep="first").to_numpy()
    if not dup.any():
        return None
    n_cells = len(names[names.duplicated(keep=False).to_numpy()].drop_duplicates())
    first = row_text(frame.iloc[int(dup.argmax())], frame.index[int(dup.argmax())], keys)
    what = "cell and trial" if "trial" in frame.columns else "cell"
    return (f"{_rows(dup.sum())} repeat{'s' if dup.sum() == 1 else ''} the {what} of another row ({n_cells} "
            f"cell{'s' if n_cells != 1 else ''}; the first: {first}): averaged with it as trials are")
