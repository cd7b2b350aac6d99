"""The in-cluster trace collector (tasks.k8s.incluster_traces) over real HTTP on loopback, and the runner's puller
(tasks.k8s.traces) against it: spans without a parent never held, a bounded buffer that counts what it drops,
pages forgotten once taken, a restart told by its epoch, pods renamed to the run's process names; and the run's
TraceCollector joining pulled spans with their records."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from epdbench.otlp import encode_spans, new_span_id, new_trace_id
from epdbench.tasks.k8s.incluster_traces import SpanBuffer, make_server
from epdbench.tasks.k8s.traces import SpanPuller
from epdbench.tasks.load.otlp_receiver import TraceCollector
from epdbench.tasks.rundir.traces import read_spans

CELL = {"config": "pd-tcp", "suite": "fixed", "cell": "fixed|1024/8|c2|main", "workload": "1024/8", "stream": "main",
        "concurrency": 2, "trial": 0}


def span(trace_id: str, parent: str, name: str = "llm_request") -> dict:
    return {"trace_id": trace_id, "span_id": new_span_id(), "parent_span_id": parent, "name": name,
            "start_ns": 2_000, "end_ns": 3_000, "attributes": {"gen_ai.latency.time_in_queue": 0.25}}


def resource(pod: str, role: str) -> dict:
    return {"service.name": pod, "epdbench.role": role, "epdbench.pod": pod}


@pytest.fixture
def collector():
    buffer = SpanBuffer(max_spans=5)
    server = make_server(buffer, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield buffer, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def post(url: str, body: bytes) -> int:
    req = urllib.request.Request(url + "/v1/traces", data=body, headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_buffer_keeps_children_only_drops_past_its_bound_and_forgets_what_was_taken():
    buffer = SpanBuffer(max_spans=3)
    t, client = new_trace_id(), new_span_id()
    buffer.add([span(t, ""), *[span(t, client) for _ in range(4)]])
    assert (buffer.received, buffer.unparented, buffer.dropped, buffer.waiting) == (5, 1, 1, 3)
    first = buffer.page(0, limit=2)
    assert [len(first["spans"]), first["next"], first["more"]] == [2, 2, True]
    assert buffer.page(0, epoch="another")["next"] == 3          # a stranger's cursor starts over
    second = buffer.page(first["next"], epoch=first["epoch"])
    assert [len(second["spans"]), second["next"], second["more"]] == [1, 3, False]
    assert buffer.waiting == 1                                     # the first page is forgotten
    assert buffer.page(second["next"], epoch=first["epoch"])["spans"] == [] and buffer.waiting == 0
    buffer.add([span(t, client)])                                  # room again
    assert buffer.page(3, epoch=first["epoch"])["next"] == 4 and buffer.dropped == 1


def test_the_collector_answers_otlp_exports_health_and_pages_of_spans(collector):
    buffer, url = collector
    t, client = new_trace_id(), new_span_id()
    assert post(url, encode_spans([span(t, client), span(t, "")], resource("pd-tcp-decode-0", "decode"))) == 200
    assert post(url, b"\xff\xff\xff") == 400
    assert get(url + "/health")[0] == 200 and get(url + "/v1/other")[0] == 404
    assert get(url + "/v1/spans?after=x")[0] == 400
    status, body = get(url + "/v1/spans?after=0")
    page = json.loads(body)
    assert status == 200 and page["epoch"] == buffer.epoch and page["unparented"] == 1
    assert [(s["trace_id"], s["parent_span_id"], s["resource"]["epdbench.role"]) for s in page["spans"]] == [
        (t, client, "decode")]


def test_the_puller_takes_every_page_once_renames_pods_and_says_each_problem_once(collector):
    buffer, url = collector
    said: list[str] = []
    pull = SpanPuller(url, {"pd-tcp-decode-0": "decode-0"}, said.append)
    t, client = new_trace_id(), new_span_id()
    post(url, encode_spans([span(t, client) for _ in range(3)], resource("pd-tcp-decode-0", "decode")))
    post(url, encode_spans([span(t, client) for _ in range(4)], resource("prefill-0", "prefill")))
    spans = pull()
    assert len(spans) == 5 and pull() == []                       # five held (the bound), each taken once
    assert {s["resource"]["epdbench.pod"] for s in spans} == {"decode-0", "prefill-0"}
    assert said == ["  traces: the in-cluster collector's buffer was full; 2 span(s) dropped so far; their requests "
                    "have no engine spans"]
    buffer.epoch = "restarted"                                     # as a new collector process would answer
    post(url, encode_spans([span(t, client)], resource("prefill-0", "prefill")))
    assert len(pull()) == 1 and "restarted" in said[-1]
    gone = SpanPuller("http://127.0.0.1:9", {}, said.append, timeout_s=1)
    assert gone() == [] and gone() == [] and sum("did not answer" in line for line in said) == 1


def test_pulled_spans_join_their_records_and_the_wait_ends_once_each_has_come(collector, tmp_path):
    _, url = collector
    path = tmp_path / "traces" / "pd-tcp.parquet"
    traces = TraceCollector(path, quiet_s=0.05, pull=SpanPuller(url, {"pd-tcp-prefill-0": "prefill-0"}, print))
    t, client = new_trace_id(), new_span_id()
    record = {**CELL, "request_id": "epd-1", "status": 200, "ok": True, "phase": "measured",
              "trace": [t, client, 1_000, 4_000]}
    assert traces.add_records([record]) == 1
    threading.Timer(0.3, post, (url, encode_spans([span(t, client)], resource("pd-tcp-prefill-0", "prefill")))).start()
    assert traces.flush(max_wait_s=5) == 2
    traces.close(max_wait_s=0.1)
    df = read_spans(path)
    assert sorted(df["name"]) == ["client.request", "llm_request"]
    assert df.set_index("name").loc["llm_request", "pod"] == "prefill-0"


def test_the_collector_container_imports_nothing_heavy():
    """It runs in the router's pod under a 512Mi limit: no pandas, pyarrow, Prefect or MLflow in its process."""
    import subprocess
    import sys
    code = ("import sys, epdbench.cli, epdbench.tasks.k8s.incluster_traces; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'pyarrow', 'prefect', 'mlflow'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
