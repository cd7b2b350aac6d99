"""benchmarks/pipeline/quickstart_decisions.py: what it counts from a run's summary — the Verdict's decisions named
and in all, contaminated configuration × cell rows, and headline findings on a contaminated cell (none)."""
from __future__ import annotations

from epdbench.analysis.compare import compare
from epdbench.analysis.metrics import summarize
from epdbench.reports.verdict import verdict_view
from epdbench.specs.models import load_spec
from tests.benchmark_scripts import load_benchmark
from tests.reports.synthetic_run import synthetic_records


def test_it_counts_what_the_verdict_shows_and_no_finding_stands_on_a_contaminated_cell():
    bench = load_benchmark("pipeline/quickstart_decisions")
    spec = load_spec("pd-text")
    summary = summarize(synthetic_records(spec), {c.name: c.gpus for c in spec.configurations})
    configs = [{"name": c.name, "topology": c.topology} for c in spec.configurations]
    clean = bench.tally(summary, configs)
    view = verdict_view(compare(summary))
    assert (clean["named"], clean["total"], clean["contaminated"]) == (view["decided"], view["total"], 0)
    assert clean["findings"] > 0 and clean["spoilt_findings"] == 0
    assert clean["cells"] == len(summary.drop_duplicates(["config", "suite", "workload", "concurrency", "stream"]))
    first = summary.iloc[0]
    same_cell = ((summary["suite"] == first["suite"]) & (summary["workload"] == first["workload"])
                 & (summary["concurrency"] == first["concurrency"]) & (summary["stream"] == first["stream"]))
    spoilt = summary.assign(contaminated=same_cell & (summary["config"] == first["config"]))
    counted = bench.tally(spoilt, configs)
    assert counted["contaminated"] == 1 and counted["spoilt_findings"] == 0
    assert counted["total"] == clean["total"] and counted["named"] <= clean["named"]
