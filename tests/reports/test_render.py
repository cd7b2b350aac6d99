"""reports/render.py: Markdown report from a small summary; one strict Jinja environment."""
from __future__ import annotations

import re

import jinja2
import pandas as pd
import pytest

from epdbench.analysis.metrics import SUMMARY_COLUMNS
from epdbench.reports.render import render_report


def summary_row(config: str, ttft: float, itl: float, tok_s: float) -> dict:
    row = {c: None for c in SUMMARY_COLUMNS}
    row.update(config=config, suite="fixed", workload="4096/64", concurrency=8, stream="main", trial=0,
               requests_ok=8, requests_total=8, requests_failed=0, ttft_p50_ms=ttft, ttft_p95_ms=ttft * 1.2,
               ttft_p99_ms=ttft * 1.3, tpot_p50_ms=None, itl_p99_ms=itl, itl_max_ms=itl * 2, output_tok_s=tok_s,
               req_s=tok_s / 64, n_ttft_samples=8, n_itl_samples=8 * 63)
    return row


SUMMARY = pd.DataFrame([summary_row("aggregated", 154.0, 40.0, 100.0), summary_row("pd-rdma", 10.0, 12.0, 300.0)])


def meta(target: str = "sim") -> dict:
    return {"title": "epdbench: unit", "run": "r1", "spec": "unit", "target": target, "model": "toy/vl",
            "hardware": "H100-SXM5-80GB figures", "seed": 0, "trials": 1, "created": "2026-01-01T00:00:00",
            "configurations": [
                {"name": "aggregated", "topology": "aggregated", "roles": "server×1", "gpus": 1, "transport": "none",
                 "router": "vllm-router"},
                {"name": "pd-rdma", "topology": "pd", "roles": "prefill×1, decode×1", "gpus": 2,
                 "transport": "rdma", "router": "vllm-router"}],
            "failures": {}}


VERDICTS = {
    "aggregated": {"transport": "not-applicable", "transport_reasons": ["no KV moves"], "stages": "emulated",
                   "stage_reasons": ["all seen"], "fraction_seen": {}},
    "pd-rdma": {"transport": "emulated", "transport_reasons": ["rdma emulated"], "stages": "emulated",
                "stage_reasons": ["all seen"], "fraction_seen": {}},
}


@pytest.fixture(scope="module")
def sim_report() -> str:
    return render_report(meta("sim"), SUMMARY, VERDICTS)


def table_row(report: str, config: str) -> list[str]:
    line = next(l for l in report.splitlines() if l.startswith(f"| {config} | 4096/64 |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_better_value_is_bold_and_worse_is_not(sim_report):
    pd_row, agg_row = table_row(sim_report, "pd-rdma"), table_row(sim_report, "aggregated")
    # columns: config, workload, conc., requests, TTFT p50, TTFT p95, TPOT p50, ITL p99, ITL max, tok/s, req/s,
    # tok/s per GPU
    assert pd_row[4] == "**10.0**" and agg_row[4] == "154.0"
    assert pd_row[7] == "**12.0**" and agg_row[7] == "40.0"
    assert pd_row[9] == "**300.0**" and agg_row[9] == "100.0"
    assert pd_row[3] == "8/8"


def test_missing_metric_is_a_dash_never_bold_or_zero(sim_report):
    for config in ("pd-rdma", "aggregated"):
        assert table_row(sim_report, config)[6] == "—"


def test_ratio_lines(sim_report):
    assert re.search(r"TTFT p50 \(ms\) pd-rdma 10\.0 vs aggregated 154\.0 — 15\.4× lower", sim_report)
    assert re.search(r"ITL p99 \(ms\) pd-rdma 12\.0 vs aggregated 40\.0 — 3\.3× lower", sim_report)
    assert re.search(r"Output tok/s pd-rdma 300\.0 vs aggregated 100\.0 — 3\.0× higher", sim_report)
    assert re.search(r"\d+\.\d× lower", sim_report)


def test_simulator_banner_only_on_sim(sim_report):
    assert "**Simulator run.**" in sim_report
    assert "Simulator run" not in render_report(meta("kubernetes"), SUMMARY, VERDICTS)


def test_verdicts_and_configurations_are_listed(sim_report):
    assert "| pd-rdma | pd | prefill×1, decode×1 | 2 | rdma | vllm-router | emulated | emulated |" in sim_report
    # the reasons behind each verdict are shown, not only the verdict word
    assert "rdma emulated" in sim_report and "no KV moves" in sim_report


def test_report_with_missing_meta_key_fails_loudly():
    m = meta("sim")
    del m["model"]
    with pytest.raises(jinja2.UndefinedError):
        render_report(m, SUMMARY, VERDICTS)


def test_a_tie_is_not_bold():
    tied = SUMMARY.assign(tpot_p50_ms=[5.0, 5.0])
    report = render_report(meta("sim"), tied, VERDICTS)
    assert [table_row(report, c)[6] for c in ("aggregated", "pd-rdma")] == ["5.00", "5.00"]


def test_low_support_tail_is_marked_and_trials_show_ci():
    report = render_report(meta("sim"), SUMMARY, VERDICTS)
    assert table_row(report, "aggregated")[5].endswith("†")          # TTFT p95 from 8 samples
    two = pd.concat([SUMMARY, SUMMARY.assign(trial=1, ttft_p50_ms=[160.0, 12.0])], ignore_index=True)
    report = render_report({**meta("sim"), "trials": 2}, two, VERDICTS)
    assert table_row(report, "aggregated")[4].startswith("157.0 ± ")   # mean ± 95% CI
    assert "mean ± 95% CI over 2 trials" in report


def test_a_run_where_every_configuration_failed_still_renders():
    report = render_report({**meta("sim"), "failures": {"aggregated": "provisioning failed: boom"}},
                           pd.DataFrame(columns=SUMMARY_COLUMNS), VERDICTS)
    assert "provisioning failed: boom" in report and "## Suite" not in report


def failed_and_mismatched(tiny_spec):
    """A run where epd failed to provision and pd-rdma's transport did not hold."""
    from tests.reports.synthetic_run import synthetic_meta, synthetic_records, synthetic_verdicts

    records = synthetic_records(tiny_spec)
    records = records[records["config"] != "epd"]
    meta = synthetic_meta(tiny_spec, failures={"epd": "provisioning failed: <urlopen error [Errno 111]>"})
    verdicts = synthetic_verdicts(tiny_spec, transport={"pd-rdma": "mismatch"})
    verdicts["epd"] = {"transport": "not run", "transport_reasons": [meta["failures"]["epd"]], "stages": "not run",
                       "stage_reasons": [meta["failures"]["epd"]], "fraction_seen": {}, "observed": {},
                       "rdma_devices": [], "throughput_mb_s_min": None, "throughput_mb_s_max": None,
                       "failed_transfers": None, "failed_recvs": None, "per_role": {}, "suites": {}}
    return meta, records, verdicts


def test_a_failed_configuration_and_a_transport_mismatch_are_called_out(tiny_spec):
    from epdbench.analysis.metrics import summarize
    from epdbench.reports.render import render_html, render_markdown, report_context
    from tests.reports.report_checks import parse_html

    meta, records, verdicts = failed_and_mismatched(tiny_spec)
    summary = summarize(records, {c["name"]: c["gpus"] for c in meta["configurations"]})
    context = report_context(meta, summary, verdicts, None, records)
    report = render_markdown(context)
    assert "- epd: provisioning failed: <urlopen error [Errno 111]>" in report
    assert "| epd | epd | 1×encode TP1 + 1×prefill TP1 + 1×decode TP1 | 3 | tcp | epdbench-proxy | not run | not run |" \
        in report
    assert not [l for l in report.splitlines() if l.startswith("| epd | 4096/32")]          # no epd rows
    limits = report.split("## Benefits, trade-offs and limitations", 1)[1]
    assert "- epd failed (provisioning failed: <urlopen error [Errno 111]>): it is missing from the tables." in limits
    assert "- pd-rdma: transport mismatch — its numbers do not show the deployment it was meant to be." in limits
    assert "| pd-rdma | `mismatch` |" in report
    assert "The resolved spec was not available to this rendering" in report
    html = render_html(context)
    assert "&lt;urlopen error [Errno 111]&gt;" in html and "<urlopen" not in html
    assert parse_html(html).external == []


def test_trials_show_ci_in_html_too():
    from epdbench.reports.render import render_html, report_context

    two = pd.concat([SUMMARY, SUMMARY.assign(trial=1, ttft_p50_ms=[160.0, 12.0])], ignore_index=True)
    html = render_html(report_context({**meta("sim"), "trials": 2}, two, VERDICTS))
    assert '<td class="num">157.0 ± ' in html and "mean ± 95% CI over 2 trials" in html
    assert '<td class="num best">11.0 ± ' in html


def test_headline_says_why_it_is_empty():
    only_one = SUMMARY[SUMMARY["config"] == "pd-rdma"]
    assert "Fewer than two configurations produced data" in render_report(meta("sim"), only_one, VERDICTS)
    close = SUMMARY.assign(ttft_p50_ms=[10.0, 10.2], ttft_p95_ms=12.0, itl_p99_ms=[12.0, 12.1], itl_max_ms=24.0,
                           output_tok_s=[300.0, 299.0], req_s=4.7, n_itl_samples=500)
    assert ("No matched difference against `aggregated` is both outside the noise and at least 1.1× on a headline "
            "metric.") in \
        render_report(meta("sim"), close, VERDICTS)


def test_roles_pods_and_suites_show_in_path_and_run_order_however_the_verdicts_were_stored():
    """outcome.json is written with sorted keys: a report rendered again from it (or from MLflow) must show the
    same order as the run's own report."""
    from epdbench.reports.render import in_configuration_order

    stored = {"epd": {"per_role": {"decode": {}, "encode": {}, "prefill": {}, "router": {}},
                      "fraction_seen": {"decode": 1.0, "encode": 1.0, "prefill": 1.0},
                      "observed": {"decode-0": "tcp", "decode-1": "tcp", "prefill-0": "tcp", "prefill-10": "tcp"},
                      "suites": {"mixed": {"cache": {"decode": {}, "prefill": {}}}, "fixed": {"cache": {}},
                                 "zz-unplanned": {}, "mm": {"cache": {"prefill": {}, "encode": {}}}}},
              "aggregated": {"per_role": {"router": {}, "server": {}}}}
    got = in_configuration_order(stored, [{"name": "aggregated"}, {"name": "epd"}], ["fixed", "mm", "mixed"])
    assert list(got) == ["aggregated", "epd"] and list(got["aggregated"]["per_role"]) == ["server", "router"]
    epd = got["epd"]
    assert list(epd["per_role"]) == ["encode", "prefill", "decode", "router"]
    assert list(epd["fraction_seen"]) == ["encode", "prefill", "decode"]
    assert list(epd["observed"]) == ["prefill-0", "prefill-10", "decode-0", "decode-1"]
    assert list(epd["suites"]) == ["fixed", "mm", "mixed", "zz-unplanned"]
    assert list(epd["suites"]["mm"]["cache"]) == ["encode", "prefill"]
    assert list(epd["suites"]["mixed"]["cache"]) == ["prefill", "decode"]
    assert list(stored["epd"]["per_role"]) == ["decode", "encode", "prefill", "router"]      # a copy


def test_the_environment_says_which_calibration_profile_set_the_simulators_constants(tiny_spec):
    from epdbench.reports.environment import environment
    from epdbench.specs.profile import error_bar
    from tests.specs.test_profile import a_profile

    assert environment(tiny_spec)["calibration"] is None                      # the spec's own constants
    profile = a_profile(gpu=tiny_spec.hardware.gpu, model=tiny_spec.model.name)
    text = environment(tiny_spec, profile)["calibration"]
    assert text == (f"from calibration profile profile.yaml, fitted to a run of spec smoke ({tiny_spec.hardware.gpu}, "
                    f"{tiny_spec.model.name}) (results/run/summary.csv, 2026-12-01) on the roofline laws: "
                    f"compute_efficiency 0.42, tcp_gb_s 1.7; model error: {error_bar(profile, tiny_spec)}")
    assert "not fitted to (median" in text
    elsewhere = environment(tiny_spec, a_profile(gpu="A100-SXM4-40GB"))["calibration"]
    assert "model error: no measured error bar: the profile was fitted to a run on GPU A100-SXM4-40GB" in elsewhere
    assert "could not be read (bad: field)" in environment(tiny_spec, "bad: field")["calibration"]
    kube = tiny_spec.model_copy(update={"target": tiny_spec.target.model_copy(update={"kind": "kubernetes"})})
    assert environment(kube, profile)["calibration"] is None                # measured: no simulator constants
    report = render_report(meta("sim"), SUMMARY, VERDICTS, environment(tiny_spec, profile))
    assert f"- Simulator constants {text}" in report
    timings = a_profile(hardware={}, op_laws="measured", op_timings=None)
    assert environment(tiny_spec, timings)["calibration"].startswith(
        "from calibration profile profile.yaml, fitted to a run of spec smoke (results/run/summary.csv, "
        "2026-12-01) on the measured laws: no constant; model error: ")


def test_the_environment_says_which_operator_laws_the_simulated_node_runs(tiny_spec):
    from epdbench.reports.environment import environment
    assert ("GPU operators: measured on NVIDIA H200 SXM (physics/data/gpu_ops_h200.csv), scaled to 989 TFLOP/s and "
            "3.35 TB/s from the measured GPU's 989 and 4.8; ") in environment(tiny_spec)["hardware"]
    roofline = tiny_spec.model_copy(update={"hardware": tiny_spec.hardware.model_copy(update={"op_laws": "roofline"})})
    assert "GPU operators: roofline: datasheet 989 TFLOP/s × 0.5, 3.35 TB/s × 0.8; " in environment(
        roofline)["hardware"]
