"""tasks/publishing/history.py against a real MLflow SQLite store: the history of a spec on a target, the nightly
check flagging exactly a planted regression, its tags per configuration, and the `history` and
`report --run-id` commands."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from epdbench.analysis.regression import RegressionSettings
from epdbench.cli import main as cli_main
from epdbench.specs.models import spec_to_yaml
from epdbench.tasks.publishing.history import (cell_history, check_history, experiment_id, log_regression_check,
                                               mlflow_client)
from epdbench.tasks.rundir.results import append_records, write_json
from epdbench.tasks.publishing.tracking import Tracker
from tests.reports.synthetic_run import synthetic_meta, synthetic_records, synthetic_verdicts

CELLS = [("fixed", "4096/32", 4, "main"), ("mixed", "256/8", 2, "steady")]
LEVELS = {"ttft_p50_ms": 200.0, "ttft_p95_ms": 260.0, "ttft_p99_ms": 280.0, "tpot_p50_ms": 8.0, "itl_p99_ms": 12.0,
          "itl_max_ms": 15.0, "output_tok_s": 900.0, "req_s": 6.0, "requests_ok": 8.0, "requests_failed": 0.0}
PLANTED = ("pd-tcp", "fixed", "4096/32", 4, "main", "itl_p99_ms")


def night_summary(rng, planted: bool = False) -> pd.DataFrame:
    rows = []
    for config in ("aggregated", "pd-tcp"):
        for suite, workload, conc, stream in CELLS:
            row = {"config": config, "suite": suite, "workload": workload, "concurrency": conc, "stream": stream,
                   "trial": 0}
            for m, v in LEVELS.items():
                noisy = m not in ("requests_ok", "requests_failed")
                row[m] = v * (1 + 0.02 * rng.standard_normal()) if noisy else v
            if planted and (config, suite, workload, conc, stream) == PLANTED[:5]:
                row["itl_p99_ms"] *= 1.3
            rows.append(row)
    return pd.DataFrame(rows)


def log_night(tracker: Tracker, spec: str, target: str, summary: pd.DataFrame, verified: bool = True,
              fingerprint: str = "fp-tiny") -> str:
    parent = tracker.start_comparison(f"{spec}-{target}-night", tags={
        "epdbench.spec": spec, "epdbench.target": target, "epdbench.spec_fingerprint": fingerprint,
        "epdbench.all_verified": verified}, params={})
    for config, rows in summary.groupby("config", sort=False):
        run = tracker.log_configuration(parent, config, tags={}, params={}, metrics={})
        for _, r in rows.iterrows():
            tracker.log_cell(run, f"{config}:{r['suite']}:{r['workload']}", tags={"epdbench.config": config},
                             params={"suite": r["suite"], "cell": r["workload"], "concurrency": r["concurrency"],
                                     "stream": r["stream"], "trial": 0}, summary=r.to_dict())
    return parent


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_spec):
    work = tmp_path_factory.mktemp("history")
    uri = f"sqlite:///{work / 'mlflow.db'}"
    tracker = Tracker(uri, "epdbench")
    rng = np.random.default_rng(11)
    for _ in range(6):
        log_night(tracker, "tiny", "sim", night_summary(rng))
    log_night(tracker, "other", "sim", night_summary(rng))                 # another spec
    log_night(tracker, "tiny", "kubernetes", night_summary(rng))           # another target
    log_night(tracker, "tiny", "sim", night_summary(rng, planted=True), verified=False)   # its evidence failed
    log_night(tracker, "tiny", "sim", night_summary(rng, planted=True), fingerprint="fp-x")   # another spec body
    tonight = night_summary(rng, planted=True)
    parent = log_night(tracker, "tiny", "sim", tonight)
    rdir = work / "tonight"                                               # what compare logs on the parent
    rdir.mkdir()
    append_records(rdir / "records.parquet", synthetic_records(tiny_spec).to_dict("records"))
    (rdir / "spec.yaml").write_text(spec_to_yaml(tiny_spec))
    write_json(rdir / "outcome.json", {"meta": synthetic_meta(tiny_spec), "verdicts": synthetic_verdicts(tiny_spec)})
    for name in ("records.parquet", "spec.yaml", "outcome.json"):
        tracker.log_artifacts(parent, rdir / name)
    return uri, tracker, parent, tonight, work


def test_history_is_the_spec_on_the_target_only(store):
    uri, tracker, parent, _, _ = store
    client = mlflow_client(uri)
    before = client.get_run(parent).info.start_time
    everything = cell_history(client, experiment_id(client, "epdbench"), "tiny", "sim", last_n=10, before_ms=before)
    assert everything["run_id"].nunique() == 8                 # by name and target alone
    history = cell_history(client, experiment_id(client, "epdbench"), "tiny", "sim", last_n=10, before_ms=before,
                           fingerprint="fp-tiny", verified_only=True)
    assert history["run_id"].nunique() == 6 and len(history) == 6 * 4
    assert set(history["concurrency"]) == {4, 2} and set(history["stream"]) == {"main", "steady"}
    assert history["itl_p99_ms"].between(10, 14).all()
    assert len(cell_history(client, experiment_id(client, "epdbench"), "tiny", "sim", last_n=3)) == 3 * 4


def test_the_nightly_check_flags_exactly_the_planted_metric(store):
    uri, _, parent, tonight, _ = store
    check = check_history(uri, "epdbench", "tiny", "sim", parent, tonight, RegressionSettings())
    assert check["status"] == "regression" and len(check["runs"]) == 6
    flagged = [(j["config"], j["suite"], j["workload"], j["concurrency"], j["stream"], j["metric"])
               for j in check["judgements"] if j["status"] in ("regression", "improvement")]
    assert flagged == [PLANTED]
    assert check["per_config"]["aggregated"]["status"] == "within-noise"


def test_verdicts_are_logged_per_configuration_and_on_the_comparison(store):
    uri, _, parent, tonight, _ = store
    check = check_history(uri, "epdbench", "tiny", "sim", parent, tonight, RegressionSettings())
    log_regression_check(uri, parent, check)
    client = mlflow_client(uri)
    runs = client.search_runs([client.get_run(parent).info.experiment_id],
                              f"tags.`mlflow.parentRunId` = '{parent}'")
    tags = {r.data.tags["epdbench.config"]: (r.data.tags["epdbench.regression"], r.data.metrics["regressions"],
                                             r.data.tags["epdbench.regressions"]) for r in runs}
    assert tags["aggregated"] == ("within-noise", 0.0, "none")
    assert tags["pd-tcp"][:2] == ("regression", 1.0)
    assert tags["pd-tcp"][2].startswith("pd-tcp fixed 4096/32 c=4 itl_p99_ms regression +")
    comparison = client.get_run(parent).data
    assert comparison.tags["epdbench.regression"] == "regression" and comparison.metrics["regressions"] == 1.0


def test_an_unreadable_store_is_reported_not_raised(store):
    _, _, parent, tonight, work = store
    bad = check_history(f"sqlite:///{work / 'missing-dir' / 'x.db'}", "epdbench", "tiny", "sim", parent, tonight,
                        RegressionSettings())
    assert bad["status"] == "unavailable" and bad["error"]
    assert check_history("unused", "epdbench", "tiny", "sim", None, tonight, RegressionSettings())["status"] == \
        "unavailable"


def test_history_command_prints_the_trend_and_the_newest_verdict(store, capsys):
    uri = store[0]
    code = cli_main(["history", "--spec", "tiny", "--tracking-uri", uri, "--config", "pd-tcp",
                     "--workload", "4096/32", "--concurrency", "4"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "ITL p99 (ms) over 7 run(s), oldest first:"
    line = next(l for l in out if l.startswith("pd-tcp fixed 4096/32 c=4"))
    assert line.split()[-5] == "regression" and len(line.split()) == 4 + 7 + 5


@pytest.mark.parametrize("args,needle", [
    (["history", "--spec", "nope"], "--spec nope: no comparison runs"),
    (["history", "--spec", "x' or '1"], "not a spec name"),
    (["history", "--spec", "tiny", "--metric", "warp_ms"], "--metric warp_ms"),
    (["history", "--spec", "tiny", "--history-runs", "0"], "--history-runs"),
    (["compare", "--noise-k", "0"], "--noise-k: Input should be greater than 0"),
    (["compare", "--history-runs", "0"], "--history-runs"),
    (["report"], "give a results directory or --run-id"),
    (["report", "--run-id", "0123456789abcdef"], "--run-id 0123456789abcdef: no such run"),
])
def test_bad_input_is_one_line_and_exit_2(store, capsys, args, needle):
    extra = ["--tracking-uri", store[0]]
    assert cli_main(args + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_report_from_an_mlflow_run(store, capsys, tmp_path):
    uri, tracker, parent, _, _ = store
    assert cli_main(["report", "--run-id", parent, "--tracking-uri", uri, "--out", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "r" / "report.md"), str(tmp_path / "r" / "report.html")]
    assert "## Suite `fixed`" in (tmp_path / "r" / "report.md").read_text()
    assert len(list((tmp_path / "r" / "plots").glob("*.png"))) == 3 * 4   # CDF, throughput and Pareto per suite
    config_run = tracker.client.search_runs([tracker.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")[0]
    assert cli_main(["report", "--run-id", config_run.info.run_id, "--tracking-uri", uri]) == 2
    assert "give the comparison (parent) run" in capsys.readouterr().err
