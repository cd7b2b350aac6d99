"""The report of a simulated run of each preset (synthetic records over the preset's planned cells):
every section, a suite section and four plots per suite, bold winners, and every headline and ratio
number equal to the summary's."""
from __future__ import annotations

import base64

import pytest

from epdbench.analysis.metrics import summarize
from epdbench.specs.models import load_spec, spec_to_yaml
from epdbench.tasks.rundir.report_files import rerender
from epdbench.tasks.rundir.results import append_records, write_json
from tests.reports.report_checks import (SECTIONS, check_bold_winners, check_headline_matches_summary,
                                         check_ratio_lines_match_summary, parse_html)
from tests.reports.synthetic_run import synthetic_meta, synthetic_records, synthetic_verdicts

PRESETS = ["smoke", "pd-text", "epd-multimodal", "epd-reuse"]


@pytest.fixture(scope="module", params=PRESETS)
def rendered(request, tmp_path_factory):
    spec = load_spec(request.param)
    rdir = tmp_path_factory.mktemp(request.param)
    records = synthetic_records(spec)
    append_records(rdir / "records.parquet", records.to_dict("records"))
    (rdir / "spec.yaml").write_text(spec_to_yaml(spec))
    meta = synthetic_meta(spec)
    write_json(rdir / "outcome.json", {"meta": meta, "verdicts": synthetic_verdicts(spec)})
    rerender(rdir)
    summary = summarize(records, {c["name"]: c["gpus"] for c in meta["configurations"]})
    return spec, rdir, (rdir / "report.md").read_text(), (rdir / "report.html").read_text(), summary


def test_every_section_and_suite_is_there(rendered):
    spec, _, report, _, _ = rendered
    for heading in SECTIONS:
        assert f"\n{heading}\n" in report, heading
    for suite in spec.suites:
        assert f"\n## Suite `{suite.name}`\n" in report
        assert f"\n### Suite `{suite.name}`\n" in report        # its plots
    assert "**Simulator run.**" in report and "on simulator (emulated hardware)" in report


def test_winners_are_bold_and_every_number_matches_the_summary(rendered):
    spec, _, report, _, summary = rendered
    assert sum(check_bold_winners(report, s.name) for s in spec.suites) >= len(spec.suites)
    assert check_headline_matches_summary(report, summary) >= 3
    assert check_ratio_lines_match_summary(report, summary) >= len(spec.suites)


def expected_plots(suite) -> int:
    """ITL CDF, throughput per GPU and throughput per GPU against interactivity, and attainment versus rate (rate
    suite with an SLO) or latency versus concurrency (more than one concurrency)."""
    if getattr(suite, "slo", None) is not None:
        return 4
    levels = ({st.concurrency for st in suite.streams} if hasattr(suite, "streams")
              else set(getattr(suite, "concurrencies", [])))
    return 3 + (len(levels) > 1)


def test_the_plots_of_each_suite_on_disk_and_inline(rendered):
    spec, rdir, report, html, _ = rendered
    files = sorted(p.name for p in (rdir / "plots").glob("*.png"))
    assert len(files) == sum(expected_plots(s) for s in spec.suites)
    assert not any(f.endswith("latency-vs-concurrency.png") and f.split("-latency")[0] in
                   {s.name for s in spec.suites if expected_plots(s) == 3} for f in files)
    for name in files:
        assert f"](plots/{name})" in report
    page = parse_html(html)
    assert len(page.images) == len(files) and page.external == []
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_environment_and_limitations_come_from_the_spec(rendered):
    spec, _, report, _, _ = rendered
    env = report.split("## Environment", 1)[1].split("\n## ", 1)[0]
    assert f"{spec.hardware.gpus_per_node} × {spec.hardware.gpu}" in env
    assert f"--max-model-len {spec.engine.max_model_len}" in env
    gpus = {c.gpus for c in spec.configurations}
    limits = report.split("## Benefits, trade-offs and limitations", 1)[1]
    assert ("Unequal GPU budgets" in limits) == (len(gpus) > 1)
    trials = "A single trial per cell" if spec.trials == 1 else f"{spec.trials} trials per cell"
    assert trials in limits and "Simulator run:" in limits
