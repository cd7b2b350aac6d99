"""End to end: a nightly-style `epdbench compare --fail-on-regression` against an MLflow store whose
history holds six earlier runs with a much lower ITL p99 for pd-tcp: exactly that metric is flagged,
the run exits 4, the report says so and is logged as HTML with its plots, and `history` shows it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from epdbench.specs.models import load_spec, spec_fingerprint
from epdbench.tasks.publishing.tracking import Tracker
from tests.reports.report_checks import (SECTIONS, check_bold_winners, check_headline_matches_summary,
                                         parse_html)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]    # two nightly runs of a spec and their reports: about 45 s on 2 cores
ROOT = Path(__file__).resolve().parents[1]
SPEC = "regress"
# One suite of one concurrency: its ITL CDF, throughput per GPU, throughput per GPU against interactivity and where
# TTFT goes (no latency-vs-concurrency).
PLOTS = ["fixed-itl-cdf.png", "fixed-pareto.png", "fixed-throughput-per-gpu.png", "fixed-ttft-breakdown.png"]
PAST_ITL_P99_MS = [4.00, 4.04, 3.97, 4.02, 3.99, 4.01]      # the simulator's decode step alone is ~7 ms


def epdbench(*args, cwd):
    return subprocess.run([sys.executable, "-m", "epdbench.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=400, env={**os.environ, "PYTHONPATH": str(ROOT)})


def seed_history(uri: str, spec_path: Path) -> None:
    """Six earlier comparisons of the same resolved spec on the simulator, their evidence held; only pd-tcp's
    ITL p99 has history. A seventh with a much higher value failed its evidence: it must not count."""
    tracker = Tracker(uri, "epdbench")
    fingerprint = spec_fingerprint(load_spec(str(spec_path)))
    for value, verified in [(v, True) for v in PAST_ITL_P99_MS] + [(400.0, False)]:
        parent = tracker.start_comparison(f"{SPEC}-sim-past", tags={
            "epdbench.spec": SPEC, "epdbench.target": "sim", "epdbench.spec_fingerprint": fingerprint,
            "epdbench.all_verified": verified}, params={})
        run = tracker.log_configuration(parent, "pd-tcp", tags={}, params={}, metrics={})
        tracker.log_cell(run, "pd-tcp:fixed:4096/32:c4", tags={"epdbench.config": "pd-tcp"},
                         params={"suite": "fixed", "cell": "4096/32", "concurrency": 4, "stream": "main", "trial": 0},
                         summary={"itl_p99_ms": value})
        tracker.finish(parent)


@pytest.fixture(scope="module")
def nightly(tmp_path_factory, tiny_spec_path):
    work = tmp_path_factory.mktemp("nightly")
    spec = yaml.safe_load(tiny_spec_path.read_text())
    spec["name"] = SPEC
    spec["configurations"] = [c for c in spec["configurations"] if c["name"] in ("aggregated", "pd-tcp")]
    spec["suites"] = [s for s in spec["suites"] if s["kind"] == "fixed"]
    (work / "spec.yaml").write_text(yaml.safe_dump(spec))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    seed_history(uri, work / "spec.yaml")
    out = work / "results"
    proc = epdbench("compare", "--spec", str(work / "spec.yaml"), "--out", str(out), "--tracking-uri", uri,
                    "--fail-on-regression", "--gpu-hour-usd", "2", cwd=work)
    return proc, out, uri, work


def test_exactly_the_planted_metric_fails_the_run(nightly):
    proc, out, _, _ = nightly
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    check = json.loads((out / "outcome.json").read_text())["regression"]
    flagged = [(j["config"], j["workload"], j["concurrency"], j["metric"], j["status"])
               for j in check["judgements"] if j["status"] in ("regression", "improvement")]
    assert flagged == [("pd-tcp", "4096/32", 4, "itl_p99_ms", "regression")]
    assert "Regression check against the last 6 run(s): 1 regression(s)" in proc.stdout
    assert "Pareto frontier, suite fixed (output tok/s per GPU against tok/s per user) — simulated: 4096/32: " in (
        proc.stdout.replace("\n", " "))


def test_the_report_has_every_section_and_the_flag(nightly):
    _, out, _, _ = nightly
    report = (out / "report.md").read_text()
    for heading in SECTIONS:
        assert f"\n{heading}\n" in report, heading
    assert "- pd-tcp, suite fixed, 4096/32, concurrency 4: ITL p99 " in report
    summary = pd.read_csv(out / "summary.csv")
    assert check_bold_winners(report, "fixed") >= 2     # TPOT p50 and ITL p99 win outside the noise, at least
    assert check_headline_matches_summary(report, summary) >= 1
    page = parse_html((out / "report.html").read_text())
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == PLOTS
    assert len(page.images) == len(PLOTS) and page.external == []


def test_mlflow_holds_the_html_report_plots_and_verdict_tags(nightly):
    from mlflow.tracking import MlflowClient

    _, out, uri, _ = nightly
    client = MlflowClient(tracking_uri=uri)
    parent = json.loads((out / "outcome.json").read_text())["mlflow_run_id"]
    artifacts = {a.path for a in client.list_artifacts(parent)}
    assert {"report.md", "report.html", "plots"} <= artifacts
    assert sorted(a.path for a in client.list_artifacts(parent, "plots")) == [f"plots/{p}" for p in PLOTS]
    runs = client.search_runs([client.get_run(parent).info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    tags = {r.data.tags["epdbench.config"]: r.data.tags["epdbench.regression"] for r in runs}
    assert tags == {"pd-tcp": "regression", "aggregated": "insufficient-history"}
    metrics = client.get_run(parent).data.metrics
    assert metrics["regressions"] == 1.0
    # the price given on the command line: cost per cell; frontier points per configuration
    summary = pd.read_csv(out / "summary.csv").set_index("config")
    for config in ("aggregated", "pd-tcp"):
        per_gpu = float(summary.loc[config, "output_tok_s_per_gpu"])
        assert metrics[f"cost_usd_per_mtok.fixed.4096/32.c4.{config}"] == pytest.approx(2 / 3600 / per_gpu * 1e6)
    assert metrics["frontier_points.fixed.aggregated"] + metrics["frontier_points.fixed.pd-tcp"] >= 1
    assert "$2 per GPU-hour" in (out / "report.md").read_text()


def test_history_command_shows_the_jump(nightly):
    _, _, uri, work = nightly
    proc = epdbench("history", "--spec", SPEC, "--tracking-uri", uri, "--config", "pd-tcp", cwd=work)
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("pd-tcp fixed 4096/32 c=4"))
    assert line.split()[4:10] == ["4.00", "4.04", "3.97", "4.02", "3.99", "4.01"] and "regression (+" in line


def test_the_real_report_opens_in_chromium(nightly, tmp_path):
    from tests.reports.browser import chromium, probe, screenshot

    chromium()
    _, out, _, _ = nightly
    page = probe(out / "report.html", tmp_path)
    assert page["images"] == page["decoded"] == len(PLOTS)
    assert screenshot(out / "report.html", tmp_path, "report-e2e.png", min(page["height"], 16000)).exists()
