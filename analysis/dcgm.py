"""GPU telemetry from NVIDIA's DCGM exporter (dcgm-exporter, `GET :9400/metrics`), pure: one scrape's Prometheus
text → gpu_telemetry's neutral Samples per (pod, GPU), each with its GPU's energy counter.

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

Energy: where a GPU's energy counter is exported, each Sample carries it (`energy_mj`), and a window's energy is the
counter's rise across it (gpu_telemetry.energy_j), measured by the GPU itself between DCGM's readings, rather than
the trapezoid of 1-s power samples, which only sees instants.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

from epdbench.analysis.gpu_telemetry import Sample
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
        sample = Sample(t, gpu.index, *(values.get(f, math.nan) for f in FIGURES), values.get(ENERGY, math.nan))
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
