"""reports/live.py: the live terminal line of the current cell."""
from types import SimpleNamespace

from epdbench.reports.live import LiveCell


def rec(ok=True, ttft=10.0, offsets=(0, 5_000_000, 12_000_000), phase="measured"):
    return SimpleNamespace(ok=ok, ttft_ms=ttft, chunk_offsets_ns=list(offsets), phase=phase)


def test_live_line_counts_requests_errors_and_running_latencies():
    live = LiveCell(enabled=False)
    live.reset("[pd-tcp] fixed 4096/64 c=8 trial 0", 3)
    live.on_record(rec(ttft=10.0))
    live.on_record(rec(ok=False))
    live.on_record(rec(ttft=30.0, phase="warmup"))        # warm-ups count as done, not in the latencies
    text = live.text()
    assert text.startswith("[pd-tcp] fixed 4096/64 c=8 trial 0: 3/3 requests, 1 errors")
    assert text.endswith("TTFT p50 10.0 ms, ITL p99 7.0 ms")          # gaps of 5 and 7 ms
