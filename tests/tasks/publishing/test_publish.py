"""tasks/publishing/publish.py and tasks/publishing/tracking.py against a real MLflow SQLite store,
on a synthetic results folder (no simulator): one run per key however often a piece is published (retries, resume, sync), a failed
configuration that later has its data ends FINISHED, `sync` publishes what changed since, MLflow equals
the folder (`mlflow_matches_results`), and an unreachable server is one line, quickly."""
from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path

import pytest
import yaml

from epdbench.analysis.metrics import summarize
from epdbench.specs.models import load_spec
from epdbench.tasks.publishing import mlflow_check
from epdbench.tasks.publishing import publish
from epdbench.tasks.publishing import publish_state
from epdbench.tasks.rundir.results import append_records, read_records, write_json, write_summary
from epdbench.tasks.publishing.mlflow_quiet import MlflowUnreachable, QuietClient
from epdbench.tasks.publishing.tracking import KEY_TAG, Tracker, ui_url
from tests.reports.synthetic_run import synthetic_records

DATA = Path(__file__).parents[2] / "data"
RUN = "tiny-sim-20260101-120000"
CONFIGS = ("aggregated", "pd-tcp")


# --- a synthetic results folder ------------------------------------------------------------------------

def write_spec(rdir: Path) -> None:
    spec = yaml.safe_load((DATA / "tiny.yaml").read_text())
    spec["configurations"] = [c for c in spec["configurations"] if c["name"] in CONFIGS]
    spec["suites"] = [s for s in spec["suites"] if s["kind"] in ("fixed", "mixed")]
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "spec.yaml").write_text(yaml.safe_dump(spec))


def write_config(rdir: Path, name: str, ok: bool = True, records: bool = True, seed: int = 0) -> None:
    """evidence/<name>/ as the flow writes it; with `records`, that configuration's rows in records.parquet."""
    spec = load_spec(str(rdir / "spec.yaml"))
    config = next(c for c in spec.configurations if c.name == name)
    kv = config.topology != "aggregated"
    ev = rdir / "evidence" / name
    write_json(ev / "outcome.json", {"ok": ok, "error": None if ok else "provisioning failed: no GPU",
                                     "router": "vllm-router" if ok else ""})
    if ok:
        write_json(ev / "transport.json", {"verdict": "emulated" if kv else "not-applicable",
                                           "throughput_mb_s_min": 900.0 if kv else None,
                                           "throughput_mb_s_max": 1200.0 if kv else None, "failed_transfers": 0})
        write_json(ev / "stages.json", {"verdict": "emulated", "fraction_seen": {r.role: 1.0 for r in config.roles}})
        (ev / "router.log").write_text(f"{name} router log\n")
    if records:
        rows = synthetic_records(spec, seed)
        rows = rows[rows["config"] == name].copy()
        rows["request_id"] = [f"{rid}-s{seed}" for rid in rows["request_id"]]
        append_records(rdir / "records.parquet", rows.to_dict("records"))


def write_comparison(rdir: Path) -> None:
    """summary files, report and outcome.json from what the folder holds (as the end of the flow does)."""
    spec = load_spec(str(rdir / "spec.yaml"))
    summary = summarize(read_records(rdir / "records.parquet"), {c.name: c.gpus for c in spec.configurations})
    write_summary(rdir, summary)
    configs = {n: publish.config_outcome(rdir, n) for n in publish.folder_configs(rdir, spec)}
    (rdir / "report.md").write_text(f"# {RUN}\n\n## Verdict\n{len(summary)} cells\n")
    write_json(rdir / "outcome.json", {
        "run": RUN, "results_dir": str(rdir), "trigger": "cli",
        "configs": {n: {"ok": bool(o.get("ok")), "verified": bool(o.get("ok")), "error": o.get("error"),
                        "transport": o["transport"].get("verdict"), "stages": o["stages"].get("verdict")}
                    for n, o in configs.items()},
        "all_verified": all(o.get("ok") for o in configs.values())})


@pytest.fixture
def folder(tmp_path):
    rdir = tmp_path / "results" / "folder-name"
    write_spec(rdir)
    publish.save_state(rdir, publish.load_state(rdir, RUN))     # what compare() records first
    for name in CONFIGS:
        write_config(rdir, name)
    write_comparison(rdir)
    return rdir


@pytest.fixture
def uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def all_runs(uri: str) -> list:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("epdbench")
    return list(client.search_runs([exp.experiment_id], run_view_type=ViewType.ACTIVE_ONLY, max_results=5000))


def keys_count(uri: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in all_runs(uri):
        key = r.data.tags.get(KEY_TAG, f"(no key) {r.info.run_id}")
        out[key] = out.get(key, 0) + 1
    return out


def n_cells(rdir: Path) -> int:
    rec = read_records(rdir / "records.parquet")
    return len(rec.groupby(["config", "suite", "workload", "concurrency", "stream", "trial"]))


# --- keys ------------------------------------------------------------------------------------------------

def test_keys_are_deterministic_and_documented():
    assert publish.config_key(RUN, "pd-tcp") == f"{RUN}/pd-tcp"
    assert publish.cell_key(RUN, "pd-tcp", "fixed", "4096/32", 4, "main", 0) == f"{RUN}/pd-tcp/fixed/4096/32/c4/main/t0"
    for fragment in ("<run>/<config>/<suite>/<workload>/c<concurrency>/<stream>/t<trial>", "fingerprint"):
        assert fragment in publish_state.__doc__


def test_the_printed_addresses_open_mlflow_in_model_training(uri):
    """MLflow 3.17 opens GenAI unless the address asks for Model training (a browser test: test_e2e_compare)."""
    assert ui_url("http://h:5000/", "3") == "http://h:5000/#/experiments/3/runs?workflowType=machine_learning"
    assert ui_url("http://h", "3", "r1") == "http://h/#/experiments/3/runs/r1?workflowType=machine_learning"
    tracker = Tracker(uri, "epdbench")
    assert tracker.run_url("r1") == (f"{uri} (experiment {tracker.experiment_id}, run r1); to browse it run mlflow ui "
                                     f"--backend-store-uri {uri} --port 5000 and open "
                                     f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs/r1"
                                     "?workflowType=machine_learning")


# --- one run per key -------------------------------------------------------------------------------------

def test_publishing_twice_leaves_one_run_per_key_and_mlflow_equals_the_folder(folder, uri):
    first = publish.sync_results(folder, uri)
    assert "published aggregated, pd-tcp, comparison" in first
    assert mlflow_check.mlflow_matches_results(uri, folder) == []
    counts = keys_count(uri)
    assert len(counts) == 1 + len(CONFIGS) + n_cells(folder) and set(counts.values()) == {1}
    assert RUN in counts and f"{RUN}/pd-tcp/fixed/4096/32/c4/main/t0" in counts   # the run name recorded first

    assert "already in MLflow" in publish.sync_results(folder, uri)              # nothing changed: nothing sent
    publish.save_state(folder, {**json.loads((folder / "state.json").read_text()),   # forget what was published
                                "published": {}, "parent_published": None})
    again = publish.sync_results(folder, uri)
    assert "published aggregated, pd-tcp, comparison" in again
    assert keys_count(uri) == counts                                              # updated, not duplicated
    assert mlflow_check.mlflow_matches_results(uri, folder) == []
    outcome = json.loads((folder / "outcome.json").read_text())
    assert outcome["mlflow_pending"] == [] and outcome["mlflow_run_id"]


class FlakyTracker(Tracker):
    """MLflow failing once mid-way through a configuration (after its cell runs, at the artifacts)."""
    failures = 1

    def log_artifacts(self, run_id, path, artifact_path=None):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("MLflow went away for a moment")
        super().log_artifacts(run_id, path, artifact_path)


def test_a_retry_after_a_failure_mid_way_updates_the_same_runs(folder, uri):
    spec = load_spec(str(folder / "spec.yaml"))
    tracker = FlakyTracker(uri, "epdbench")
    parent = publish.start_comparison(tracker, spec, RUN, folder, "cli", None)
    config = spec.configurations[1]
    with pytest.raises(ConnectionError):
        publish.publish_configuration(tracker, parent, spec, config, folder)
    first = publish.publish_configuration(tracker, parent, spec, config, folder)     # the task's retry
    assert publish.start_comparison(tracker, spec, RUN, folder, "cli", None) == parent
    assert publish.publish_configuration(tracker, parent, spec, config, folder) == first
    counts = keys_count(uri)
    assert set(counts.values()) == {1}
    pd_cells = [k for k in counts if k.startswith(f"{RUN}/pd-tcp/")]
    assert len(pd_cells) == len(read_records(folder / "records.parquet").query("config == 'pd-tcp'")
                                .groupby(["suite", "workload", "concurrency", "stream", "trial"]))
    run = tracker.client.get_run(first)
    assert run.info.status == "FINISHED" and run.data.tags["epdbench.router"] == "vllm-router"
    assert "evidence" in {a.path for a in tracker.client.list_artifacts(first)}


# --- failed, then its data exists ------------------------------------------------------------------------

def test_a_failed_configuration_republished_with_its_data_ends_finished(tmp_path, uri):
    rdir = tmp_path / "results" / RUN
    write_spec(rdir)
    write_config(rdir, "aggregated")
    write_config(rdir, "pd-tcp", ok=False, records=False)
    write_comparison(rdir)
    assert "published aggregated, pd-tcp, comparison" in publish.sync_results(rdir, uri)
    runs = {r.data.tags[KEY_TAG]: r for r in all_runs(uri)}
    failed = runs[f"{RUN}/pd-tcp"]
    assert failed.info.status == "FAILED" and failed.data.tags["epdbench.error"].startswith("provisioning failed")
    assert runs[RUN].info.status == "FAILED"
    assert not [k for k in runs if k.startswith(f"{RUN}/pd-tcp/")]
    assert mlflow_check.mlflow_matches_results(uri, rdir) == []           # FAILED is what the folder says

    write_config(rdir, "pd-tcp")                                       # --resume ran it again
    write_comparison(rdir)
    assert publish.pending(publish.load_state(rdir), rdir) == ["comparison", "pd-tcp"]
    assert "published pd-tcp, comparison" in publish.sync_results(rdir, uri)
    runs = all_runs(uri)
    assert not [r for r in runs if r.info.status == "FAILED"]
    by_key = {r.data.tags[KEY_TAG]: r for r in runs}
    fixed = by_key[f"{RUN}/pd-tcp"]
    assert fixed.info.run_id == failed.info.run_id                     # the same run, updated
    assert fixed.data.tags["epdbench.status"] == "ok" and fixed.data.tags["epdbench.error"] == ""
    assert fixed.data.tags["epdbench.router"] == "vllm-router"
    assert [k for k in by_key if k.startswith(f"{RUN}/pd-tcp/")]
    assert set(keys_count(uri).values()) == {1}
    assert mlflow_check.mlflow_matches_results(uri, rdir) == []
    assert "already in MLflow" in publish.sync_results(rdir, uri)


# --- sync after the folder changed -----------------------------------------------------------------------

def test_sync_after_the_folder_changed_publishes_again(folder, uri):
    publish.sync_results(folder, uri)
    assert mlflow_check.mlflow_matches_results(uri, folder) == []
    rec = read_records(folder / "records.parquet")
    gone = (rec["config"] == "aggregated") & (rec["suite"] == "mixed")       # resume dropped these cells...
    faster = rec["config"] == "pd-tcp"                                        # ...and measured pd-tcp again
    rec.loc[faster, "ttft_ms"] = [v / 2 for v in rec.loc[faster, "ttft_ms"]]
    (folder / "records.parquet").unlink()
    append_records(folder / "records.parquet", rec[~gone].to_dict("records"))
    write_comparison(folder)
    diffs = mlflow_check.mlflow_matches_results(uri, folder)
    assert any("ttft_p50_ms" in d for d in diffs) and any("no such cell" in d for d in diffs)
    assert publish.pending(publish.load_state(folder), folder) == ["comparison", "aggregated", "pd-tcp"]

    synced = publish.sync_results(folder, uri)
    assert "published aggregated, pd-tcp, comparison" in synced and "already" not in synced
    assert mlflow_check.mlflow_matches_results(uri, folder) == []
    assert not [k for k in keys_count(uri) if k.startswith(f"{RUN}/aggregated/mixed/")]   # stale cells deleted
    assert "already in MLflow" in publish.sync_results(folder, uri)


def test_a_configuration_run_for_data_no_longer_in_the_folder_is_deleted(folder, uri):
    publish.sync_results(folder, uri)
    for f in (folder / "evidence" / "aggregated").iterdir():
        f.unlink()
    rec = read_records(folder / "records.parquet")
    (folder / "records.parquet").unlink()
    append_records(folder / "records.parquet", rec[rec["config"] != "aggregated"].to_dict("records"))
    write_comparison(folder)
    assert any("not in the folder" in d for d in mlflow_check.mlflow_matches_results(uri, folder))
    publish.sync_results(folder, uri)
    assert mlflow_check.mlflow_matches_results(uri, folder) == []
    assert not [k for k in keys_count(uri) if k.startswith(f"{RUN}/aggregated")]


# --- state.json ------------------------------------------------------------------------------------------

def test_load_state_reads_the_old_format_as_pending(folder):
    write_json(folder / "state.json", {"mlflow_parent": "abc", "published": ["aggregated"], "parent_published": True})
    state = publish.load_state(folder)
    assert state["run"] == RUN                                   # from outcome.json
    assert state["published"] == {"aggregated": None} and state["parent_published"] is None
    assert publish.pending(state, folder) == ["comparison", "aggregated", "pd-tcp"]
    other = publish.load_state(folder, store=publish.store_id("sqlite:///other.db", "epdbench"))
    assert other["store"].startswith("sqlite:///other.db")
    write_json(folder / "state.json", other)
    again = publish.load_state(folder, store=publish.store_id("sqlite:///third.db", "epdbench"))
    assert again["mlflow_parent"] is None and again["published"] == {}  # recorded for another store


def test_runs_published_before_keys_existed_are_adopted_not_duplicated(folder, uri):
    """An old run: comparison, configuration and cell runs without keys, and the old state.json format."""
    spec = load_spec(str(folder / "spec.yaml"))
    tracker = Tracker(uri, "epdbench")
    parent = tracker.start_comparison(RUN, tags={"epdbench.spec": spec.name}, params={})
    records = read_records(folder / "records.parquet")
    for config in spec.configurations:
        run = tracker.log_configuration(parent, config.name, tags={}, params={"router": "old"}, metrics={})
        for _, row in summarize(records[records["config"] == config.name]).iterrows():
            tracker.log_cell(run, "old", tags={"epdbench.config": config.name},
                             params={"suite": row["suite"], "cell": row["workload"], "concurrency": row["concurrency"],
                                     "stream": row["stream"], "trial": row["trial"]}, summary={})
    write_json(folder / "state.json", {"mlflow_parent": parent, "published": list(CONFIGS), "parent_published": True})
    before = len(all_runs(uri))
    assert "published aggregated, pd-tcp, comparison" in publish.sync_results(folder, uri)
    assert len(all_runs(uri)) == before
    assert mlflow_check.mlflow_matches_results(uri, folder) == []


# --- MLflow unreachable ----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fast_mlflow_env(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")


def test_an_unreachable_server_is_one_line_and_quick(folder, capfd, caplog, fast_mlflow_env):
    from epdbench.flows import compare as flow

    uri = f"http://127.0.0.1:{free_port()}"
    flow._MLFLOW_NOTICE.reset(uri, folder)
    spec = load_spec(str(folder / "spec.yaml"))
    caplog.set_level(logging.DEBUG)
    t0 = time.monotonic()
    assert flow._try_mlflow("connect", Tracker, uri, "epdbench") is None
    assert flow._try_mlflow("connect", Tracker, uri, "epdbench") is None
    assert time.monotonic() - t0 < 10
    out, err = capfd.readouterr()
    lines = [x for x in (out + err).splitlines() if x.strip()]
    assert len(lines) == 1, out + err
    assert lines[0].startswith(f"MLflow unreachable at {uri} (")
    assert f"results kept in {folder}; publish later with: epdbench sync {folder}" in lines[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    with pytest.raises(MlflowUnreachable):
        publish.sync_results(folder, uri)
    state = publish.load_state(folder, store=publish.store_id(uri, spec.tracking.experiment))
    assert publish.pending(state, folder, spec) == ["comparison", "aggregated", "pd-tcp"]


def test_a_server_going_away_mid_run_is_still_one_line(folder, uri, capfd):
    from epdbench.flows import compare as flow

    spec = load_spec(str(folder / "spec.yaml"))
    tracker = Tracker(uri, "epdbench")
    parent = publish.start_comparison(tracker, spec, RUN, folder, "cli", None)

    def gone(*args, **kwargs):
        raise ConnectionError("Connection refused")

    tracker.client = type("Gone", (), {"__getattr__": lambda self, name: gone})()
    flow._MLFLOW_NOTICE.reset(uri, folder)
    for config in spec.configurations:
        assert flow._try_mlflow(config.name, publish.publish_configuration, tracker, parent, spec, config,
                                folder) is None
    assert flow._try_mlflow("comparison", publish.publish_comparison, tracker, parent, folder, True, True) is None
    out, err = capfd.readouterr()
    assert len([x for x in out.splitlines() if x.strip()]) == 1 and "epdbench sync" in out, out
    assert "Retrying" not in err


def test_mlflow_retry_warnings_are_silenced(caplog, fast_mlflow_env):
    """Past the TCP probe (a server that goes away later): urllib3's per-attempt warnings are not shown."""
    from mlflow.tracking import MlflowClient

    caplog.set_level(logging.WARNING)
    client = QuietClient(MlflowClient(tracking_uri=f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(Exception):
        client.get_experiment_by_name("epdbench")
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()], caplog.text


def test_a_calibration_profile_is_part_of_the_comparison_only_when_the_folder_has_one(tmp_path):
    """Folders without a profile.yaml keep the fingerprint they were published with (no republishing after an
    upgrade); one added, changed or removed is pending again."""
    import hashlib
    import json

    from epdbench.tasks.publishing.publish_state import PARENT_ARTIFACTS, _file_digest, comparison_fingerprint

    (tmp_path / "outcome.json").write_text(json.dumps({"run": "r", "mlflow_run_id": "x"}))
    (tmp_path / "summary.csv").write_text("config\na\n")
    before = comparison_fingerprint(tmp_path)
    files = {name: _file_digest(tmp_path / name) for name in PARENT_ARTIFACTS if name != "outcome.json"}
    as_published = hashlib.sha256(json.dumps([{"run": "r"}, files], sort_keys=True, default=str).encode()).hexdigest()
    assert before == as_published                                   # as defined before profiles were carried
    (tmp_path / "profile.yaml").write_text("hardware: {compute_efficiency: 0.4}\n")
    with_profile = comparison_fingerprint(tmp_path)
    assert with_profile != before
    (tmp_path / "profile.yaml").write_text("hardware: {compute_efficiency: 0.3}\n")
    assert comparison_fingerprint(tmp_path) not in (before, with_profile)
    (tmp_path / "profile.yaml").unlink()
    assert comparison_fingerprint(tmp_path) == before
