"""`calibrate --engine-steps CSV`: the simulator's engine constants fitted to a real engine's own step timings (a
truth table, analysis.truth), not to what a client saw — so no router, API server or network time enters the fit.

The fit reads the lone requests (cells at concurrency 1: each request has the engine to itself) and compares, per
cell, the engine's mean prefill time and decode time per output token with the cost model's for a lone request of
the same prompt length (analysis.engine_steps.lone_engine_cells): exact, and a fit of microseconds per step. The
batched cells (concurrency above 1), whose engine times also depend on how requests share steps, are then the
check: the virtual-time core serves them with the spec's and with the fitted constants (tasks.sim.engine_times),
and their engine figures are compared as a calibration's held-out cells are. Also the truth table's reading,
shared with benchmarks/simulator/sim_vs_real.py (load_truth). Imports are deferred, as in commands."""
from __future__ import annotations

from epdbench.cli.common import CliError

DEFAULT_SPEC = "vllm-truth"


def load_truth(path: str, tool: str, spec_name: str | None, option: str = "--engine-steps"):
    """(the spec on the table's GPU, the table's usable rows of `tool`, notes) from a truth table CSV; CliError
    (one line) when it cannot be read or used, or names a GPU whose datasheet is not known."""
    from pathlib import Path

    import pandas as pd

    from epdbench.analysis import truth
    from epdbench.specs.gpus import datasheet_for, known_devices, on_gpu
    from epdbench.specs.models import load_spec

    if not Path(path).is_file():
        raise CliError(f"{option} {path}: no such file; give a truth table CSV (benchmarks/data/README.md)")
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise CliError(f"{option} {path}: cannot read it as CSV ({str(e).splitlines()[0] if str(e) else e})") from None
    if table.empty:
        raise CliError(f"{option} {path}: no rows")
    try:
        truth.check(table)
        rows = truth.for_tool(table, tool)
    except truth.TruthError as e:
        raise CliError(f"{option} {path}: {e}") from None
    gpu = truth.gpu_of(rows)
    sheet = datasheet_for(gpu)
    if sheet is None:
        raise CliError(f"{option} {path}: gpu {gpu!r} is not a GPU whose datasheet epdbench knows ({known_devices()}); "
                       "add it to specs/gpus.py with its source")
    spec = load_spec(spec_name or DEFAULT_SPEC)
    notes = []
    if spec.hardware.gpu != sheet.gpu:
        notes.append(f"the table was measured on {gpu}: spec {spec.name}'s node ({spec.hardware.gpu}) takes its "
                     f"datasheet figures ({sheet.source})")
    return on_gpu(spec, sheet), truth.usable(rows, notes), notes


def spec_cells(spec, cells, notes: list[str]):
    """(`spec` narrowed to the cells' configurations and suites, the cells it runs); CliError when none."""
    from epdbench.analysis import fit

    try:
        narrowed = fit.spec_for_cells(spec, cells)
    except fit.FitInputError as e:
        raise CliError(str(e)) from None
    if missing := fit.unplanned(narrowed, cells):
        notes.append(f"{len(missing)} cell(s) of the table the spec does not run, left out (the first: "
                     f"{'/'.join(map(str, missing[0]))})")
        cells = cells.drop(index=missing)
    return narrowed, cells


def lone_shapes(spec, cells):
    """The lone cells' shapes for analysis.engine_steps.lone_engine_cells: each request's prompt as the server
    counted it (prompt_tokens_mean), or where the table lacks it the spec's target."""
    from epdbench.physics.costmodel import image_tokens

    shapes = cells.reset_index()
    px = shapes["image_px"].fillna(0).astype(int)
    target = shapes["input_tokens"] + [spec.model.chat_overhead_tokens + image_tokens(spec.model, p, p) if p else 0
                                       for p in px]
    return shapes.assign(image_px=px, prompt_tokens=shapes["prompt_tokens_mean"].fillna(target))


def cmd_calibrate_engine_steps(args) -> int:
    from datetime import date
    from pathlib import Path

    from epdbench.analysis import fit, holdout, truth
    from epdbench.analysis.engine_steps import ENGINE_FIT_METRICS, lone_engine_cells
    from epdbench.cli.calibration import calibrate_fit, print_constants, print_errors, write_profile
    from epdbench.specs.models import spec_fingerprint
    from epdbench.specs.profile import ENGINE_CONSTANTS, FREE_CONSTANTS, CalibrationProfile, cell_fingerprints

    if args.metrics:
        raise CliError("--metrics: the engine-step fit reads engine_prefill_ms and engine_decode_ms_per_token; "
                       "--metrics is for --from")
    if args.evaluations < 2:
        raise CliError("--evaluations: at least 2 simulator runs")
    out = Path(args.out)
    if not out.parent.is_dir():
        raise CliError(f"--out {args.out}: folder {out.parent} does not exist")
    spec, rows, notes = load_truth(args.engine_steps, args.tool, args.spec)
    if rows.empty:
        raise CliError(f"--engine-steps {args.engine_steps}: no row of tool {args.tool} left to fit ({'; '.join(notes)})")
    cells = truth.cells(rows, notes)[["input_tokens", "image_px", "output_tokens", "prompt_tokens_mean",
                                      *ENGINE_FIT_METRICS]].dropna(how="all", subset=list(ENGINE_FIT_METRICS))
    if cells.empty:
        raise CliError(f"--engine-steps {args.engine_steps}: no cell has engine_prefill_ms_mean or "
                       "engine_decode_ms_mean (nor engine_tpot_ms_mean): nothing to fit")
    spec, cells = spec_cells(spec, cells, notes)
    if others := sorted({c.name for c in spec.configurations if c.topology != "aggregated"}):
        raise CliError(f"--engine-steps: configuration(s) {', '.join(others)} are not aggregated: the fit reads one "
                       "engine serving whole requests")
    lone = cells[cells.index.get_level_values("concurrency") == 1]
    batched = cells[cells.index.get_level_values("concurrency") > 1]
    if lone.empty:
        raise CliError(f"--engine-steps {args.engine_steps}: no cell at concurrency 1: the fit reads lone requests' "
                       "engine timings")
    shapes = lone_shapes(spec, lone)
    observed = lone[list(ENGINE_FIT_METRICS)]
    print(f"Calibrating the simulator's engine constants to the engine step timings in {args.engine_steps} (tool "
          f"{args.tool}, spec {spec.name} on {spec.hardware.gpu}): {len(lone)} lone cells (concurrency 1) fitted, "
          f"{len(batched)} batched cells to check", flush=True)
    for note in notes:
        print(f"  {note}", flush=True)
    full = calibrate_fit("fit on the lone cells", spec, observed, lambda s: lone_engine_cells(s, shapes),
                         args.evaluations, {}, ENGINE_CONSTANTS)
    print_constants(spec, full)
    host = [n for n in FREE_CONSTANTS if n not in ENGINE_CONSTANTS]
    print(f"not fitted here, outside the engine: {', '.join(host)} (fit them to a run's client figures with "
          "calibrate --from)")
    if not full.values:
        raise CliError("none of the engine constants moves the engine timings: nothing to fit")
    fit_error = fit.relative_errors(observed, full.predicted)
    errors = {"spec's constants": fit.relative_errors(observed, full.start_predicted), "fitted (lone)": fit_error}
    checked, spec_error, fitted_error, fitted_tail = check_batched(spec, batched, full.values)
    if spec_error:
        errors[f"batched ({len(batched)}), spec's"] = spec_error
        errors[f"batched ({len(batched)}), fitted"] = fitted_error
    print_errors(errors)
    if checked:
        print(f"\ncheck on the batched cells: {holdout.summary_line(checked)} (sign test over the cells; the "
              f"metrics together at p < {holdout.ALPHA}, Holm's correction)")
    pairs = set(zip(observed.index.get_level_values("config"), observed.index.get_level_values("suite")))
    profile = CalibrationProfile(
        spec=spec.name, spec_fingerprint=spec_fingerprint(spec), source=str(args.engine_steps),
        gpu=spec.hardware.gpu, model=spec.model.name, created=date.today(), hardware=full.values,
        left_as_in_spec=sorted(full.left), evaluations=full.evaluations, fit_error=fit_error,
        holdout_error=fitted_error, holdout_tail=fitted_tail, holdout_spec_error=spec_error,
        holdout_verdict={m: c["verdict"] for m, c in checked.items()}, fitted_figures="engine",
        cells_fitted={k: v for k, v in cell_fingerprints(spec).items() if tuple(k.split("|")) in pairs},
        op_laws=spec.hardware.op_laws,
        op_timings=spec.hardware.op_timings if spec.hardware.op_laws == "measured" else None)
    return write_profile(out, profile, args.out)


def check_batched(spec, batched, values: dict) -> tuple[dict, dict, dict, dict]:
    """The batched cells' engine figures served in virtual time with the spec's and with the fitted constants:
    (the hold-out check of the two, analysis.holdout; the spec's median errors; the fitted ones; the fitted ones'
    90th percentile and worst cell, analysis.error_tail), all empty without batched cells."""
    import time

    from epdbench.analysis import error_tail, fit, holdout, truth
    from epdbench.analysis.engine_steps import ENGINE_FIT_METRICS
    from epdbench.tasks.sim.engine_times import simulate_cells

    observed = batched[list(ENGINE_FIT_METRICS)]
    if observed.empty:
        return {}, {}, {}, {}
    narrowed = fit.spec_for_cells(spec, observed)
    t0 = time.perf_counter()
    before, after = (truth.cells(truth.as_truth_table(simulate_cells(s), "", spec.model.name))
                     for s in (narrowed, fit.spec_with(narrowed, values)))
    print(f"\nthe {len(observed)} batched cells in virtual time, with the spec's and with the fitted constants "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    metrics = list(ENGINE_FIT_METRICS)
    return (holdout.compare_on_held_out(observed, before[metrics], after[metrics]),
            fit.relative_errors(observed, before), fit.relative_errors(observed, after),
            error_tail.holdout_tails(observed, after))
