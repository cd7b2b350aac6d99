"""Emulation lag: how late the simulator's events happened against their modelled time (pure). The HTTP
simulator's engines and response writers observe it (sim.engine, sim.replica) and export it as Prometheus
histograms (sim.metrics), from which analysis.noise judges whether a cell's figures were bent by host load.
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

# Upper edges of the emulation-lag histograms (seconds of modelled time): fine below 10 ms, where a lag
# starts to matter against decode steps of a few ms.
LAG_BUCKETS_S = (0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25,
                 0.5, 1.0)


@dataclass
class Lag:
    """How late events happened against their modelled time (emulation lag): count, sum, max and a
    cumulative histogram over LAG_BUCKETS_S, in modelled seconds."""
    count: int = 0
    sum_s: float = 0.0
    max_s: float = 0.0
    per_bucket: list[int] = field(default_factory=lambda: [0] * (len(LAG_BUCKETS_S) + 1))   # the last: above all

    def observe(self, lag_s: float, times: int = 1) -> None:
        self.count += times
        self.sum_s += lag_s * times
        if lag_s > self.max_s:
            self.max_s = lag_s
        self.per_bucket[bisect.bisect_left(LAG_BUCKETS_S, lag_s)] += times

    @property
    def buckets(self) -> list[int]:
        """Observations at or below each edge of LAG_BUCKETS_S (Prometheus' cumulative `le` buckets)."""
        return list(itertools.accumulate(self.per_bucket[:-1]))
