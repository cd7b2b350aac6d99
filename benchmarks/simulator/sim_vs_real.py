"""The simulator against a real engine: runs the cells of a truth table (benchmarks/data/README.md) on the
simulator in virtual time (tasks.sim.engine_times: the core `compare --clock virtual`, whatif and calibrate use),
on the GPU the table names, and prints per cell sim / real for TTFT p50 and p99, TPOT p50, ITL p99, output
throughput and the engine's own prefill time and decode time per token, then per metric and over all of them the
median error |sim / real − 1| and the median sim / real, and past the median the 90th percentile of the error and
the worst cell (analysis.sim_vs_real, analysis.error_tail). With --profile, each figure before and after the
profile's constants, side by side.

A table of several configurations (benchmarks/simulator/truth_from_run.py; give its spec with --spec, e.g.
gpu-qwen25vl) is run with each of them, and then also judged as a choice between them (analysis.config_order): per
cell and client metric, whether the simulator names the configuration the real engines do, and orders every pair as they
do, a real difference within the metric's tie band counted as a tie, not a judgement.

    python benchmarks/simulator/sim_vs_real.py --truth benchmarks/data/vllm_truth_h100.csv [--profile P]
                                               [--tool epdbench] [--spec vllm-truth]

Bad input (a table it cannot read or use, a GPU whose datasheet is not known, a missing profile) is one line and
exit 2.
"""
from __future__ import annotations

import argparse
import sys
import time

from epdbench.analysis import config_order, sim_vs_real, truth
from epdbench.analysis.fit import FitInputError, spec_for_cells, unplanned
from epdbench.cli.common import CliError
from epdbench.cli.engine_steps import DEFAULT_SPEC, load_truth
from epdbench.specs.models import SpecError
from epdbench.specs.profile import apply_profile, load_profile, profile_origin
from epdbench.tasks.sim.engine_times import simulate_cells


def simulated(spec, model: str):
    """The spec's cells in virtual time as analysis.truth.cells shapes a truth table's."""
    return truth.cells(truth.as_truth_table(simulate_cells(spec), "", model))


def print_order(real, sims: dict) -> None:
    """Whether the simulator (each of `sims`) orders the table's configurations as the real engines do."""
    configs = list(dict.fromkeys(real.index.get_level_values("config")))
    print(f"\nthe {len(configs)} configurations ({', '.join(configs)}) per cell and metric: the winner (lowest "
          "latency, highest out tok/s) and the order of each pair, on the real engines and on the simulator; a real "
          f"difference within the tie band ({config_order.band_text()}: the machine-to-machine spread, "
          "benchmarks/data/README.md) is a tie, not counted")
    for which, sim in sims.items():
        winners, pairs = config_order.judgements(real, sim)
        print(f"\nsimulator{which}:")
        for line in config_order.lines(winners, pairs):
            print("  " + line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--truth", required=True, help="the truth table CSV")
    ap.add_argument("--profile", default=None, help="a calibration profile: figures before and after it")
    ap.add_argument("--tool", default="epdbench", help="the load generator whose rows to compare (default: epdbench)")
    ap.add_argument("--spec", default=None, help=f"the spec of the table's cells (default: {DEFAULT_SPEC})")
    args = ap.parse_args(argv)
    try:
        spec, rows, notes = load_truth(args.truth, args.tool, args.spec, option="--truth")
        real = truth.cells(rows, notes)
        spec = spec_for_cells(spec, real)
        if missing := unplanned(spec, real):
            notes.append(f"{len(missing)} cell(s) the spec does not run, left out (the first: "
                         f"{'/'.join(map(str, missing[0]))})")
            real = real.drop(index=missing)
        real = sim_vs_real.in_plan_order(real, spec)
        profile = load_profile(args.profile) if args.profile else None
    except (CliError, SpecError, FitInputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.truth} (tool {args.tool}, {len(real)} cells) against the simulator in virtual time: spec "
          f"{spec.name} on {spec.hardware.gpu}" + (f"; profile {args.profile}: {profile_origin(profile)}"
                                                   if profile else ""), flush=True)
    for note in notes:
        print(f"  {note}")
    t0 = time.perf_counter()
    before = simulated(spec, spec.model.name)
    after = simulated(apply_profile(spec, profile), spec.model.name) if profile else None
    seconds = time.perf_counter() - t0
    for line in sim_vs_real.prompt_mismatches(real, before):
        print(f"  warning: prompts differ, {line}: those cells compare other requests")
    ratio = sim_vs_real.ratios(real, before)
    ratio_after = sim_vs_real.ratios(real, after) if after is not None else None
    which = "sim / real" + (" before → after the profile" if profile else "")
    print(f"\n{which} per cell (under 1: the simulator faster, or for out tok/s slower):")
    for line in sim_vs_real.cell_lines(ratio, ratio_after):
        print("  " + line)
    print("\nmedian over cells of |sim/real − 1| (error) and of sim/real (direction):")
    summary_before = sim_vs_real.summary(ratio)
    summary_after = sim_vs_real.summary(ratio_after) if ratio_after is not None else None
    for line in sim_vs_real.summary_lines(summary_before, summary_after):
        print("  " + line)
    print("\npast the median: the 90th percentile over cells of |sim/real − 1| (numpy's linear interpolation) and "
          "the worst cell, with its sim/real:")
    for line in sim_vs_real.tail_lines(summary_before, summary_after, sim_vs_real.several_configs(real)):
        print("  " + line)
    if sim_vs_real.several_configs(real):
        print_order(real, {"": before} if after is None else {" before the profile": before,
                                                                " after the profile": after})
    print(f"\n{len(real)} cells simulated {'twice' if profile else 'once'} in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
