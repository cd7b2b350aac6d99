"""analysis/gpu_telemetry.py: nvidia-smi's sample lines read as they are printed, a window's figures over the
chosen GPUs, energy integrated between samples and cut at the window's ends, and nothing guessed where a reading
is missing or the samples do not cover the window."""
from __future__ import annotations

import math

import pytest

from epdbench.analysis import gpu_telemetry as g


def lines(rows) -> str:
    """rows of (second, gpu, util, mem, power, clock) as nvidia-smi prints them (csv,noheader,nounits)."""
    return "".join(f"2026/12/05 17:21:{sec:06.3f}, {gpu}, {u}, {m}, {p}, {c}\n" for sec, gpu, u, m, p, c in rows)


SAMPLES = g.parse_samples(lines([
    (0.0, 0, 10, 1000, 100.00, 1500), (0.0, 1, 0, 500, 70.00, 345),
    (1.0, 0, 90, 3000, 300.00, 1980), (1.0, 1, 50, 700, 170.00, 1980),
    (2.0, 0, 90, 3000, 300.00, 1980), (2.0, 1, 50, 900, 170.00, 1980),
]))
T0 = SAMPLES[0].t


def test_the_query_and_the_lines_it_prints_are_read_back_with_the_drivers_own_instants():
    assert g.smi_command(250) == [
        "nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw,clocks.sm",
        "--format=csv,noheader,nounits", "-lms=250"]
    s = SAMPLES[2]
    assert (s.gpu, s.util_pct, s.mem_used_mib, s.power_w, s.sm_clock_mhz) == (0, 90, 3000, 300.0, 1980)
    assert s.t - T0 == pytest.approx(1.0)
    assert g.epoch_of_smi_timestamp("2026/12/05 17:21:00.500") - T0 == pytest.approx(0.5)


def test_a_line_cut_by_the_samplers_end_is_dropped_and_any_other_bad_line_is_named():
    cut = lines([(0.0, 0, 1, 2, 3.0, 4)]) + "2026/12/05 17:21:01.000, 0, 5"
    assert len(g.parse_samples(cut)) == 1
    with pytest.raises(g.TelemetryError, match=r"telemetry line 1: .*3 fields, not 6"):
        g.parse_samples("2026/12/05 17:21:01.000, 0, 5\n" + lines([(0.0, 0, 1, 2, 3.0, 4)]))
    assert math.isnan(g.parse_samples("2026/12/05 17:21:01.000, 0, 5, 6, [N/A], 7\n")[0].power_w)


def test_energy_is_the_trapezoids_cut_at_the_windows_ends():
    gpu0 = [s for s in SAMPLES if s.gpu == 0]
    assert g.energy_j(gpu0, T0, T0 + 2) == pytest.approx(200 + 300)          # (100+300)/2·1 + 300·1
    assert g.energy_j(gpu0, T0 + 0.5, T0 + 1.5) == pytest.approx(125 + 150)  # 200→300 over 0.5 s, then 300 flat
    assert math.isnan(g.energy_j(gpu0, T0 - 1, T0 + 1))                      # not covered: no figure
    assert math.isnan(g.energy_j(gpu0, T0 + 1, T0 + 1))


def test_a_windows_figures_over_the_chosen_gpus():
    both = g.window(SAMPLES, T0 + 0.5, T0 + 2)
    assert set(both) == set(g.FIGURES)
    assert both["gpu_samples"] == 4
    assert both["gpu_util_pct_mean"] == pytest.approx((90 + 50 + 90 + 50) / 4)
    assert both["gpu_power_w_mean"] == pytest.approx((300 + 170 + 300 + 170) / 4)
    assert both["gpu_mem_used_mib_max"] == 3900                               # the largest sum at one instant
    assert both["gpu_energy_j"] == pytest.approx((125 + 300) + (72.5 + 170))  # gpu 1: 120→170 over 0.5 s, then flat
    one = g.window(SAMPLES, T0 + 0.5, T0 + 2, gpus=[1])
    assert one["gpu_mem_used_mib_max"] == 900 and one["gpu_energy_j"] == pytest.approx(242.5)


def test_nothing_is_invented_where_there_is_no_reading():
    gap = g.parse_samples(lines([(0.0, 0, 10, 1000, 100.0, 1500)]) + "2026/12/05 17:21:01.000, 0, 5, 6, [N/A], 7\n")
    w = g.window(gap, T0, T0 + 1)
    assert w["gpu_energy_j"] is None and w["gpu_power_w_mean"] == 100.0
    empty = g.window([], T0, T0 + 1)
    assert empty == {"gpu_samples": 0, "gpu_util_pct_mean": None, "gpu_power_w_mean": None,
                     "gpu_sm_clock_mhz_mean": None, "gpu_mem_used_mib_max": None, "gpu_energy_j": None}
    assert g.energy_per_token(None, 10) is None and g.energy_per_token(50.0, 0) is None
    assert g.energy_per_token(50.0, 100) == 0.5


def test_neutral_csv_round_trips_samples_per_host_and_keeps_missing_figures_missing():
    a = [g.Sample(100.0, 0, 50.0, 1000.0, 300.5, 1980.0), g.Sample(100.2, 0, math.nan, 1001.0, 301.0, 1980.0)]
    b = [g.Sample(100.1, 1, 10.0, 20.0, 70.0, 1100.0)]
    text = g.samples_csv(a, "nvidia-smi") + g.samples_csv(b, "dcgm", host="pod-b", header=False)
    back = g.parse_samples_csv(text)
    assert set(back) == {"", "pod-b"}
    assert back["pod-b"] == b
    assert back[""][0] == a[0] and math.isnan(back[""][1].util_pct) and back[""][1].power_w == 301.0


def test_neutral_csv_refuses_another_header_and_a_bad_line_but_drops_a_cut_last_line():
    good = g.samples_csv([g.Sample(1.0, 0, 1, 2, 3, 4)], "nvidia-smi")
    assert len(g.parse_samples_csv(good + "2.0,,0,1,2")[""]) == 1
    with pytest.raises(g.TelemetryError, match="header"):
        g.parse_samples_csv("time,gpu\n1,0\n")
    with pytest.raises(g.TelemetryError, match="line 2"):
        g.parse_samples_csv(good.replace("1.000,", "x,") + "3.0,,0,1,2,3,4,dcgm\n")
    assert g.parse_samples_csv("") == {}


def test_the_drivers_energy_counter_is_preferred_to_the_power_trapezoids_and_a_reset_gives_no_figure():
    pts = [g.Sample(10.0, 0, 0, 0, 100.0, 0, 5_000.0), g.Sample(11.0, 0, 0, 0, 300.0, 0, 5_250.0),
           g.Sample(12.0, 0, 0, 0, 300.0, 0, 5_550.0)]
    assert g.energy_j(pts, 10.5, 12.0) == pytest.approx((5_550 - 5_125) / 1000)   # counter, interpolated at 10.5
    no_counter = [g.Sample(s.t, s.gpu, s.util_pct, s.mem_used_mib, s.power_w, s.sm_clock_mhz) for s in pts]
    assert g.energy_j(no_counter, 10.0, 12.0) == pytest.approx(200 + 300)          # trapezoids
    reset = pts[:2] + [g.Sample(12.0, 0, 0, 0, 300.0, 0, 40.0)]
    assert math.isnan(g.energy_j(reset, 10.0, 12.0))


def rec(send, e2e, out, phase="measured", ok=True):
    return {"send_wall_s": send, "e2e_ms": e2e, "output_tokens": out, "phase": phase, "ok": ok}


def test_a_cells_window_runs_from_the_first_measured_send_to_the_last_measured_end():
    rows = [rec(T0 - 5, 9_000, 50, phase="warmup"), rec(T0 + 0.5, 500, 10), rec(T0 + 0.6, 1_400, 30),
            rec(T0 + 0.7, None, 0, ok=False)]
    assert g.measured_window(rows) == pytest.approx((T0 + 0.5, T0 + 2.0, 40))
    assert g.measured_window([rec(T0, 100, 3, phase="warmup")]) is None
    figures = g.cell_telemetry(SAMPLES, rows)
    assert set(figures) == set(g.COLUMNS)
    assert figures["gpu_energy_j"] == pytest.approx((125 + 300) + (72.5 + 170))
    assert figures["energy_j_per_token"] == pytest.approx(figures["gpu_energy_j"] / 40)
    assert g.cell_telemetry([], rows) == {c: None for c in g.COLUMNS}
    late = g.cell_telemetry(SAMPLES, [rec(T0 + 1.5, 2_000, 10)])   # past the last sample: no energy, no guess
    assert late["gpu_energy_j"] is None and late["energy_j_per_token"] is None


def test_several_hosts_gpus_are_told_apart():
    a = [g.Sample(1.0, 0, 1, 1, 1, 1)]
    b = [g.Sample(1.0, 0, 2, 2, 2, 2)]
    flat = g.flatten_hosts({"pod-a": a, "pod-b": b})
    assert sorted(s.gpu for s in flat) == [0, 1]
    assert g.window(flat, 0.5, 1.5)["gpu_mem_used_mib_max"] == 3
