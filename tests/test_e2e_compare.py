"""End to end: `epdbench compare` on a tiny spec, real Prefect (ephemeral) and a real MLflow SQLite store."""
import html
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from epdbench.analysis.metrics import METRIC_KEYS
from tests.processes import marked_processes

pytestmark = pytest.mark.e2e
SUMMARY_REQUIRED = ["config", "suite", "workload", "concurrency", "stream", "requests_ok", "requests_total",
                    "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms",
                    "output_tok_s", "req_s"]


RUN_MARK = os.urandom(6).hex()


def epdbench(*args, cwd, **kw):
    return subprocess.run([sys.executable, "-m", "epdbench.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=400, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]),
                                            "EPDBENCH_TEST_MARK": RUN_MARK}, **kw)


def leftovers(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


# A calibration profile that sets the spec's own figures (the physics unchanged for the other tests): the run
# keeps it and says where its constants came from.
PROFILE = {"spec": "tiny", "spec_fingerprint": "0" * 16, "source": "hardware/summary.csv", "created": "2026-12-01",
           "gpu": "H100-SXM5-80GB", "model": "Qwen/Qwen2.5-VL-7B-Instruct",
           "hardware": {"compute_efficiency": 0.5, "tcp_gb_s": 3.0}, "holdout_seed": 0,
           "holdout_error": {"ttft_p50_ms": 0.031}, "op_laws": "measured"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_spec_path):
    work = tmp_path_factory.mktemp("e2e")
    out = work / "results"
    (work / "profile.yaml").write_text(yaml.safe_dump(PROFILE))
    proc = epdbench("compare", "--spec", str(tiny_spec_path), "--out", str(out), "--profile", "profile.yaml",
                    "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", cwd=work)
    return proc, out, work


def test_compare_exits_zero_and_writes_results(run):
    proc, out, _ = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("spec.yaml", "records.parquet", "summary.csv", "summary.parquet", "report.md", "outcome.json"):
        assert (out / name).exists(), name
    summary = pd.read_csv(out / "summary.csv")
    assert set(SUMMARY_REQUIRED) <= set(summary.columns)
    assert sorted(summary["config"].unique()) == ["aggregated", "epd", "pd-rdma", "pd-tcp"]
    assert (summary["requests_ok"] == summary["requests_total"]).all()
    assert "ITL p99" in proc.stdout and "MLflow:" in proc.stdout          # compact terminal table + links
    tail = proc.stdout.rstrip().splitlines()    # the Verdict per suite, then where the report is
    assert tail[-1] == f"report:  {out / 'report.md'} · {out / 'report.html'}", tail[-12:]
    assert any(line.startswith("Verdict (report.md opens with it)") for line in tail[-20:]), tail[-20:]
    assert "  suite fixed, 1 matched cell:" in tail
    assert not leftovers(str(out)), "simulator processes left running"
    assert not marked_processes(RUN_MARK), "a child (simulator, router or Prefect server) outlived the run"


def test_the_run_keeps_the_calibration_profile_its_constants_came_from(run):
    proc, out, _ = run
    assert "Simulator constants from profile profile.yaml; its predictions' measured error" in proc.stdout
    assert yaml.safe_load((out / "profile.yaml").read_text())["hardware"] == PROFILE["hardware"]
    for report in ("report.md", "report.html"):
        text = html.unescape((out / report).read_text())
        assert ("Simulator constants from calibration profile profile.yaml, fitted to a run of spec tiny "
                "(H100-SXM5-80GB, Qwen/Qwen2.5-VL-7B-Instruct) (hardware/summary.csv, 2026-12-01) on the measured "
                "laws: compute_efficiency 0.5, tcp_gb_s 3; model error: its predictions' measured error on cells it was "
                "not fitted to (median |predicted/observed − 1|): ttft_p50_ms 3.1%") in text, report


def test_a_report_rendered_again_from_mlflow_says_where_the_constants_came_from(run):
    from mlflow.tracking import MlflowClient
    _, out, work = run
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("epdbench").experiment_id],
                                   "tags.`epdbench.kind` = 'comparison'")
    proc = epdbench("report", "--run-id", parent.info.run_id, "--tracking-uri", uri, "--out",
                    str(work / "from-mlflow"), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert (work / "from-mlflow" / "report.md").read_text() == (out / "report.md").read_text()


def test_mixed_streams_share_one_window_and_gpus_are_counted(run):
    _, out, _ = run
    s = pd.read_csv(out / "summary.csv")
    mixed = s[s["suite"] == "mixed"]
    assert set(mixed["stream"]) == {"steady", "burst"}
    for _, g in mixed.groupby("config"):
        assert g["window_s"].nunique() == 1               # both streams: the whole mixed window
    agg = s[(s["config"] == "pd-tcp") & (s["suite"] == "fixed")].iloc[0]
    assert agg["gpus"] == 2 and agg["output_tok_s_per_gpu"] == pytest.approx(agg["output_tok_s"] / 2)
    rec = pd.read_parquet(out / "records.parquet")
    burst = rec[(rec["stream"] == "burst") & (rec["phase"] == "measured") & (rec["config"] == "pd-tcp")]
    lag_ms = (burst["send_ns"] - burst["scheduled_ns"]) / 1e6
    assert (lag_ms >= 0).all() and burst["scheduled_ns"].nunique() == 2      # two bursts of two
    assert (rec["prompt_tokens"] == rec["target_prompt_tokens"]).all()       # calibrated to the tokenizer
    assert (out / "calibration.json").exists() and (out / "summary_trials.csv").exists()


def test_every_configuration_got_the_same_prompts(run):
    _, out, _ = run
    rec = pd.read_parquet(out / "records.parquet")
    per_config = rec.groupby(["config", "cell"])["prompt_hash"].apply(lambda s: tuple(sorted(s)))
    for cell, hashes in per_config.groupby(level="cell"):
        assert hashes.nunique() == 1, f"cell {cell} got different prompts"


def test_long_prompt_interference_is_modelled(run):
    _, out, _ = run
    s = pd.read_csv(out / "summary.csv").set_index(["config", "workload"])
    agg = s.loc[("aggregated", "4096/32"), "itl_p99_ms"]
    pd_tcp = s.loc[("pd-tcp", "4096/32"), "itl_p99_ms"]
    assert agg > 3 * pd_tcp, (agg, pd_tcp)


def test_evidence_says_emulated(run):
    import json
    _, out, _ = run
    assert json.loads((out / "evidence/pd-tcp/transport.json").read_text())["verdict"] == "emulated"
    assert json.loads((out / "evidence/pd-rdma/transport.json").read_text())["verdict"] == "emulated"
    assert json.loads((out / "evidence/aggregated/transport.json").read_text())["verdict"] == "not-applicable"
    stages = json.loads((out / "evidence/epd/stages.json").read_text())
    assert stages["verdict"] == "emulated" and stages["fraction_seen"]["encode"] == 1.0
    # the encoder outputs' own verdict (ECCPUConnector over NIXL), next to the KV's
    ec = json.loads((out / "evidence/epd/ec_transport.json").read_text())
    assert ec["verdict"] == "emulated" and ec["what"] == "ec"
    assert sum(p["ec_reads"] for p in ec["pods"].values()) > 0
    assert json.loads((out / "evidence/epd/transport.json").read_text())["ec"]["verdict"] == "emulated"


def test_stage_correlation_and_per_suite_deltas(run):
    import json
    _, out, _ = run
    for config, roles in {"aggregated": ["server"], "pd-tcp": ["decode", "prefill"],
                          "pd-rdma": ["decode", "prefill"], "epd": ["decode", "encode", "prefill"]}.items():
        stages = json.loads((out / f"evidence/{config}/stages.json").read_text())
        assert stages["fraction_seen"] == {r: 1.0 for r in roles}, config
        assert set(stages["suites"]) == {"fixed", "mm", "mm-reuse", "mixed"}
    pd_tcp = json.loads((out / "evidence/pd-tcp/stages.json").read_text())["suites"]
    kv_bytes = pd_tcp["fixed"]["metrics_delta"]["prefill"]["mooncake_bytes_transferred"]
    assert kv_bytes == (1 + 8) * 4096 * 57344          # warm-up + measured requests of the suite, no probe
    epd = json.loads((out / "evidence/epd/stages.json").read_text())["suites"]["mm"]["metrics_delta"]
    assert epd["encode"]["mm_cache_queries"] == 2 and epd["encode"]["mm_cache_hits"] == 0
    # mm-reuse sends mm's cell with one image, two requests at once: the second waits for the first's
    # encode instead of running the encoder again (a hit, as in vLLM's encoder cache manager)
    reuse = json.loads((out / "evidence/epd/stages.json").read_text())["suites"]["mm-reuse"]["metrics_delta"]
    assert reuse["encode"]["mm_cache_queries"] == 2 and reuse["encode"]["mm_cache_hits"] == 1
    report = (out / "report.md").read_text()
    assert "### Image reuse" in report and "each of its cells is set against the same cell" in report
    assert "| epd | 1k:560px+200/8 | 2 |" in report and "50% (encode) vs 0%" in report
    transport = json.loads((out / "evidence/pd-tcp/transport.json").read_text())
    assert transport["throughput_mb_s_max"] > 0 and transport["failed_transfers"] == 0
    assert "## Transport and stage verification" in (out / "report.md").read_text()


@pytest.mark.faults   # a fault injected into a whole comparison: in the faults lane for time
def test_router_skipping_prefill_is_caught(tmp_path, tiny_spec_path):
    import json

    import yaml
    spec = yaml.safe_load(tiny_spec_path.read_text())
    spec["configurations"] = [c for c in spec["configurations"] if c["name"] == "pd-tcp"]
    spec["suites"] = [s for s in spec["suites"] if s["kind"] == "fixed"]
    spec["target"] = {"sim": {"faults": {"skip_prefill_fraction": 0.5}}}
    (tmp_path / "fault.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "results"
    proc = epdbench("compare", "--spec", str(tmp_path / "fault.yaml"), "--out", str(out),
                    "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    stages = json.loads((out / "evidence/pd-tcp/stages.json").read_text())
    assert stages["verdict"] == "mismatch"
    skipped = stages["n_skipped"]
    assert 0 < skipped < 8 and stages["fraction_seen"]["prefill"] == (8 - skipped) / 8
    report = (out / "report.md").read_text()
    assert f"prefill: {100 * (8 - skipped) / 8:.1f}% of measured requests seen" in report


def test_mlflow_holds_comparison_configuration_and_cell_runs(run):
    from mlflow.tracking import MlflowClient
    _, out, work = run
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("epdbench")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"     # earlier MLflow 3 UIs: the runs table
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    kinds = {}
    for r in runs:
        kinds.setdefault(r.data.tags["epdbench.kind"], []).append(r)
    assert len(kinds["comparison"]) == 1
    parent = kinds["comparison"][0]
    assert parent.data.tags["epdbench.target"] == "sim" and parent.data.tags["epdbench.trigger"] == "cli"
    assert len(kinds["configuration"]) == 4
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in kinds["configuration"])
    config_ids = {r.info.run_id for r in kinds["configuration"]}
    assert len(kinds["cell"]) == 4 * 5          # fixed, mm, mm-reuse, and the two streams of mixed
    for r in kinds["cell"]:
        assert r.data.tags["mlflow.parentRunId"] in config_ids
        assert set(METRIC_KEYS) <= set(r.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "records.parquet", "summary.csv", "profile.yaml"} <= artifacts
    # the comparison run on its own: the report's verdict as its description, a verdict tag per cell, wins
    note = parent.data.tags["mlflow.note.content"]
    assert note.startswith("# epdbench: tiny") and "## Verdict" in note and "## Summary" not in note
    verdicts = {k: v for k, v in parent.data.tags.items() if k.startswith("epdbench.verdict.")}
    assert "epdbench.verdict.fixed.4096/32.c4.ttft_p50_ms" in verdicts
    assert set(verdicts.values()) <= {"aggregated", "pd-tcp", "pd-rdma", "epd", "tie", "contaminated"}
    wins = {k: v for k, v in parent.data.metrics.items() if k.startswith("wins.ttft_p50_ms.")}
    assert set(wins) == {f"wins.ttft_p50_ms.{c}" for c in ("aggregated", "pd-tcp", "pd-rdma", "epd")}
    decided = sum(v not in ("tie", "contaminated") for k, v in verdicts.items() if k.endswith(".ttft_p50_ms"))
    assert sum(wins.values()) == decided
    for r in kinds["configuration"]:           # every configuration run points at the comparison's report
        assert r.data.tags["epdbench.report"] == f"runs:/{parent.info.run_id}/report.html"


def test_mlflow_ui_opens_the_printed_addresses_on_the_runs_table_with_the_comparison_first(run, tmp_path):
    """In a fresh browser, MLflow 3.17 opens the experiment's runs table (Model training), the comparison run its
    first row with the rest folded under it, and the comparison run's page at the address compare printed; not
    GenAI's Overview, where a fresh browser opens it from MLflow's own experiment list whatever its tags."""
    from mlflow.tracking import MlflowClient

    from epdbench.tasks.publishing.tracking import LOCAL_UI, ui_url
    from tests.devtools import Browser
    from tests.mlflow_ui import GENAI, RUN_PAGE, RUNS_TABLE, drawn, mlflow_server
    from tests.reports.browser import ARTIFACTS, chromium
    chromium()
    proc, _, work = run
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("epdbench").experiment_id
    parent = client.search_runs([exp], "tags.`epdbench.kind` = 'comparison'")[0].info
    line = next(x for x in proc.stdout.splitlines() if x.startswith("MLflow:"))
    assert f"run mlflow ui --backend-store-uri sqlite:///{work / 'mlflow.db'} --port 5000 and open " in line, line
    printed = line.rsplit(" and open ", 1)[1]
    assert printed == ui_url(LOCAL_UI, exp, parent.run_id)
    with mlflow_server(work / "mlflow.db") as base, Browser(tmp_path / "fresh-profile") as browser:
        page = drawn(browser, ui_url(base, exp), RUNS_TABLE)
        browser.screenshot(ARTIFACTS / "mlflow-runs-table.png")
        assert f"/experiments/{exp}/runs?workflowType=machine_learning" in page["href"], page["href"]
        assert "Run Name" in page["text"] and parent.run_name in page["text"]
        assert page["runs"][0].endswith(f"/runs/{parent.run_id}"), page["runs"]     # the first row
        assert not [g for g in GENAI if g in page["text"]], page["text"][:1500]
        page = drawn(browser, printed.replace(LOCAL_UI, base), RUN_PAGE)
        browser.screenshot(ARTIFACTS / "mlflow-comparison-run-page.png")
        assert f"/runs/{parent.run_id}" in page["href"] and parent.run_name in page["text"]
        assert "epdbench: tiny" in page["text"] and "Artifacts" in page["text"]  # its description: the report's opening
        assert not [g for g in GENAI if g in page["text"]], page["text"][:1500]


def test_report_rerenders_from_results_dir(run):
    _, out, work = run
    (out / "report.md").unlink()
    proc = epdbench("report", str(out), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "## Suite `fixed`" in (out / "report.md").read_text()
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    elsewhere = work / "elsewhere"
    proc = epdbench("report", str(out), "--out", str(elsewhere), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(elsewhere / "report.md"), str(elsewhere / "report.html")]
    assert "## Suite `fixed`" in (elsewhere / "report.md").read_text() and (elsewhere / "plots").is_dir()
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before     # the results untouched
    points = pd.read_csv(elsewhere / "pareto.csv")
    assert points["cost_usd_per_mtok"].isna().all() and set(points["status"]) <= {"frontier", "dominated", "contaminated"}
    priced = work / "priced"
    proc = epdbench("report", str(out), "--out", str(priced), "--gpu-hour-usd", "3.6", cwd=work)
    assert proc.returncode == 0, proc.stderr
    points = pd.read_csv(priced / "pareto.csv")   # $3.60/GPU-hour is $1 per million tokens at 1000 tok/s per GPU
    assert points["cost_usd_per_mtok"].tolist() == pytest.approx((1000 / points["output_tok_s_per_gpu"]).tolist())
    assert "at $3.6 per GPU-hour" in (priced / "report.md").read_text()
    proc = epdbench("report", str(out), "--gpu-hour-usd", "-1", cwd=work)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --gpu-hour-usd -1: give the price of one GPU-hour in USD, 0 or more (e.g. 2.5)"], proc.stderr


@pytest.mark.parametrize("args,needle", [
    (["compare", "--spec", "no-such-preset"], "not found"),
    (["compare", "--configs", "aggregated,warp-drive"], "warp-drive"),
    (["compare", "--seed", "-1"], "--seed"),
    (["compare", "--bogus"], "unrecognized"),
])
def test_bad_input_gets_one_line_and_exit_2(args, needle, tmp_path):
    proc = epdbench(*args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


@pytest.mark.faults   # a fault injected into a whole comparison: in the faults lane for time
def test_interrupt_leaves_nothing_running(tmp_path, tiny_spec_path):
    out = tmp_path / "results"
    mark = os.urandom(6).hex()
    proc = subprocess.Popen([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(tiny_spec_path),
                             "--out", str(out), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]),
                                 "EPDBENCH_TEST_MARK": mark})
    deadline = time.monotonic() + 180
    seen = []
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen.append(line)
            if "serving at" in line or not line:
                break
        assert any("serving at" in line for line in seen), "".join(seen)[-2000:]
        assert leftovers(str(out)), "expected simulator processes while serving"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    time.sleep(0.5)
    assert not leftovers(str(out)), leftovers(str(out))
    assert not marked_processes(mark), "a child (simulator, router or Prefect server) outlived the run"


def test_the_virtual_time_core_agrees_with_the_http_simulator_on_warmed_closed_loop_cells(run):
    """The same spec in virtual time (no HTTP, no sleeping) gives figures within the HTTP run's noise band (plus
    the host path for TTFT): analysis.agreement's tolerance, as README states it. Here on the tiny spec's
    closed-loop suite, which has a warm-up; the tiny multimodal cells have none (their first requests carry
    the HTTP simulator's one-time host costs) and its mixed streams hold four requests each, so the whole
    smoke preset is checked in the slow lane (tests/test_vtime_agreement.py)."""
    from epdbench.analysis.agreement import METRICS, agreement
    from epdbench.specs.models import load_spec
    from epdbench.tasks.sim.vrun import simulate_summary

    _, out, _ = run
    spec = load_spec(str(out / "spec.yaml"))
    spec = spec.model_copy(update={"suites": [s for s in spec.suites if s.name == "fixed"]})
    http = pd.read_csv(out / "summary.csv").query("suite == 'fixed'")
    table = agreement(http, simulate_summary(spec))
    assert set(table["metric"]) == set(METRICS) and len(table) == len(http) * len(METRICS) == 16
    judged = table[table["judged"]]       # a cell contaminated by host load is no reference (analysis.agreement)
    assert len(judged) >= len(table) / 4, table.to_string()     # not vacuous even on a loaded host
    assert judged["agrees"].all(), judged[~judged["agrees"]].to_string()
