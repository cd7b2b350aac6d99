"""The virtual-time core's agreement with the HTTP simulator: within the HTTP cell's noise band, plus the host
path for TTFT."""
import pandas as pd

from epdbench.analysis.agreement import HOST_PATH_MS, agreement

KEY = {"config": "agg", "suite": "fixed", "workload": "512/64", "concurrency": 1, "stream": "main", "trial": 0}


def frame(**metrics):
    return pd.DataFrame([{**KEY, "timing": "modelled", **metrics}])


def test_ttft_may_differ_by_the_host_path_beyond_the_noise_band():
    http = frame(ttft_p50_ms=100.0, ttft_p50_ms_sample_ci95=4.0, itl_p99_ms=7.0, itl_p99_ms_sample_ci95=0.01)
    near = agreement(http, frame(ttft_p50_ms=100 - 4 - HOST_PATH_MS + 0.5, itl_p99_ms=7.1))
    assert near.set_index("metric")["agrees"].to_dict() == {"ttft_p50_ms": True, "itl_p99_ms": True}
    far = agreement(http, frame(ttft_p50_ms=100 - 4 - HOST_PATH_MS - 0.5, itl_p99_ms=7.2))
    assert far.set_index("metric")["agrees"].to_dict() == {"ttft_p50_ms": False, "itl_p99_ms": False}
    assert far.set_index("metric").loc["itl_p99_ms", "allowed"] == 7.0 * 0.02     # run-to-run spread floor


def test_unmatched_cells_and_missing_figures_are_left_out():
    http = pd.concat([frame(ttft_p50_ms=10.0), frame(ttft_p50_ms=10.0).assign(workload="4096/64")])
    virtual = frame(ttft_p50_ms=None, output_tok_s=5.0)
    assert agreement(http, virtual).empty


def test_a_contaminated_http_cell_is_shown_but_not_judged():
    http = frame(ttft_p50_ms=100.0, ttft_p50_ms_sample_ci95=4.0, contaminated=True)
    row = agreement(http, frame(ttft_p50_ms=50.0)).iloc[0]
    assert not row["agrees"] and not row["judged"]
    assert agreement(frame(ttft_p50_ms=100.0, contaminated=float("nan")), frame(ttft_p50_ms=100.0)).iloc[0]["judged"]
