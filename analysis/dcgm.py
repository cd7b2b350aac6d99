"""GPU telemetry from NVIDIA's DCGM exporter (dcgm-exporter, `GET :9400/metrics`), pure: one scrape's Prometheus
text → gpu_telemetry's neutral Samples per (pod, GPU), and the readings of the GPUs' energy counters, with the
energy a window drew computed from those counters.

The format, as read in NVIDIA/dcgm-exporter (main at d5e5f51, 2026-05-12, after release 4.5.3-4.8.2):
- etc/default-counters.csv and etc/dcp-metrics-included.csv (the file the GPU Operator's exporter collects):
  DCGM_FI_DEV_GPU_UTIL (gauge, %), DCGM_FI_DEV_FB_USED (gauge, MiB), DCGM_FI_DEV_POWER_USAGE (gauge, W),
  DCGM_FI_DEV_SM_CLOCK (gauge, MHz), DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (counter, "Total energy consumption since
  boot (in mJ)").
- internal/pkg/rendermetrics/render_metrics.go: one line per GPU and field, no timestamp, label values written as
  they are (unescaped): `NAME{gpu="0",UUID="GPU-…",pci_bus_id="…",device="nvidia0",modelName="…"` then
  `GPU_I_PROFILE`/`GPU_I_ID` for a MIG instance, `hostname="<node>"` (`Hostname` up to 4.5.3-4.8.2; #655 renamed
  it: both are read), the static labels (e.g. DCGM_FI_DRIVER_VERSION) and the attributes, `} VALUE`. The README's
  older sample writes `gpu="0", UUID="…"` with a space and `container="",namespace="",pod=""`.
- internal/pkg/transformation/kubernetes.go and const.go: with Kubernetes mapping on (DCGM_EXPORTER_KUBERNETES=true,
  as the GPU Operator runs it) the lines of a GPU a pod holds carry `pod`, `namespace`, `container` (`pod_name`,
  `pod_namespace`, `container_name` with --use-old-namespace); a GPU no pod holds carries none (older releases:
  empty values); a GPU shared by several pods has its lines repeated per pod, plus the device's own line for the
  per-process fields (GPU_UTIL, FB_USED).
- internal/pkg/collector/gpu_collector.go: integer fields printed with %d, float ones with %f; DCGM's blank
  sentinels are skipped there (the README's older sample prints one, 9223372036854775794): read as missing here.
- pkg/cmd/app.go: the exporter reads DCGM every --collect-interval (DCGM_EXPORTER_INTERVAL, 30000 ms by default)
  and serves the latest reading to every scrape in between: a scrape's instant is the sampler's.

Energy: where a GPU's energy counter is exported, a window's energy is the counter's rise across it (`counter_
energy_j`), measured by the GPU itself between DCGM's readings, rather than the trapezoid of 1-s power samples
(gpu_telemetry.energy_j), which only sees instants. Its readings are kept apart from the neutral CSV, in
ENERGY_HEADER's form.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Iterable, Mapping, Sequence

from epdbench.analysis.gpu_telemetry import Sample, TelemetryError
from epdbench.analysis.prom import parse_prometheus

SOURCE = "dcgm"
# Field -> the Sample attribute it fills.
FIGURES = {"DCGM_FI_DEV_GPU_UTIL": "util_pct", "DCGM_FI_DEV_FB_USED": "mem_used_mib",
           "DCGM_FI_DEV_POWER_USAGE": "power_w", "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz"}
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
POD_LABELS = ("pod", "pod_name")
NAMESPACE_LABELS = ("namespace", "pod_namespace")
HOST_LABELS = ("hostname", "Hostname")
UUID_LABELS = ("UUID", "uuid")
# DCGM's blank / not found / not supported / not permissioned values (dcgm_fields.h), as Python reads them.
INT32_BLANKS = {0x7FFFFFF0, 0x7FFFFFF1, 0x7FFFFFF2, 0x7FFFFFF3}
INT64_BLANK_MIN = float(0x7FFFFFFFFFFFFFF0)
FP64_BLANKS = {140737488355328.0, 140737488355329.0, 140737488355330.0, 140737488355331.0}

Key = tuple[str, int]   # (pod, GPU index on its node)


@dataclass(frozen=True, order=True)
class Gpu:
    """One GPU as the exporter names it."""
    node: str
    index: int
    uuid: str

    def __str__(self) -> str:
        return f"GPU {self.index} ({self.uuid or 'no UUID'}) on {self.node or 'an unnamed node'}"


@dataclass
class Scrape:
    t: float
    samples: dict[str, list[Sample]] = field(default_factory=dict)   # pod -> one Sample per GPU it holds
    energy_mj: dict[Key, float] = field(default_factory=dict)         # (pod, gpu) -> the GPU's energy counter
    unattributed: list[Gpu] = field(default_factory=list)             # GPUs whose lines carry no pod at all
    shared: dict[Gpu, list[str]] = field(default_factory=dict)        # GPUs several of the pods share
    mig: list[Gpu] = field(default_factory=list)                      # MIG instances' GPUs (not sampled)

    @property
    def sample_count(self) -> int:
        return sum(len(v) for v in self.samples.values())


def reading(value: float) -> float:
    """The exported value, or NaN for one of DCGM's blank sentinels."""
    if math.isnan(value) or value in INT32_BLANKS or value >= INT64_BLANK_MIN or value in FP64_BLANKS:
        return math.nan
    return value


def _first(labels: Mapping[str, str], names: Sequence[str]) -> str:
    return next((labels[n] for n in names if labels.get(n)), "")


def parse_scrape(text: str, t: float, namespace: str, pods: Collection[str]) -> Scrape:
    """One scrape of the exporter, stamped `t` (epoch seconds, the sampler's clock), as Samples of the GPUs that
    `pods` of `namespace` hold, keyed by pod name. A GPU several of them share is kept once, under the first pod
    by name (its power and energy are the GPU's, not each pod's). GPUs whose lines carry no pod label cannot be
    attributed and are listed instead (unless another line of the same GPU names a pod); MIG instances
    (GPU_I_ID) are listed apart and not sampled."""
    out = Scrape(t)
    figures: dict[Gpu, dict[str, dict[str, float]]] = {}   # GPU -> pod -> field -> value
    unlabelled: set[Gpu] = set()
    labelled: set[Gpu] = set()
    mig: set[Gpu] = set()
    for name, labels, value in parse_prometheus(text):
        if name not in FIGURES and name != ENERGY:
            continue
        index = labels.get("gpu", "")
        if not index.isdigit():
            continue
        gpu = Gpu(_first(labels, HOST_LABELS), int(index), _first(labels, UUID_LABELS))
        if labels.get("GPU_I_ID"):
            mig.add(gpu)
            continue
        pod = _first(labels, POD_LABELS)
        if not pod:
            unlabelled.add(gpu)
            continue
        labelled.add(gpu)
        if _first(labels, NAMESPACE_LABELS) != namespace or pod not in pods:
            continue
        figures.setdefault(gpu, {}).setdefault(pod, {})[name] = reading(value)
    for gpu in sorted(figures):
        by_pod = figures[gpu]
        owner = min(by_pod)
        if len(by_pod) > 1:
            out.shared[gpu] = sorted(by_pod)
        values = by_pod[owner]
        sample = Sample(t, gpu.index, *(values.get(f, math.nan) for f in FIGURES))
        out.samples.setdefault(owner, []).append(sample)
        if not math.isnan(values.get(ENERGY, math.nan)):
            out.energy_mj[(owner, gpu.index)] = values[ENERGY]
    out.unattributed = sorted(unlabelled - labelled)
    out.mig = sorted(mig)
    return out


def fresh(scrape: Scrape, last_mj: Mapping[Key, float]) -> tuple[Scrape, dict[Key, float]]:
    """The scrape without the GPUs whose energy counter has not moved since the reading last kept, and the
    counters to compare the next scrape with. The exporter serves DCGM's latest reading until its next
    collection, so an unchanged counter (it rises with every reading while the GPU draws any power) marks a
    repeat of a reading already kept, stamped later than it was taken. A GPU without the counter is always kept:
    a repeat cannot be told from a steady reading."""
    kept = Scrape(scrape.t, unattributed=scrape.unattributed, shared=scrape.shared, mig=scrape.mig)
    last = dict(last_mj)
    for pod, samples in scrape.samples.items():
        for s in samples:
            mj = scrape.energy_mj.get((pod, s.gpu))
            if mj is not None and last.get((pod, s.gpu)) == mj:
                continue
            kept.samples.setdefault(pod, []).append(s)
            if mj is not None:
                kept.energy_mj[(pod, s.gpu)] = last[(pod, s.gpu)] = mj
    return kept, last


# The energy counters' readings, one line per GPU and reading: epoch seconds, pod, GPU index, the counter (mJ).
ENERGY_HEADER = ("t", "host", "gpu", "energy_mj", "source")


def energy_csv(scrape: Scrape, header: bool = True) -> str:
    lines = [",".join(ENERGY_HEADER)] if header else []
    for (pod, gpu), mj in sorted(scrape.energy_mj.items()):
        lines.append(f"{scrape.t:.3f},{pod},{gpu},{mj:.0f},{SOURCE}")
    return "\n".join(lines) + ("\n" if lines else "")


def parse_energy_csv(text: str) -> dict[Key, list[tuple[float, float]]]:
    """energy_csv's lines back as (t, mJ) readings per (host, gpu). A last line cut short by the sampler's end is
    dropped; any other malformed line raises TelemetryError naming it."""
    lines = [x for x in text.splitlines() if x.strip()]
    if not lines:
        return {}
    if tuple(f.strip() for f in lines[0].split(",")) != ENERGY_HEADER:
        raise TelemetryError(f"energy header {lines[0][:120]!r} is not {','.join(ENERGY_HEADER)}")
    out: dict[Key, list[tuple[float, float]]] = {}
    for i, line in enumerate(lines[1:], start=2):
        fields = [f.strip() for f in line.split(",")]
        try:
            if len(fields) != len(ENERGY_HEADER):
                raise ValueError(f"{len(fields)} fields, not {len(ENERGY_HEADER)}")
            out.setdefault((fields[1], int(fields[2])), []).append((float(fields[0]), float(fields[3])))
        except ValueError as e:
            if i == len(lines) and not text.endswith("\n"):
                break
            raise TelemetryError(f"energy line {i}: {line[:120]!r}: {e}") from None
    return out


def _at(a: tuple[float, float], b: tuple[float, float], t: float) -> float:
    return a[1] if b[0] == a[0] else a[1] + (b[1] - a[1]) * (t - a[0]) / (b[0] - a[0])


def counter_energy_j(readings: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    """Energy (J) one GPU drew from t0 to t1, from its cumulative counter's (t, mJ) readings: the counter at each
    end of the window, interpolated linearly between the readings around it (steady power between DCGM's
    readings), then their difference. NaN when the readings do not bracket the window, or the counter fell
    within it (a driver reload starts it again)."""
    pts = sorted(readings)
    if t1 <= t0 or not pts or pts[0][0] > t0 or pts[-1][0] < t1:
        return math.nan
    lo = max(i for i, p in enumerate(pts) if p[0] <= t0)
    hi = min(i for i, p in enumerate(pts) if p[0] >= t1)
    span = pts[lo:hi + 1]
    if any(b[1] < a[1] for a, b in zip(span, span[1:])):
        return math.nan
    start = _at(pts[lo], pts[min(lo + 1, hi)], t0)
    end = _at(pts[max(hi - 1, lo)], pts[hi], t1)
    return (end - start) / 1000.0


def window_energy_j(readings: Mapping[Key, Sequence[tuple[float, float]]], t0: float, t1: float,
                    keys: Iterable[Key] | None = None) -> float | None:
    """Energy (J) the GPUs `keys` (every one with readings by default) drew over [t0, t1], from their counters;
    None when there are none, or any one's counter cannot give it (then the power trapezoid of
    gpu_telemetry.window is the figure to use, and never a mix of the two)."""
    chosen = sorted(readings if keys is None else keys)
    energies = [counter_energy_j(readings.get(k, ()), t0, t1) for k in chosen]
    if not energies or any(math.isnan(e) for e in energies):
        return None
    return sum(energies)
