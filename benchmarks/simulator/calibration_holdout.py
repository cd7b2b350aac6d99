"""Does calibrating on some cells predict the others? A "hardware run" is made by the virtual-time simulator
(tasks.sim.vrun) with changed hidden constants (HIDDEN_BY_LAWS below) and another seed than the spec's (other prompts,
images and burst lengths, so the run is not the model's own sample); the constants are then fitted, from the
preset's values, on half of its cells (analysis.fit.holdout_mask) and the other half predicted. Prints the
median relative error per metric over the fitted and the held-out cells, with the preset's and the fitted
constants, and with the hidden constants themselves at the spec's seed (the floor the two seeds' sampling noise
sets), the recovered constants against the hidden ones, and calibrate's hold-out verdict (analysis.holdout).

    python benchmarks/simulator/calibration_holdout.py [--spec smoke] [--evaluations 100] [--holdout-seed 0]
                                                       [--laws roofline]
"""
from __future__ import annotations

import argparse
import time

from epdbench.analysis import fit, holdout
from epdbench.specs.models import load_spec
from epdbench.tasks.sim.vrun import simulate_summary

# The "hardware": every free constant moved from the presets' values (0.5, 0.8, 1.0 ms, 3 GB/s, 0 ms, 0.8,
# 0.05 ms, 36 ms/Mpx, 3.3 ms); the GPU's speed by the constants of the spec's operator laws (hardware.op_laws): the
# roofline's efficiencies, or the measured laws' factors moved by as much (0.38 / 0.5, 0.68 / 0.8).
OTHERS = {"step_overhead_ms": 1.6, "tcp_gb_s": 2.2, "tcp_latency_ms": 1.5, "rdma_efficiency": 0.6,
          "rdma_latency_ms": 0.15, "image_preprocess_ms_per_mp": 50.0, "request_hop_ms": 2.0}
HIDDEN_BY_LAWS = {"roofline": {"compute_efficiency": 0.38, "hbm_efficiency": 0.68, **OTHERS},
                  "measured": {"measured_compute_factor": 0.76, "measured_hbm_factor": 0.85, **OTHERS}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="smoke", help="preset or spec path (default: smoke)")
    ap.add_argument("--evaluations", type=int, default=100, help="simulator runs the fit may use (default: 100)")
    ap.add_argument("--holdout-seed", type=int, default=0, help="seed of the split (default: 0)")
    ap.add_argument("--run-seed", type=int, default=None, help="seed of the hardware run (default: spec's + 1)")
    ap.add_argument("--laws", choices=sorted(HIDDEN_BY_LAWS), default=None,
                    help="the operator laws (hardware.op_laws; default: the spec's)")
    args = ap.parse_args()
    spec = load_spec(args.spec)
    if args.laws:
        spec = fit.spec_with(spec, {"op_laws": args.laws})
    HIDDEN = HIDDEN_BY_LAWS[spec.hardware.op_laws]
    run_seed = spec.seed + 1 if args.run_seed is None else args.run_seed
    print(f"spec {spec.name} on the {spec.hardware.op_laws} laws; hardware run: seed {run_seed}, hidden constants "
          + ", ".join(f"{k}={v:g}" for k, v in HIDDEN.items()), flush=True)
    t0 = time.perf_counter()
    run = simulate_summary(fit.spec_with(spec, HIDDEN).model_copy(update={"seed": run_seed}))
    observed = fit.observed_cells(run)
    held = fit.holdout_mask(observed.index, args.holdout_seed)
    print(f"{len(observed)} cells ({time.perf_counter() - t0:.1f} s per simulator run): fit on {int((~held).sum())}, "
          f"hold out {int(held.sum())} (split seed {args.holdout_seed}); metrics {', '.join(observed.columns)}",
          flush=True)
    t0 = time.perf_counter()
    result = fit.fit_constants(spec, observed[~held], simulate_summary, args.evaluations, on_evaluation=(
        lambda n, total, loss, best: print(f"  run {n:>3}/{total}  loss {loss:.3g}  best {best:.3g}", flush=True)))
    print(f"fit: {result.evaluations} simulator runs in {time.perf_counter() - t0:.0f} s, "
          f"loss {result.start_loss:.3g} -> {result.loss:.3g}")
    truth = fit.predicted_cells(simulate_summary(fit.spec_with(spec, HIDDEN)), list(observed.columns))
    print(f"loss of the hidden constants themselves on the fitted cells (the two seeds' sampling noise): "
          f"{fit.loss(observed[~held], truth):.3g}\n")
    print(f"{'constant':<20}{'preset':>10}{'hidden':>10}{'fitted':>10}{'error':>9}")
    for name, hidden in HIDDEN.items():
        value = result.values.get(name)
        fitted = f"{value:>10.4g}{value / hidden - 1:>+9.1%}" if value is not None else f"{'(left)':>10}"
        print(f"{name:<20}{getattr(spec.hardware, name):>10.4g}{hidden:>10.4g}{fitted}")
    for name, why in result.left.items():
        print(f"  {name} left as in the spec: {why}")
    columns = {"fitted cells, preset": fit.relative_errors(observed[~held], result.start_predicted),
               "fitted cells, fitted": fit.relative_errors(observed[~held], result.predicted),
               "held out, preset": fit.relative_errors(observed[held], result.start_predicted),
               "held out, fitted": fit.relative_errors(observed[held], result.predicted),
               "held out, hidden": fit.relative_errors(observed[held], truth)}    # the floor: seeds differ
    print(f"\nmedian relative error over cells\n{'metric':<14}" + "".join(f"{h:>22}" for h in columns))
    for m in observed.columns:
        print(f"{m:<14}" + "".join(f"{'—' if c[m] is None else f'{c[m]:.1%}':>22}" for c in columns.values()))
    checks = holdout.compare_on_held_out(observed[held], result.start_predicted, result.predicted)
    print(f"\n{holdout.summary_line(checks)} (sign test; the metrics together at p < {holdout.ALPHA}, Holm)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
