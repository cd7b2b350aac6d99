"""analysis/logformats.py: a line counts only when it parses whole in its producer's format."""
from __future__ import annotations

import pytest

from epdbench.analysis.logformats import EMULATED_MARK, parse_line
from epdbench.sim import logfmt

GLOG = "I1018 00:45:47.969202 1844453 rdma_context.cpp:129] RDMA device: mlx5_ib1, LID: 470"


def test_glog_line_with_vllm_prefixes_keeps_the_emitter():
    line = parse_line(f"(EngineCore_DP0 pid=714) (Worker_TP1 pid=802) {GLOG}\n")
    assert (line.kind, line.severity, line.file, line.thread) == ("glog", "I", "rdma_context.cpp", 1844453)
    assert line.message == "RDMA device: mlx5_ib1, LID: 470"
    assert line.worker == "Worker_TP1 pid=802"


def test_glog_line_without_a_worker_prefix_is_keyed_by_its_thread():
    assert parse_line(f"(EngineCore_DP0 pid=714) {GLOG}").worker == "thread 1844453"
    assert parse_line(GLOG).worker == "thread 1844453"


def test_vllm_and_access_lines():
    v = parse_line("(APIServer pid=428) INFO 10-18 00:46:10 [metrics.py:103] KV Transfer metrics: Num successful "
                   "transfers=12")
    assert (v.kind, v.file, v.worker) == ("vllm", "metrics.py", "APIServer pid=428")
    assert v.message.startswith("KV Transfer metrics:")
    a = parse_line('(APIServer pid=782545) INFO:     10.35.102.36:52864 - "POST /v1/chat/completions HTTP/1.1" 200 OK')
    assert (a.kind, a.method, a.path, a.status) == ("access", "POST", "/v1/chat/completions", 200)


@pytest.mark.parametrize("text", [
    "prompt: 'I1018 00:45:47.969202 1844453 rdma_context.cpp:129] RDMA device: mlx5_ib1, LID: 470'",
    "(APIServer pid=1) INFO 10-18 00:46:10 [logger.py:49] Received request x: prompt: '" + GLOG + "'",
    "I1018 00:45:47.969202 1844453 rdma_context.py:129] RDMA device: mlx5_ib1, LID: 470",   # not a C++ file
    "I1018 00:45:47 1844453 rdma_context.cpp:129] RDMA device: mlx5_ib1",                     # no microseconds
    "(Worker_TP0 pid=) " + GLOG, "", "\x00\xff", "x" * 10000,
])
def test_a_phrase_anywhere_else_is_not_a_line_of_that_producer(text):
    line = parse_line(text)
    assert line is None or line.kind != "glog"


def test_the_simulator_mark_is_a_suffix_of_the_message_only():
    line = parse_line(logfmt.glog_line("I", 11, "transfer_engine.cpp", 1, "Topology discovery complete. Found 0 HCAs."))
    assert line.emulated and line.message == "Topology discovery complete. Found 0 HCAs."
    inside = parse_line(f"I1018 00:45:47.969202 11 transfer_engine.cpp:1] {EMULATED_MARK} Found 0 HCAs.")
    assert not inside.emulated
    assert logfmt.EMULATED_MARK == EMULATED_MARK
