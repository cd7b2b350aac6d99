"""How much faster than real time the virtual-time core runs a preset: modelled seconds over host seconds.

Per preset: prompt calibration and every cell's requests are built first (one untimed round, as `calibrate` and
`whatif` re-run cells with their requests cached), then each round runs every configuration in virtual time
(`tasks.vrun.simulate_configuration`, warm-ups included) and prints the host time, the modelled time (the
virtual clock when each configuration's last cell ends, summed) and their ratio. The host's speed drifts (up to
1.5× over hours on the development VM): compare code by interleaving rounds, not across hours. `--profile`
adds, for the last round, the host time per source file (cProfile inflates code that makes many small calls).

    python benchmarks/vtime_speed.py [smoke epd-multimodal pd-text ...] [--rounds 3] [--profile]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import pstats
import re
import time
from pathlib import Path

from epdbench.specs.models import load_spec
from epdbench.tasks.vrun import prompt_calibration, simulate_configuration

ROOT = str(Path(__file__).resolve().parents[1]) + "/"


def one_round(spec, calibration) -> tuple[float, float]:
    """(host seconds, modelled seconds) of every configuration of the spec, one after the other."""
    modelled = 0.0
    host = 0.0
    for config in spec.configurations:
        ends: list[float] = []
        t0 = time.perf_counter()
        simulate_configuration(spec, config, calibration,
                               on_cell=lambda *_: ends.append(asyncio.get_running_loop().time()))
        host += time.perf_counter() - t0
        modelled += ends[-1] if ends else 0.0
    return host, modelled


def by_file(profile: cProfile.Profile, top: int = 12) -> list[tuple[float, str]]:
    spent: collections.Counter = collections.Counter()
    for (path, _, _), (_, _, own, _, _) in pstats.Stats(profile).stats.items():
        path = "(built-in functions)" if path == "~" else re.sub(r".*/lib/python3\.\d+/(site-packages/)?", "", path)
        spent[path.removeprefix(ROOT)] += own
    total = sum(spent.values()) or 1.0
    return [(own / total, path) for path, own in spent.most_common(top)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="*", default=["smoke", "epd-multimodal", "epd-reuse", "pd-text"],
                    help="presets or spec paths (default: smoke epd-multimodal epd-reuse pd-text)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per preset (default: 3)")
    ap.add_argument("--profile", action="store_true", help="host time per source file in the last round")
    args = ap.parse_args()
    for name in args.presets:
        spec = load_spec(name)
        calibration = prompt_calibration(spec)
        one_round(spec, calibration)                      # builds and caches every cell's requests
        for k in range(max(1, args.rounds)):
            profile = cProfile.Profile() if args.profile and k == args.rounds - 1 else None
            if profile:
                profile.enable()
            host, modelled = one_round(spec, calibration)
            if profile:
                profile.disable()
            note = " (profiled)" if profile else ""
            print(f"{spec.name}: {host:.3f} s host for {modelled:.1f} s modelled: ×{modelled / host:.0f}{note}",
                  flush=True)
            if profile:
                for share, path in by_file(profile):
                    print(f"    {share:6.1%}  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
