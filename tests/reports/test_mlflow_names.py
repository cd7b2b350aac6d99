"""reports/mlflow_names.py: every name a shipped preset gives MLflow passes MLflow's own validation
(mlflow.utils.validation), valid names stay as they are, and two labels never share a name."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import (MAX_ENTITY_KEY_LENGTH, _validate_length_limit, _validate_metric_name,
                                     _validate_param_name, _validate_tag_name)

from epdbench.analysis.compare import VERDICT_METRICS, Comparison
from epdbench.analysis.goodput import GOODPUT_COLUMNS, rate_cells
from epdbench.analysis.metrics import METRIC_KEYS
from epdbench.reports.mlflow_names import MAX_NAME, mlflow_names, readable_name
from epdbench.reports.mlflow_view import verdict_tags, verdict_wins
from epdbench.specs.models import load_spec
from epdbench.specs.workload import plan_cells
from epdbench.tasks.publishing.publish import goodput_metrics

PRESETS = sorted((Path(__file__).parents[2] / "specs").glob("*.yaml"))
FAILED_NAME = "goodput_req_s.epd.capacity.1260px+400/128"     # what MLflow refused in an epd-multimodal run


def refused(name: str) -> str | None:
    """MLflow's reason for refusing `name` as a metric, param or tag key; None when all three take it."""
    try:
        for check in (_validate_metric_name, _validate_param_name, _validate_tag_name):
            check(name)
        _validate_length_limit("Metric name", MAX_ENTITY_KEY_LENGTH, name)
    except MlflowException as e:
        return e.message
    return None


class Recorder:
    """Stands for a Tracker: keeps what would be logged."""

    def __init__(self):
        self.metrics: dict = {}

    def log_metrics(self, run_id, metrics):
        self.metrics.update(metrics)


def preset_names(spec_path: Path, tmp_path: Path) -> dict[str, set[str]]:
    """Every label-made name a preset gives MLflow, by kind, built by the code that publishes them: goodput
    metrics (goodput_metrics over a goodput.csv of every rate shape, per configuration), the verdict tag of
    every planned cell and metric and the wins metrics (mlflow_view)."""
    spec = load_spec(str(spec_path))
    configs = [c.name for c in spec.configurations]
    shapes = sorted({(c.suite, c.shape) for c in rate_cells(spec).values()})
    table = pd.DataFrame([{**dict.fromkeys(GOODPUT_COLUMNS), "config": config, "suite": suite, "shape": shape,
                           "goodput_req_s": 1.0, "goodput_req_s_per_gpu": 0.5}
                          for config in configs for suite, shape in shapes], columns=GOODPUT_COLUMNS)
    table.to_csv(tmp_path / "goodput.csv", index=False)
    recorder = Recorder()
    goodput_metrics(recorder, "parent", tmp_path / "goodput.csv")
    comparisons = [Comparison(c.suite, c.workload, c.concurrency, c.stream, metric, {}, None, None, None, configs[0])
                   for c in plan_cells(spec) for metric in VERDICT_METRICS]
    return {"goodput": set(recorder.metrics), "verdict tags": set(verdict_tags(comparisons)),
            "wins": set(verdict_wins(comparisons, configs)), "rate shapes": {s for _, s in shapes}}


@pytest.mark.parametrize("spec_path", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_name_a_shipped_preset_gives_mlflow_is_valid(spec_path, tmp_path):
    spec = load_spec(str(spec_path))
    names = preset_names(spec_path, tmp_path)
    cells = plan_cells(spec)
    assert len(names["verdict tags"]) == len({(c.suite, c.workload, c.concurrency, c.stream) for c in cells}) \
        * len(VERDICT_METRICS)                                    # one per cell and metric: none merged
    assert len(names["goodput"]) == 2 * len(spec.configurations) * len(names["rate shapes"])
    every = set().union(*(names[k] for k in ("goodput", "verdict tags", "wins")), METRIC_KEYS)
    bad = {n: refused(n) for n in every if refused(n)}
    assert bad == {}
    streams = {c.stream for c in cells}
    assert {readable_name(s) for s in streams} == streams         # stream and configuration names: valid as given
    assert {readable_name(c.name) for c in spec.configurations} == {c.name for c in spec.configurations}


def test_the_name_mlflow_refused_now_passes_and_reads_alike(tmp_path):
    assert refused(FAILED_NAME) is not None and "Names may only contain" in refused(FAILED_NAME)
    made = readable_name(FAILED_NAME)
    assert refused(made) is None and made == "goodput_req_s.epd.capacity.1260px_400/128"
    names = preset_names(next(p for p in PRESETS if p.stem == "epd-multimodal"), tmp_path)
    assert made in names["goodput"]


def test_valid_names_are_kept_as_they_are():
    """Keys logged before (cell metrics the nightly history reads, goodput of text shapes, verdict tags as
    mlflow_view always wrote them) keep their names."""
    kept = [*METRIC_KEYS, "goodput_req_s.pd-tcp.capacity.4096/128", "goodput_req_s_per_gpu.epd.capacity.2048/16",
            "epdbench.verdict.fixed.1k_560px_624/64.c8.burst.ttft_p50_ms", "wins.ttft_p50_ms.pd-rdma",
            "epdbench.param.roles", "mlflow.note.content", "mixed 4096-8192/64", "débit.é", "x" * MAX_NAME]
    assert mlflow_names(kept) == {n: n for n in kept}
    assert all(refused(n) is None for n in kept)


def test_refused_names_become_valid_distinct_and_do_not_depend_on_order():
    labels = ["a+b", "a_b", "a:b", "a@b", "1k:560px+624/128", "1k_560px_624/128", "4096/128@0.5/s", "a//b", "a/./b",
              "/lead", "trail/", "a/../b", "..", ".", "", "x" * 300, "x" * 300 + "y", "🚀", "tab\there", "a/b:c"]
    names = mlflow_names(labels)
    assert {n: refused(v) for n, v in names.items() if refused(v)} == {}
    assert len(set(names.values())) == len(labels)                  # no two labels share a name
    assert names["a_b"] == "a_b" and names["1k_560px_624/128"] == "1k_560px_624/128"   # the valid one keeps it
    assert names["a+b"].startswith("a_b-") and names["a//b"].startswith("a/_/b")
    assert mlflow_names(reversed(labels)) == names
    assert mlflow_names(["a+b"]) == {"a+b": "a_b"}                    # alone, no suffix: readable
