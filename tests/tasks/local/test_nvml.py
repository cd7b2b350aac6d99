"""tasks/local/nvml.py: the NVML sampler's thread reads every GPU it was given, keeps the readings for each cell's
figures, appends them to the neutral CSV as it goes and at stop, and says why when NVML cannot be had. NVML itself
is a stand-in object with pynvml's functions (no GPU here); its figures are what the driver would report."""
from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import pytest

from epdbench.analysis import gpu_telemetry as g
from epdbench.tasks.local import nvml as sampler


class FakeNvml:
    """pynvml's calls the sampler makes: GPU i draws 100·(i+1) W, its energy counter rising with real time."""
    NVML_CLOCK_SM = 1

    def __init__(self, gpus=2, power_supported=True):
        self.t0 = time.time()
        self.gpus = gpus
        self.power_supported = power_supported
        self.shutdown = threading.Event()

    def nvmlDeviceGetHandleByIndex(self, i):
        if i >= self.gpus:
            raise ValueError(f"GPU {i} not found")
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=50 + h)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(1000 + h) * 2**20)

    def nvmlDeviceGetPowerUsage(self, h):
        if not self.power_supported:
            raise RuntimeError("Not Supported")
        return 100_000 * (h + 1)

    def nvmlDeviceGetClockInfo(self, h, clock):
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.power_supported:
            raise RuntimeError("Not Supported")
        return 1e6 + (time.time() - self.t0) * 100_000 * (h + 1)      # mJ at 100·(h+1) W

    def nvmlShutdown(self):
        self.shutdown.set()


def test_the_sampler_reads_each_gpu_keeps_a_cells_figures_and_writes_the_neutral_csv(tmp_path):
    csv = tmp_path / "telemetry" / "agg.csv"
    nv = FakeNvml()
    s, why = sampler.start_sampler([1, 0], csv, nvml=nv, interval_s=0.05)
    assert why is None
    start = time.time()
    time.sleep(0.6)
    rows = [{"phase": "measured", "ok": True, "send_wall_s": start + 0.1, "e2e_ms": 300.0, "output_tokens": 12}]
    figures = s.cell(rows)
    s.stop()
    assert nv.shutdown.is_set()
    assert figures["gpu_util_pct_mean"] == pytest.approx(50.5)
    assert figures["gpu_mem_used_mib_max"] == pytest.approx(2001)
    assert figures["gpu_power_w_mean"] == pytest.approx(150)
    assert figures["gpu_energy_j"] == pytest.approx(0.3 * (100 + 200), rel=0.05)    # 0.3 s at 300 W
    assert figures["energy_j_per_token"] == pytest.approx(figures["gpu_energy_j"] / 12)
    back = g.parse_samples_csv(csv.read_text())[""]
    assert {x.gpu for x in back} == {0, 1} and len(back) == len(s.samples())
    assert csv.read_text().startswith(",".join(g.CSV_HEADER) + "\n") and csv.read_text().count("t,host") == 1


def test_a_gpu_without_power_readings_gives_no_energy_and_no_guess(tmp_path):
    s, _ = sampler.start_sampler([0], tmp_path / "x.csv", nvml=FakeNvml(gpus=1, power_supported=False),
                                 interval_s=0.05)
    start = time.time()
    time.sleep(0.3)
    figures = s.cell([{"phase": "measured", "ok": True, "send_wall_s": start, "e2e_ms": 100.0, "output_tokens": 5}])
    s.stop()
    assert figures["gpu_util_pct_mean"] == 50 and figures["gpu_energy_j"] is None
    assert figures["gpu_power_w_mean"] is None and figures["energy_j_per_token"] is None
    assert all(math.isnan(x.power_w) for x in s.samples())


def test_without_nvml_or_with_a_gpu_it_does_not_have_it_says_why_and_samples_nothing(tmp_path, monkeypatch):
    none, why = sampler.start_sampler([3], tmp_path / "x.csv", nvml=FakeNvml(gpus=1))
    assert none is None and why == "no GPU telemetry: GPU 3 not found"
    import builtins
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "pynvml" else real(name, *a, **k))
    none, why = sampler.start_sampler([0], tmp_path / "x.csv")
    assert none is None and "nvidia-ml-py is not installed" in why
    assert not (tmp_path / "x.csv").exists()


def test_a_csv_that_cannot_be_written_is_said_once_and_the_cells_figures_still_come(tmp_path, capsys, monkeypatch):
    csv = tmp_path / "evidence" / "agg" / "gpu-telemetry.csv"
    csv.mkdir(parents=True)                       # a folder where the file should be: every append fails
    monkeypatch.setattr(sampler, "FLUSH_S", 0.05)
    s, _ = sampler.start_sampler([0], csv, nvml=FakeNvml(gpus=1), interval_s=0.02)
    start = time.time()
    try:
        time.sleep(0.4)
        figures = s.cell([{"phase": "measured", "ok": True, "send_wall_s": start + 0.1, "e2e_ms": 200.0,
                           "output_tokens": 4}])
    finally:
        s.stop()
    out = capsys.readouterr().out
    assert out.count("[agg] GPU telemetry not written to ") == 1 and s.error.startswith("GPU telemetry not written")
    assert figures["gpu_power_w_mean"] == pytest.approx(100) and figures["energy_j_per_token"] is not None
