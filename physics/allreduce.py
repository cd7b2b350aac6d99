"""The cost model's TP all-reduce law: seconds of one all-reduce (sum) of `n_bytes` across a TP group's GPUs
(costmodel.CostModel.allreduce_s charges two per layer per step, of the step's tokens × hidden bf16 activations).

Two laws, per TP:
- measured, where hardware.op_laws is `measured` and a measurement has rows of op `allreduce` at that TP
  (benchmarks/gpu/gpu_allreduce.py: NCCL, one process per GPU, NVLink multicast off; the CUDA-graph rows, as vLLM
  runs decode, else the eager ones): the time interpolated log-log in bytes between the measured sizes, the
  smallest size's time below them (NCCL's latency floor), and beyond the largest the last two sizes' slope (the
  link's bandwidth). Where from: hardware.op_timings when its CSV has such rows (a GPU of its own: taken as this
  node's, unscaled), else physics/data/allreduce_h200x2.csv when it is there (two H200 SXM over NVLink,
  benchmarks/data/README.md), its time beyond the floor scaled by NVLink 900 GB/s (the H200 SXM datasheet) over the
  node's nvlink_gb_s;
- NCCL's constants otherwise (a TP the measurement lacks, TP > 2 on the two-GPU machine, op_laws roofline, no
  measurement): a ring as NCCL models it (src/graph/tuning.cc, NCCL 2.21 to 2.30): base latency
  (hardware.allreduce_latency_us, the ring's LL latency) plus 2·(TP−1) ring steps of NVLink latency
  (nvlink_hop_latency_us), and 2·(TP−1)/TP of the bytes through each GPU's link in one direction at half the
  bidirectional NVLink figure (nvlink_gb_s; H100 SXM5 datasheet: 900 GB/s total, 450 GB/s each way).
`describe` names the law and the source of each figure for a node.
"""
from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from epdbench.physics.gpu_ops import OpRow, parse_ops_csv
from epdbench.specs.node import HardwareSpec

SOURCE_CSV = Path(__file__).resolve().parent / "data" / "allreduce_h200x2.csv"
SOURCE_NAME = "physics/data/allreduce_h200x2.csv"
SOURCE_NVLINK_GB_S = 900.0      # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: NVLink 900 GB/s


@dataclass(frozen=True)
class AllReduceLaw:
    """One TP's measured all-reduce: seconds by bytes on the measured GPUs."""
    tp: int
    log_bytes: tuple[float, ...]        # ascending, at least two
    log_seconds: tuple[float, ...]
    impl: str

    @property
    def floor_s(self) -> float:
        return math.exp(min(self.log_seconds))

    @property
    def bus_gb_s(self) -> float:
        """The bus bandwidth (nccl-tests' busbw: bytes · 2(TP−1)/TP per second) between the two largest sizes."""
        (b0, b1), (t0, t1) = (math.exp(x) for x in self.log_bytes[-2:]), (math.exp(y) for y in self.log_seconds[-2:])
        return (b1 - b0) * 2 * (self.tp - 1) / self.tp / max(t1 - t0, 1e-12) / 1e9

    def seconds_at_source(self, n_bytes: float) -> float:
        xs, ys = self.log_bytes, self.log_seconds
        if n_bytes <= math.exp(xs[0]):
            return math.exp(ys[0])
        x = math.log(n_bytes)
        if x >= xs[-1]:
            (b0, b1), (t0, t1) = (math.exp(v) for v in xs[-2:]), (math.exp(v) for v in ys[-2:])
            return t1 + max(0.0, (t1 - t0) / (b1 - b0)) * (n_bytes - b1)
        i = bisect.bisect_right(xs, x)
        w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return math.exp(ys[i - 1] + w * (ys[i] - ys[i - 1]))

    def seconds(self, n_bytes: float, link_ratio: float = 1.0) -> float:
        """seconds_at_source with the time beyond the latency floor `link_ratio` times longer (a slower link)."""
        t, floor = self.seconds_at_source(n_bytes), self.floor_s
        return floor + (t - floor) * link_ratio if t > floor else t


def fit_laws(rows: Iterable[OpRow]) -> dict[int, AllReduceLaw]:
    """Per TP, the law of a CSV's all-reduce rows: the CUDA-graph ones where there are any, else the eager ones;
    rows of one size (bytes) merged at their median time. A TP with fewer than two sizes has none."""
    mine = [r for r in rows if r.op == "allreduce" and r.tp and r.bytes > 0]
    out = {}
    for tp in sorted({r.tp for r in mine}):
        at_tp = [r for r in mine if r.tp == tp]
        graph = [r for r in at_tp if "cuda-graph" in r.impl]
        chosen = graph or [r for r in at_tp if "eager" in r.impl] or at_tp
        by_size: dict[float, list[float]] = defaultdict(list)
        for r in chosen:
            by_size[r.bytes].append(r.time_ms / 1e3)
        if len(by_size) < 2:
            continue
        sizes = sorted(by_size)
        out[tp] = AllReduceLaw(tp, tuple(math.log(b) for b in sizes),
                               tuple(math.log(statistics.median(by_size[b])) for b in sizes),
                               "cuda-graph" if graph else chosen[0].impl)
    return out


@functools.lru_cache(maxsize=8)
def _laws_of(text: str, source: str) -> tuple[dict[int, AllReduceLaw], str]:
    """The laws of a CSV's text and the GPU its rows name (the first row's), cached: the simulator asks every step."""
    rows = parse_ops_csv(text, source)
    return fit_laws(rows), rows[0].gpu


@functools.lru_cache(maxsize=1)
def _default() -> tuple[str, str] | None:
    return (SOURCE_CSV.read_text(encoding="utf-8"), SOURCE_NAME) if SOURCE_CSV.is_file() else None


@dataclass(frozen=True)
class Measured:
    laws: dict[int, AllReduceLaw]
    source: str
    gpu: str
    link_ratio: float           # seconds per byte on this node's NVLink over the measured GPUs'


def measured(hw: HardwareSpec) -> Measured | None:
    """The measured all-reduce laws for the node, or None (op_laws roofline, or no all-reduce rows anywhere)."""
    if hw.op_laws != "measured":
        return None
    t = hw.op_timings
    if t is not None and (laws := _laws_of(t.csv, t.source)[0]):
        return Measured(laws, t.source, t.gpu, 1.0)
    if (default := _default()) is None:
        return None
    laws, gpu = _laws_of(*default)
    return Measured(laws, default[1], gpu, SOURCE_NVLINK_GB_S / hw.nvlink_gb_s) if laws else None


def nccl_seconds(hw: HardwareSpec, tp: int, n_bytes: float) -> float:
    """One ring all-reduce by NCCL's tuning constants and the datasheet's NVLink (the module's second law)."""
    ring_steps = 2 * (tp - 1)
    latency_s = (hw.allreduce_latency_us + ring_steps * hw.nvlink_hop_latency_us) / 1e6
    return latency_s + n_bytes * ring_steps / tp / (hw.nvlink_gb_s / 2 * 1e9)


def seconds(hw: HardwareSpec, tp: int, n_bytes: float) -> float:
    """One all-reduce of `n_bytes` over `tp` GPUs on the node: measured where the measurement has this TP, else
    NCCL's constants; 0 at TP 1 or no bytes."""
    if tp <= 1 or n_bytes <= 0:
        return 0.0
    m = measured(hw)
    if m is not None and (law := m.laws.get(tp)) is not None:
        return law.seconds(n_bytes, m.link_ratio)
    return nccl_seconds(hw, tp, n_bytes)


def describe(hw: HardwareSpec) -> str:
    """Which all-reduce law the cost model uses on `hw`, and where each figure comes from, in one line."""
    nccl = (f"NCCL's ring constants ({hw.allreduce_latency_us:g} µs + {hw.nvlink_hop_latency_us:g} µs per ring "
            f"step, src/graph/tuning.cc) and {hw.nvlink_gb_s:g} GB/s NVLink at half each way (datasheet)")
    m = measured(hw)
    if m is None:
        return f"TP all-reduce: {nccl}"
    tps = sorted(m.laws)
    floors = ", ".join(f"TP {tp}: {m.laws[tp].floor_s * 1e6:.1f} µs floor, {m.laws[tp].bus_gb_s:.0f} GB/s bus"
                       for tp in tps)
    scaled = ("as measured" if m.link_ratio == 1.0 else
              f"beyond the floor scaled to {hw.nvlink_gb_s:g} GB/s NVLink from the measured {SOURCE_NVLINK_GB_S:g}")
    return (f"TP all-reduce: measured at TP {', '.join(map(str, tps))} on {m.gpu} ({m.source}; {floors}), "
            f"{scaled}; other TP: {nccl}")
