"""Rows of a matched cell together, workloads in numeric order (terminal and report tables)."""
import pandas as pd

from epdbench.reports.fmt import matched_order, workload_key


def test_workloads_sort_by_their_numbers():
    labels = ["4096/64", "512/64", "1k:560px+624/64", "4096/128@16/s", "4096/128@4/s", "4096/128@0.5/s", "512/1024"]
    assert sorted(labels, key=workload_key) == ["1k:560px+624/64", "512/64", "512/1024", "4096/64",
                                                 "4096/128@0.5/s", "4096/128@4/s", "4096/128@16/s"]


def test_rows_of_one_matched_cell_come_together():
    rows = [(cfg, w, c, st) for cfg in ("agg", "pd") for st in ("main", "burst") for w in ("4096/64", "512/64")
            for c in (8, 1)]
    frame = pd.DataFrame(rows, columns=["config", "workload", "concurrency", "stream"])
    out = list(matched_order(frame).itertuples(index=False, name=None))
    assert out[:4] == [("agg", "512/64", 1, "main"), ("pd", "512/64", 1, "main"),
                       ("agg", "512/64", 8, "main"), ("pd", "512/64", 8, "main")]
    assert [r[3] for r in out] == ["main"] * 8 + ["burst"] * 8
    assert matched_order(frame.iloc[0:0]).empty
