"""analysis/dcgm.py: the DCGM exporter's page (tests/analysis/data, in dcgm-exporter 4.5.3-4.8.2's form) as Samples
per pod and GPU, the label variants of other releases, repeats of one reading, and energy from the counter."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from epdbench.analysis import dcgm
from epdbench.analysis.gpu_telemetry import Sample, energy_j, parse_samples_csv, samples_csv

PAGE = (Path(__file__).parent / "data" / "dcgm-exporter-h100-k8s.txt").read_text()
PODS = {"pd-tcp-prefill-0", "pd-tcp-decode-0", "pd-tcp-decode-1"}
LABELS = ('{gpu="%d",UUID="GPU-%d",pci_bus_id="00000000:18:00.0",device="nvidia%d",modelName="NVIDIA H100 80GB HBM3"'
          ',hostname="gpu-node-1"%s}')


def line(name: str, gpu: int, value: str, extra: str = "") -> str:
    return f"{name}{LABELS % (gpu, gpu, gpu, extra)} {value}"


def test_the_exporters_page_gives_one_sample_per_gpu_of_the_configurations_pods():
    scrape = dcgm.parse_scrape(PAGE, 1000.0, "epdbench", PODS)
    assert scrape.samples == {
        "pd-tcp-prefill-0": [Sample(1000.0, 0, 62.0, 72806.0, 391.9, 1980.0, 412873251044.0)],
        "pd-tcp-decode-0": [Sample(1000.0, 1, 81.0, 72807.0, 491.07, 1980.0, 422744554161.0)],
        "pd-tcp-decode-1": [Sample(1000.0, 2, 78.0, 72808.0, 475.84, 1980.0, 432615857278.0)]}
    assert scrape.energy_mj == {("pd-tcp-prefill-0", 0): 412873251044.0, ("pd-tcp-decode-0", 1): 422744554161.0,
                                ("pd-tcp-decode-1", 2): 432615857278.0}
    # the free GPUs carry no pod label; GPU 5 is another namespace's pod's: not ours, and not unattributed either
    assert [(g.node, g.index) for g in scrape.unattributed] == [("gpu-node-1", i) for i in (3, 4, 6, 7)]
    assert str(scrape.unattributed[0]) == "GPU 3 (GPU-0e6f3b84-d2a9-47c1-85fe-2c7a9b0d1f64) on gpu-node-1"
    assert scrape.shared == {} and scrape.mig == [] and scrape.sample_count == 3


def test_only_the_named_pods_of_the_namespace_are_attributed():
    assert set(dcgm.parse_scrape(PAGE, 1.0, "epdbench", {"pd-tcp-decode-0"}).samples) == {"pd-tcp-decode-0"}
    assert dcgm.parse_scrape(PAGE, 1.0, "other", PODS).samples == {}
    assert dcgm.parse_scrape(PAGE, 1.0, "team-a", {"trainer-7f9c4-0"}).samples["trainer-7f9c4-0"][0].gpu == 5


def test_the_samples_round_trip_through_the_neutral_csv_with_the_pod_as_host():
    scrape = dcgm.parse_scrape(PAGE, 1000.25, "epdbench", PODS)
    text = "".join(samples_csv(s, dcgm.SOURCE, host=pod, header=i == 0)
                   for i, (pod, s) in enumerate(sorted(scrape.samples.items())))
    assert text.splitlines()[1] == "1000.250,pd-tcp-decode-0,1,81,72807,491.07,1980,422744554161,dcgm"
    assert parse_samples_csv(text) == scrape.samples


def test_other_releases_label_variants_and_blank_values():
    old_pod = ',container_name="engine",pod_name="p-0",pod_namespace="ns"'   # --use-old-namespace
    readme = ('DCGM_FI_DEV_SM_CLOCK{gpu="1", UUID="GPU-1",container="",namespace="",pod=""} 139\n'
              'DCGM_FI_DEV_POWER_USAGE{gpu="1", UUID="GPU-1",container="",namespace="",pod=""} 9223372036854775794\n')
    text = "\n".join([line("DCGM_FI_DEV_POWER_USAGE", 0, "140737488355328.000000", old_pod),   # FP64 blank
                      line("DCGM_FI_DEV_GPU_UTIL", 0, "2147483632", old_pod),                  # INT32 blank
                      line("DCGM_FI_DEV_SM_CLOCK", 0, "1755", old_pod), readme])
    scrape = dcgm.parse_scrape(text, 5.0, "ns", {"p-0"})
    (s,) = scrape.samples["p-0"]
    assert (s.gpu, s.sm_clock_mhz) == (0, 1755.0)
    assert math.isnan(s.power_w) and math.isnan(s.util_pct) and math.isnan(s.mem_used_mib)   # blank, blank, absent
    assert scrape.energy_mj == {}
    assert [(g.node, g.index, g.uuid) for g in scrape.unattributed] == [("", 1, "GPU-1")]   # empty pod labels
    assert str(scrape.unattributed[0]) == "GPU 1 (GPU-1) on an unnamed node"


def test_a_gpu_shared_by_two_pods_is_kept_once_and_mig_instances_are_set_apart():
    a, b = ',container="engine",namespace="ns",pod="a-0"', ',container="engine",namespace="ns",pod="b-0"'
    mig = ',GPU_I_PROFILE="1g.10gb",GPU_I_ID="3",container="engine",namespace="ns",pod="c-0"'
    text = "\n".join([line("DCGM_FI_DEV_POWER_USAGE", 0, "300.000000", b), line("DCGM_FI_DEV_POWER_USAGE", 0,
                                                                                  "300.000000", a),
                      line("DCGM_FI_DEV_GPU_UTIL", 0, "90"),     # the device's own line beside per-process ones
                      line("DCGM_FI_DEV_GPU_UTIL", 0, "40", a), line("DCGM_FI_DEV_GPU_UTIL", 0, "50", b),
                      line("DCGM_FI_DEV_POWER_USAGE", 1, "100.000000", mig)])
    scrape = dcgm.parse_scrape(text, 5.0, "ns", {"a-0", "b-0", "c-0"})
    assert list(scrape.samples) == ["a-0"] and scrape.samples["a-0"][0].util_pct == 40.0
    assert [(g.index, pods) for g, pods in scrape.shared.items()] == [(0, ["a-0", "b-0"])]
    assert scrape.unattributed == [] and [g.index for g in scrape.mig] == [1]


def test_other_metrics_and_malformed_lines_are_ignored():
    text = "\n".join(["DCGM_FI_DEV_POWER_USAGE_TOTAL" + (LABELS % (0, 0, 0, ',namespace="ns",pod="p"')) + " 1",
                      line("DCGM_FI_DEV_POWER_USAGE", 0, "not-a-number", ',namespace="ns",pod="p"'),
                      'DCGM_FI_DEV_POWER_USAGE{gpu="all",namespace="ns",pod="p"} 5',
                      ' DCGM_FI_DEV_POWER_USAGE{gpu="0",namespace="ns",pod="p"} 5', "# DCGM_FI_DEV_POWER_USAGE 5"])
    assert dcgm.parse_scrape(text, 1.0, "ns", {"p"}).samples == {}


def scrape_at(t: float, mj: float | None, power: float = 500.0) -> dcgm.Scrape:
    pod = ',container="engine",namespace="ns",pod="p"'
    lines = [line("DCGM_FI_DEV_POWER_USAGE", 0, f"{power:f}", pod), line("DCGM_FI_DEV_POWER_USAGE", 1, "70.0", pod)]
    if mj is not None:
        lines.append(line(dcgm.ENERGY, 0, f"{mj:.0f}", pod))
    return dcgm.parse_scrape("\n".join(lines), t, "ns", {"p"})


def test_a_reading_the_exporter_serves_again_is_kept_once():
    kept, last = dcgm.fresh(scrape_at(1.0, 5000), {})
    assert [s.gpu for s in kept.samples["p"]] == [0, 1] and last == {("p", 0): 5000}
    again, last = dcgm.fresh(scrape_at(2.0, 5000, power=480.0), last)    # the same collection, scraped again
    assert [s.gpu for s in again.samples["p"]] == [1] and again.energy_mj == {}   # GPU 1 has no counter: kept
    moved, last = dcgm.fresh(scrape_at(3.0, 505000), last)
    assert [s.gpu for s in moved.samples["p"]] == [0, 1] and moved.energy_mj == {("p", 0): 505000}
    assert last == {("p", 0): 505000}


def test_each_sample_carries_its_gpus_energy_counter_and_a_windows_energy_is_its_rise():
    samples = [scrape_at(t, mj).samples["p"][0] for t, mj in ((1.0, 5000), (2.0, 505000), (3.0, 1005000))]
    assert [s.energy_mj for s in samples] == [5000, 505000, 1005000]
    assert energy_j(samples, 1.5, 2.5) == pytest.approx(500.0)                     # 500 W by the counter
    # a burst between two 1-s readings is in the counter, whatever the instants the power samples saw
    bursty = [Sample(t, 0, 0.0, 0.0, 100.0, 0.0, mj) for t, mj in ((0.0, 0.0), (1.0, 300_000.0), (2.0, 1e6))]
    assert energy_j(bursty, 0.0, 2.0) == pytest.approx(1000.0)
    assert math.isnan(energy_j(bursty, -0.1, 2.0))                                 # not covered
    assert math.isnan(energy_j([Sample(t, 0, 0, 0, 1, 0, mj) for t, mj in ((0.0, 9e6), (1.0, 10.0))], 0.0, 1.0))
