"""GPU telemetry over a time window, from samples of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits -lms N`
(NVML's figures as the driver's own tool prints them): utilisation, memory used, power and SM clock per GPU, and the
energy the GPUs drew, integrated over the window (trapezoids between samples, the window's ends interpolated).
Pure: text in, figures out; the samplers that read the GPUs are the targets' (nvidia-smi on the local target, the
DCGM exporter on Kubernetes). Whatever the source, a configuration's samples are kept in its evidence folder as one
CSV, `evidence/<config>/gpu-telemetry.csv`, in this module's neutral form (CSV_HEADER; samples_csv /
parse_samples_csv)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Iterable, Sequence

# The query, in this order (`timestamp` is the driver's local time with milliseconds: the samples' own instants).
QUERY = ("timestamp", "index", "utilization.gpu", "memory.used", "power.draw", "clocks.sm")
# What a window's summary carries, over the GPUs chosen: the keys of a cell's telemetry.
FIGURES = ("gpu_util_pct_mean", "gpu_mem_used_mib_max", "gpu_power_w_mean", "gpu_sm_clock_mhz_mean",
           "gpu_energy_j", "gpu_samples")
# A cell's telemetry as the summary keeps it: the window's figures and the energy per output token.
COLUMNS = [*FIGURES, "energy_j_per_token"]


def smi_command(interval_ms: int) -> list[str]:
    """nvidia-smi printing one CSV line per GPU every `interval_ms`, until it is stopped."""
    return ["nvidia-smi", f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits", f"-lms={interval_ms}"]


class TelemetryError(ValueError):
    """A sample line that is not the query's."""


@dataclass(frozen=True)
class Sample:
    t: float            # epoch seconds
    gpu: int
    util_pct: float
    mem_used_mib: float
    power_w: float
    sm_clock_mhz: float
    energy_mj: float = math.nan   # the driver's energy counter since it loaded (NVML, DCGM); NaN where not read


def _number(text: str) -> float:
    text = text.strip()
    if text in ("[N/A]", "[Not Supported]", "N/A", ""):
        return math.nan
    return float(text)


def epoch_of_smi_timestamp(stamp: str) -> float:
    """nvidia-smi's `timestamp` field (`2026/12/05 17:21:03.123`, the host's local time) as epoch seconds."""
    return datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()


def parse_samples(text: str) -> list[Sample]:
    """smi_command's lines (`timestamp, index, util, mem_used, power, sm_clock`). A last line cut short by the
    sampler's end is dropped; any other malformed line raises TelemetryError naming it. `[N/A]` reads as NaN."""
    lines = [x for x in text.splitlines() if x.strip()]
    out: list[Sample] = []
    for i, line in enumerate(lines):
        fields = [f.strip() for f in line.split(",")]
        try:
            if len(fields) != len(QUERY):
                raise ValueError(f"{len(fields)} fields, not {len(QUERY)}")
            out.append(Sample(epoch_of_smi_timestamp(fields[0]), int(fields[1]), *(_number(f) for f in fields[2:])))
        except ValueError as e:
            if i == len(lines) - 1 and not text.endswith("\n"):
                break
            raise TelemetryError(f"telemetry line {i + 1}: {line[:120]!r}: {e}") from None
    return out


def _interp(a: Sample, b: Sample, t: float) -> float:
    if math.isnan(a.power_w) or math.isnan(b.power_w):
        return math.nan
    if b.t == a.t:
        return a.power_w
    return a.power_w + (b.power_w - a.power_w) * (t - a.t) / (b.t - a.t)


def counter_at(pts: Sequence[Sample], t: float) -> float:
    """The energy counter (mJ) at `t`, interpolated between the samples around it (sorted by time); NaN without a
    reading on both sides."""
    before = [s for s in pts if s.t <= t and not math.isnan(s.energy_mj)]
    after = [s for s in pts if s.t >= t and not math.isnan(s.energy_mj)]
    if not before or not after:
        return math.nan
    a, b = before[-1], after[0]
    return a.energy_mj if b.t == a.t else a.energy_mj + (b.energy_mj - a.energy_mj) * (t - a.t) / (b.t - a.t)


def energy_j(samples: Sequence[Sample], t0: float, t1: float) -> float:
    """Energy (J) one GPU drew from t0 to t1: from the driver's energy counter where the samples carry it on both
    sides of each end (interpolated there; a counter that went backwards — the driver reloaded — gives no figure),
    else the trapezoids of its power samples, cut at the window's ends (power interpolated there). NaN when the
    samples do not cover the window or a power reading inside it is missing."""
    pts = sorted(samples, key=lambda s: s.t)
    if t1 <= t0 or not pts or pts[0].t > t0 or pts[-1].t < t1:
        return math.nan
    e0, e1 = counter_at(pts, t0), counter_at(pts, t1)
    if not (math.isnan(e0) or math.isnan(e1)):
        return (e1 - e0) / 1000.0 if e1 >= e0 else math.nan
    total = 0.0
    for a, b in zip(pts, pts[1:]):
        lo, hi = max(a.t, t0), min(b.t, t1)
        if hi <= lo:
            continue
        p_lo, p_hi = _interp(a, b, lo), _interp(a, b, hi)
        if math.isnan(p_lo) or math.isnan(p_hi):
            return math.nan
        total += (p_lo + p_hi) / 2 * (hi - lo)
    return total


def _mean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else None


def window(samples: Sequence[Sample], t0: float, t1: float, gpus: Sequence[int] | None = None) -> dict:
    """The FIGURES over [t0, t1] for the GPUs `gpus` (all sampled ones by default): utilisation, power and SM clock
    averaged over the samples inside the window and the GPUs, memory the largest sum over the GPUs at one instant,
    energy summed over the GPUs; a figure that cannot be had is None (never a guess)."""
    chosen = sorted({s.gpu for s in samples} if gpus is None else set(gpus))
    inside = [s for s in samples if t0 <= s.t <= t1 and s.gpu in chosen]
    out: dict = {"gpu_samples": len(inside)}
    out["gpu_util_pct_mean"] = _mean(s.util_pct for s in inside)
    out["gpu_power_w_mean"] = _mean(s.power_w for s in inside)
    out["gpu_sm_clock_mhz_mean"] = _mean(s.sm_clock_mhz for s in inside)
    by_t: dict[float, float] = {}
    for s in inside:
        if not math.isnan(s.mem_used_mib):
            by_t[s.t] = by_t.get(s.t, 0.0) + s.mem_used_mib
    out["gpu_mem_used_mib_max"] = max(by_t.values()) if by_t else None
    energies = [energy_j([s for s in samples if s.gpu == g], t0, t1) for g in chosen]
    out["gpu_energy_j"] = sum(energies) if energies and not any(math.isnan(e) for e in energies) else None
    return out


# The neutral form every sampler writes (epoch seconds, the GPU's index on its host, its figures; `source` says
# what read them: nvidia-smi, dcgm) and `host` which node or pod's GPU it is (empty on one host).
TELEMETRY_FILE = "gpu-telemetry.csv"     # its name in a configuration's evidence folder
CSV_HEADER = ("t", "host", "gpu", "util_pct", "mem_used_mib", "power_w", "sm_clock_mhz", "energy_mj", "source")


def _cell(v: float) -> str:
    return "" if math.isnan(v) else f"{v:.15g}"   # an energy counter (mJ since boot) keeps its units digit


def samples_csv(samples: Iterable[Sample], source: str, host: str = "", header: bool = True) -> str:
    """Samples as the neutral CSV (a header line first unless `header` is False, for appending); a missing
    figure is an empty field."""
    lines = [",".join(CSV_HEADER)] if header else []
    for s in samples:
        lines.append(f"{s.t:.3f},{host},{s.gpu},{_cell(s.util_pct)},{_cell(s.mem_used_mib)},{_cell(s.power_w)},"
                     f"{_cell(s.sm_clock_mhz)},{_cell(s.energy_mj)},{source}")
    return "\n".join(lines) + ("\n" if lines else "")


def parse_samples_csv(text: str) -> dict[str, list[Sample]]:
    """The neutral CSV back as samples per host ('' for one host). The header must be CSV_HEADER; a last line
    cut short by a sampler's end is dropped; any other malformed line raises TelemetryError naming it."""
    lines = [x for x in text.splitlines() if x.strip()]
    if not lines:
        return {}
    if tuple(f.strip() for f in lines[0].split(",")) != CSV_HEADER:
        raise TelemetryError(f"telemetry header {lines[0][:120]!r} is not {','.join(CSV_HEADER)}")
    out: dict[str, list[Sample]] = {}
    for i, line in enumerate(lines[1:], start=2):
        fields = [f.strip() for f in line.split(",")]
        try:
            if len(fields) != len(CSV_HEADER):
                raise ValueError(f"{len(fields)} fields, not {len(CSV_HEADER)}")
            t, host, gpu, *figures, _source = fields
            out.setdefault(host, []).append(Sample(float(t), int(gpu), *(_number(f) for f in figures)))
        except ValueError as e:
            if i == len(lines) and not text.endswith("\n"):
                break
            raise TelemetryError(f"telemetry line {i}: {line[:120]!r}: {e}") from None
    return out


def energy_per_token(energy: float | None, output_tokens: int) -> float | None:
    """Joules per output token; None without an energy or without tokens."""
    if energy is None or not output_tokens or output_tokens <= 0:
        return None
    return energy / output_tokens


def measured_window(rows: Iterable[dict]) -> tuple[float, float, int] | None:
    """The wall-clock window (epoch s) a cell's measured requests ran in — from the first one's send to the last
    one's end — and the output tokens they produced; None without a measured request that finished. `rows` are
    records (send_wall_s, e2e_ms, output_tokens, phase, ok)."""
    starts, ends, tokens = [], [], 0
    for r in rows:
        if r.get("phase") != "measured" or r.get("send_wall_s") is None:
            continue
        starts.append(float(r["send_wall_s"]))
        if r.get("ok") and r.get("e2e_ms") is not None:
            ends.append(float(r["send_wall_s"]) + float(r["e2e_ms"]) / 1000.0)
            tokens += int(r.get("output_tokens") or 0)
    if not ends:
        return None
    return min(starts), max(ends), tokens


def flatten_hosts(by_host: dict[str, list[Sample]]) -> list[Sample]:
    """Samples of several hosts (pods, nodes) as one set, each (host, GPU) a GPU of its own."""
    ids = {key: i for i, key in enumerate(sorted({(h, s.gpu) for h, ss in by_host.items() for s in ss}))}
    return [replace(s, gpu=ids[(h, s.gpu)]) for h, ss in by_host.items() for s in ss]


def cell_telemetry(samples: Sequence[Sample], rows: Iterable[dict]) -> dict:
    """COLUMNS for a cell (or a mixed window, whose streams share the GPUs) from the GPUs' samples and its records:
    the figures over its measured window, and the energy over it per output token of its measured requests. Every
    figure None when the window cannot be had or no sample covers it."""
    found = measured_window(rows)
    if found is None or not samples:
        return {c: None for c in COLUMNS}
    t0, t1, tokens = found
    figures = window(samples, t0, t1)
    figures["energy_j_per_token"] = energy_per_token(figures["gpu_energy_j"], tokens)
    return figures
