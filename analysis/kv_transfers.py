"""The KV link's rate from the connector's own transfer timings (pure).

vLLM's KV connectors log, once a stats interval, how many KV transfers completed and their mean time and size
(`KV Transfer metrics: Num successful transfers=1, Avg xfer time (ms)=138.983, ..., Avg MB per transfer=57.75, ...,
Avg number of descriptors=28.0`; NixlConnector's nixl/stats.py, read on the side that pulls: MB as bytes / 2**20).
A window of exactly one transfer times that transfer alone; a window of several averages transfers that may have
shared the link, so only the lone ones measure it. Each lone window gives a rate, its bytes over its time less the
setup the cost model charges a transfer apart from its bytes (physics.costmodel.setup_seconds); the link's rate is
their median, with the distribution-free 95 % interval of a median (analysis.noise.percentile_ci). A lone window
can still overlap a transfer counted in the next window: that only slows it, and the median keeps such outliers
out. Lines are matched whole in vLLM's format (analysis.logformats), never a phrase inside another line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from epdbench.analysis.logformats import parse_line
from epdbench.analysis.noise import percentile_ci, percentile_value
from epdbench.analysis.kv_stats import KV_FIELD, KV_METRICS, KV_METRICS_FILES, MIB

# Fewest lone windows a rate is given from: below it the median's interval spans most of the windows.
MIN_LONE = 5
_TIME = re.compile(r"'?Avg xfer time \(ms\)'?(?:=|: )([\d.]+)")
_DESCRIPTORS = re.compile(r"'?Avg number of descriptors'?(?:=|: )([\d.]+)")


@dataclass(frozen=True)
class Window:
    """One `KV Transfer metrics` line of a pod: its transfers, their mean time (ms) and mean size (bytes)."""
    pod: str
    transfers: int
    avg_ms: float
    avg_bytes: float
    descriptors: float
    emulated: bool


@dataclass
class Windows:
    """A pod's timed windows, and how many lines counted transfers without saying their time or size."""
    timed: list[Window] = field(default_factory=list)
    untimed: int = 0


def windows_of(lines: Iterable[str], pod: str) -> Windows:
    """The `KV Transfer metrics` windows with transfers in a pod's log lines."""
    out = Windows()
    for raw in lines:
        line = parse_line(raw)
        if line is None or line.kind != "vllm" or line.file not in KV_METRICS_FILES:
            continue
        m = KV_METRICS.fullmatch(line.message)
        if m is None:
            continue
        fields = {k: float(v) for k, v in KV_FIELD.findall(m.group(1))}
        n = int(fields.get("Num successful transfers", fields.get("num_successful_transfers", 0)))
        if n <= 0:
            continue
        t, d = _TIME.search(m.group(1)), _DESCRIPTORS.search(m.group(1))
        if t is None or "Avg MB per transfer" not in fields:
            out.untimed += 1
            continue
        out.timed.append(Window(pod, n, float(t.group(1)), fields["Avg MB per transfer"] * MIB,
                                float(d.group(1)) if d else 1.0, line.emulated))
    return out


@dataclass(frozen=True)
class LinkRate:
    """The link's rate from lone windows: median bytes/s and its 95 % interval (None below MIN_LONE windows),
    the lone windows' rates, and the windows left out (several transfers; no time left after the setup)."""
    bytes_per_s: float | None
    low: float | None
    high: float | None
    rates: tuple[float, ...]
    overlapped: int
    too_short: int
    mean_bytes: float | None


def link_rate(windows: Iterable[Window], setup_s: Callable[[Window], float],
              share: Callable[[Window], float] = lambda w: 1.0) -> LinkRate:
    """The rate the lone windows show; `setup_s(window)` is the cost model's setup of one such transfer, and
    `share(window)` what its rate is divided by before pooling (an RDMA sender's NIC count: the rate per NIC)."""
    rates, sizes, overlapped, too_short = [], [], 0, 0
    for w in windows:
        if w.transfers != 1:
            overlapped += 1
            continue
        moving = w.avg_ms / 1e3 - setup_s(w)
        if moving <= 0 or w.avg_bytes <= 0:
            too_short += 1
            continue
        rates.append(w.avg_bytes / moving / share(w))
        sizes.append(w.avg_bytes)
    mid = percentile_value(rates, 50) if len(rates) >= MIN_LONE else None
    ci = percentile_ci(rates, 50) if mid is not None else None
    return LinkRate(mid, ci[0] if ci else None, ci[1] if ci else None, tuple(rates), overlapped, too_short,
                    sum(sizes) / len(sizes) if sizes else None)


def link_constant(transport: str, bytes_per_s: float, nic_gbit_s: float, interfaces: int = 1) -> tuple[str, float]:
    """The hardware field a measured rate sets (physics.costmodel.link_bytes_per_s inverted): over TCP the link's
    rate itself (tcp_gb_s, GB/s), over RDMA the fraction of the sending pod's NIC line rate (rdma_efficiency)."""
    if transport == "rdma":
        return "rdma_efficiency", bytes_per_s / (nic_gbit_s / 8 * 1e9 * max(1, interfaces))
    return "tcp_gb_s", bytes_per_s / 1e9
