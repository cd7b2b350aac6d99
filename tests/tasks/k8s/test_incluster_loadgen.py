"""`epdbench loadgen` (the in-cluster load generator) against the simulator over loopback: the seeded plan's
requests, each exactly once, read back whole from its stdout."""
from __future__ import annotations

import subprocess
import sys

import pytest

from epdbench.specs.workload import build_requests, plan_cells
from epdbench.tasks.sim import target as sim_target
from epdbench.tasks.load.loadgen_wire import parse_output


@pytest.fixture
def aggregated(tiny_spec, tiny_spec_path, tmp_path):
    dep = sim_target.start(tiny_spec, tiny_spec.configuration("aggregated"), tiny_spec_path, tmp_path / "agg")
    yield dep
    sim_target.stop(dep)


@pytest.mark.parametrize("suite", ["fixed", "mixed"])
def test_loadgen_command_streams_every_planned_request_once_with_a_checked_end(aggregated, tiny_spec,
                                                                               tiny_spec_path, suite):
    done = subprocess.run([sys.executable, "-m", "epdbench.cli", "loadgen", "--spec", str(tiny_spec_path),
                           "--suite", suite, "--url", aggregated.endpoint, "--run", "t-incluster"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = parse_output(done.stdout.splitlines())
    assert got.complete, got.problem
    planned = {c.cell_id: sorted(r.prompt_hash for r in build_requests(tiny_spec, c, 0))
               for c in plan_cells(tiny_spec) if c.suite == suite}
    seen: dict[str, list[str]] = {}
    for r in got.records:
        seen.setdefault(r["cell"], []).append(r["prompt_hash"])
        assert r["ok"], r["error"]
        assert r["timing"] == "modelled"
    assert {cell: sorted(h) for cell, h in seen.items()} == planned
    assert set(got.noise) == {(cell, 0) for cell in planned}


def test_loadgen_command_names_an_unknown_suite_in_one_line(tiny_spec_path):
    done = subprocess.run([sys.executable, "-m", "epdbench.cli", "loadgen", "--spec", str(tiny_spec_path),
                           "--suite", "nope", "--url", "http://127.0.0.1:9"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "suite 'nope' is not in spec tiny (suites: fixed, mm, mm-reuse, mixed)" in done.stderr
    assert "Traceback" not in done.stderr
