"""tasks/load/loadgen_wire.py: the in-cluster load generator's log lines, read back whole or known to be cut."""
from __future__ import annotations

from epdbench.tasks.load.loadgen_wire import LoadgenOutput, parse_output


def produced(n: int = 3) -> list[str]:
    out = LoadgenOutput()
    lines = ["WARNING something on stderr"]
    for i in range(n):
        lines.append(out.record("fixed|512/64|c1|main", 0, {"request_id": f"r{i}", "ok": True, "ttft_ms": 10.0 + i}))
    lines.append(out.cell("fixed|512/64|c1|main", 0, {"loop_lag_p99_ms": 0.4}))
    lines.append("{not json")
    lines.append(out.end())
    return lines


def test_a_whole_log_gives_every_record_with_its_cell_and_the_cells_noise():
    got = parse_output(line + "\n" for line in produced())
    assert got.complete and got.problem is None
    assert [r["request_id"] for r in got.records] == ["r0", "r1", "r2"]
    assert got.records[0]["cell"] == "fixed|512/64|c1|main" and got.records[0]["trial"] == 0
    assert got.noise == {("fixed|512/64|c1|main", 0): {"loop_lag_p99_ms": 0.4}}


def test_a_log_cut_short_or_altered_is_never_complete():
    lines = produced()
    cut = parse_output(lines[:-1])
    assert not cut.complete and "no end line after 3 records" in cut.problem and len(cut.records) == 3
    lost = parse_output([l for l in lines if '"r1"' not in l])
    assert not lost.complete and "counts 3 records, the log holds 2" in lost.problem
    altered = parse_output([l.replace('"ttft_ms":11.0', '"ttft_ms":99.0') for l in lines])
    assert not altered.complete and "checksum" in altered.problem
