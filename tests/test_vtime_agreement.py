"""The smoke preset on the HTTP simulator and in virtual time: every judged figure of every cell agrees within
analysis.agreement's tolerance (the done-when of the virtual-time core), and virtual time is much faster.

One HTTP run on a shared 2-core host now and then has a cell a host stall moved beyond the run-to-run spread
measured on an idle host, without its lag reaching the contamination threshold. So a figure that disagrees is
measured again in a second HTTP run, and must agree there: noise hits one run's cell, an error of the model hits
both."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from epdbench.analysis.agreement import METRICS, agreement
from epdbench.specs.models import load_spec, parse_spec, spec_to_yaml
from epdbench.tasks.sim.vrun import simulate_summary

pytestmark = [pytest.mark.e2e, pytest.mark.slow]       # the smoke preset over HTTP: about two minutes
ROOT = Path(__file__).parents[1]
# Cells the HTTP simulator lands in one of two modes, run by run, that virtual time does not follow: shown when
# they disagree, not failed. aggregated 4096/64 c=8 (two replicas behind round robin, 8 closed
# loops of 4096-token prompts): TTFT p50 303.7 ms and TPOT p50 9.7 ms in virtual time; over HTTP either the same or
# 192.7 ms and 11.1 ms, the second mode the same to 0.03 ms in two runs of one CI job (2026-12-06) — an order of
# near-simultaneous events (which replica a new request joins, which step it starts in) that host timing decides
# and the virtual core resolves one way. Not reproduced on the development VM (2026-12-06): ten HTTP runs of the
# cell (six of it alone, four of smoke's aggregated configuration) gave 303/9.7 or 283-290/10.4, the two modes
# virtual time itself gives across seeds 0-7 (280-308 ms / 9.71 or 10.41 ms): closed loops of equal requests that
# stay in lockstep or not. To be explained and modelled; listed so that it does not hide others.
TWO_MODES = {("aggregated", "fixed", "4096/64", 8): {"ttft_p50_ms", "tpot_p50_ms"}}


def http_summary(tmp_path, name: str, configs: list[str] | None = None) -> pd.DataFrame:
    """The smoke preset (only `configs` when given) on the HTTP simulator, one trial: its summary."""
    out = tmp_path / name
    data = load_spec("smoke").model_dump(mode="json")
    data["trials"] = 1
    data["target"]["sim"]["clock"] = "real"
    spec = tmp_path / "smoke.yaml"
    spec.write_text(spec_to_yaml(parse_spec(data)))
    proc = subprocess.run([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(spec), "--out", str(out),
                           "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                           *(["--configs", ",".join(configs)] if configs else [])], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return pd.read_csv(out / "summary.csv")


def test_smoke_agrees_between_the_http_simulator_and_virtual_time(tmp_path):
    t0 = time.monotonic()
    http = http_summary(tmp_path, "http")
    http_s = time.monotonic() - t0
    out = tmp_path / "http"
    t0 = time.monotonic()
    virtual = simulate_summary(load_spec(str(out / "spec.yaml")))
    virtual_s = time.monotonic() - t0
    table = agreement(http, virtual)
    assert len(table) == len(http) * len(METRICS) == 28 * len(METRICS)
    judged = table[table["judged"]]       # a cell contaminated by host load is no reference (analysis.agreement)
    assert len(judged) >= len(table) / 4, table.to_string()     # not vacuous even on a loaded host
    assert virtual_s * 20 < http_s, (virtual_s, http_s)
    off = judged[~judged["agrees"]]
    listed = pd.Series([r["metric"] in TWO_MODES.get((r["config"], r["suite"], r["workload"], r["concurrency"]), ())
                        for r in off.to_dict("records")], index=off.index, dtype=bool)
    if listed.any():
        print("known two-mode cells, disagreeing (shown, not failed):\n" + off[listed].to_string())
    off = off[~listed]
    if off.empty:
        return
    # measured again (the configurations concerned only): each figure must agree, or be contaminated, there
    again = agreement(http_summary(tmp_path, "http-again", sorted(set(off["config"]))), virtual)
    keys = ["config", "suite", "workload", "concurrency", "stream", "metric"]
    second = off[keys].merge(again, on=keys, how="left")
    agrees = second["agrees"].fillna(False).astype(bool) | ~second["judged"].fillna(True).astype(bool)
    assert len(second) == len(off) and agrees.all(), (
        "disagreed twice:\n" + second.to_string() + "\nfirst run:\n" + off.to_string())
