"""What every `calibrate` mode shares (the fit of a run's summary in planning, --ops in ops, --engine-steps in
engine_steps, --transport in transport_fit): the spec a run used, the fit with its progress lines, the tables of
constants and errors, the profile written whole. The modes import this module; it imports none of them, so the arrows
run one way (tests/test_layers.py checks it)."""
from __future__ import annotations

from epdbench.cli.common import CliError


def stored_spec(kept, flag_spec: str | None, what: str, where: str):
    """(the spec a run used, its target kind or None): the spec.yaml it kept (`kept`, a path or None) — without
    --spec that is the spec; with --spec, the two must agree in all the virtual-time core reproduces (not the free
    constants, where a fit starts, nor the target). A run without its spec.yaml needs --spec."""
    from epdbench.specs.models import SpecError, load_spec
    from epdbench.specs.profile import calibration_changes

    stored = None
    if kept is not None and kept.is_file():
        try:
            stored = load_spec(str(kept))
        except SpecError as e:
            if flag_spec is None:
                raise CliError(f"{what}: cannot read the run's spec.yaml ({e}); give --spec") from None
            print(f"note: cannot read {kept} ({e}): --spec {flag_spec} is not checked against it", flush=True)
    if flag_spec is None:
        if stored is None:
            raise CliError(f"--spec: give the spec the run used (no spec.yaml {where})")
        return stored, stored.target.kind
    spec = load_spec(flag_spec)
    if stored is not None and (changes := calibration_changes(stored, spec)):
        raise CliError(f"--spec {flag_spec} is not the spec the run used ({'; '.join(changes)}, against {kept}); "
                       "leave --spec out to fit the run's own")
    return spec, stored.target.kind if stored is not None else None


def calibrate_fit(title: str, spec, observed, predict, budget: int, cache: dict, constants=None):
    """fit.fit_constants (of `constants`, by default those a run's client figures tell) with a progress line per
    simulator run."""
    import time

    from epdbench.analysis import fit

    print(f"{title} (at most {budget} simulator runs):", flush=True)
    t0 = time.perf_counter()

    def progress(n: int, total: int, loss: float, best: float) -> None:
        print(f"  run {n:>3}/{total}  loss {loss:.3g}  best {best:.3g}  ({time.perf_counter() - t0:.0f} s)",
              flush=True)

    try:
        result = fit.fit_constants(spec, observed, predict, budget, cache, progress,
                                   fit.FREE_CONSTANTS if constants is None else constants)
    except fit.FitInputError as e:
        raise CliError(f"{e}") from None
    print(f"  loss {result.start_loss:.3g} with the spec's constants, {result.loss:.3g} fitted "
          f"({result.evaluations} simulator runs, {time.perf_counter() - t0:.0f} s)", flush=True)
    return result


def print_constants(spec, result) -> None:
    names = list(result.values) + list(result.left)
    width = max(len(n) for n in names)
    print(f"\n{'constant':<{width}}  {'spec':>10}  {'fitted':>10}")
    for name in result.values:
        print(f"{name:<{width}}  {getattr(spec.hardware, name):>10.4g}  {result.values[name]:>10.4g}")
    for name, why in result.left.items():
        print(f"{name:<{width}}  {getattr(spec.hardware, name):>10.4g}  {'as in spec':>10}  ({why})")
    from epdbench.analysis.fit import BOUNDS, pinned
    if ends := pinned(result.values):
        which = ", ".join(f"{n} ({BOUNDS[n][end == 'upper']:g}, its {end} bound)" for n, end in ends.items())
        print(f"warning: {which} ended at the edge of the search range: the fit is the best the range allows, not "
              "a match — check the table's units (…_ms in milliseconds, …_tok_s and req_s per second) and that the "
              "spec is the run's (GPU, model)", flush=True)


def print_errors(errors: dict[str, dict]) -> None:
    metrics = list(next(iter(errors.values())))
    width = max(len(m) for m in metrics)
    print(f"\nmedian relative error over cells, per metric:\n{'metric':<{width}}  "
          + "  ".join(f"{h:>22}" for h in errors))
    for m in metrics:
        cells = [errors[h][m] for h in errors]
        print(f"{m:<{width}}  " + "  ".join(f"{'—' if v is None else f'{v:.1%}':>22}" for v in cells))


def write_profile(out, profile: dict, flag: str) -> int:
    """The profile written whole or not at all (even if stopped while writing), and how to use it; one line
    naming --out when it cannot be written."""
    from epdbench.specs.profile import profile_to_yaml

    part = out.with_name(out.name + ".part")
    try:
        part.write_text(profile_to_yaml(profile))
        part.replace(out)
    except OSError as e:
        part.unlink(missing_ok=True)
        raise CliError(f"--out {flag}: cannot write it ({e.strerror})") from None
    print(f"wrote {out}: use it with epdbench compare --profile {out} or epdbench whatif --profile {out}")
    return 0
