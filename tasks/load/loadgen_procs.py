"""Worker processes sharing a load generator's concurrency, so that ingest scales with cores.

Each worker is a spawned process with its own event loop, HTTP session and LoadGenerator; a phase is split
by request index (request i goes to worker i mod N) and its concurrency spread over the workers. Every
worker schedules from the same start stamp on the same clock (time.perf_counter_ns is CLOCK_MONOTONIC,
system-wide), so scheduled arrivals, send stamps and chunk offsets are comparable across processes and the
merged records are those one process would have written. A worker measures its own event-loop lag over the
phase. Workers are terminated when a phase is cancelled, and die with the process that started them, however
it dies (tasks/proc/lifeline.py: started on its spawner thread, the parent-death signal armed first thing).
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
from dataclasses import dataclass

from epdbench.tasks.proc import lifeline

READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Settings:
    base_url: str
    model: str
    timeout_s: float
    run_tag: str
    time_scale: float


def _worker(settings: Settings, parent_pid: int, jobs, results) -> None:
    """A worker's life: ready, then one phase per job (requests, concurrency, start_ns) until None."""
    lifeline.die_with_parent(parent_pid)
    from epdbench.tasks.load.loadgen import LoadGenerator
    from epdbench.tasks.load.looplag import LoopLag

    async def serve() -> None:
        async with LoadGenerator(settings.base_url, settings.model, settings.timeout_s, run_tag=settings.run_tag,
                                 time_scale=settings.time_scale) as lg:
            results.put(("ready", os.getpid()))
            loop = asyncio.get_running_loop()
            while True:
                job = await loop.run_in_executor(None, jobs.get)
                if job is None:
                    return
                requests, concurrency, start_ns = job
                try:
                    async with LoopLag(settings.time_scale) as lag:
                        records = await lg.run_phase(lg.session, requests, concurrency, start_ns=start_ns)
                    results.put(("done", records, list(lag.samples_s)))
                except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the phase
                    results.put(("error", f"{type(e).__name__}: {e}"))

    asyncio.run(serve())


def split_concurrency(concurrency: int, workers: int) -> list[int]:
    """`concurrency` spread over `workers`, as evenly as whole numbers allow (the first ones get the rest)."""
    base, rest = divmod(concurrency, workers)
    return [base + (1 if k < rest else 0) for k in range(workers)]


class WorkerPool:
    """N spawned load generator processes, started once and reused phase after phase."""

    def __init__(self, settings: Settings, n: int):
        self.settings, self.n = settings, n
        self.ctx = mp.get_context("spawn")
        self.procs: list = []

    def start(self) -> None:
        self.jobs = [self.ctx.Queue() for _ in range(self.n)]
        self.results = [self.ctx.Queue() for _ in range(self.n)]
        self.procs = [self.ctx.Process(target=_worker, args=(self.settings, os.getpid(), j, r), daemon=True,
                                       name=f"epdbench-loadgen-{k}")
                      for k, (j, r) in enumerate(zip(self.jobs, self.results))]
        for k, p in enumerate(self.procs):
            lifeline.start_process(p, f"loadgen/{k}")
        for k, r in enumerate(self.results):
            try:
                kind, _ = r.get(timeout=READY_TIMEOUT_S)
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"load generator worker {k} not ready after {READY_TIMEOUT_S:.0f} s") from None
            assert kind == "ready"

    async def run_phase(self, requests: list, concurrency: int, start_ns: int, on_batch) -> list:
        """The phase split over the workers; `on_batch(records, loop_lag_samples)` as each worker ends.
        A cancelled phase terminates the workers (they would go on sending); the next phase restarts them."""
        if not self.procs:
            await asyncio.to_thread(self.start)
        loop = asyncio.get_running_loop()
        parts = [requests[k::self.n] for k in range(self.n)]
        concs = split_concurrency(max(concurrency, 1), self.n)
        busy = [k for k in range(self.n) if parts[k]]
        for k in busy:
            self.jobs[k].put((parts[k], max(1, concs[k]), start_ns))
        pending = {loop.run_in_executor(None, self._result, self.results[k], self.procs[k]): k for k in busy}
        records = []
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    k = pending.pop(fut)
                    kind, *payload = fut.result()
                    if kind == "error":
                        raise RuntimeError(f"load generator worker {k}: {payload[0]}")
                    batch, lags = payload
                    records += batch
                    on_batch(batch, lags)
        except BaseException:
            self.stop()
            raise
        return records

    @staticmethod
    def _result(results, proc):
        """A worker's next message; an error once it is gone (never blocks past its death)."""
        while True:
            try:
                return results.get(timeout=0.5)
            except queue.Empty:
                if not proc.is_alive():
                    return ("error", "the worker process exited")

    def stop(self) -> None:
        """Terminate every worker and wait for it (bounded)."""
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self.procs = []

    def close(self) -> None:
        """Ask idle workers to leave, then make sure they did."""
        for j in getattr(self, "jobs", []):
            try:
                j.put(None)
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(timeout=5)
        self.stop()
