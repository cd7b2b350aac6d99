"""analysis.itl_stalls: a cell's token gaps split into the decode rhythm and the stalls, and the pooled p99 placed on
its side of the 1 % line."""
from __future__ import annotations

import pandas as pd
import pytest

from epdbench.analysis import itl_stalls


def offsets(gaps_ms: list[float]) -> list[int]:
    """A request's chunk offsets (ns from the send) whose consecutive gaps are `gaps_ms`, its first token at 100 ms."""
    out, t = [100_000_000], 100.0
    for g in gaps_ms:
        t += g
        out.append(int(round(t * 1e6)))
    return out


def test_a_stall_is_a_gap_over_three_times_the_cells_median():
    # 4 requests × 100 gaps of 7 ms; one of them stalled twice (150 and 21.5 ms), one gap of 20 ms is no stall
    reqs = [offsets([7.0] * 100) for _ in range(3)] + [offsets([7.0] * 96 + [150.0, 21.5, 20.0, 7.0])]
    s = itl_stalls.stalls(reqs)
    assert (s.requests, s.gaps, s.median_gap_ms) == (4, 400, pytest.approx(7.0))
    assert s.stalls == 2 and s.stall_ms_max == pytest.approx(150.0) and s.stall_ms_p50 == pytest.approx(85.75)
    assert s.stall_ms_per_request == pytest.approx(171.5 / 4)
    assert s.share_pct == pytest.approx(0.5) and not s.p99_is_stall        # 2 of 400: the p99 is a decode step
    assert s.p99_ms == pytest.approx(7.0) and s.p99_ci[0] <= s.p99_ms <= s.p99_ci[1]


def test_over_one_percent_of_stalls_put_the_p99_among_them():
    reqs = [offsets([7.0] * 97 + [120.0, 130.0, 140.0]) for _ in range(4)]      # 3 % of the gaps stall
    s = itl_stalls.stalls(reqs)
    assert s.p99_is_stall and s.stalls == 12 and s.p99_ms > 100


def test_too_few_gaps_is_none_and_cells_split_by_their_keys():
    assert itl_stalls.stalls([[0]]) is None
    rows = []
    for c, gaps in ((1, [7.0] * 10), (4, [7.0] * 97 + [120.0, 130.0, 140.0])):
        for i in range(2):
            rows.append({"config": "aggregated", "suite": "image", "workload": "1792px+400/128", "concurrency": c,
                         "phase": "measured", "ok": True, "chunk_offsets_ns": offsets(gaps)})
    rows.append({**rows[-1], "phase": "warmup", "chunk_offsets_ns": offsets([500.0] * 10)})   # warm-ups left out
    cells = itl_stalls.cell_stalls(pd.DataFrame(rows), min_concurrency=2)
    assert list(cells) == [("aggregated", "image", "1792px+400/128", 4)]
    assert cells[("aggregated", "image", "1792px+400/128", 4)].stalls == 6


def test_the_lines_and_the_cells_on_the_other_side():
    key = ("aggregated", "image", "1792px+400/128", 4)
    real = {key: itl_stalls.stalls([offsets([7.0] * 97 + [120.0, 130.0, 140.0]) for _ in range(4)])}
    sim = {key: itl_stalls.stalls([offsets([7.0] * 99 + [290.0]) for _ in range(4)])}
    printed = itl_stalls.lines(real, sim)
    assert printed[1].split()[:7] == ["aggregated", "image", "1792px+400/128", "c=4", "real", "400", "12"]
    assert printed[2].split()[:3] == ["sim", "400", "4"]
    (verdict,) = itl_stalls.verdicts(real, sim)
    assert verdict.startswith("aggregated image 1792px+400/128 c=4: the real p99 is a stall (3.0% of gaps stall), "
                              "the simulator's not (1.0%): 4 stalls against 12, median stall 290 ms against 130 ms")
    assert itl_stalls.verdicts(real, real) == []
