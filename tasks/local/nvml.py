"""The local GPU target's telemetry: NVML (the driver's management library, what nvidia-smi prints) read in a thread
of this process while a configuration serves — utilisation, memory used, power, SM clock and the energy counter of
each of its GPUs every `interval_s` — kept in memory for each cell's figures (analysis.gpu_telemetry.cell_telemetry)
and appended to the configuration's evidence folder (`evidence/<config>/gpu-telemetry.csv`, on its MLflow run with the
other evidence) every few seconds, so a crash keeps what was read.

NVML comes from `nvidia-ml-py` (the `pynvml` module; the GPU image and vLLM carry it, and epdbench's `local` extra
pins it). Without it, or without a driver to load, start() says why and nothing is sampled: no figure is ever
guessed. NVML numbers GPUs by PCI bus order; the engines' CUDA_VISIBLE_DEVICES uses the same numbers when
CUDA_DEVICE_ORDER=PCI_BUS_ID (on one GPU, or GPUs of one kind, the orders agree)."""
from __future__ import annotations

import collections
import math
import threading
import time
from pathlib import Path
from typing import Iterable

from epdbench.analysis.gpu_telemetry import Sample, cell_telemetry, measured_window, samples_csv
from epdbench.tasks.rundir.results import append_text

INTERVAL_S = 0.2           # five readings a second, as benchmarks/simulator/vllm_truth.py samples nvidia-smi
FLUSH_S = 5.0              # how often the samples read since the last write are appended to the CSV
KEEP = 200_000             # samples kept in memory (about 5.5 hours of one GPU at 0.2 s)
SOURCE = "nvml"


def load_nvml():
    """The pynvml module, initialised; raises RuntimeError (one line) when it or the driver cannot be had."""
    try:
        import pynvml
    except ImportError:
        raise RuntimeError("nvidia-ml-py is not installed (pip install 'epdbench[local]')") from None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - pynvml.NVMLError and its library-not-found subclasses
        raise RuntimeError(f"NVML did not start: {e}") from None
    return pynvml


def _read(fn, *args) -> float:
    try:
        return float(fn(*args))
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin: a figure this GPU does not give
        return math.nan


def read_gpu(nvml, handle, index: int, t: float) -> Sample:
    """One reading of one GPU at `t` (epoch s); a figure the GPU does not give is NaN."""
    util = _read(lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu, handle)
    mem = _read(lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20, handle)
    power = _read(nvml.nvmlDeviceGetPowerUsage, handle) / 1000.0                 # mW → W
    clock = _read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
    energy = _read(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)            # mJ since the driver loaded
    return Sample(t, index, util, mem, power, clock, energy)


class NvmlSampler:
    """Reads `gpus` every `interval_s` from start() to stop(), in a daemon thread (bounded by stop's event)."""

    def __init__(self, gpus: Iterable[int], csv_path: Path, nvml, interval_s: float = INTERVAL_S):
        self.gpus = sorted(set(gpus))
        self.csv_path = csv_path
        self.interval_s = interval_s
        self._nvml = nvml
        self._handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in self.gpus}
        self._samples: collections.deque[Sample] = collections.deque(maxlen=KEEP)
        self._unwritten: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epdbench-nvml", daemon=True)
        self.error: str | None = None       # the first failure, said once on the run's output

    def _fail(self, line: str) -> None:
        if self.error is None:
            self.error = line
            print(f"[{self.csv_path.parent.name}] {line}", flush=True)   # the configuration's evidence folder

    def start(self) -> "NvmlSampler":
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        last_flush = time.monotonic()
        try:
            while not self._stop.is_set():
                t = time.time()
                batch = [read_gpu(self._nvml, h, i, t) for i, h in self._handles.items()]
                with self._lock:
                    self._samples.extend(batch)
                    self._unwritten.extend(batch)
                if time.monotonic() - last_flush >= FLUSH_S:
                    self._flush()
                    last_flush = time.monotonic()
                self._stop.wait(self.interval_s)
        except Exception as e:  # noqa: BLE001 - a sampler that fails stops sampling; the run goes on
            self._fail(f"GPU telemetry stopped: {e}; the cells after it have no GPU figures")
        finally:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            batch, self._unwritten = self._unwritten, []
        if not batch:
            return
        try:
            append_text(self.csv_path, lambda header: samples_csv(batch, SOURCE, header=header))
        except OSError as e:
            self._fail(f"GPU telemetry not written to {self.csv_path}: {e.strerror}")

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def cell(self, rows: list[dict]) -> dict:
        """A finished cell's telemetry (analysis.gpu_telemetry.COLUMNS) from its records, once a reading past its
        end is in (waiting at most a few intervals for it)."""
        found = measured_window(rows)
        if found is not None:
            limit = time.monotonic() + 3 * self.interval_s + 1.0
            while time.monotonic() < limit and self._thread.is_alive():
                with self._lock:
                    latest = self._samples[-1].t if self._samples else -math.inf
                if latest >= found[1]:
                    break
                time.sleep(self.interval_s / 2)
        return cell_telemetry(self.samples(), rows)

    def stop(self) -> None:
        """Stop reading and append what is left to the CSV; never raises."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10 * self.interval_s + 5)
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - teardown
            pass


def start_sampler(gpus: Iterable[int], csv_path: Path, nvml=None,
                  interval_s: float = INTERVAL_S) -> tuple[NvmlSampler | None, str | None]:
    """A started sampler of `gpus`, or None and why there is none (one line)."""
    try:
        lib = nvml if nvml is not None else load_nvml()
        return NvmlSampler(gpus, csv_path, lib, interval_s).start(), None
    except Exception as e:  # noqa: BLE001 - RuntimeError from load_nvml, NVMLError for a GPU index
        return None, f"no GPU telemetry: {e}"
