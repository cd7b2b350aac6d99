"""reports/findings.py: the one-line regression verdict and the limitations, from data."""
from __future__ import annotations

from analysis.samples import EarlyStops, PromptFit
from reports.findings import early_stop_line, gpu_budget_line, prompt_line, regression_line, trials_line


def check(regressions: int, improvements: int, flagged: list[str]) -> dict:
    return {"status": "regression" if regressions else "within-noise", "runs": [{}] * 7,
            "overall": {"regressions": regressions, "improvements": improvements, "flagged": flagged}}


def test_regression_line_for_every_outcome():
    assert regression_line(None) == "Regression check: not run."
    assert regression_line({"status": "unavailable", "error": "MLflow down"}) == \
        "Regression check: history unavailable (MLflow down)."
    assert regression_line({"status": "no-history"}) == "Regression check: no earlier run of this spec on this target yet."
    assert regression_line(check(0, 0, [])) == \
        "Regression check against the last 7 run(s): 0 regression(s), 0 improvement(s) beyond noise."
    many = [f"pd-tcp fixed 512/256 c={c} itl_p99_ms regression +40.0% vs median of 7 runs" for c in range(7)]
    line = regression_line(check(7, 0, many))
    assert line.count("regression +40.0%") == 5 and line.endswith("; and 2 more.")


def test_limitation_lines_state_the_data():
    assert gpu_budget_line([{"name": "a", "gpus": 6}, {"name": "b", "gpus": 6}]) == \
        "Equal GPU budgets (a 6, b 6 GPUs): absolute numbers compare directly."
    assert trials_line(3).startswith("3 trials per cell: tables show the mean ± the 95% confidence interval")
    assert prompt_line(PromptFit(40, 3, 3 / 1047, [])) == [
        "Measured prompt lengths are within 3 tokens (0.3%) of their targets over 40 measured requests."]
    stops = EarlyStops(100, 12, [("epd", "mm", "1k/128", 8, 12, 24)])
    assert early_stop_line(stops) == ("12 of 100 measured requests stopped before max_tokens (epd mm 1k/128 c=8: "
                                      "12/24): their cells count fewer output tokens.")
