"""The GPU footing in MLflow (tasks/publishing/publish.py, real SQLite store, synthetic folder): the comparison run's
tags `epdbench.gpu_budget` and `epdbench.gpu_footing`, and each configuration run's params `gpus` (what it ran on)
and `budget_scale` (the factor its replicas were multiplied by)."""
from __future__ import annotations

import json

from epdbench.flows.outputs import report_meta
from epdbench.reports.footing import gpu_footing
from epdbench.specs.budget import resolve_gpu_budget
from epdbench.specs.models import load_spec, spec_to_yaml
from epdbench.tasks.publishing import mlflow_check, publish
from tests.tasks.publishing.test_publish import (CONFIGS, RUN, all_runs, uri, write_comparison, write_config,  # noqa: F401
                                                 write_spec)


def published(rdir, uri, budget: int | None) -> dict:
    """Publish a folder of the tiny spec's aggregated and pd-tcp at `budget`; its runs by kind."""
    write_spec(rdir)
    spec = resolve_gpu_budget(load_spec(str(rdir / "spec.yaml")), budget)
    (rdir / "spec.yaml").write_text(spec_to_yaml(spec))           # the resolved spec, as the flow writes it
    publish.save_state(rdir, publish.load_state(rdir, RUN))
    for name in CONFIGS:
        write_config(rdir, name)
    write_comparison(rdir)
    outcome = json.loads((rdir / "outcome.json").read_text())
    (rdir / "outcome.json").write_text(json.dumps({**outcome, "meta": report_meta(spec, RUN, {})}))
    publish.sync_results(rdir, uri)
    assert mlflow_check.mlflow_matches_results(uri, rdir) == []
    runs: dict = {}
    for r in all_runs(uri):
        runs.setdefault(r.data.tags["epdbench.kind"], []).append(r)
    return runs


def test_a_budgeted_comparison_says_its_footing_and_each_configurations_scale(tmp_path, uri):  # noqa: F811
    runs = published(tmp_path / "results" / "budget", uri, 3)
    (parent,) = runs["comparison"]
    assert parent.data.tags["epdbench.gpu_budget"] == "3"
    assert parent.data.tags["epdbench.gpu_footing"] == ("GPU budget 3: aggregated ×3 replicas (3 GPUs), pd-tcp as "
                                                        "written (2); pd-tcp uses 2 of 3.")
    params = {r.data.tags["epdbench.config"]: r.data.params for r in runs["configuration"]}
    assert {n: (p["gpus"], p["budget_scale"], p["roles"]) for n, p in params.items()} == {
        "aggregated": ("3", "3", "3×server TP1"), "pd-tcp": ("2", "1", "1×prefill TP1 + 1×decode TP1")}


def test_without_a_budget_the_tags_say_none_and_the_unequal_counts(tmp_path, uri):  # noqa: F811
    runs = published(tmp_path / "results" / "plain", uri, None)
    (parent,) = runs["comparison"]
    assert parent.data.tags["epdbench.gpu_budget"] == "none"
    assert parent.data.tags["epdbench.gpu_footing"] == gpu_footing(
        {"configurations": [{"name": "aggregated", "gpus": 1}, {"name": "pd-tcp", "gpus": 2}]})
    assert {r.data.params["budget_scale"] for r in runs["configuration"]} == {"1"}
