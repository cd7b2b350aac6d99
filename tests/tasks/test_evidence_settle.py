"""tasks/evidence.settled_transport: the KV pods log their transfer windows once per interval, so the verdict of a
configuration whose last cell just ended is read again, for up to one interval and a margin, while it lacks
evidence; never longer, and not at all once the evidence is there."""
import shutil
from pathlib import Path

import pytest

from epdbench.specs.models import load_spec
from epdbench.tasks.deployment import Deployment, Process
from epdbench.tasks.evidence import SETTLE_MARGIN_S, settled_transport

LOGS = Path(__file__).parents[1] / "data" / "logs"
WINDOW = "[Metrics] Transfer Engine Throughput"


@pytest.fixture
def smoke():
    """The smoke spec's pd-tcp and the /metrics deltas and records of four measured 1000-token prompts whose KV
    moved in full, so the verdict rests on the logs alone."""
    spec = load_spec("smoke")
    records = [{"ok": True, "phase": "measured", "prompt_tokens": 1000, "cached_tokens": 0}] * 4
    sent = 4 * 1000 * spec.model.kv_bytes_per_token
    deltas = {"prefill": {"mooncake_transfers": 4, "mooncake_bytes_transferred": sent}}
    return spec, spec.configuration("pd-tcp"), deltas, records


class Clock:
    def __init__(self):
        self.now, self.sleeps = 100.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.sleeps.append(s)
        self.now += s


def pd_tcp(tmp_path: Path, window_after_syncs: int | None) -> Deployment:
    """A pd-tcp deployment whose prefill log has its install lines; its throughput window (tcp-ok-prefill.log's
    own line) reaches the log on the `window_after_syncs`-th refresh, or never."""
    lines = (LOGS / "tcp-ok-prefill.log").read_text().splitlines(keepends=True)
    window = [x for x in lines if WINDOW in x]
    assert len(window) == 1
    prefill = tmp_path / "prefill-0.log"
    prefill.write_text("".join(x for x in lines if WINDOW not in x))
    shutil.copy(LOGS / "tcp-ok-decode.log", tmp_path / "decode-0.log")
    dep = Deployment("pd-tcp", "", "", [Process("prefill-0", "prefill", "", prefill),
                                        Process("decode-0", "decode", "", tmp_path / "decode-0.log")],
                     kv_log_interval_s=1.0)
    syncs = []

    def sync():
        syncs.append(1)
        if len(syncs) == window_after_syncs:
            with prefill.open("a") as f:
                f.write(window[0])
    dep.sync_logs = sync
    return dep


def test_a_window_logged_after_the_cell_is_waited_for_and_read(tmp_path, smoke):
    spec, config, deltas, records = smoke
    clock = Clock()
    t = settled_transport(pd_tcp(tmp_path, 3), spec, config, deltas, records, clock=clock, sleep=clock.sleep)
    assert t["verdict"] == "verified" and t["throughput_mb_s_max"] == 113.07
    assert len(clock.sleeps) == 3 and clock.now - 100.0 <= 1.0 + SETTLE_MARGIN_S


def test_evidence_that_never_comes_is_waited_for_one_interval_and_a_margin_only(tmp_path, smoke):
    spec, config, deltas, records = smoke
    clock = Clock()
    t = settled_transport(pd_tcp(tmp_path, None), spec, config, deltas, records, clock=clock, sleep=clock.sleep)
    assert t["verdict"] == "no-evidence" and any("nothing moved" in r for r in t["reasons"])
    assert clock.now - 100.0 == pytest.approx(1.0 + SETTLE_MARGIN_S)


def test_evidence_already_there_or_no_interval_known_means_no_wait(tmp_path, smoke):
    spec, config, deltas, records = smoke
    clock = Clock()
    there = pd_tcp(tmp_path, 1)
    there.sync_logs()                             # the window is in the log before the verdict is read
    assert settled_transport(there, spec, config, deltas, records, clock=clock,
                             sleep=clock.sleep)["verdict"] == "verified"
    (tmp_path / "unknown").mkdir()
    unknown = pd_tcp(tmp_path / "unknown", None)
    unknown.kv_log_interval_s = None              # a target that does not say how often its pods log
    assert settled_transport(unknown, spec, config, deltas, records, clock=clock,
                             sleep=clock.sleep)["verdict"] == "no-evidence"
    assert clock.sleeps == []
