"""Time `epdbench compare --clock virtual` of every preset in specs/ end to end (a fresh process each: Python and
Prefect start-up, the virtual run, summary, report, MLflow publishing) and print one line per preset.

    python benchmarks/pipeline/virtual_presets.py [--presets smoke,pd-text] [--rounds 1]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from epdbench.specs.models import PRESET_DIR


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default=",".join(sorted(x.stem for x in PRESET_DIR.glob("*.yaml"))))
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    env = {**os.environ, "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    worst = 0
    for preset in args.presets.split(","):
        times = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as work:
                start = time.monotonic()
                proc = subprocess.run([sys.executable, "-m", "epdbench.cli", "compare", "--clock", "virtual",
                                       "--spec", preset, "--out", str(Path(work) / "run"),
                                       "--tracking-uri", f"sqlite:///{work}/mlflow.db"],
                                      capture_output=True, text=True, env=env, timeout=900)
                times.append(time.monotonic() - start)
                worst = max(worst, proc.returncode)
                if proc.returncode:
                    print(f"{preset}: exit {proc.returncode}: {(proc.stdout + proc.stderr).strip().splitlines()[-1]}")
        print(f"{preset:<16} {' '.join(f'{t:6.1f}' for t in times)} s  (exit {proc.returncode})", flush=True)
    return worst


if __name__ == "__main__":
    sys.exit(main())
