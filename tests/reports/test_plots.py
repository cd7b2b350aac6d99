"""reports/plots.py: three PNG plots per suite, captions from the data, nothing drawn without data."""
from __future__ import annotations

import pytest

from epdbench.analysis.metrics import summarize
from epdbench.reports.plots import suite_plots
from tests.reports.synthetic_run import synthetic_records

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tiny_spec):
    records = synthetic_records(tiny_spec)
    summary = summarize(records, {c.name: c.gpus for c in tiny_spec.configurations})
    configs = [c.name for c in tiny_spec.configurations]
    return records, summary, configs, suite_plots(summary, records, configs)


def test_two_png_plots_per_suite_at_one_concurrency(run, tiny_spec):
    plots = run[3]           # every tiny suite runs at one concurrency: no plot versus concurrency
    assert [p.name for p in plots] == [f"{s.name}-{kind}.png" for s in tiny_spec.suites
                                      for kind in ("itl-cdf", "throughput-per-gpu")]
    for p in plots:
        assert p.png.startswith(PNG) and len(p.png) > 5000
        assert p.data_uri().startswith("data:image/png;base64,iVBORw0KGgo")


def test_cdf_caption_counts_the_summary_gaps(run):
    _, summary, _, plots = run
    cdf = next(p for p in plots if p.name == "mixed-itl-cdf.png")
    burst = summary[(summary["suite"] == "mixed") & (summary["stream"] == "burst")]
    assert "1024-2048/8 (burst), concurrency 2" in cdf.caption          # the longer stream
    for _, r in burst.iterrows():
        assert f"{r['config']} {r['n_itl_samples']}" in cdf.caption


def test_a_suite_at_several_concurrencies_gets_latency_versus_concurrency(tiny_spec):
    fixed = tiny_spec.suites[0].model_copy(update={"concurrencies": [1, 4]})
    spec = tiny_spec.model_copy(update={"suites": [fixed]})
    records = synthetic_records(spec)
    plots = suite_plots(summarize(records, {c.name: c.gpus for c in spec.configurations}), records,
                        [c.name for c in spec.configurations])
    assert [p.name for p in plots] == [f"fixed-{k}.png" for k in ("itl-cdf", "latency-vs-concurrency",
                                                                  "throughput-per-gpu")]
    assert all(p.png.startswith(PNG) and len(p.png) > 5000 for p in plots)


def test_no_throughput_plot_without_gpu_counts(run):
    records, _, configs, _ = run
    mm = records[records["suite"] == "mm"]
    plots = suite_plots(summarize(mm), mm, configs)
    assert [p.name for p in plots] == ["mm-itl-cdf.png"]
    assert suite_plots(summarize(records.iloc[0:0]), records.iloc[0:0], configs) == []


def test_every_plot_says_under_it_where_its_figures_come_from():
    from epdbench.reports.plots import plot_note
    assert plot_note({"target": "sim", "clock": "virtual"}) == ("Simulator in virtual time: the cost model's figures, "
                                                                "not a measurement.")
    assert plot_note({"target": "sim", "clock": "real"}).startswith("Simulator: the cost model's figures")
    assert plot_note({"target": "kubernetes", "clock": "real"}) == ""
