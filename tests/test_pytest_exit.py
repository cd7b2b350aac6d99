"""A green test run ends quietly: Prefect's temporary server, started by a flow run inside the session, is stopped
before pytest closes the stream Prefect's logging writes to (tests/conftest.py), so no "--- Logging error ---"."""
from __future__ import annotations

import logging
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests import conftest

ROOT = Path(__file__).parent.parent

A_FLOW_TEST = '''
from prefect import flow


@flow
def one() -> int:
    return 1


def test_a_flow_runs_in_this_process():
    assert one() == 1
'''


@pytest.mark.slow   # a Prefect server started and stopped: about 30 s on 2 busy cores
def test_a_session_that_ran_a_flow_ends_without_a_logging_error(tmp_path):
    (tmp_path / "test_flow_here.py").write_text(A_FLOW_TEST)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect"),
           "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           str(tmp_path / "test_flow_here.py")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "Logging error" not in done.stderr and "I/O operation on closed file" not in done.stderr, done.stderr
    assert "Stopping temporary server" not in done.stdout + done.stderr


def test_the_session_end_sends_prefects_queued_work_then_stops_its_server_quietly(monkeypatch, caplog):
    """The order Prefect's own test harness keeps: logs and events drained while the server still answers, then the
    server stopped, its INFO line held back (a stand-in server, Prefect's real workers)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    order = []
    logger = logging.getLogger("epdbench-test-prefect-server")
    logger.setLevel(logging.INFO)

    class Server:
        _instances: dict = {}

        def stop(self):
            logger.info("Stopping temporary server on http://127.0.0.1:8000")
            order.append("server stopped")
            Server._instances.clear()

    Server._instances[None] = Server()
    for worker in (APILogWorker, EventsWorker):
        monkeypatch.setattr(worker, "drain_all", classmethod(lambda cls, timeout=None: order.append(cls.__name__)))
    monkeypatch.setitem(sys.modules, "prefect.server.api.server",
                        types.SimpleNamespace(SubprocessASGIServer=Server, subprocess_server_logger=logger))
    with caplog.at_level(logging.DEBUG):
        conftest.pytest_sessionfinish(None)
    assert order == ["APILogWorker", "EventsWorker", "server stopped"] and not Server._instances
    assert "Stopping temporary server" not in caplog.text and logger.level == logging.INFO
