"""tasks.load.otlp_receiver: spans posted over OTLP/HTTP joined with traced records into traces/<config>.parquet,
each span once, spans of untraced requests dropped; tasks.rundir.traces rows."""
import json
import urllib.request

from epdbench.otlp import encode_spans, new_span_id, new_trace_id
from epdbench.tasks.load.otlp_receiver import TraceCollector
from epdbench.tasks.rundir.traces import drop_spans, read_spans

CELL = {"config": "pd-tcp", "suite": "fixed", "cell": "fixed|1024/8|c2|main", "workload": "1024/8", "stream": "main",
        "concurrency": 2, "trial": 0}


def post(endpoint: str, body: bytes) -> int:
    req = urllib.request.Request(endpoint, data=body, headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status


def engine_span(trace_id: str, parent: str, name="llm_request") -> dict:
    return {"trace_id": trace_id, "span_id": new_span_id(), "parent_span_id": parent, "name": name,
            "start_ns": 2_000, "end_ns": 3_000, "attributes": {"gen_ai.latency.time_in_queue": 0.5}}


def test_spans_join_their_records_once_and_strangers_are_dropped(tmp_path):
    path = tmp_path / "traces" / "pd-tcp.parquet"
    col = TraceCollector(path, quiet_s=0.05)
    endpoint = col.start()
    try:
        t, client = new_trace_id(), new_span_id()
        record = {**CELL, "request_id": "epd-1", "status": 200, "ok": True, "phase": "measured",
                  "trace": [t, client, 1_000, 4_000]}
        resource = {"service.name": "decode-0", "epdbench.role": "decode", "epdbench.pod": "decode-0"}
        assert post(endpoint, encode_spans([engine_span(t, client), engine_span(t, client, "kv_transfer")],
                                           resource)) == 200
        assert post(endpoint, encode_spans([engine_span(new_trace_id(), new_span_id())], resource)) == 200
        assert col.add_records([record, {**CELL, "request_id": "epd-2", "trace": None}]) == 1
        assert col.flush(max_wait_s=2) == 3
        assert col.flush(max_wait_s=0.1) == 0            # nothing written twice
    finally:
        col.close(max_wait_s=0.1)
    df = read_spans(path)
    assert sorted(df["name"]) == ["client.request", "kv_transfer", "llm_request"]
    assert set(df["request_id"]) == {"epd-1"} and set(df["cell"]) == {CELL["cell"]}
    by = df.set_index("name")
    assert by.loc["client.request", "parent_span_id"] == "" and by.loc["client.request", "role"] == "client"
    assert by.loc["llm_request", "parent_span_id"] == client and by.loc["llm_request", "role"] == "decode"
    assert by.loc["kv_transfer", "role"] == "kv" and by.loc["kv_transfer", "pod"] == "decode-0"
    assert json.loads(by.loc["llm_request", "attributes"])["gen_ai.latency.time_in_queue"] == 0.5
    assert drop_spans(path, {(CELL["cell"], 0)}) == 3 and read_spans(path).empty


def test_a_body_that_is_not_otlp_is_refused(tmp_path):
    col = TraceCollector(tmp_path / "t.parquet")
    endpoint = col.start()
    try:
        try:
            post(endpoint, b"\xff\xff\xff")
            status = 200
        except urllib.error.HTTPError as e:
            status = e.code
        assert status == 400 and col.rejected == 1
    finally:
        col.close(max_wait_s=0.1)


def test_without_a_receiver_spans_handed_over_join_their_records_and_discarded_ones_never_do(tmp_path):
    """As a virtual run uses it: receive() directly, flush(0); a cell served again but not recorded discarded."""
    path = tmp_path / "traces" / "pd-tcp.parquet"
    col = TraceCollector(path)
    resource = {"service.name": "prefill-0", "epdbench.role": "prefill", "epdbench.pod": "prefill-0"}
    kept, skipped = (new_trace_id(), new_span_id()), (new_trace_id(), new_span_id())
    col.receive([{**engine_span(t, c), "resource": resource} for t, c in (kept, skipped)])
    rows = [{**CELL, "request_id": f"epd-{i}", "status": 200, "ok": True, "phase": "measured",
             "trace": [t, c, 1_000, 4_000]} for i, (t, c) in enumerate((kept, skipped))]
    col.discard(rows[1:])
    assert col.add_records(rows[:1]) == 1 and col.flush(0) == 2
    assert col.add_records(rows[1:]) == 1 and col.flush(0) == 1      # its client span only: its engine's went
    col.close(0)
    df = read_spans(path)
    assert sorted(df[df["request_id"] == "epd-0"]["name"]) == ["client.request", "llm_request"]
    assert list(df[df["request_id"] == "epd-1"]["name"]) == ["client.request"]
    assert set(df[df["name"] == "llm_request"]["role"]) == {"prefill"}


def test_an_exporter_gone_before_its_answer_is_no_traceback(tmp_path, capfd):
    """An engine killed (or stopped) while it exports resets its connection: the receiver keeps its spans and says
    nothing (socketserver printed a BrokenPipeError traceback on the run's console)."""
    import socket
    import struct
    import time
    from urllib.parse import urlsplit

    col = TraceCollector(tmp_path / "traces" / "pd-tcp.parquet", quiet_s=0.05)
    endpoint = urlsplit(col.start())
    try:
        body = encode_spans([engine_span(new_trace_id(), new_span_id())], {"service.name": "decode-0"})
        for _ in range(20):
            s = socket.create_connection((endpoint.hostname, endpoint.port))
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close with a reset
            s.close()
        deadline = time.monotonic() + 5
        while col.received < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
    finally:
        col.close()
    assert col.received == 20
    assert "Traceback" not in capfd.readouterr().err
