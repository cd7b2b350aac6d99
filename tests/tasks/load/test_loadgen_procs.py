"""Worker processes sharing a load generator's concurrency: every request once, the concurrency cap kept
across processes, scheduled arrivals from one common start, each worker's loop lag returned, and no
process left behind (also when a phase is cancelled). Loopback only, bounded."""
from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import pytest

from epdbench.tasks.load.loadgen import LoadGenerator
from epdbench.tasks.load.loadgen_procs import split_concurrency
from tests.tasks.load.test_loadgen import _request, fake_server, serving  # noqa: F401


def test_concurrency_is_spread_over_the_workers():
    assert split_concurrency(7, 3) == [3, 2, 2] and split_concurrency(2, 4) == [1, 1, 0, 0]
    assert sum(split_concurrency(256, 3)) == 256


def children() -> set[int]:
    """Live processes whose parent is this one (whichever thread started them)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) != os.getpid() or fields[0] == "Z":
            continue
        # multiprocessing's resource tracker stays for the parent's life and leaves with it
        if b"resource_tracker" not in (stat.parent / "cmdline").read_bytes():
            found.add(int(stat.parent.name))
    return found


def test_two_processes_record_every_request_once_within_the_cap(fake_server):  # noqa: F811
    handler, state = fake_server
    before = children()

    async def go():
        async with serving(handler) as port:
            async with LoadGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=10, processes=2) as lg:
                assert len(children() - before) >= 2
                seen = []
                closed = await lg.run_cell([_request(0, "warmup"), *[_request(i) for i in range(1, 13)]], 4,
                                           on_record=seen.append)
                arrivals = [dataclasses.replace(_request(i), offset_s=0.02 * i) for i in range(8)]
                scheduled = await lg.run_phase(lg.session, arrivals, 8)
                return closed, seen, scheduled, list(lg.worker_lag_s)

    closed, seen, scheduled, lags = asyncio.run(go())
    assert [r.index for r in closed] == list(range(13)) and all(r.ok for r in closed)
    assert sorted(r.index for r in seen) == list(range(13))
    assert len({r.request_id for r in closed}) == 13
    assert state["max_concurrent"] <= 4
    # one start for both processes: every arrival scheduled 20 ms after the one before, whichever sent it
    stamps = [r.scheduled_ns for r in sorted(scheduled, key=lambda r: r.index)]
    assert all(abs((b - a) - 20_000_000) < 1000 for a, b in zip(stamps, stamps[1:]))
    assert all(0 <= (r.send_ns - r.scheduled_ns) / 1e6 < 20 for r in scheduled)
    assert lags                                                   # the workers measured their loops
    assert not (children() - before), "a worker process outlived the load generator"


def test_a_cancelled_phase_stops_the_workers(fake_server):  # noqa: F811
    handler, _ = fake_server
    before = children()

    async def go():
        async with serving(handler) as port:
            async with LoadGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=10, processes=2) as lg:
                slow = [_request(i, max_tokens=400) for i in range(6)]
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(lg.run_phase(lg.session, slow, 2), 0.5)
                assert not lg.pool.procs                          # terminated, not left sending
                again = await lg.run_phase(lg.session, [_request(i) for i in range(4)], 2)   # restarted
                return again

    again = asyncio.run(go())
    assert [r.index for r in again] == [0, 1, 2, 3] and all(r.ok for r in again)
    assert not (children() - before)
