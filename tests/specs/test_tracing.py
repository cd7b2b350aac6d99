"""specs.tracing: which measured requests a cell traces, and build_requests marking them."""
import pytest

from epdbench.specs.tracing import traced_indices
from epdbench.specs.workload import build_requests, plan_cells


@pytest.mark.parametrize("n,k", [(0, 4), (3, 4), (4, 4)])
def test_a_small_cell_is_traced_whole(n, k):
    assert traced_indices(n, k) == set(range(n))


@pytest.mark.parametrize("n,k", [(1000, 32), (33, 32), (10, 2), (7, 1)])
def test_a_large_cell_traces_per_cell_spread_from_first_to_last(n, k):
    got = traced_indices(n, k)
    assert len(got) == k and min(got) == 0 and max(got) == (n - 1 if k > 1 else 0)
    assert got <= set(range(n))


def test_build_requests_marks_only_sampled_measured_requests(tiny_spec):
    spec = tiny_spec.model_copy(update={"tracing": tiny_spec.tracing.model_copy(update={"per_cell": 3})})
    cell = next(c for c in plan_cells(spec) if c.n_measured > 3)
    reqs = build_requests(spec, cell)
    traced = [r for r in reqs if r.traced]
    assert len(traced) == 3 and all(r.phase == "measured" for r in traced)
    off = spec.model_copy(update={"tracing": spec.tracing.model_copy(update={"enabled": False})})
    assert not any(r.traced for r in build_requests(off, cell))
