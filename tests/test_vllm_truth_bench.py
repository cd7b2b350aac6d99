"""benchmarks/vllm_truth.py against a running server (`--url`, here one simulator replica over loopback): a row per
cell with the product's load generator; run again into the same --out it keeps the rows there and measures only the
cells without one; with nothing left it starts nothing; --deadline-s stops before a cell, keeping what it has."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from epdbench.tasks.sim import target as sim_target

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "vllm_truth.py"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_spec_path):
    """A spec of four short text cells and one aggregated simulator replica serving its model."""
    from epdbench.specs.models import load_spec
    folder = tmp_path_factory.mktemp("truth-spec")
    data = yaml.safe_load(tiny_spec_path.read_text())
    data["suites"] = [{"kind": "fixed", "name": "text", "concurrencies": [1, 2], "n_warmup": 1, "n_measured": 2,
                       "shapes": [{"input_tokens": 256, "output_tokens": 8}, {"input_tokens": 512, "output_tokens": 8}]}]
    path = folder / "truth-tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(str(path))
    dep = sim_target.start(spec, spec.configuration("aggregated"), path, folder / "sim")
    try:
        yield path, next(p for p in dep.processes if p.role == "server").url
    finally:
        sim_target.stop(dep)


def truth(spec: Path, url: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--url", url, "--spec", str(spec), "--tools", "epdbench",
                           "--out", str(out), *extra], capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)


def rows(out: Path) -> list[dict]:
    with open(out / "truth.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_second_run_into_the_same_folder_measures_only_the_cells_without_a_row(served, tmp_path):
    spec, url = served
    out = tmp_path / "truth"
    first = truth(spec, url, out)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    made = rows(out)
    assert [(r["tool"], r["workload"], r["concurrency"]) for r in made] == [
        ("epdbench", w, c) for w in ("256/8", "512/8") for c in ("1", "2")]
    assert all(r["requests_ok"] == r["n_measured"] == "2" and float(r["ttft_p50_ms"]) > 0 for r in made)

    with open(out / "truth.csv", "w", newline="") as fh:      # as if the run had stopped before its last cell
        w = csv.DictWriter(fh, fieldnames=list(made[0]))
        w.writeheader()
        w.writerows(made[:3])
    again = truth(spec, url, out)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"3 rows already in {out / 'truth.csv'}: their cells are skipped" in again.stdout
    now = rows(out)
    assert now[:3] == made[:3] and len(now) == 4
    assert (now[3]["workload"], now[3]["concurrency"]) == ("512/8", "2")

    idle = truth(spec, url, out)
    assert idle.returncode == 0 and "nothing to measure" in idle.stdout
    assert rows(out) == now


def test_a_deadline_reached_before_the_first_cell_keeps_an_empty_table_and_says_what_is_left(served, tmp_path):
    spec, url = served
    out = tmp_path / "late"
    done = truth(spec, url, out, "--deadline-s", "0.000001")
    assert done.returncode == 1
    assert "deadline reached: 4 epdbench cell(s) left; run again with the same --out to go on" in done.stdout
    assert rows(out) == []
