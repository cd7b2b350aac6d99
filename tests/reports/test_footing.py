"""reports/footing.py: the GPU footing the verdict stands on, one sentence from the report's metadata — every
configuration on the same count, scaled to a GPU budget (saying which leave part of it unused), unequal (with how
to equalise them), or all on one shared GPU — and where it shows: report.md and report.html under `## Verdict`, and
the terminal's closing Verdict lines."""
from __future__ import annotations

import html

import pytest

from epdbench.analysis.compare import compare
from epdbench.analysis.metrics import summarize
from epdbench.flows.outputs import report_meta
from epdbench.reports.footing import gpu_footing
from epdbench.reports.render import render_html, render_markdown, report_context
from epdbench.reports.verdict import verdict_lines
from epdbench.specs.budget import resolve_gpu_budget
from epdbench.specs.models import load_spec
from tests.reports.synthetic_run import synthetic_records, synthetic_verdicts

UNEQUAL = ("Unequal GPU counts (aggregated 1, pd-tcp 2, epd 3, epd-rdma 3): throughput per GPU is normalised, "
           "latency compares deployments of different sizes — set cost.gpu_budget or --gpu-budget to compare at an "
           "equal budget.")


def meta_of(preset: str, budget: int | None = None) -> dict:
    """The report's metadata as the flow writes it, for a preset run at `budget`."""
    spec = load_spec(preset)
    return report_meta(resolve_gpu_budget(spec, budget) if budget else spec, "r", {})


@pytest.mark.parametrize("budget, sentence", [
    (None, UNEQUAL),
    (6, "GPU budget 6: aggregated ×6 replicas (6 GPUs), pd-tcp ×3 (6), epd ×2 (6), epd-rdma ×2 (6)."),
    (4, "GPU budget 4: aggregated ×4 replicas (4 GPUs), pd-tcp ×2 (4), epd as written (3), epd-rdma as written (3); "
        "epd uses 3 of 4, epd-rdma uses 3 of 4."),
    (3, "GPU budget 3: aggregated ×3 replicas (3 GPUs), pd-tcp as written (2), epd as written (3), epd-rdma as "
        "written (3); pd-tcp uses 2 of 3.")])
def test_the_unequal_preset_said_without_and_with_a_budget(budget, sentence):
    assert gpu_footing(meta_of("epd-multimodal", budget)) == sentence


def test_equal_counts_are_said_once():
    assert gpu_footing(meta_of("pd-text")) == "Every configuration on 6 GPUs."
    assert gpu_footing({"configurations": [{"name": "aggregated", "gpus": 1}]}) == "Every configuration on 1 GPU."
    assert gpu_footing(meta_of("pd-text", 6)) == ("GPU budget 6: aggregated as written (6 GPUs), pd-tcp as written "
                                                  "(6), pd-rdma as written (6).")


def test_engines_sharing_one_gpu_are_said_so():
    meta = meta_of("gpu-qwen25vl")
    assert meta["gpu_share"] and {c["gpus"] for c in meta["configurations"]} == {1}
    assert gpu_footing(meta) == ("Every configuration on one shared GPU (target.local.gpu_share): PD and EPD ran "
                                 "their roles side by side on its compute and memory.")


def test_a_run_from_before_budgets_reads_from_its_gpu_counts():
    meta = meta_of("epd-multimodal")
    for c in meta["configurations"]:
        del c["budget_scale"]
    del meta["gpu_budget"]
    assert gpu_footing(meta) == UNEQUAL
    assert gpu_footing({"configurations": []}) is None


@pytest.fixture(scope="module")
def budgeted_run():
    spec = resolve_gpu_budget(load_spec("epd-multimodal"), 4)
    meta = report_meta(spec, "r", {})
    summary = summarize(synthetic_records(spec), {c["name"]: c["gpus"] for c in meta["configurations"]})
    return spec, meta, summary


def test_the_report_opens_its_verdict_with_the_footing(budgeted_run):
    spec, meta, summary = budgeted_run
    context = report_context({**meta, "created": "2026-01-01T00:00:00"}, summary, synthetic_verdicts(spec))
    md = render_markdown(context)
    verdict = md.split("## Verdict\n\n", 1)[1]
    assert verdict.startswith(f"**GPU footing:** {gpu_footing(meta)}\n")
    page = render_html(context)
    section = page.split('<h2 id="verdict">Verdict</h2>', 1)[1]
    assert html.unescape(section).lstrip().startswith(f"<p><strong>GPU footing:</strong> {gpu_footing(meta)}</p>")


def test_the_terminals_verdict_lines_carry_it_under_their_first(budgeted_run):
    _, meta, summary = budgeted_run
    comparisons = compare(summary)
    lines = verdict_lines(comparisons, gpu_footing(meta))
    assert lines[0].startswith("Verdict (report.md opens with it)")
    assert lines[1] == "  " + gpu_footing(meta) and lines[2:] == verdict_lines(comparisons)[1:]
