"""The real-engine lane: `epdbench compare --target local --spec cpu-tiny` against real vLLM CPU engines, the real
vllm-router and NIXL over UCX on this host (a few minutes on 2 cores). Skipped without vLLM's environment
(`epdbench engine-env`, or EPDBENCH_VLLM_PYTHON naming another interpreter with vLLM)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from epdbench.tasks.local.engine_env import default_env_dir, env_python, installed
from epdbench.tasks.rundir.runstate import leftovers

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(1500)]
RUN_TIMEOUT_S = 1200     # cpu-tiny took 183 s on the 2-core development VM


def engine_python() -> str:
    """vLLM's interpreter (EPDBENCH_VLLM_PYTHON, else the one `epdbench engine-env` made); skips the test without."""
    given = os.environ.get("EPDBENCH_VLLM_PYTHON")
    if given:
        return given
    env = default_env_dir()
    if not installed(env):
        pytest.skip("no vLLM environment: make one with `epdbench engine-env` (or set EPDBENCH_VLLM_PYTHON)")
    return str(env_python(env))


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    python = engine_python()
    where = tmp_path_factory.mktemp("local")
    out, uri = where / "run", f"sqlite:///{where / 'mlflow.db'}"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "epdbench.cli", "compare", "--target", "local", "--spec", "cpu-tiny",
                           "--vllm-python", python, "--out", str(out), "--tracking-uri", uri],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=where, stdin=subprocess.DEVNULL)
    print(f"epdbench compare --target local --spec cpu-tiny: exit {done.returncode} in "
          f"{time.monotonic() - start:.0f} s")
    return done, out, uri


def test_cpu_tiny_runs_real_engines_end_to_end_and_verifies_pd_from_their_own_output(local_run):
    done, out, _ = local_run
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    outcome = json.loads((out / "outcome.json").read_text())
    assert outcome["all_verified"]
    assert outcome["configs"]["pd-nixl-tcp"]["transport"] == "verified"
    assert {c["stages"] for c in outcome["configs"].values()} == {"verified"}
    transport = json.loads((out / "evidence" / "pd-nixl-tcp" / "transport.json").read_text())
    assert transport["reasons"][0].startswith("every KV pod and UCX worker")
    assert {p["observed"] for p in transport["pods"].values()} == {"tcp"}
    assert not any(p["emulated"] for p in transport["pods"].values())
    kv = transport["kv_check"]         # from the decode engine's vllm:nixl_bytes_transferred and transfer count
    assert kv["bytes"] > 0 and kv["transfers"] >= kv["measured_requests"] > 0
    assert leftovers(out) == []        # every engine, engine core and router the run started is gone


def test_the_report_and_mlflow_say_local(local_run):
    done, out, uri = local_run
    assert done.returncode == 0
    report = (out / "report.md").read_text()
    assert report.startswith("# epdbench: cpu-tiny on local vLLM engines (CPU)") and "target `local`" in report
    import mlflow
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`epdbench.kind` = 'comparison'")
    assert [r.data.tags["epdbench.target"] for r in runs] == ["local"]


def test_the_same_engines_logs_read_expecting_rdma_name_the_tcp_lanes(local_run):
    _, out, _ = local_run
    ev = out / "evidence" / "pd-nixl-tcp"
    done = subprocess.run([sys.executable, "-m", "epdbench.cli", "verify-transport", str(ev / "prefill-0.log"),
                           str(ev / "decode-0.log"), "--expect", "rdma"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout.startswith("mismatch: expected rdma;") and "tcp/lo" in done.stdout.splitlines()[0]


def test_the_real_engines_spans_join_each_sampled_request_s_trace(local_run):
    """vLLM itself (--otlp-traces-endpoint, http/protobuf) exports an `llm_request` span per request into the
    trace the load generator's traceparent started: one tree per sampled request, the engines' spans not
    emulated, carrying vLLM's own latency attributes."""
    import pandas as pd

    _, out, _ = local_run
    for config, roles in (("aggregated", {"aggregated"}), ("pd-nixl-tcp", {"prefill", "decode"})):
        spans = pd.read_parquet(out / "traces" / f"{config}.parquet")
        clients = spans[spans.name == "client.request"]
        engines = spans[spans.name == "llm_request"]
        assert len(clients) > 0 and set(engines.role) == roles
        assert not engines.emulated.any()
        for trace_id, tree in spans.groupby("trace_id"):
            root = tree[tree.parent_span_id == ""]
            assert list(root.name) == ["client.request"], trace_id
            inside = tree[tree.name == "llm_request"]
            assert set(inside.role) == roles and set(inside.parent_span_id) == set(root.span_id), trace_id
            for attrs in inside.attributes:
                a = json.loads(attrs)
                assert a["gen_ai.latency.time_to_first_token"] > 0 and a["gen_ai.latency.time_in_queue"] >= 0
        assert set(spans.trace_id) == set(clients.trace_id)


def test_the_ttft_breakdown_comes_from_the_real_engines_spans(local_run):
    """The report's breakdown on real vLLM: every traced request complete (each role's span and attribute there),
    its parts adding up to its TTFT, PD's KV transfer read from the decode's remote-KV wait (NIXL reports no span
    of its own), nothing emulated."""
    import pandas as pd

    from epdbench.analysis.breakdown import PARTS, request_parts

    _, out, _ = local_run
    records = pd.read_parquet(out / "records.parquet")
    for config, topology in (("aggregated", "aggregated"), ("pd-nixl-tcp", "pd")):
        spans = pd.read_parquet(out / "traces" / f"{config}.parquet")
        parts = request_parts(spans, records[records.config == config], {config: topology})
        assert len(parts) > 0 and set(parts.status) <= {"ok", "clock"}, parts[["status", "reason"]]
        total = parts[[f"{p}_ms" for p in PARTS]].sum(axis=1)
        assert ((total - parts.ttft_ms).abs() < 1e-6).all()
        assert not parts.emulated.any()
        if topology == "pd":
            assert set(parts.kv_source) == {"decode-queue"} and (parts.kv_transfer_ms > 0).all()
            assert (parts.first_decode_ms > 0).all()
    assert "## Where TTFT goes" in (out / "report.md").read_text()
