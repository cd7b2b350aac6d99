"""The smoke preset on the HTTP simulator and in virtual time: every judged figure of every cell agrees within
analysis.agreement's tolerance (the done-when of the virtual-time core), and virtual time is much faster."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from epdbench.analysis.agreement import METRICS, agreement
from epdbench.specs.models import load_spec
from epdbench.tasks.sim.vrun import simulate_summary

pytestmark = [pytest.mark.e2e, pytest.mark.slow]       # the smoke preset over HTTP: about two minutes
ROOT = Path(__file__).parents[1]


def test_smoke_agrees_between_the_http_simulator_and_virtual_time(tmp_path):
    out = tmp_path / "http"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "epdbench.cli", "compare", "--spec", "smoke", "--out", str(out),
                           "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    http_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    http = pd.read_csv(out / "summary.csv")
    t0 = time.monotonic()
    virtual = simulate_summary(load_spec(str(out / "spec.yaml")))
    virtual_s = time.monotonic() - t0
    table = agreement(http, virtual)
    assert len(table) == len(http) * len(METRICS) == 28 * len(METRICS)
    judged = table[table["judged"]]       # a cell contaminated by host load is no reference (analysis.agreement)
    assert len(judged) >= len(table) / 4, table.to_string()     # not vacuous even on a loaded host
    assert judged["agrees"].all(), judged[~judged["agrees"]].to_string()
    assert virtual_s * 20 < http_s, (virtual_s, http_s)
