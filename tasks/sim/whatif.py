"""What-if planning in virtual time: each deployment variant (analysis.whatif) served the spec's SLO suites at
searched rates by the virtual-time simulator (tasks.sim.vrun), in worker processes; the capacity table, the
points and the plots written to a folder."""
from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pandas as pd

from epdbench.analysis.goodput import ItlP99, itl_p99, requests_meeting, wilson
from epdbench.analysis.whatif import (CAPACITY_COLUMNS, Point, Variant, best_per_configuration, capacity_row,
                                      noise_range, search_rate, slo_suites)
from epdbench.specs.models import ExperimentSpec, RateSuite, spec_to_yaml
from epdbench.specs.workload import Calibration
from epdbench.tasks.proc import lifeline
from epdbench.tasks.rundir.results import write_json, write_text_atomic
from epdbench.tasks.sim.vrun import prompt_calibration, simulate_configuration

POINT_COLUMNS = ["configuration", "variant", "suite", "shape", "rate", "requests", "met", "attainment",
                 "attainment_low", "attainment_high", "target", "itl_p99_ms", "sustained", "uncertain"]


def evaluate(spec: ExperimentSpec, variant: Variant, suite: RateSuite, shape_index: int, rate: float,
             calibration: Calibration, window_s: float) -> Point:
    """One rate of one shape of an SLO suite on a fresh deployment of the variant: requests and how many met
    the SLO. The suite's measured requests, or more so that arrivals span `window_s` at this rate: a short
    burst of arrivals above capacity ends before its queue has grown past the SLO, and would pass."""
    n = max(suite.n_measured, math.ceil(rate * window_s))
    one = suite.model_copy(update={"shapes": [suite.shapes[shape_index]], "rates": [rate], "n_measured": n})
    sub = spec.model_copy(update={"suites": [one], "configurations": [variant.config], "trials": 1})
    rows = pd.DataFrame(simulate_configuration(sub, variant.config, calibration))
    measured = rows[rows["phase"] == "measured"] if len(rows) else rows
    met = int(requests_meeting(measured, suite.slo).sum()) if len(measured) else 0
    itl = itl_p99(measured, suite.slo) if len(measured) else ItlP99(None, True, False)
    return Point(rate, len(measured), met, suite.slo.attainment, itl.p99_ms, itl.holds, itl.uncertain)


def plan_variant(spec: ExperimentSpec, variant: Variant, calibration: Calibration, refine: int,
                 window_s: float) -> dict:
    """Every SLO suite and shape of the spec on one variant: its capacity rows and evaluated points."""
    t0 = time.perf_counter()
    rows, points = [], []
    for suite in slo_suites(spec):
        for i, shape in enumerate(suite.shapes):
            found = search_rate(lambda r: evaluate(spec, variant, suite, i, r, calibration, window_s), suite.rates,
                                refine)
            rows.append({**capacity_row(variant, found), "suite": suite.name, "shape": shape.workload})
            for p in found:
                low, high = wilson(p.met, p.requests)
                points.append({"configuration": variant.family, "variant": variant.config.name, "suite": suite.name,
                               "shape": shape.workload, "rate": p.rate, "requests": p.requests, "met": p.met,
                               "attainment": p.attainment, "attainment_low": low, "attainment_high": high,
                               "target": p.target, "itl_p99_ms": p.itl_p99_ms, "sustained": p.sustained,
                               "uncertain": p.uncertain})
    return {"rows": rows, "points": points, "seconds": time.perf_counter() - t0}


def run_whatif(spec: ExperimentSpec, variants: list[Variant], refine: int = 3, workers: int | None = None,
               window_s: float = 30.0, say=print, done: list[dict] | None = None
               ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(every variant's capacity, the best variant per configuration and SLO shape, every evaluated point).
    Each variant's result is appended to `done` as it finishes: on an interrupt (KeyboardInterrupt, raised
    again) the caller still has the finished ones — the variants not started are cancelled at once, the ones
    running are left to the caller to stop (their worker processes are its children)."""
    calibration = prompt_calibration(spec)
    workers = max(1, min(workers or os.cpu_count() or 1, len(variants)))
    results: list[dict] = [] if done is None else done
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_setup,
                               initargs=(os.getpid(),))
    try:
        futures = {pool.submit(plan_variant, spec, v, calibration, refine, window_s): v for v in variants}
        for n, fut in enumerate(as_completed(futures), 1):
            v, res = futures[fut], fut.result()
            results.append(res)
            found = ", ".join(f"{r['goodput_req_s']:.3g} req/s ({r['goodput_req_s_per_gpu']:.3g}/GPU; noise range "
                              f"{noise_range(r)})" if r["goodput_req_s"] is not None else r["note"]
                              for r in res["rows"])
            say(f"  [{n}/{len(variants)}] {v.family}: {v.roles}, {v.config.gpus} GPUs — {found} "
                f"({len(res['points'])} rates, {res['seconds']:.1f} s)")
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)    # never wait for the variants still queued
        raise
    pool.shutdown()
    return tables(variants, results)


def _worker_setup(parent_pid: int) -> None:
    """A worker leaves Ctrl-C to the command (which stops it): a terminal's SIGINT reaches the whole process
    group, and every worker would print its own KeyboardInterrupt. It dies with the command, however that dies
    (the pool forks its workers on the thread that submits, the command's main thread)."""
    lifeline.die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def tables(variants: list[Variant], results: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The capacity of every variant in `results` (in the order of `variants`), the best per configuration and
    SLO shape, and every evaluated point."""
    rows = [r for res in results for r in res["rows"]]
    order = {v.config.name: i for i, v in enumerate(variants)}
    rows.sort(key=lambda r: order[r["variant"]])
    allv = pd.DataFrame(rows, columns=["suite", "shape"] + CAPACITY_COLUMNS)
    best = pd.DataFrame([b for (_, _), g in allv.groupby(["suite", "shape"], sort=False)
                         for b in best_per_configuration(g.to_dict("records"))], columns=allv.columns)
    points = pd.DataFrame([p for res in results for p in res["points"]], columns=POINT_COLUMNS)
    return allv, best, points


def write_provenance(out: Path, spec: ExperimentSpec, about: dict) -> None:
    """What the folder's tables are, written before any of them: the spec as the variants were made from
    (spec.yaml, the profile's constants applied) and `about` (whatif.json: modelled, not measured; the
    options, the profile and the model's error bar), so a table read later says where it came from."""
    write_text_atomic(out / "spec.yaml", spec_to_yaml(spec))
    write_json(out / "whatif.json", about)


def write_outputs(out: Path, allv: pd.DataFrame, best: pd.DataFrame, points: pd.DataFrame, plots: list) -> None:
    out.mkdir(parents=True, exist_ok=True)
    allv.to_csv(out / "variants.csv", index=False)
    best.to_csv(out / "capacity.csv", index=False)
    points.to_csv(out / "points.csv", index=False)
    for name, png in plots:
        (out / name).write_bytes(png)
