"""reports/live.py: the live terminal line of the current cell."""
from types import SimpleNamespace

from epdbench.reports.live import LiveCell


def rec(ok=True, ttft=10.0, offsets=(0, 5_000_000, 12_000_000), phase="measured"):
    return SimpleNamespace(ok=ok, ttft_ms=ttft, chunk_offsets_ns=list(offsets), phase=phase)


def test_live_line_counts_requests_errors_and_running_latencies():
    live = LiveCell(enabled=False)
    live.reset("[pd-tcp] fixed 4096/64 c=8 trial 0", 2, warmup=1)
    live.on_record(rec(ttft=30.0, phase="warmup"))        # a warm-up counts apart, not in the latencies
    live.on_record(rec(ttft=10.0))
    live.on_record(rec(ok=False))
    text = live.text()
    # as the result line counts them: measured requests only ("2/2 ok" would follow, never "3/3")
    assert text.startswith("[pd-tcp] fixed 4096/64 c=8 trial 0: warm-up 1/1, 2/2 measured requests, 1 errors")
    assert text.endswith("TTFT p50 10.0 ms, ITL p99 7.0 ms")          # gaps of 5 and 7 ms


def test_without_warm_up_the_line_says_only_measured_requests():
    live = LiveCell(enabled=False)
    live.reset("[agg] mm 1k c=2 trial 0", 4)
    live.on_record(rec())
    assert live.text().startswith("[agg] mm 1k c=2 trial 0: 1/4 measured requests, TTFT p50")
