"""`calibrate --ops CSV`: a profile carrying operator timings measured on your GPU (benchmarks/gpu/gpu_ops.py), from
which the simulator derives its measured operator laws (physics.oplaws) wherever the profile is applied. Imports
are deferred, as in commands."""
from __future__ import annotations

from epdbench.cli.common import CliError


def _checked_laws(rows, path: str, spec) -> list[str]:
    """The models whose laws the CSV gives whole, after building them for the spec's model (or, without a spec,
    for the presets' models it holds); CliError (one line) when none, or the spec's model is not among them."""
    from epdbench.physics.gpu_ops import LM_MODELS
    from epdbench.physics.oplaws import TEXT_LAWS, Peaks, build_tables, law_rows
    from epdbench.specs.models import PRESET_DIR, load_spec

    laws = law_rows(rows)
    whole = sorted(m for m, have in laws.items() if set(TEXT_LAWS) <= have)
    if not whole:
        lacking = "".join(f"; {m} lacks {', '.join(sorted(set(TEXT_LAWS) - have))}" for m, have in laws.items())
        raise CliError(f"--ops {path}: no model has rows of every law ({', '.join(TEXT_LAWS)}){lacking}; run "
                       "benchmarks/gpu/gpu_ops.py whole (or with --quick)")
    if spec is not None and spec.model.name not in whole:
        raise CliError(f"--spec: its model {spec.model.name} is not measured whole in {path} (it has "
                       f"{', '.join(whole)}); give a spec of one of those, or leave --spec out")
    presets = {m.name: m for m in (load_spec(p.stem).model for p in sorted(PRESET_DIR.glob("*.yaml")))}
    models = [spec.model] if spec is not None else [m for name, m in presets.items()
                                                    if name in whole and name in LM_MODELS]
    for model in models:
        try:
            tables = build_tables(rows, model, Peaks(1e15, 1e12))
        except (ValueError, ZeroDivisionError, ArithmeticError) as e:
            raise CliError(f"--ops {path}: the rows of {model.name} give no law ({e.__class__.__name__}: {e}); "
                           "check their flops, bytes and time_ms against benchmarks/gpu/gpu_ops.py's") from None
        if tables.missing:
            raise CliError(f"--ops {path}: {model.name} has no {' nor '.join(tables.missing)} at one TP; run "
                           "benchmarks/gpu/gpu_ops.py whole (or with --quick)")
    return whole


def cmd_calibrate_ops(args) -> int:
    """Write a profile carrying the operator timings of a gpu_ops CSV; `compare --profile` and `whatif --profile`
    then run on the measured laws derived from them."""
    from datetime import date
    from pathlib import Path

    from epdbench.physics.gpu_ops import GpuOpsError, read_ops_csv
    from epdbench.physics.measured import describe
    from epdbench.physics.oplaws import digest, law_rows
    from epdbench.specs.models import load_spec, spec_fingerprint
    from epdbench.specs.node import OperatorTimings
    from epdbench.cli.calibration import write_profile
    from epdbench.specs.profile import CalibrationProfile, apply_profile

    out = Path(args.out)
    if not out.parent.is_dir():
        raise CliError(f"--out {args.out}: folder {out.parent} does not exist")
    try:
        rows = read_ops_csv(args.ops)
    except GpuOpsError as e:
        raise CliError(f"--ops {e}") from None
    gpus = sorted({r.gpu for r in rows})
    if len(gpus) > 1:
        raise CliError(f"--ops {args.ops}: rows of {len(gpus)} GPUs ({', '.join(gpus)}): one GPU's timings per "
                       "profile")
    spec = load_spec(args.spec) if args.spec else None
    whole = _checked_laws(rows, args.ops, spec)
    text = Path(args.ops).read_text(encoding="utf-8").replace("\r\n", "\n")    # csv's line ends, as YAML keeps them
    timings = OperatorTimings(source=str(args.ops), gpu=gpus[0], sha256=digest(text),
                              bf16_tflops=spec.hardware.bf16_tflops if spec else None,
                              hbm_tb_s=spec.hardware.hbm_tb_s if spec else None, csv=text)
    profile = CalibrationProfile(
        spec=spec.name if spec else None, spec_fingerprint=spec_fingerprint(spec) if spec else None,
        source=str(args.ops), gpu=spec.hardware.gpu if spec else None, created=date.today(), hardware={},
        op_laws="measured", op_timings=timings)
    meta = rows[0]
    print(f"Operator timings of {gpus[0]} (driver {meta.driver}, torch {meta.torch}, {meta.date:%Y-%m-%d}) from "
          f"{args.ops}: {len(rows)} rows", flush=True)
    laws = law_rows(rows)
    for model in sorted(laws):
        state = "measured laws" if model in whole else "incomplete: keeps the roofline"
        print(f"  {model}: {', '.join(sorted(laws[model])) or 'no law'} ({state})")
    if spec is not None:
        applied = apply_profile(spec, profile.model_dump(mode="json"))
        print(f"  on spec {spec.name} ({spec.hardware.gpu}, the GPU measured): "
              f"{describe(applied.model, applied.hardware)}")
    else:
        print("  no --spec: the timings are taken as made on the GPU of whatever spec the profile is applied to "
              "(no datasheet scaling)")
    return write_profile(out, profile, args.out)
