"""benchmarks/simulator/vllm_truth.py against a running server (`--url`, here one simulator replica over loopback): a
row per cell with the product's load generator; run again into the same --out it keeps the rows there and measures only
the cells without one; with nothing left it starts nothing; --deadline-s stops before a cell, keeping what it has."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from epdbench.tasks.sim import target as sim_target

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "simulator" / "vllm_truth.py"
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


def truth(spec: Path, url: str, out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--url", url, "--spec", str(spec), "--tools", "epdbench",
                           "--out", str(out), *extra], capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL, env=env)


# nvidia-smi as the benchmark calls it: the GPU's name, or a sample line per 50 ms (200 W, 50 %) until stopped
FAKE_SMI = f"""#!{sys.executable}
import sys, time
if "--query-gpu=name" in sys.argv:
    print("Fake GPU 80GB")
    sys.exit(0)
for _ in range(4000):
    now = time.time()
    print(time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{{int(now % 1 * 1000):03d}}, 0, 50, 1000, 200.00, 1980",
          flush=True)
    time.sleep(0.05)
"""


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
    first_records = pd.read_parquet(out / "records.parquet")
    assert len(first_records) == 8 and first_records["request_id"].is_unique      # 4 cells × 2 measured
    again = truth(spec, url, out)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"3 rows already in {out / 'truth.csv'}: their cells are skipped" in again.stdout
    now = rows(out)
    assert now[:3] == made[:3] and len(now) == 4
    assert (now[3]["workload"], now[3]["concurrency"]) == ("512/8", "2")
    # the last cell's records, written before its row was lost, went before it was measured again: once each
    records = pd.read_parquet(out / "records.parquet")
    assert len(records) == 8 and records["request_id"].is_unique
    assert records.groupby("cell").size().to_dict() == first_records.groupby("cell").size().to_dict()

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


def test_the_gpus_power_over_each_measured_phase_gives_its_energy_per_token(served, tmp_path):
    spec, url = served
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = truth(spec, url, tmp_path / "out", env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    made = rows(tmp_path / "out")
    assert len(made) == 4 and {r["gpu"] for r in made} == {"Fake GPU 80GB"}
    for r in made:
        assert float(r["gpu_power_w_mean"]) == 200.0 and float(r["gpu_util_pct_mean"]) == 50.0
        # 200 W over the measured phase, spread over its output tokens (2 requests × 8)
        assert float(r["energy_j_per_token"]) == pytest.approx(float(r["gpu_energy_j"]) / 16, rel=1e-3)
        assert 0 < float(r["gpu_energy_j"]) < 200 * 60
    assert not [line for line in (tmp_path / "out" / "raw" / "gpu_telemetry.csv").read_text().splitlines()
                if line.count(",") != 5][:-1]


def script_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("vllm_truth_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_is_written_as_each_cell_ends_so_a_killed_run_keeps_its_finished_cells(served, tmp_path):
    import asyncio

    from epdbench.specs.models import load_spec
    from epdbench.specs.workload import calibration_keys
    from epdbench.tasks.load.calibrate import calibrate

    vt = script_module()
    path, url = served
    spec = load_spec(str(path))
    cal = calibrate(url, spec.model.name, calibration_keys(spec))
    keys_of = lambda cell, req, tool: vt.cell_keys(spec, cell, req, "Fake GPU", "0", tool)  # noqa: E731
    table = tmp_path / "truth.csv"
    on_disk = []

    def save(rows, cell_records):
        vt.write_rows(table, rows)
        on_disk.append((len(rows_of(table)), len(cell_records)))

    rows_of = lambda p: list(csv.DictReader(open(p, newline="")))  # noqa: E731
    made: list[dict] = []
    asyncio.run(vt.measure_cells(spec, url, cal, keys_of, made, save=save))
    # after each cell, the file on disk held every row so far (a run killed between cells loses none of them), and
    # each cell's save had its own 2 measured records
    assert on_disk == [(1, 2), (2, 2), (3, 2), (4, 2)]
    assert [(r["workload"], r["concurrency"]) for r in rows_of(table)] == [
        (w, c) for w in ("256/8", "512/8") for c in ("1", "2")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["truth.csv"]      # replaced whole, no temporary left
    # the simulator answers no /version: its rows say `external`, not a version it never gave
    assert vt.server_version(url) == "external"
