"""analysis.labels: a cell named by its load (a rate cell by its rate and in-flight cap), and a reason's subject said
once for many workers or endpoints."""
import pytest

from epdbench.analysis.labels import cell_label, load_label, named_or_counted, shape_label
from epdbench.specs.workload import plan_cells, rate_workload, split_rate
from epdbench.specs.models import load_spec


@pytest.mark.parametrize("shape,rate", [("4096/128", 4.0), ("1260px+400/128", 0.5), ("1k:560px+200/8", 100000.0),
                                        ("512/64", 1e-05)])
def test_split_rate_inverts_rate_workload(shape, rate):
    assert split_rate(rate_workload(shape, rate)) == (shape, rate)
    assert split_rate(shape) == (shape, None)


def test_closed_loop_cells_keep_their_concurrency():
    assert load_label("512/64", 8) == "concurrency 8"
    assert cell_label("512/64", 8) == "512/64, concurrency 8"
    assert cell_label("1024-2048/8", 2, "burst") == "1024-2048/8 (burst), concurrency 2"
    assert cell_label("512/64", 8, short=True) == "512/64 c=8"
    assert cell_label("256/8", 2, "steady", short=True) == "256/8 (steady) c=2"


def test_rate_cells_read_as_their_rate_and_in_flight_cap():
    workload = rate_workload("4096/128", 4)
    assert load_label(workload, 1024) == load_label(workload, 1024, short=True) == "4 req/s (≤1024 in flight)"
    assert shape_label(workload) == "4096/128"
    assert cell_label(workload, 1024) == "4096/128, 4 req/s (≤1024 in flight)"
    assert cell_label(workload, 1024, short=True) == "4096/128 at 4 req/s (≤1024 in flight)"
    assert "concurrency" not in cell_label(rate_workload("4096/128", 0.5), 1024)


def test_every_planned_rate_cell_is_labelled_by_its_own_rate_and_cap():
    spec = load_spec("pd-text")
    rated = [c for c in plan_cells(spec) if c.rate is not None]
    assert rated
    for c in rated:
        assert load_label(c.workload, c.concurrency) == f"{c.rate:g} req/s (≤{c.concurrency} in flight)"


def test_many_alike_are_counted_per_pod_a_few_are_named():
    assert named_or_counted([("decode-0", "thread 1")], "worker") == "decode-0 thread 1"
    assert named_or_counted([("d", "a"), ("p", "b")], "endpoint") == "2 endpoints (d a; p b)"
    many = [("decode-0", f"thread {i}") for i in range(6)] + [("prefill-0", f"thread {i}") for i in range(4)]
    assert named_or_counted(many, "endpoint") == "10 endpoints (decode-0: 6, prefill-0: 4)"
