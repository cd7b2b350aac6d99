"""`calibrate --transport RUN`: the simulator's KV link fitted to the KV connector's own transfer timings, not to
what a client saw — so no prefill, decode, router or API server time enters it.

The engines' logs of a PD or EPD run hold, once a stats interval, the KV transfers completed with their mean time
and size (analysis.kv_transfers). The windows of one transfer each time the link alone: their median rate is the
link's (tcp_gb_s over TCP, rdma_efficiency over RDMA), with its 95 % interval; windows of several transfers are left
out. The run's client figures (its records) are then the check: the virtual-time core serves its cells with the
spec's and with the fitted link, and each cell's TTFT, TPOT and throughput are compared as a calibration's held-out
cells are (analysis.holdout) — none of them entered the fit. Imports are deferred, as in commands."""
from __future__ import annotations

from pathlib import Path

from epdbench.cli.common import CliError

LOG_SUFFIXES = (".log", ".log.gz")


def _logs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(LOG_SUFFIXES))


def _lines(path: Path):
    import gzip

    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            yield from fh
    except (OSError, EOFError) as e:
        raise CliError(f"--transport: cannot read {path} ({e})") from None


def _pod(path: Path) -> str:
    return path.name.removesuffix(".gz").removesuffix(".log")


def run_spec(folder: Path, flag_spec: str | None):
    """(the spec of the run whose logs `folder` holds, its target kind or None): the run's spec.yaml, in the folder
    or two levels up from evidence/<config>/, checked against --spec as calibrate --from checks it."""
    from epdbench.cli.calibration import stored_spec

    kept = next((p for p in (folder / "spec.yaml", folder.parent.parent / "spec.yaml") if p.is_file()), None)
    return stored_spec(kept, flag_spec, f"--transport {folder}", f"in {folder} or its run's folder")


def evidence_folders(folder: Path, spec, config: str | None) -> dict[str, Path]:
    """Configuration name -> the folder of its engines' logs: a results folder's evidence/<config>/ of every PD and
    EPD configuration, or a folder of one configuration's logs (named by --config, or by the folder's own name)."""
    moving = {c.name for c in spec.configurations if c.topology != "aggregated"}
    if not moving:
        raise CliError(f"--transport: spec {spec.name} has no PD or EPD configuration: no KV crosses a link")
    if (folder / "evidence").is_dir():
        found = {d.name: d for d in sorted((folder / "evidence").iterdir())
                 if d.is_dir() and d.name in moving and (config is None or d.name == config)}
        if not found:
            raise CliError(f"--transport {folder}: no evidence/<config>/ folder of "
                           f"{config or 'a PD or EPD configuration (' + ', '.join(sorted(moving)) + ')'}")
        return found
    if not _logs(folder):
        raise CliError(f"--transport {folder}: neither a results folder (evidence/<config>/) nor a folder of engine "
                       "logs (*.log, *.log.gz)")
    name = config or folder.name
    if name not in moving:
        raise CliError(f"--transport {folder}: say which configuration's logs these are with --config "
                       f"({', '.join(sorted(moving))})" if config is None else
                       f"--config {config}: not a PD or EPD configuration of spec {spec.name} "
                       f"({', '.join(sorted(moving))})")
    return {name: folder}


def records_summary(folder: Path):
    """The run's summary from the records.parquet beside the logs (in the folder, or two levels up), else None."""
    path = next((p for p in (folder / "records.parquet", folder.parent.parent / "records.parquet") if p.is_file()),
                None)
    if path is None:
        return None
    from epdbench.analysis.metrics import RECORD_COLUMNS, summarize
    from epdbench.tasks.rundir.results import read_records
    try:
        return summarize(read_records(path, RECORD_COLUMNS))
    except (ValueError, KeyError, OSError) as e:
        raise CliError(f"--transport: cannot read {path} ({str(e).splitlines()[0] if str(e) else e})") from None


def fit_links(spec, folders: dict[str, Path]) -> dict[str, dict]:
    """Per transport of the configurations: its lone-window rate (analysis.kv_transfers.LinkRate), the constant it
    sets and what each configuration's logs held; printed as it goes."""
    from epdbench.analysis.kv_transfers import MIN_LONE, link_constant, link_rate, windows_of
    from epdbench.physics.costmodel import setup_seconds

    configs = {c.name: c for c in spec.configurations}
    by_transport: dict[str, dict] = {}
    for name, folder in folders.items():
        c = configs[name]
        timed, untimed, pods = [], 0, []
        for log in _logs(folder):
            w = windows_of(_lines(log), f"{name}/{_pod(log)}")     # pods of two configurations share names
            timed += w.timed
            untimed += w.untimed
            if w.timed:
                pods.append(f"{_pod(log)} {len(w.timed)}")
        lone = sum(1 for w in timed if w.transfers == 1)
        print(f"  {name} ({c.kv_connector} over {c.kv_transport}): {len(timed)} windows of transfers"
              + (f" ({', '.join(pods)})" if pods else "") + f", {lone} of one transfer"
              + (f"; {untimed} without a transfer time" if untimed else ""), flush=True)
        acc = by_transport.setdefault(c.kv_transport, {"windows": [], "configs": [], "interfaces": {},
                                                        "connector": {}})
        acc["windows"] += timed
        acc["configs"].append(name)
        sender = next((r for r in c.roles if r.role == "prefill"), None)
        acc["interfaces"].update({w.pod: max(1, sender.rdma_interfaces if sender else 1) for w in timed})
        acc["connector"].update({w.pod: c.kv_connector for w in timed})
    hw = spec.hardware
    for transport, acc in by_transport.items():
        connector, nics = acc["connector"], acc["interfaces"]
        # over RDMA a sender's rate is its NICs' together: each configuration's windows count per NIC before
        # they are pooled, so configurations with different rdma_interfaces share one rdma_efficiency
        per_nic = transport == "rdma" and any(n > 1 for n in nics.values())
        rate = link_rate(acc["windows"], lambda w: setup_seconds(hw, transport, round(w.descriptors),
                                                                  connector.get(w.pod, "mooncake")),
                         (lambda w: nics.get(w.pod, 1)) if transport == "rdma" else (lambda w: 1.0))
        if rate.bytes_per_s is None:
            raise CliError(f"--transport: {len(rate.rates)} lone {transport} transfer window(s) in the logs of "
                           f"{', '.join(acc['configs'])}, at least {MIN_LONE} needed (windows of one transfer with "
                           "its time: vLLM's NixlConnector logs `KV Transfer metrics ... Avg xfer time (ms)` once a "
                           "stats interval; Mooncake's lines carry no time) — fit the link to the run's client "
                           "figures with calibrate --from")
        name, value = link_constant(transport, rate.bytes_per_s, hw.rdma_nic_gbit_s)
        if name == "rdma_efficiency" and value > 1:
            raise CliError(f"--transport: the lone RDMA transfers ran at {rate.bytes_per_s / 1e9:.3g} GB/s per NIC, "
                           f"above {hw.rdma_nic_gbit_s:g} Gbit/s (the spec's hardware.rdma_nic_gbit_s, with the "
                           "prefill role's rdma_interfaces NICs per sender): fix those first")
        acc["constant"] = (name, float(f"{value:.4g}"))
        low, high = (link_constant(transport, x, hw.rdma_nic_gbit_s)[1] for x in (rate.low, rate.high))
        print(f"{transport}: {len(rate.rates)} lone transfers of {rate.mean_bytes / 1e6:.1f} MB on average ran at "
              f"{rate.bytes_per_s / 1e6:.0f} MB/s{' per NIC' if per_nic else ''} (median; 95 % interval "
              f"{rate.low / 1e6:.0f}–{rate.high / 1e6:.0f}"
              f"; {rate.overlapped} windows of several transfers left out"
              + (f", {rate.too_short} no longer than the setup" if rate.too_short else "")
              + f"): {name} {value:.4g} (interval {low:.3g}–{high:.3g}; spec: {getattr(hw, name):g})", flush=True)
    return by_transport


SHOWN = ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s")


def print_cells(observed, before, after) -> None:
    """Per cell, each shown figure as observed, then simulated without → with the fitted link."""
    shown = [m for m in SHOWN if m in observed.columns]
    print("  cell: " + "; ".join(f"{m} observed, simulated without → with the link" for m in shown[:1])
          + (f" (so too {', '.join(shown[1:])})" if len(shown) > 1 else ""))
    for key in observed.index:
        label = " ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)) if str(k) != "main")
        figures = "; ".join(f"{m.removesuffix('_ms').removesuffix('_p50')} {observed.at[key, m]:.4g}, "
                            f"{before.at[key, m]:.4g} → {after.at[key, m]:.4g}" for m in shown)
        print(f"  {label}: {figures}")


def _base_profile(path: str | None, spec):
    """The profile --profile names (its constants applied before the fit and carried into the written profile),
    or None; CliError when it cannot be read."""
    if path is None:
        return None
    from epdbench.specs.models import SpecError
    from epdbench.specs.profile import fitted_elsewhere, load_profile

    try:
        base = load_profile(path)
    except SpecError as e:
        raise CliError(str(e)) from None
    if moved := fitted_elsewhere(spec, base):
        raise CliError(f"--profile {path}: fitted on {' and '.join(moved)}: its constants are not this run's")
    return base


def client_cells(spec, summary, configs: list[str]):
    """(the run's usable cells of `configs` from its summary, `spec` narrowed to them), or (None, None) saying why
    there is no check."""
    from epdbench.analysis import fit

    notes: list[str] = []
    try:
        usable = fit.usable_rows(summary[summary["config"].isin(configs)], notes)
        observed = fit.observed_cells(usable, None, notes)
        narrowed = fit.spec_for_cells(spec, observed)
    except fit.FitInputError as e:
        print(f"  no check on the run's client figures: {e}")
        return None, None
    if missing := fit.unplanned(narrowed, observed):
        observed = observed.drop(index=missing)
    for note in notes:
        print(f"  {note}")
    return observed, narrowed


def simulated(spec, observed):
    """The observed cells' client figures as the virtual-time core serves them under `spec`."""
    from epdbench.analysis import fit
    from epdbench.tasks.sim.vrun import simulate_summary

    return fit.predicted_cells(simulate_summary(spec), list(observed.columns))


def cmd_calibrate_transport(args) -> int:
    import time
    from datetime import date

    from epdbench.analysis import error_tail, fit, holdout
    from epdbench.cli.calibration import print_errors, write_profile
    from epdbench.specs.models import spec_fingerprint
    from epdbench.specs.profile import CalibrationProfile, cell_fingerprints

    if args.metrics:
        raise CliError("--metrics: the transport fit reads the KV transfers' own times; --metrics is for --from")
    folder = Path(args.transport)
    if not folder.is_dir():
        raise CliError(f"--transport {args.transport}: no such folder; give a PD or EPD run's results folder or a "
                       "folder of one configuration's engine logs")
    out = Path(args.out)
    if not out.parent.is_dir():
        raise CliError(f"--out {args.out}: folder {out.parent} does not exist")
    spec, target = run_spec(folder, args.spec)
    folders = evidence_folders(folder, spec, args.config)
    base = _base_profile(args.profile, spec)
    plain = spec
    if base is not None:
        from epdbench.specs.profile import apply_profile
        spec = apply_profile(spec, base)
    print(f"Calibrating the simulator's KV link to the KV transfer timings the engines logged in {folder} (spec "
          f"{spec.name} on {spec.hardware.gpu}):", flush=True)
    if target == "sim":
        print("note: the run was made by the simulator (target sim in its spec.yaml): its transfer windows are the "
              "cost model's own, not hardware's, and the profile says so wherever it is used", flush=True)
    if base is not None:
        from epdbench.specs.profile import profile_origin
        print(f"  on profile {args.profile}: {profile_origin(base)}", flush=True)
    links = fit_links(spec, folders)
    values = dict(acc["constant"] for acc in links.values())
    baseline = "profile's constants" if base is not None else "spec's constants"
    held = {"tcp": "tcp_latency_ms", "rdma": "rdma_latency_ms"}
    summary = records_summary(folder)
    checked, spec_error, fitted_error, fitted_tail, observed, errors = {}, {}, {}, {}, None, {}
    if summary is None:
        print("no records.parquet beside the logs: no check on the run's client figures")
    else:
        observed, narrowed = client_cells(spec, summary, list(folders))
    if observed is not None:
        t0 = time.perf_counter()
        before, after = simulated(narrowed, observed), simulated(fit.spec_with(narrowed, values), observed)
        observed = fit.matched(observed, before)
        if base is not None:
            errors["spec's constants"] = fit.relative_errors(observed, simulated(fit.spec_for_cells(plain, observed),
                                                                                 observed))
        print(f"\nthe run's {len(observed)} cells of {', '.join(folders)} in virtual time, without and with the "
              f"fitted link ({time.perf_counter() - t0:.1f} s): their client figures, none of which the fit read",
              flush=True)
        print_cells(observed, before, after)
        checked = holdout.compare_on_held_out(observed, before, after)
        spec_error, fitted_error = fit.relative_errors(observed, before), fit.relative_errors(observed, after)
        fitted_tail = error_tail.holdout_tails(observed, after)
    if spec_error:
        print_errors({**errors, baseline: spec_error,
                      "profile + fitted link" if base is not None else "fitted link": fitted_error})
        print(f"\ncheck on the run's cells: {holdout.summary_line(checked)} (sign test over the cells; the metrics "
              f"together at p < {holdout.ALPHA}, Holm's correction)")
    pairs = set() if observed is None else set(zip(observed.index.get_level_values("config"),
                                                   observed.index.get_level_values("suite")))
    profile = CalibrationProfile(
        spec=spec.name, spec_fingerprint=spec_fingerprint(plain),
        source=f"{folder}" + (f" on profile {args.profile}" if base is not None else ""), gpu=spec.hardware.gpu,
        model=spec.model.name, source_target=target, created=date.today(),
        hardware={**(base["hardware"] if base is not None else {}), **values},
        left_as_in_spec=sorted(held[t] for t in links), evaluations=2 if spec_error else 0,
        holdout_error=fitted_error, holdout_tail=fitted_tail, holdout_spec_error=spec_error,
        holdout_verdict={m: c["verdict"] for m, c in checked.items()}, fitted_figures="transfers",
        cells_fitted={k: v for k, v in cell_fingerprints(spec).items() if tuple(k.split("|")) in pairs},
        op_laws=spec.hardware.op_laws,
        op_timings=spec.hardware.op_timings if spec.hardware.op_laws == "measured" else None)
    return write_profile(out, profile, args.out)
