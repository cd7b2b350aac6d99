"""Planning sub-commands on the virtual-time simulator: `whatif` (capacity per configuration under SLOs) and
`calibrate` (fit the simulator's free constants to a hardware run). Imports are deferred, as in commands."""
from __future__ import annotations

import signal

from epdbench.cli.calibration import calibrate_fit, print_constants, print_errors, stored_spec, write_profile
from epdbench.cli.common import INTERRUPTED_RUN, CliError, config_names


def cmd_calibrate(args) -> int:
    """Fit the simulator's free constants to a run's summary, check them on held-out cells, write a profile."""
    from datetime import date

    from epdbench.analysis import error_tail, fit, holdout
    from epdbench.specs.models import spec_fingerprint
    from epdbench.specs.profile import CalibrationProfile, cell_fingerprints
    from epdbench.tasks.sim.vrun import simulate_summary

    given = [flag for flag, value in (("--ops", args.ops), ("--from", args.source),
                                      ("--engine-steps", args.engine_steps), ("--transport", args.transport))
             if value is not None]
    if len(given) > 1:
        raise CliError(f"{' and '.join(given)}: give one — a run to fit (--from), a gpu_ops CSV to carry (--ops), "
                       "a truth table of engine step timings to fit (--engine-steps) or a run's KV transfer timings "
                       "to fit (--transport)")
    for flag, value in (("--config", args.config), ("--profile", args.profile)):
        if value is not None and args.transport is None:
            raise CliError(f"{flag}: it goes with --transport (a run's KV transfer timings to fit)")
    if args.ops is not None:
        from epdbench.cli.ops import cmd_calibrate_ops
        return cmd_calibrate_ops(args)
    if args.engine_steps is not None:
        from epdbench.cli.engine_steps import cmd_calibrate_engine_steps
        return cmd_calibrate_engine_steps(args)
    if args.transport is not None:
        from epdbench.cli.transport_fit import cmd_calibrate_transport
        return cmd_calibrate_transport(args)
    if args.source is None:
        raise CliError("--from: give the run to fit (its results folder, summary.csv or records.parquet), --ops "
                       "with a gpu_ops CSV, --engine-steps with a truth table, or --transport with a PD or EPD run")
    metrics, out = _calibrate_flags(args)
    args.source = _run_file(args.source)
    signal.signal(signal.SIGTERM, signal.default_int_handler)     # SIGTERM stops it as Ctrl-C does
    INTERRUPTED_RUN["note"] = f"no profile written to {out}"
    run_spec, target = _calibration_spec(args)
    table = _read_run(args.source)
    notes: list[str] = []
    try:
        usable = fit.usable_rows(table, notes)
        observed = fit.observed_cells(usable, metrics, notes)
        spec = fit.spec_for_cells(run_spec, observed)
    except fit.FitInputError as e:
        raise CliError(f"--from {args.source}: {e}") from None
    if missing := fit.unplanned(spec, observed):      # said before the fit, not after minutes of it
        which = "s are not cells" if len(missing) > 1 else " is not a cell"
        notes.append(f"{len(missing)} observed cell{which} the spec runs, left out (the first: "
                     f"{'/'.join(map(str, missing[0]))}): check workload, concurrency and stream against the spec")
        observed = observed.drop(index=missing)
    print(f"Calibrating the virtual-time simulator to {args.source}: {len(observed)} cells of "
          f"{', '.join(c.name for c in spec.configurations)} (spec {run_spec.name}); "
          f"metrics {', '.join(observed.columns)}", flush=True)
    for note in notes:
        print(f"  {note}", flush=True)
    if target == "sim":
        print("note: the run was made by the simulator (target sim in its spec.yaml): this fits the simulator to its "
              "own emulated figures, not to hardware, and the profile says so wherever it is used", flush=True)
    cache: dict = {}      # simulator runs shared by the two fits (both start from the spec's constants)
    full = calibrate_fit("fit on every cell", spec, observed, simulate_summary, args.evaluations, cache)
    cells = fit.matched(observed, full.start_predicted)
    if len(cells) < len(observed):
        print(f"  {len(observed) - len(cells)} observed cells got no figure from the simulator; left out")
    print_constants(run_spec, full)
    if not full.values:
        raise CliError("none of the free constants moves the observed figures: nothing to fit")
    held = fit.holdout_mask(cells.index, args.holdout_seed)
    fit_error = fit.relative_errors(cells, full.predicted)
    errors = {"spec's constants": fit.relative_errors(cells, full.start_predicted),
              f"fitted ({len(cells)} cells)": fit_error}
    holdout_error: dict = {}
    holdout_spec_error: dict = {}
    holdout_tail: dict = {}
    checks: dict = {}
    if held.any():
        half = calibrate_fit(f"hold-out check (seed {args.holdout_seed}): fit on {int((~held).sum())} cells, "
                              f"predict {int(held.sum())}", spec, cells[~held], simulate_summary,
                              args.evaluations, cache)
        n_held = int(held.sum())
        holdout_spec_error = errors[f"held out ({n_held}), spec's"] = fit.relative_errors(cells[held],
                                                                                         full.start_predicted)
        holdout_error = errors[f"held out ({n_held}), fitted"] = fit.relative_errors(cells[held], half.predicted)
        holdout_tail = error_tail.holdout_tails(cells[held], half.predicted)
        checks = holdout.compare_on_held_out(cells[held], full.start_predicted, half.predicted)
    print_errors(errors)
    if checks:
        print(f"\nhold-out check: {holdout.summary_line(checks)} (sign test over the cells; the metrics "
              f"together at p < {holdout.ALPHA}, Holm's correction)")
        if worse := [m for m, c in checks.items() if c["verdict"] == "worse"]:
            print(f"warning: for {', '.join(worse)} the spec's own constants predict cells the fit did not see "
                  "better than fitted ones do; the profile records it and its error bar says so wherever it is used")
    pairs = set(zip(cells.index.get_level_values("config"), cells.index.get_level_values("suite")))
    fitted_pairs = {k: v for k, v in cell_fingerprints(spec).items() if tuple(k.split("|")) in pairs}
    profile = CalibrationProfile(
        spec=run_spec.name, spec_fingerprint=spec_fingerprint(run_spec), source=str(args.source),
        gpu=run_spec.hardware.gpu, model=run_spec.model.name, source_target=target,
        created=date.today(), hardware=full.values, left_as_in_spec=sorted(full.left),
        evaluations=full.evaluations, fit_error=fit_error, holdout_seed=args.holdout_seed if holdout_error else None,
        holdout_error=holdout_error, holdout_tail=holdout_tail, holdout_spec_error=holdout_spec_error,
        cells_fitted=fitted_pairs,
        holdout_verdict={m: c["verdict"] for m, c in checks.items()}, op_laws=run_spec.hardware.op_laws,
        op_timings=run_spec.hardware.op_timings if run_spec.hardware.op_laws == "measured" else None)
    return write_profile(out, profile, args.out)


def _calibration_spec(args):
    """(the spec the run used, where it ran: "sim", "kubernetes", "local" or None if unknown) for --from: the run's
    folder (the one holding --from) keeps its resolved spec.yaml."""
    from pathlib import Path

    return stored_spec(Path(args.source).parent / "spec.yaml", args.spec, f"--from {args.source}",
                       f"beside {args.source}")


def _calibrate_flags(args):
    """(--metrics as a list or None, --out as a Path), after checking every calibrate flag."""
    from pathlib import Path

    from epdbench.analysis.fit import FIT_METRICS

    if args.evaluations < 2:
        raise CliError("--evaluations: at least 2 simulator runs")
    if args.holdout_seed < 0:
        raise CliError("--holdout-seed: must be >= 0")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    if metrics is not None and (not metrics or not set(metrics) <= set(FIT_METRICS)):
        raise CliError(f"--metrics {args.metrics}: choose from {', '.join(FIT_METRICS)}")
    out = Path(args.out)
    if not out.parent.is_dir():
        raise CliError(f"--out {args.out}: folder {out.parent} does not exist")
    return metrics, out


def _run_file(source: str) -> str:
    """--from as a file: a run's results folder stands for its summary.csv (else its records.parquet)."""
    from pathlib import Path

    folder = Path(source)
    if not folder.is_dir():
        return source
    for name in ("summary.csv", "records.parquet"):
        if (folder / name).is_file():
            return str(folder / name)
    raise CliError(f"--from {source}: a folder without summary.csv or records.parquet; give a run's results folder "
                   "or one of those files")


def _read_run(source: str):
    """The summary of a run: a summary.csv (or summary.parquet) as it is, a records.parquet summarised as a run
    summarises it."""
    from pathlib import Path

    import pandas as pd

    path = Path(source)
    if not path.is_file():
        raise CliError(f"--from {source}: no such file; give the summary.csv or records.parquet of a run")
    try:
        if path.suffix == ".csv":
            return pd.read_csv(path)
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq
            if {"phase", "ttft_ms"} <= set(pq.read_schema(path).names):
                from epdbench.analysis.metrics import RECORD_COLUMNS, summarize
                from epdbench.tasks.rundir.results import read_records
                return summarize(read_records(path, RECORD_COLUMNS))
            return pd.read_parquet(path)
    except (ValueError, KeyError, OSError) as e:   # pandas' and Arrow's parse errors are ValueErrors
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CliError(f"--from {source}: cannot read it ({first})") from None
    raise CliError(f"--from {source}: give a .csv summary or a .parquet of records or a summary")


DEFAULT_REPLICAS = [1, 2, 3, 4]     # whatif --replicas


def _ints(flag: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{flag} {text}: give comma-separated whole numbers, e.g. 1,2,4") from None
    if not values or min(values) < 1:
        raise CliError(f"{flag} {text}: give comma-separated whole numbers of at least 1")
    return values


def cmd_whatif(args) -> int:
    import time
    from pathlib import Path

    from epdbench.analysis.goodput import slo_text
    from epdbench.analysis.whatif import TABLE_LEGEND, slo_suites, table_lines, tp_problem, variants
    from epdbench.specs.models import load_spec, select_configurations

    from epdbench.specs.profile import error_bar, fitted_elsewhere, profile_origin

    spec = load_spec(args.spec)
    profile = None
    origin = ""
    if args.profile:
        from epdbench.specs.profile import apply_profile, load_profile
        profile = load_profile(args.profile)
        spec = apply_profile(spec, profile)
        origin = f", profile {args.profile} ({profile_origin(profile)})"
        if moved := fitted_elsewhere(spec, profile):
            origin += f" — fitted on another {' and '.join(moved)}"
    configs = config_names(args.configs)
    spec = select_configurations(spec, configs)
    suites = slo_suites(spec)
    if not suites:
        raise CliError(f"--spec {args.spec}: no open-loop suite with an slo (kind: rate, slo: ...) to plan "
                       "capacity for; add one (see the capacity suites of the pd-text and epd-multimodal presets)")
    transports = [t.strip() for t in args.transports.split(",") if t.strip()] if args.transports else None
    if transports and not set(transports) <= {"tcp", "rdma"}:
        raise CliError(f"--transports {args.transports}: choose from tcp, rdma")
    if not 1 <= args.window <= 3600:
        raise CliError("--window: between 1 and 3600 seconds")
    if args.refine < 0 or args.refine > 8:
        raise CliError("--refine: between 0 and 8")
    if args.max_gpus is not None and not 1 <= args.max_gpus <= spec.hardware.gpus_per_node:
        raise CliError(f"--max-gpus {args.max_gpus}: between 1 and the node's {spec.hardware.gpus_per_node} GPUs "
                       "(hardware.gpus_per_node): the simulator models one node — a TP group's all-reduce over "
                       "its NVLink, KV moved over its pod network — not a cluster of them")
    if args.workers is not None and args.workers < 1:
        raise CliError("--workers: at least 1")
    asked, tps = _ints("--replicas", args.replicas), _ints("--tp", args.tp)
    replicas = asked or DEFAULT_REPLICAS
    gpus = args.max_gpus or spec.hardware.gpus_per_node
    for tp in tps or []:
        if why := tp_problem(spec, tp):
            serving = [t for t in range(1, gpus + 1) if not tp_problem(spec, t)]
            raise CliError(f"--tp {args.tp}: TP {tp} cannot serve {spec.model.name}: {why.rstrip('.')}; use TP "
                           f"{', '.join(map(str, serving)) or 'none: no TP within the GPUs starts it'}")
    over: list[int] = []
    found = variants(spec, replicas, tps, transports, args.max_gpus, over)
    if not found:
        raise CliError("no variant fits: raise --max-gpus or lower --replicas/--tp")
    # a value given that no variant can use is a mistake (the default's 4 replicas may simply not fit)
    for flag, values, used in (("--replicas", asked or [], {r.replicas for v in found for r in v.config.roles}),
                               ("--tp", tps or [], {r.tp for v in found for r in v.config.roles})):
        if unused := [x for x in values if x not in used]:
            where = ("--max-gpus; drop it or raise --max-gpus" if gpus < spec.hardware.gpus_per_node
                     else "the node, hardware.gpus_per_node; drop it")
            raise CliError(f"{flag} {', '.join(map(str, unused))}: no variant with it fits on {gpus} GPUs ({where})")
    # what is predicted: each variant on the SLO suites (the error bar says whether a profile saw such cells)
    planned = spec.model_copy(update={"configurations": [v.config for v in found], "suites": suites})
    model_error = error_bar(profile, planned)
    out = Path(args.out or f"results/whatif-{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        raise CliError(f"--out {out}: directory exists and is not empty; choose a new one")
    from epdbench.reports.whatif import best_attainment, capacity_per_gpu
    from epdbench.specs.models import spec_fingerprint
    from epdbench.tasks.sim.whatif import run_whatif, tables, write_outputs, write_provenance

    write_provenance(out, spec, {
        "what": "modelled by the virtual-time simulator, not measured", "spec": spec.name,
        "spec_fingerprint": spec_fingerprint(spec), "modelled_gpu": spec.hardware.gpu,
        "options": {"replicas": ",".join(map(str, replicas)), "tp": args.tp, "transports": args.transports,
                    "max_gpus": args.max_gpus, "configs": args.configs, "refine": args.refine,
                    "window_s": args.window},
        "variants": [v.config.name for v in found], "profile": args.profile, "profile_contents": profile,
        "model_error": model_error, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})

    print(f"What-if on the virtual-time simulator (modelled hardware {spec.hardware.gpu}, not a measurement): "
          f"{len(found)} variants of {len(spec.configurations)} configurations, suites "
          + "; ".join(f"{s.name} ({', '.join(x.workload for x in s.shapes)}; {slo_text(s.slo)})" for s in suites)
          + origin, flush=True)
    if over:
        need = f"{min(over)}–{max(over)}" if min(over) < max(over) else f"{min(over)}"
        print(f"  {len(over)} other combination{'s' if len(over) > 1 else ''} of the replica counts and TP sizes "
              f"left out: {'they need' if len(over) > 1 else 'it needs'} {need} GPUs, over the {gpus} a variant "
              "may use", flush=True)
    t0 = time.perf_counter()
    done: list[dict] = []
    signal.signal(signal.SIGTERM, signal.default_int_handler)     # SIGTERM stops it as Ctrl-C does
    try:
        allv, best, points = run_whatif(spec, found, args.refine, args.workers, args.window,
                                        say=lambda line: print(line, flush=True), done=done)
    except KeyboardInterrupt:
        if done:   # what finished is kept; no capacity table: the variants not tried could have won
            part_v, _, part_p = tables(found, done)
            out.mkdir(parents=True, exist_ok=True)
            part_v.to_csv(out / "variants.csv", index=False)
            part_p.to_csv(out / "points.csv", index=False)
            INTERRUPTED_RUN["note"] = (f"the {len(done)} of {len(found)} variants that finished are in "
                                       f"{out}/ (variants.csv, points.csv)")
        raise
    plots = [capacity_per_gpu(allv, best)] + [best_attainment(points, best, s.name) for s in suites]
    write_outputs(out, allv, best, points, [(p.name, p.png) for p in plots])
    for (suite, shape), g in best.groupby(["suite", "shape"], sort=False):
        print(f"\nCapacity within the SLO, suite {suite} {shape} — best variant per configuration, by goodput per GPU:")
        for line in table_lines(g.to_dict("records")):
            print("  " + line)
    print(f"\n{TABLE_LEGEND}")
    print(f"\nModel error: {model_error}; the noise ranges are the workload's sampling noise only.")
    print(f"\n{len(found)} variants in {time.perf_counter() - t0:.1f} s; tables and plots in {out}/ "
          "(variants.csv, capacity.csv, points.csv, *.png; what they are: whatif.json, spec.yaml)")
    return 0
