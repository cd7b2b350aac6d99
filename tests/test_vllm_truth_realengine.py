"""benchmarks/simulator/vllm_truth.py on a real vLLM engine (the CPU build serving cpu-tiny's tiny model, 512-token
prompts: four of its 128-token KV blocks each): the product's load generator and `vllm bench serve` measure every cell
on the same engine and the engine's own cache counters show that both found its prefix cache cold; a `vllm bench serve`
cell run as the script once ran it (one seed for every run, so the same prompts again) is served from that cache,
and its row says so and is left out of what the simulator is held to."""
from __future__ import annotations

import csv
import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from epdbench.analysis import truth
from epdbench.analysis.truth_rows import bench_serve_args, client_figures_from_bench, engine_means, truth_row
from epdbench.specs.models import load_spec
from epdbench.specs.workload import build_requests, plan_cells
from epdbench.tasks.local.target import model_to_serve
from tests.benchmark_scripts import load_benchmark
from tests.test_e2e_local import engine_python

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "simulator" / "vllm_truth.py"
pytestmark = [pytest.mark.realengine, pytest.mark.timeout(900)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script():
    return load_benchmark("simulator/vllm_truth")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """One aggregated CPU engine serving the tiny model, and the spec of its cells: 512/8 at concurrency 1 and 2."""
    python = engine_python()
    where = tmp_path_factory.mktemp("truth-real")
    data = yaml.safe_load((Path(__file__).parents[1] / "specs" / "cpu-tiny.yaml").read_text())
    data["configurations"] = data["configurations"][:1]
    data["suites"] = [{"kind": "fixed", "name": "text", "concurrencies": [1, 2], "n_warmup": 1, "n_measured": 4,
                       "shapes": [{"input_tokens": 512, "output_tokens": 8}]}]
    spec_path = where / "truth-cpu.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    spec = load_spec(str(spec_path))
    model_dir = model_to_serve(spec, where)
    bench = script()
    proc, url = bench.start_engine(SimpleNamespace(vllm_python=python, port=free_port()), spec, model_dir,
                                   where / "engine.log")
    try:
        yield SimpleNamespace(python=python, spec=spec, spec_path=spec_path, model_dir=model_dir, url=url,
                              where=where, script=bench)
    finally:
        bench.stop(proc)


def metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return r.read().decode()


def test_both_tools_measure_every_cell_on_a_cold_prefix_cache(engine):
    out = engine.where / "truth"
    done = subprocess.run([sys.executable, str(SCRIPT), "--url", engine.url, "--model-dir", engine.model_dir,
                           "--spec", str(engine.spec_path), "--vllm-python", engine.python, "--out", str(out),
                           "--tools", "epdbench,vllm-bench"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(out / "truth.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    cells = {(c.workload, c.concurrency) for c in plan_cells(engine.spec)}
    for tool in ("epdbench", "vllm-bench"):
        assert {(r["workload"], int(r["concurrency"])) for r in rows if r["tool"] == tool} == cells
    for r in rows:
        assert r["requests_ok"] == r["n_measured"], r
        # the engine looked its prompts up (the column is no blank) and served none of their blocks from its cache
        assert r["engine_prefix_hit_pct"] != "" and float(r["engine_prefix_hit_pct"]) <= truth.WARM_PREFIX_PCT, r
    notes: list[str] = []
    assert len(truth.usable(pd.DataFrame(rows), notes)) == len(rows) and notes == []


def test_one_seed_for_every_run_measures_the_prefix_cache_and_the_row_is_left_out(engine):
    cell = plan_cells(engine.spec)[0]
    req = build_requests(engine.spec, cell, 0)[-1]

    def bench(name: str) -> subprocess.CompletedProcess:
        args = bench_serve_args(api=req.api, input_tokens=512, output_tokens=8, image_px=None, concurrency=1,
                                n_measured=4, base_url=engine.url, model=engine.spec.model.name,
                                tokenizer=engine.model_dir, seed=engine.spec.seed, result_dir=str(engine.where),
                                result_file=name)
        return subprocess.run([engine.python, "-c", engine.script.BENCH_LAUNCHER, "bench", "serve", *args],
                              capture_output=True, text=True, timeout=300)

    assert bench("first.json").returncode == 0
    before = metrics(engine.url)
    again = bench("again.json")
    assert again.returncode == 0, again.stderr[-2000:]
    means = engine_means(before, metrics(engine.url))
    # the same four prompts again: each one's first three blocks (the last holds the token to compute) from cache
    assert means["engine_prefix_hit_pct"] >= 50.0, means
    result = json.loads((engine.where / "again.json").read_text())
    row = truth_row({"gpu": "cpu", "tool": "vllm-bench", "config": "aggregated", "suite": "text",
                     "workload": "512/8", "input_tokens": 512, "image_px": 0, "output_tokens": 8, "concurrency": 1},
                    client_figures_from_bench(result), means)
    notes: list[str] = []
    assert truth.usable(pd.DataFrame([row]), notes).empty
    assert notes[0].startswith("1 row measured on a warm cache left out (prefix hits up to ")
