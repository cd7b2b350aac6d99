"""benchmarks/simulator/itl_stalls.py on the H100 truth run kept in benchmarks/data (records.parquet): every batched
cell of the real engine set beside the simulator's, with the stalls counted on both sides; bad input is one line and
exit 2."""
from __future__ import annotations

from pathlib import Path

from tests.benchmark_scripts import load_benchmark

RECORDS = Path(__file__).resolve().parents[1] / "benchmarks/data/h100-2026-12-07/records.parquet"


def script():
    return load_benchmark("simulator/itl_stalls")


def test_the_real_engines_stalls_beside_the_simulators(capsys):
    assert script().main(["--records", str(RECORDS)]) == 0
    printed = capsys.readouterr().out
    assert "9 cells at concurrency 2 or more" in printed
    real = [x.split() for x in printed.splitlines() if x.split()[4:5] == ["real"]]
    assert len(real) == 9
    # the kept run's 1792-px images at concurrency 4: 40 of 2,032 gaps stalled, the p99 among them
    big = next(r for r in real if r[2] == "1792px+400/128")
    assert big[5:8] == ["2032", "40", "2.0%"]
    assert "cells with the p99 on the other side of the 1 % line" in printed


def test_bad_input_is_one_line(tmp_path, capsys):
    assert script().main(["--records", str(tmp_path / "nope.parquet")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    assert script().main(["--records", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
