"""reports/pareto.py and the Pareto plot: the report's "Throughput per GPU against interactivity" section (table,
plot, price or how to give one, energy never invented), the terminal's line per suite and the comparison run's
cost and frontier metrics."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from epdbench.analysis.metrics import SUMMARY_COLUMNS
from epdbench.analysis.pareto import pareto_points
from epdbench.reports.mlflow_names import is_valid_name
from epdbench.reports.pareto import energy_text, pareto_lines, pareto_metrics, pareto_view, usd
from epdbench.reports.plots import pareto_plots
from epdbench.reports.render import render_html, render_markdown, report_context
from epdbench.reports.terminal import print_summary
from tests.analysis.test_pareto import row
from tests.reports.report_checks import parse_html
from tests.reports.test_render import VERDICTS, meta

PNG = b"\x89PNG\r\n\x1a\n"
CONFIGS = ["aggregated", "pd-rdma"]


def summary() -> pd.DataFrame:
    """Two shapes of suite fixed: at 512/64 aggregated leads at c=1 and pd-rdma at c=8 (both on the frontier); at
    4096/64 aggregated is behind pd-rdma beyond the noise at both loads. Suite mm: one cell each, a tie."""
    return pd.DataFrame([
        row("aggregated", 10, 100), row("aggregated", 25, 400, 8), row("pd-rdma", 14, 80), row("pd-rdma", 20, 600, 8),
        row("aggregated", 40, 50, workload="4096/64"), row("aggregated", 80, 150, 8, workload="4096/64"),
        row("pd-rdma", 20, 120, workload="4096/64"), row("pd-rdma", 40, 450, 8, workload="4096/64"),
        row("aggregated", 20, 90, 2, workload="1k:560px+200/8", suite="mm"),
        row("pd-rdma", 20, 90, 2, workload="1k:560px+200/8", suite="mm")])


def full(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows with every summary column the rest of the report reads."""
    base = {c: None for c in SUMMARY_COLUMNS} | {"requests_failed": 0, "ttft_p50_ms": 100.0, "itl_p99_ms": 30.0}
    return pd.DataFrame([{**base, **r} for r in frame.to_dict("records")])


def render(price: float | None, target: str = "sim", with_plots: bool = True, frame: pd.DataFrame | None = None):
    frame = summary() if frame is None else frame
    points = pareto_points(frame, price)
    plots = pareto_plots(points, CONFIGS, "note") if with_plots else []
    ctx = report_context(meta(target), full(frame), VERDICTS,
                         pareto=pareto_view(points, meta(target), price, plots))
    return render_markdown(ctx), render_html(ctx), plots


def section(md: str) -> str:
    return md[md.index("## Throughput per GPU against interactivity"):md.index("## Where TTFT goes")]


def test_a_png_per_suite_with_its_caption():
    plots = pareto_plots(pareto_points(summary()), CONFIGS, "note")
    assert [p.name for p in plots] == ["fixed-pareto.png", "mm-pareto.png"]
    assert all(p.png.startswith(PNG) and len(p.png) > 10000 for p in plots)
    assert plots[0].title == "Throughput per GPU against interactivity, suite fixed"
    assert "Ringed: the Pareto frontier of its shape" in plots[0].caption
    assert "one trial" in plots[0].caption


def test_the_staircase_runs_through_the_points_nothing_matches_on_both_axes():
    from epdbench.reports.plots import _envelope
    x, y = _envelope(np.array([117.6, 116.4, 116.5, 119.0, 110.0]), np.array([109.0, 105.7, 100.0, 50.0, 109.0]))
    assert x.tolist() == [117.6, 119.0] and y.tolist() == [109.0, 50.0]


def test_no_plot_without_a_placed_point():
    unplaced = pd.DataFrame([row("aggregated", None, 100), row("pd-rdma", None, 80)])
    assert pareto_plots(pareto_points(unplaced), CONFIGS) == []
    assert pareto_plots(pareto_points(pd.DataFrame()), CONFIGS) == []


def test_the_section_with_a_price_lists_the_frontier_and_costs_and_embeds_the_plot():
    md, html, plots = render(2.0)
    text = section(md)
    assert "> **Simulator: the cost model's figures on emulated hardware, not a measurement.**" in text
    assert "- Cost per million output tokens: at $2 per GPU-hour" in text
    assert "- Energy per token (J): unavailable — the simulator has no GPU whose power could be read" in text
    fixed = text[text.index("### Suite `fixed`"):text.index("### Suite `mm`")]
    rows = [line for line in fixed.splitlines() if line.startswith("| 512/64") or line.startswith("| 4096/64")]
    # most interactive first; 4096/64 aggregated is off its frontier; costs = 2 / 3600 / tok/s per GPU × 1e6
    assert rows[:3] == ["| 512/64 | aggregated | c=1 | 100.0 | 100.0 | $5.56 |",
                        "| 512/64 | pd-rdma | c=8 | 50.0 | 600.0 | $0.926 |",
                        "| 4096/64 | pd-rdma | c=1 | 50.0 | 120.0 | $4.63 |"]
    assert "| aggregated | 512/64 | c=1: $5.56 · c=8: $1.39 |" in fixed
    assert "On no frontier of this suite" not in fixed          # aggregated is on the 512/64 one
    assert "![Throughput per GPU against interactivity, suite fixed](plots/fixed-pareto.png)" in fixed
    page = parse_html(html)
    assert len(page.images) == len(plots) == 2
    assert "<th>$ per M output tokens</th>" in html and "at $2 per GPU-hour" in html


def test_without_a_price_the_section_says_how_to_give_one_and_shows_no_cost():
    md, html, _ = render(None)
    text = section(md)
    assert ("none, as no price per GPU-hour was given: set `cost: {gpu_hour_usd: 2.5}` in the spec, or run "
            "`epdbench compare --gpu-hour-usd 2.5`") in text
    assert "$" not in text.replace("$ per M", "")
    assert "<code>epdbench compare --gpu-hour-usd 2.5</code>" in html
    assert "| Shape | Configuration | Load | tok/s per user | tok/s per GPU |\n" in text


def test_a_configuration_on_no_frontier_is_named():
    md, _, _ = render(None, with_plots=False, frame=summary().query("workload != '512/64'"))
    assert "On no frontier of this suite: aggregated." in section(md)
    assert "](plots/" not in section(md)         # no plots given: none referenced


def test_energy_is_never_invented_on_any_target():
    assert energy_text({"target": "sim"}).startswith("unavailable — the simulator has no GPU")
    assert energy_text({"target": "kubernetes"}) == (
        "unavailable — no GPU power was read on this run (the cluster's DCGM exporter: see the run's log for why), "
        "and epdbench never estimates it")
    assert energy_text({"target": "local", "device": "cpu"}).startswith("unavailable — the engines ran on CPU")
    assert set(pareto_points(summary(), 2.0)["energy_j_per_token"]) == {None}
    md, _, _ = render(2.0, target="kubernetes")
    assert "Simulator:" not in section(md) and "no GPU power was read on this run" in section(md)
    assert "J per output token" not in section(md)


def measured() -> pd.DataFrame:
    """summary() with the GPUs read on every cell of suite fixed (two trials of aggregated c=1, 0.5 and 0.7 J per
    token), and nothing read on suite mm."""
    rows = []
    for r in summary().to_dict("records"):
        if r["suite"] == "fixed":
            r.update(gpu_samples=40, gpu_util_pct_mean=80.0, gpu_mem_used_mib_max=70_000.0, gpu_power_w_mean=500.0,
                     gpu_sm_clock_mhz_mean=1980.0, gpu_energy_j=900.0, energy_j_per_token=0.5)
        rows.append(r)
    rows.append({**rows[0], "trial": 1, "energy_j_per_token": 0.7, "gpu_util_pct_mean": 60.0})
    return pd.DataFrame(rows)


def test_measured_energy_per_token_and_the_gpus_figures_are_shown_where_read():
    points = pareto_points(measured(), 2.0)
    agg1 = points[(points["config"] == "aggregated") & (points["concurrency"] == 1)
                  & (points["workload"] == "512/64")].iloc[0]
    assert agg1["energy_j_per_token"] == pytest.approx(0.6)          # the mean over the two trials
    assert set(points[points["suite"] == "mm"]["energy_j_per_token"]) == {None}
    md, html, _ = render(2.0, target="local", frame=measured())
    text = section(md)
    assert "Energy per token (J): the energy the configuration's GPUs drew over each cell's measured window (read " \
           "by NVML on this host" in text
    assert "| Shape | Configuration | Load | tok/s per user | tok/s per GPU | $ per M output tokens | J per output " \
           "token |" in text
    assert "| aggregated | 512/64 | c=1 | 70 % | 68.4 GiB | 500 W | 1980 MHz | 0.6 J |" in text
    mm = text[text.index("### Suite `mm`"):]
    assert "The GPUs over each cell's measured window" not in mm and "| c=2 | 50.0 | 90.0 | $6.17 | — |" in mm
    assert "<th>J per output token</th>" in html and "<td class=\"num\">0.6 J</td>" in html
    lines = pareto_lines(points, {"target": "local"})
    assert "(least energy pd-rdma 0.5 J/output token at c=1)" in lines[0] or \
           "(least energy aggregated 0.5 J/output token at c=8)" in lines[0]
    metrics = pareto_metrics(points, CONFIGS)
    assert metrics["energy_j_per_token.fixed.512/64.c1.aggregated"] == pytest.approx(0.6)
    assert not [k for k in metrics if k.startswith("energy_j_per_token.mm.")]


def test_usd_keeps_three_figures_below_a_dollar():
    assert [usd(v) for v in (1234.5, 5.555, 1.0, 0.92593, 0.0412, 0.0, None)] == [
        "$1,234.50", "$5.55", "$1.00", "$0.926", "$0.0412", "$0.00", "—"]


def test_one_terminal_line_per_suite_names_the_frontier_and_the_cheapest():
    lines = pareto_lines(pareto_points(summary(), 2.0), meta())
    assert lines == [
        "Pareto frontier, suite fixed (output tok/s per GPU against tok/s per user) — simulated: 512/64: aggregated, "
        "pd-rdma (cheapest pd-rdma $0.926/M output tokens at c=8); 4096/64: pd-rdma (cheapest pd-rdma $1.23/M output "
        "tokens at c=8)",
        "Pareto frontier, suite mm (output tok/s per GPU against tok/s per user) — simulated: 1k:560px+200/8: "
        "aggregated, pd-rdma (cheapest aggregated $6.17/M output tokens at c=2)"]
    plain = pareto_lines(pareto_points(summary()), meta("kubernetes"))
    assert plain[0] == ("Pareto frontier, suite fixed (output tok/s per GPU against tok/s per user): 512/64: "
                        "aggregated, pd-rdma; 4096/64: pd-rdma")


def test_the_terminal_prints_the_lines(tmp_path):
    full(summary()).to_csv(tmp_path / "summary.csv", index=False)
    lines = pareto_lines(pareto_points(summary()), meta())
    outcome = {"results_dir": str(tmp_path), "mlflow_url": "http://x", "pareto": lines,
               "configs": {n: {"ok": True, "transport": "emulated", "stages": "emulated"} for n in CONFIGS}}
    out = io.StringIO()
    print_summary(outcome, Console(file=out, width=140))
    assert all(line in out.getvalue() for line in lines)


def test_mlflow_metrics_cost_per_cell_and_frontier_points_per_configuration():
    frame = pd.concat([summary(), pd.DataFrame([row("epd", 10, 300, 2, suite="mixed", stream="burst",
                                                    workload="1024-2048/8")])])
    metrics = pareto_metrics(pareto_points(frame, 3.6), [*CONFIGS, "epd"])
    assert all(is_valid_name(k) for k in metrics)
    assert metrics["cost_usd_per_mtok.fixed.512/64.c1.aggregated"] == pytest.approx(10.0)
    assert metrics["cost_usd_per_mtok.mm.1k_560px_200/8.c2.pd-rdma"] == pytest.approx(1000 / 90)
    assert metrics["cost_usd_per_mtok.mixed.1024-2048/8.c2.burst.epd"] == pytest.approx(1000 / 300)
    assert metrics["frontier_points.fixed.aggregated"] == 1.0 and metrics["frontier_points.fixed.pd-rdma"] == 3.0
    assert metrics["frontier_points.fixed.epd"] == 0.0 and metrics["frontier_points.mixed.epd"] == 1.0
    unpriced = pareto_metrics(pareto_points(frame), CONFIGS)
    assert not any(k.startswith("cost_usd_per_mtok.") for k in unpriced) and "frontier_points.mm.pd-rdma" in unpriced


def test_a_results_folder_priced_in_its_spec_renders_plots_and_costs(tmp_path, tiny_spec):
    from epdbench.specs.models import spec_to_yaml
    from epdbench.tasks.rundir.report_files import rerender
    from epdbench.tasks.rundir.results import append_records, write_json
    from tests.reports.synthetic_run import synthetic_meta, synthetic_records, synthetic_verdicts

    spec = tiny_spec.model_copy(update={"cost": tiny_spec.cost.model_copy(update={"gpu_hour_usd": 3.6})})
    append_records(tmp_path / "records.parquet", synthetic_records(spec).to_dict("records"))
    (tmp_path / "spec.yaml").write_text(spec_to_yaml(spec))
    write_json(tmp_path / "outcome.json", {"meta": synthetic_meta(spec), "verdicts": synthetic_verdicts(spec)})
    rerender(tmp_path)
    report = (tmp_path / "report.md").read_text()
    for suite in spec.suites:
        png = tmp_path / "plots" / f"{suite.name}-pareto.png"
        assert png.read_bytes().startswith(PNG)
        assert f"](plots/{suite.name}-pareto.png)" in report
    assert "at $3.6 per GPU-hour" in section(report) and "Cost per million output tokens, by load:" in report
