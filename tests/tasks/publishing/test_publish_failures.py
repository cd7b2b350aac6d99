"""A publish that MLflow refuses, against a real MLflow SQLite store: the run it opened ends FAILED with the
whole reason (never RUNNING), the user gets one line with that reason, a later `sync` sets it FINISHED; and
`epdbench sync` answers every failure with one line and its documented exit code, never a traceback."""
from __future__ import annotations

import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from epdbench.analysis.goodput import GOODPUT_COLUMNS
from epdbench.cli import main
from epdbench.cli.common import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNPUBLISHED
from epdbench.reports import mlflow_names
from epdbench.specs.models import load_spec
from epdbench.tasks.publishing import mlflow_check
from epdbench.tasks.publishing import publish
from epdbench.tasks.publishing.tracking import PUBLISH_ERROR_TAG, Tracker
from tests.tasks.publishing.test_publish import RUN, all_runs, fast_mlflow_env, folder, free_port, uri  # noqa: F401

MLFLOW_REASON = ("Names may only contain alphanumerics, underscores (_), dashes (-), periods (.), spaces ( ), "
                 "colon(:) and slashes (/).")
REFUSED = "goodput_req_s.pd-tcp.capacity.1260px+400/128"


def with_image_goodput(rdir) -> None:
    """goodput.csv with an image shape, as a rate suite of epd-multimodal writes it."""
    pd.DataFrame([{**dict.fromkeys(GOODPUT_COLUMNS), "config": "pd-tcp", "suite": "capacity",
                   "shape": "1260px+400/128", "goodput_req_s": 4.0, "goodput_req_s_per_gpu": 2.0}],
                 columns=GOODPUT_COLUMNS).to_csv(rdir / "goodput.csv", index=False)


def lines(capfd) -> list[str]:
    out, err = capfd.readouterr()
    return [x for x in (out + err).splitlines() if x.strip()]


def comparison_run(uri):
    return next(r for r in all_runs(uri) if r.data.tags.get("epdbench.kind") == "comparison")


def test_a_refused_name_ends_the_run_failed_with_the_whole_reason_and_sync_finishes_it(folder, uri, capfd,
                                                                                      monkeypatch):
    from epdbench.flows import compare as flow

    with_image_goodput(folder)
    monkeypatch.setattr(mlflow_names, "readable_name", lambda name: name)     # names as they were before
    spec = load_spec(str(folder / "spec.yaml"))
    tracker = Tracker(uri, "epdbench")
    parent = publish.start_comparison(tracker, spec, RUN, folder, "cli", None)
    for config in spec.configurations:
        publish.publish_configuration(tracker, parent, spec, config, folder)
    capfd.readouterr()                                                       # MLflow's lines creating its store
    flow._MLFLOW_NOTICE.reset(uri, folder)
    assert flow._try_mlflow("comparison", publish.publish_comparison, tracker, parent, folder, True, True) is None
    said = lines(capfd)
    assert len(said) == 1 and said[0].startswith("MLflow publishing failed (comparison: MlflowException: ")
    assert REFUSED in said[0] and MLFLOW_REASON in said[0] and f"epdbench sync {folder}" in said[0]
    run = tracker.client.get_run(parent)
    assert run.info.status == "FAILED"                                       # not RUNNING
    assert REFUSED in run.data.tags[PUBLISH_ERROR_TAG] and MLFLOW_REASON in run.data.tags[PUBLISH_ERROR_TAG]

    assert main(["sync", str(folder), "--tracking-uri", uri]) == EXIT_UNPUBLISHED   # still refused: one line
    said = lines(capfd)
    assert len(said) == 1 and MLFLOW_REASON in said[0] and "Traceback" not in said[0]
    assert comparison_run(uri).info.status == "FAILED"

    monkeypatch.undo()                                                       # names made valid
    assert main(["sync", str(folder), "--tracking-uri", uri]) == EXIT_OK
    assert "published comparison" in lines(capfd)[0]
    run = comparison_run(uri)
    assert run.info.run_id == parent and run.info.status == "FINISHED"
    assert PUBLISH_ERROR_TAG not in run.data.tags
    assert run.data.metrics["goodput_req_s.pd-tcp.capacity.1260px_400/128"] == 4.0
    assert mlflow_check.mlflow_matches_results(uri, folder) == []


def test_a_comparison_run_failed_for_a_missing_configuration_is_finished_by_the_sync_that_adds_it(folder, uri):
    """The flow leaves the comparison run FAILED when a configuration did not reach MLflow; the sync that
    publishes that configuration completes the run, though the comparison itself was up to date."""
    publish.sync_results(folder, uri)
    tracker = Tracker(uri, "epdbench")
    parent = comparison_run(uri).info.run_id
    tracker.fail(parent, "not published: pd-tcp")
    state = publish.load_state(folder)
    publish.save_state(folder, {**state, "published": {**state["published"], "pd-tcp": None}})
    assert publish.sync_results(folder, uri).startswith(f"{folder}: published pd-tcp to ")
    run = comparison_run(uri)
    assert run.info.status == "FINISHED" and PUBLISH_ERROR_TAG not in run.data.tags
    assert mlflow_check.mlflow_matches_results(uri, folder) == []


class RefusingTracker(Tracker):
    """MLflow refusing a configuration's evidence once (a bad request, not an outage)."""
    refusals = 1

    def log_artifacts(self, run_id, path, artifact_path=None):
        if self.refusals:
            self.refusals -= 1
            raise MlflowException("INVALID_PARAMETER_VALUE: artifact path refused\n(second line of the reason)")
        super().log_artifacts(run_id, path, artifact_path)


def test_a_configuration_run_refused_mid_way_is_failed_then_finished_by_the_retry(folder, uri):
    spec = load_spec(str(folder / "spec.yaml"))
    tracker = RefusingTracker(uri, "epdbench")
    parent = publish.start_comparison(tracker, spec, RUN, folder, "cli", None)
    config = spec.configurations[1]
    with pytest.raises(MlflowException):
        publish.publish_configuration(tracker, parent, spec, config, folder)
    refused = next(r for r in all_runs(uri) if r.data.tags.get("epdbench.config") == config.name
                   and r.data.tags.get("epdbench.kind") == "configuration")
    assert refused.info.status == "FAILED"
    assert refused.data.tags[PUBLISH_ERROR_TAG] == ("MlflowException: INVALID_PARAMETER_VALUE: artifact path refused "
                                                    "(second line of the reason)")
    assert publish.publish_configuration(tracker, parent, spec, config, folder) == refused.info.run_id
    run = tracker.client.get_run(refused.info.run_id)
    assert run.info.status == "FINISHED" and PUBLISH_ERROR_TAG not in run.data.tags


def test_sync_says_one_line_with_its_exit_code_for_each_failure(folder, tmp_path, capfd, fast_mlflow_env):
    assert main(["sync", str(tmp_path / "no-such-run")]) == EXIT_BAD_INPUT
    said = lines(capfd)
    assert len(said) == 1 and "no results directory" in said[0]

    down = f"http://127.0.0.1:{free_port()}"
    assert main(["sync", str(folder), "--tracking-uri", down]) == EXIT_UNPUBLISHED
    said = lines(capfd)
    assert len(said) == 1 and said[0].startswith("error: MLflow unreachable (") and str(folder) in said[0]

    (folder / "goodput.csv").write_text('config,suite\n"unclosed,x\n')
    assert main(["sync", str(folder), "--tracking-uri", down]) == EXIT_BAD_INPUT   # before MLflow is asked
    said = lines(capfd)
    assert len(said) == 1 and "goodput.csv: cannot be read" in said[0]
    (folder / "goodput.csv").unlink()

    (folder / "records.parquet").write_bytes(b"not parquet")
    assert main(["sync", str(folder), "--tracking-uri", down]) == EXIT_BAD_INPUT
    said = lines(capfd)
    assert len(said) == 1 and "records.parquet" in said[0] and "Traceback" not in said[0]

    (folder / "spec.yaml").write_text("name: [unclosed\n")
    assert main(["sync", str(folder), "--tracking-uri", down]) == EXIT_BAD_INPUT
    said = lines(capfd)
    assert len(said) == 1 and "spec.yaml" in said[0]
