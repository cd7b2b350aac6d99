"""What verify-transport prints per log: a log without the producer's lines says so; an unknown figure is '?'."""
from __future__ import annotations

from epdbench.analysis.mooncake_log import transport_of_pod
from epdbench.analysis.ucx import nixl_of_pod
from epdbench.reports.transport_lines import mooncake_pod_lines, nixl_pod_lines
from tests.test_cli_verify_transport import LOGS

NOT_A_LOG = ["hello world", "Traceback (most recent call last):"]


def test_a_file_that_is_no_engine_log_is_said_to_have_none_of_its_lines():
    assert mooncake_pod_lines("notes.txt", transport_of_pod(NOT_A_LOG)) == [
        "  notes.txt: no line of Mooncake's transfer engine among its 2 lines "
        "(is it a prefill or decode engine's log?)"]
    assert nixl_pod_lines("notes.txt", nixl_of_pod(NOT_A_LOG[:1])) == [
        "  notes.txt: no UCX or NIXL line among its 1 line (is it a KV engine's log, written with UCX_LOG_LEVEL=info?)"]


def test_a_figure_the_log_did_not_give_is_a_question_mark_never_none():
    pod = transport_of_pod((LOGS / "rdma-ok-prefill.log").read_text().splitlines())
    pod["hcas"] = None
    for w in pod["workers"].values():
        w["hcas"] = None
    text = "\n".join(mooncake_pod_lines("p.log", pod))
    assert "None" not in text and "HCAs ?, RDMA devices mlx5_ib1 (LID 470)" in text
    assert "installed rdma, HCAs ?, windows (MB/s) 1390.73, 2210.02" in text
