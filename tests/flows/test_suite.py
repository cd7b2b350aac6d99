"""flows/suite.py: how a cell attempt ends — ok, degraded (failed requests above the spec's threshold) or
failed (a process of the deployment died)."""
from __future__ import annotations

from epdbench.flows.suite import cell_status


def rows(ok: int, failed: int, warmup_failed: int = 0) -> list[dict]:
    return ([{"phase": "measured", "ok": True, "error": None}] * ok
            + [{"phase": "measured", "ok": False, "error": "HTTP 502: prefill leg failed"}] * failed
            + [{"phase": "warmup", "ok": False, "error": "timeout"}] * warmup_failed)


def test_all_measured_requests_ok_is_ok_whatever_the_warmups_did():
    assert cell_status(rows(8, 0, warmup_failed=2), 0.0, []) == ("ok", "")


def test_failures_above_the_threshold_degrade_the_cell_naming_the_first_error():
    status, reason = cell_status(rows(7, 1), 0.0, [])
    assert status == "degraded"
    assert reason.startswith("1 of 8 measured requests failed (threshold 0%): HTTP 502")
    assert cell_status(rows(7, 1), 0.125, []) == ("ok", "")       # exactly at the threshold is tolerated
    assert cell_status(rows(6, 2), 0.125, [])[0] == "degraded"


def test_a_dead_process_fails_the_cell_with_its_name():
    status, reason = cell_status(rows(8, 0), 0.0, ["router (pid 42) killed by SIGKILL, found at 10:00:00"])
    assert (status, reason) == ("failed", "router (pid 42) killed by SIGKILL, found at 10:00:00")
