"""Where ITL p99 comes from, real engine against simulator, cell by cell: the token gaps that are stalls (a step that
held every decode while another request's prefill, or its image's encoding, ran) apart from the decode rhythm
(analysis.itl_stalls). Reads a real run's records (a `records.parquet` of `compare --target local`, of
benchmarks/simulator/vllm_truth.py or of the GPU lane), runs the same cells on the simulator in virtual time
(optionally with a calibration profile), and prints per cell both engines' gaps, stalls (count, share, median,
longest, total per request) and pooled ITL p99 with the real one's 95 % interval; then the cells whose p99 the
simulator puts on the other side of the 1 % line (a decode step where the real engine's is a stall, or the reverse),
with what differs: how many stalls, or how long.

    python benchmarks/simulator/itl_stalls.py --records benchmarks/data/h100-2026-12-07/records.parquet \
        [--spec vllm-truth] [--profile P] [--min-concurrency 2]

Bad input (no such file, records of no cell the spec runs, a missing profile) is one line and exit 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from epdbench.analysis import itl_stalls
from epdbench.specs.models import SpecError, load_spec
from epdbench.specs.profile import apply_profile, load_profile, profile_origin
from epdbench.tasks.sim.vrun import simulate_records


def narrowed(spec, cells: set[tuple]):
    """The spec cut to the configurations and suites the real cells name (the others change nothing they read)."""
    configs = {c for c, *_ in cells}
    suites = {s for _, s, *_ in cells}
    return spec.model_copy(update={"configurations": [c for c in spec.configurations if c.name in configs],
                                   "suites": [s for s in spec.suites if s.name in suites]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", required=True, help="a real run's records.parquet")
    ap.add_argument("--spec", default="vllm-truth", help="the spec the run used (default: vllm-truth)")
    ap.add_argument("--profile", default=None, help="a calibration profile the simulator runs with")
    ap.add_argument("--min-concurrency", type=int, default=2,
                    help="cells at this concurrency or more (default 2: a lone stream has nobody to stall it)")
    args = ap.parse_args(argv)
    try:
        path = Path(args.records)
        if not path.is_file():
            raise SpecError(f"{path}: no such file")
        try:
            records = pd.read_parquet(path)
        except Exception as e:  # noqa: BLE001 - any unreadable file is one line
            raise SpecError(f"{path}: not a records file ({type(e).__name__}: {e})") from None
        missing = [c for c in itl_stalls.CELL + ["phase", "ok", "chunk_offsets_ns"] if c not in records.columns]
        if missing:
            raise SpecError(f"{path}: not a run's records (no {', '.join(missing)} column)")
        real = itl_stalls.cell_stalls(records, args.min_concurrency)
        spec = load_spec(args.spec)
        spec = narrowed(spec, set(real))
        if not spec.configurations or not spec.suites:
            raise SpecError(f"no cell of {path} at concurrency {args.min_concurrency} or more is one spec "
                            f"{args.spec} runs")
        profile = load_profile(args.profile) if args.profile else None
    except (SpecError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if profile is not None:
        spec = apply_profile(spec, profile)
    print(f"{path}: {len(real)} cells at concurrency {args.min_concurrency} or more, against the simulator in virtual "
          f"time (spec {spec.name} on {spec.hardware.gpu}"
          + (f"; profile {args.profile}: {profile_origin(profile)}" if profile else "") + ")")
    print(f"a stall: a gap over {itl_stalls.STALL_FACTOR:g}× its cell's median gap; the pooled ITL p99 is a stall when "
          f"over {itl_stalls.P99_SHARE_PCT:g} % of the gaps are\n")
    sim = itl_stalls.cell_stalls(simulate_records(spec), args.min_concurrency)
    for line in itl_stalls.lines(real, sim):
        print("  " + line)
    other = itl_stalls.verdicts(real, sim)
    print(f"\n{len(other)} of {len(set(real) & set(sim))} cells with the p99 on the other side of the 1 % line"
          + (":" if other else ""))
    for line in other:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
