"""GPU telemetry on the Kubernetes target (side effects): while a configuration is deployed, read NVIDIA's DCGM
exporter (target.kubernetes.dcgm_exporter) on the nodes of its GPU pods every second, keep the readings of its
pods' GPUs (energy counters included) for each cell's figures (`cell`, as the local target's NVML sampler), and
append them to the configuration's evidence folder, `evidence/<config>/gpu-telemetry.csv` (analysis.gpu_telemetry's
neutral CSV, source `dcgm`, host the pod's name).

The exporter is looked up once, at provisioning: absent, one line says why and nothing is read. A failed read is
said once and tried again at the next tick. Nothing here fails or holds up the run: the loop is bounded in count
and time, each read has its own timeout, and stop() waits at most that long."""
from __future__ import annotations

import collections
import math
import threading
import time
from pathlib import Path
from typing import Callable

from epdbench.analysis import dcgm
from epdbench.analysis.gpu_telemetry import Sample, cell_telemetry, flatten_hosts, measured_window, samples_csv
from epdbench.manifests.render import LABEL_ROLE
from epdbench.specs.models import KubernetesTargetSpec
from epdbench.tasks.k8s.api import KubeApi, KubeApiError
from epdbench.tasks.k8s.exporter import ExporterRef, ExporterUnavailable, ScrapeTarget, scrape_targets
from epdbench.tasks.rundir.results import append_text

INTERVAL_S = 1.0
READ_TIMEOUT_S = 5.0
MAX_SAMPLING_S = 24 * 3600.0   # a configuration deployed longer is no longer read (and that is said)
KEEP = 100_000                 # readings kept in memory per pod for cells' figures (about a day of one GPU at 1 s)

Say = Callable[[str], None]


def gpu_pods(pods: list[dict]) -> list[dict]:
    """The configuration's engine pods (the router holds no GPU)."""
    return [p for p in pods if p["metadata"].get("labels", {}).get(LABEL_ROLE) != "router"]


def locate(api: KubeApi, ref: ExporterRef, nodes: set[str]) -> tuple[list[ScrapeTarget], str | None]:
    """The exporter pods to read (exporter.scrape_targets), from its Service and EndpointSlices;
    ExporterUnavailable with the reason when the Service cannot be had."""
    where = f"Service {ref.namespace}/{ref.service}"
    try:
        service = api.get("Service", ref.service, namespace=ref.namespace)
    except KubeApiError as e:
        if e.status == 404:
            raise ExporterUnavailable(f"no {where} on this cluster (no DCGM exporter there; or name yours in "
                                      "target.kubernetes.dcgm_exporter)") from None
        if e.status == 403:
            raise ExporterUnavailable(f"these credentials may not read {where} (RBAC: get services, list "
                                      f"endpointslices, get pods/proxy in namespace {ref.namespace})") from None
        raise ExporterUnavailable(f"{where} could not be read: {e}") from None
    try:
        slices = api.list("EndpointSlice", ref.slice_selector, namespace=ref.namespace)
    except KubeApiError:
        slices = None
    return scrape_targets(ref, service, slices, nodes)


class DcgmSampler:
    """Reads `targets` every interval_s on a thread of its own, from start() until stop() (or max_s)."""

    def __init__(self, api: KubeApi, targets: list[ScrapeTarget], namespace: str, pods: set[str], csv_path: Path,
                 say: Say, interval_s: float = INTERVAL_S, max_s: float = MAX_SAMPLING_S,
                 clock: Callable[[], float] = time.time):
        self.api, self.targets, self.namespace, self.pods = api, targets, namespace, pods
        self.csv_path, self.say = csv_path, say
        self._kept: dict[str, collections.deque[Sample]] = {}
        self._lock = threading.Lock()
        self._last_read = -math.inf
        self.interval_s, self.max_s, self.clock = interval_s, max_s, clock
        self.reads = self.failed_reads = self.samples = 0
        self._last_mj: dict[dcgm.Key, float] = {}
        self._said: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="epdbench-dcgm", daemon=True)

    def start(self) -> "DcgmSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the loop (waiting at most one read's timeout) and say what was kept."""
        self._stop.set()
        self._thread.join(timeout=READ_TIMEOUT_S + self.interval_s)
        failed = f", {self.failed_reads} failed" if self.failed_reads else ""
        self.say(f"GPU telemetry: {self.samples} samples from {self.reads} reads{failed} in {self.csv_path}")

    def say_once(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.say(line)

    def _loop(self) -> None:
        deadline = time.monotonic() + self.max_s
        for _ in range(int(self.max_s / self.interval_s) + 1):
            try:
                self.read_all()
            except Exception as e:  # noqa: BLE001 - telemetry never fails the run
                self.say_once("error", f"GPU telemetry: {type(e).__name__}: {e} (said once; reading goes on)")
            if self._stop.wait(self.interval_s):
                return
            if time.monotonic() >= deadline:
                break
        self.say(f"GPU telemetry: no longer read after {self.max_s:.0f} s, its bound")

    def read_all(self) -> None:
        for target in self.targets:
            if self._stop.is_set():
                return
            try:
                text = self.api.call("GET", target.path, timeout_s=READ_TIMEOUT_S).decode("utf-8", "replace")
            except (KubeApiError, OSError) as e:
                self.failed_reads += 1
                self.say_once(f"failed {target.name}", f"GPU telemetry: reading {target.name} failed: {e} "
                                                       "(said once; tried again every tick)")
                continue
            self.reads += 1
            t = self.clock()
            self.keep(dcgm.parse_scrape(text, t, self.namespace, self.pods), target)
            with self._lock:
                self._last_read = t

    def keep(self, scrape: dcgm.Scrape, target: ScrapeTarget) -> None:
        self.notes(scrape, target)
        kept, self._last_mj = dcgm.fresh(scrape, self._last_mj)
        for pod, samples in sorted(kept.samples.items()):
            append_text(self.csv_path, lambda header: samples_csv(samples, dcgm.SOURCE, host=pod, header=header))
            with self._lock:
                self._kept.setdefault(pod, collections.deque(maxlen=KEEP)).extend(samples)
            self.samples += len(samples)

    def cell(self, rows: list[dict]) -> dict:
        """A finished cell's telemetry (analysis.gpu_telemetry.COLUMNS) from its records, once a read after its
        end is in (waiting at most a few intervals): the pods' GPUs taken together."""
        found = measured_window(rows)
        if found is not None:
            limit = time.monotonic() + 2 * self.interval_s + READ_TIMEOUT_S
            while time.monotonic() < limit and self._thread.is_alive():
                with self._lock:
                    if self._last_read >= found[1]:
                        break
                time.sleep(self.interval_s / 4)
        with self._lock:
            by_pod = {pod: list(q) for pod, q in self._kept.items()}
        return cell_telemetry(flatten_hosts(by_pod), rows)

    def notes(self, scrape: dcgm.Scrape, target: ScrapeTarget) -> None:
        if not scrape.samples:
            self.say_once(f"none {target.name}", f"GPU telemetry: {target.name} shows no GPU of this "
                                                 f"configuration's pods ({len(scrape.unattributed)} carry no pod "
                                                 "label: is its Kubernetes mapping on, DCGM_EXPORTER_KUBERNETES?)")
        if scrape.unattributed:
            verb = "carries" if len(scrape.unattributed) == 1 else "carry"
            self.say_once("unattributed", f"GPU telemetry: {', '.join(map(str, scrape.unattributed))} {verb} no "
                                          "pod label: not attributed to any pod, not sampled (said once)")
        for gpu, pods in scrape.shared.items():
            self.say_once(f"shared {gpu}", f"GPU telemetry: {gpu} is shared by pods {', '.join(pods)}: its "
                                           f"figures are kept once, under {pods[0]}")
        if scrape.mig:
            self.say_once("mig", f"GPU telemetry: MIG instances on {', '.join(map(str, scrape.mig))} are not "
                                 "sampled (whole GPUs only)")


def start_telemetry(api: KubeApi, target: KubernetesTargetSpec, csv_path: Path, config: str, pods: list[dict],
                    say: Say) -> DcgmSampler | None:
    """Start reading the exporter for a configuration whose pods are ready, or say in one line why GPU telemetry
    is unavailable and return None. Never raises."""
    if not target.dcgm_exporter:
        return None
    ref = ExporterRef.parse(target.dcgm_exporter)
    engines = gpu_pods(pods)
    nodes = {p["spec"].get("nodeName") or "" for p in engines} - {""}
    tell: Say = lambda line: say(f"[{config}] {line}")   # noqa: E731
    try:
        if not nodes:
            raise ExporterUnavailable("no engine pod of the configuration is on a node yet")
        targets, note = locate(api, ref, nodes)
    except ExporterUnavailable as e:
        tell(f"GPU telemetry unavailable: {e}; nothing is sampled")
        return None
    except Exception as e:  # noqa: BLE001 - telemetry never fails provisioning
        tell(f"GPU telemetry unavailable: {type(e).__name__}: {e}; nothing is sampled")
        return None
    if note:
        tell(f"GPU telemetry: {note}")
    tell(f"GPU telemetry: reading {', '.join(t.name for t in targets)} ({ref}) every {INTERVAL_S:g} s")
    return DcgmSampler(api, targets, api.namespace, {p["metadata"]["name"] for p in engines},
                       csv_path, tell, interval_s=INTERVAL_S).start()
