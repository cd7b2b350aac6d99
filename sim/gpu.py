"""Engines sharing one GPU (the local target's `gpu_share`: PD's and EPD's engines on GPU 0 by memory share): their
GPU work time-sliced, in virtual time.

Processes on one GPU without MPS do not run their kernels side by side: the GPU time-slices between their CUDA
contexts, each running alone for a slice while the others' work waits (NVIDIA's Multi-Process Service overview,
docs.nvidia.com/deploy/mps, "time-sliced scheduling" of contexts from different processes). Over a step's worth of
slices that is processor sharing: while k engines have GPU work in flight, each progresses at 1/k of its own speed,
and one alone runs at full speed. A step's host part (scheduling, sampling, output: hardware.step_overhead_ms) runs
on the host, outside the share. The context switches themselves are not charged, and the gaps a lone engine leaves
between its kernels (launch latency) are not given to the others: the slowdown is an upper bound where steps are
short and launch-bound.

Virtual time only (one event loop holds every engine of the configuration); the HTTP simulator's replicas are
separate processes, each with a whole GPU.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

# Work left under this (seconds) is done: float remainders of the 1/k progress (a nanosecond: far below any step,
# far above the clock's rounding).
DONE_S = 1e-9


@dataclass
class _Job:
    left: float                     # GPU seconds still to run at full speed
    done: asyncio.Future = field(repr=False)


class GpuShare:
    """One GPU's compute shared equally by the jobs in flight on it (processor sharing on the loop's clock)."""

    def __init__(self, name: str = "gpu0"):
        self.name = name
        self._jobs: list[_Job] = []
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.busy_s = 0.0           # time with at least one job in flight
        self.shared_s = 0.0         # time with two or more

    async def run(self, seconds: float) -> None:
        """Run `seconds` of GPU work (its time alone on the GPU) and return when it is done."""
        if seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        self._advance(loop.time())
        job = _Job(seconds, loop.create_future())
        self._jobs.append(job)
        self._schedule(loop)
        try:
            await job.done
        finally:
            if job in self._jobs:         # cancelled: its work leaves the GPU with it
                self._advance(loop.time())
                self._jobs.remove(job)
                self._schedule(loop)

    def _advance(self, now: float) -> None:
        """Charge the time since the last event to the jobs in flight, each its 1/k."""
        elapsed, k = now - self._last, len(self._jobs)
        self._last = now
        if k and elapsed > 0:
            self.busy_s += elapsed
            if k > 1:
                self.shared_s += elapsed
            for job in self._jobs:
                job.left -= elapsed / k

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._jobs:
            first = min(job.left for job in self._jobs)
            self._timer = loop.call_at(self._last + max(0.0, first) * len(self._jobs), self._tick)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = None
        self._advance(loop.time())
        for job in [j for j in self._jobs if j.left <= DONE_S]:
            self._jobs.remove(job)
            if not job.done.done():
                job.done.set_result(None)
        self._schedule(loop)


def shares_one_gpu(spec, config) -> bool:
    """Whether a configuration's engines share one GPU: the placement its spec gives them on the local target
    (target.local.gpu_share), whichever target runs it, where it has more than one engine."""
    return bool(spec.target.local.gpu_share) and config.gpus > 1
