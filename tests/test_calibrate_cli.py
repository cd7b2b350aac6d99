"""`epdbench calibrate` end to end on the virtual-time simulator: a "hardware run" made by the simulator with
changed hidden constants, calibrated back; bad input is one line and exit 2; `compare --profile`."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml

from epdbench.analysis import fit
from epdbench.cli import main
from epdbench.cli.common import load_compare_spec
from epdbench.cli.parser import build_parser
from epdbench.cli.planning import _read_run
from epdbench.specs.models import load_spec, parse_spec
from epdbench.specs.profile import load_profile
from epdbench.tasks.rundir.results import append_records
from epdbench.tasks.sim.vrun import simulate_records, simulate_summary

# On the default, measured operator laws: their speed factors (the roofline's efficiencies act on nothing there).
HIDDEN = {"measured_compute_factor": 0.7, "measured_hbm_factor": 0.8, "step_overhead_ms": 2.0, "tcp_gb_s": 1.5}


def tiny_spec_data() -> dict:
    """smoke's model, hardware and engine; aggregated and PD over TCP; one small fixed suite (8 cells)."""
    smoke = load_spec("smoke").model_dump(mode="json")
    return {"name": "calib-tiny", "seed": 3, "model": smoke["model"], "hardware": smoke["hardware"],
            "engine": smoke["engine"],
            "configurations": [c for c in smoke["configurations"] if c["name"] in ("aggregated", "pd-tcp")],
            "suites": [{"kind": "fixed", "name": "fixed", "concurrencies": [1, 4], "n_warmup": 1, "n_measured": 4,
                        "shapes": [{"input_tokens": 512, "output_tokens": 32},
                                   {"input_tokens": 2048, "output_tokens": 32}]}]}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(spec path, summary.csv of the run with the hidden constants)."""
    folder = tmp_path_factory.mktemp("calibrate")
    spec_path = folder / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_spec_data()))
    summary = folder / "summary.csv"
    simulate_summary(fit.spec_with(parse_spec(tiny_spec_data()), HIDDEN)).to_csv(summary, index=False)
    return spec_path, summary


def test_calibration_recovers_the_hidden_constants(run, tmp_path, capsys):
    spec_path, summary = run
    out = tmp_path / "profile.yaml"
    code = main(["calibrate", "--spec", str(spec_path), "--from", str(summary), "--out", str(out),
                 "--evaluations", "100"])   # tcp_latency_ms starts from 0: 60 runs were short (2026-12-03)
    printed = capsys.readouterr().out
    assert code == 0, printed
    profile = load_profile(out)
    for name, hidden in HIDDEN.items():
        assert profile["hardware"][name] == pytest.approx(hidden, rel=0.05), name
    assert set(profile["left_as_in_spec"]) == {"rdma_efficiency", "rdma_latency_ms", "allreduce_latency_us",
                                               "image_preprocess_ms_per_mp", "compute_efficiency", "hbm_efficiency"}
    assert profile["op_laws"] == "measured" and profile["op_timings"] is None     # the spec's own: the H200's
    assert "no cell of the run sends images" in printed
    assert "no configuration of the run moves data over RDMA" in printed
    assert max(profile["fit_error"].values()) < 0.02 and max(profile["holdout_error"].values()) < 0.03
    assert "  run   1/100  loss " in printed and 0 < profile["evaluations"] <= 100
    assert "held out (4), fitted" in printed and f"wrote {out}" in printed
    # 4 held-out cells: even all 4 closer with the fit could be chance, and the check says so
    assert set(profile["holdout_verdict"].values()) == {"too few cells"}
    assert ("hold-out check: the fitted constants against the spec's on the held-out cells: too few cells to tell "
            "for ttft_p50_ms, ") in printed
    assert min(profile["holdout_spec_error"].values()) > 10 * max(profile["holdout_error"].values())
    tails = profile["holdout_tail"]                # past the median, over the same 4 held-out cells
    assert set(tails) == set(profile["holdout_error"])
    assert all(tails[m]["p90_error"] >= profile["holdout_error"][m] for m in tails)
    smoke = load_spec("smoke")                     # the run's GPU and model, which the constants belong to
    assert (profile["gpu"], profile["model"]) == (smoke.hardware.gpu, smoke.model.name)


def test_a_published_table_with_some_metric_columns_is_fitted_on_those(run, tmp_path, capsys):
    table = pd.read_csv(run[1])[fit.MATCH_KEYS + ["ttft_p50_ms", "tpot_p50_ms", "output_tok_s"]]
    table.to_csv(tmp_path / "published.csv", index=False)
    code = main(["calibrate", "--spec", str(run[0]), "--from", str(tmp_path / "published.csv"),
                 "--out", str(tmp_path / "p.yaml"), "--evaluations", "20"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    profile = load_profile(tmp_path / "p.yaml")
    assert set(profile["fit_error"]) == set(profile["holdout_error"]) == {"ttft_p50_ms", "tpot_p50_ms", "output_tok_s"}
    assert profile["hardware"]["measured_compute_factor"] == pytest.approx(HIDDEN["measured_compute_factor"],
                                                                           rel=0.05)
    assert "metrics ttft_p50_ms, tpot_p50_ms, output_tok_s" in printed


def test_rows_and_figures_left_out_are_said(run, tmp_path, capsys):
    table = pd.read_csv(run[1])
    table.loc[0, "requests_failed"] = 1        # a cell with a failed request: its figures are the others'
    table.loc[1, "contaminated"] = True
    table.loc[2, "req_s"] = 0.0
    table = pd.concat([table, table.iloc[[3]].assign(workload="999/9")])    # a cell the spec does not run
    table.to_csv(tmp_path / "summary.csv", index=False)
    code = main(["calibrate", "--spec", str(run[0]), "--from", str(tmp_path / "summary.csv"),
                 "--out", str(tmp_path / "p.yaml"), "--evaluations", "20"])
    printed, err = capsys.readouterr()
    assert code == 0, printed + err
    assert f"{len(table) - 3} cells of" in printed
    note = ("  1 observed cell is not a cell the spec runs, left out (the first: aggregated/fixed/999/9/4/main): check "
            "workload, concurrency and stream against the spec\n")
    assert note in printed and printed.index(note) < printed.index("fit on every cell")
    assert "  1 row flagged contaminated left out (bent by host load)\n" in printed
    assert "  1 row with failed requests left out (their figures count only the requests that succeeded" in printed
    assert "  1 figure not positive left out (req_s 1): a log ratio needs a positive figure\n" in printed


def test_a_fit_left_at_the_edge_of_its_range_says_so(run, tmp_path, capsys):
    """Seconds written in the _ms columns: no speed up to ten times the measured one reaches them."""
    table = pd.read_csv(run[1])[fit.MATCH_KEYS + ["ttft_p50_ms", "tpot_p50_ms"]]
    table[["ttft_p50_ms", "tpot_p50_ms"]] /= 1000
    table.to_csv(tmp_path / "seconds.csv", index=False)
    assert main(["calibrate", "--spec", str(run[0]), "--from", str(tmp_path / "seconds.csv"),
                 "--out", str(tmp_path / "p.yaml"), "--evaluations", "40"]) == 0
    printed = capsys.readouterr().out
    assert ("warning: measured_compute_factor (10, its upper bound), measured_hbm_factor (10, its upper "
            "bound)") in printed
    assert ("ended at the edge of the search range: the fit is the best the range allows, not a match — check the "
            "table's units") in printed
    assert "ended at the edge" not in main_output_of_a_good_fit(run, tmp_path, capsys)


def main_output_of_a_good_fit(run, tmp_path, capsys) -> str:
    assert main(["calibrate", "--spec", str(run[0]), "--from", str(run[1]), "--out", str(tmp_path / "good.yaml"),
                 "--evaluations", "40"]) == 0
    return capsys.readouterr().out


def test_a_records_file_is_summarised_as_the_run_summarises_it(tmp_path):
    spec = parse_spec(tiny_spec_data())
    records = simulate_records(spec)
    append_records(tmp_path / "records.parquet", records.to_dict("records"))
    from_records = fit.observed_cells(_read_run(str(tmp_path / "records.parquet")))
    from_summary = fit.observed_cells(simulate_summary(spec))
    pd.testing.assert_frame_equal(from_records, from_summary)


def one_line_error(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("config,suite,ttft_p50_ms\naggregated,fixed,10\n", "no key column(s) workload, concurrency, stream"),
    ("config,suite,workload,concurrency,stream,itl_max_ms\naggregated,fixed,512/32,1,main,3\n", "no metric column"),
    ("config,suite,workload,concurrency,stream,ttft_p50_ms\nepd,fixed,512/32,1,main,3\n",
     "config epd not in spec calib-tiny"),
    ("config,suite,workload,concurrency,stream,ttft_p50_ms\naggregated,fixed,512/32,3,main,3\n",
     "no observed cell is one the spec runs"),
    ("", "cannot read it"),
    ("config,suite,workload,concurrency,stream,ttft_p50_ms\naggregated,fixed,512/32,1,main,950\n"
     'aggregated,fixed,512/32,4,main,"1,234"\n',
     "row 2 (config aggregated, suite fixed, workload 512/32, concurrency 4, stream main): ttft_p50_ms '1,234' is "
     "not a plain number"),
    ("config,suite,workload,concurrency,stream,ttft_p50_ms\naggregated,fixed,512/32,,main,950\n", "row 1 "),
])
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, content, message):
    source = tmp_path / "summary.csv"
    if content is not None:
        source.write_text(content)
    err = one_line_error(capsys, ["calibrate", "--spec", str(run[0]), "--from", str(source),
                                  "--out", str(tmp_path / "p.yaml")])
    assert message in err
    assert not (tmp_path / "p.yaml").exists()


def test_a_corrupt_parquet_file_is_one_line_and_exit_2(run, tmp_path, capsys):
    source = tmp_path / "records.parquet"
    source.write_bytes(b"PAR1 not really")
    err = one_line_error(capsys, ["calibrate", "--spec", str(run[0]), "--from", str(source),
                                  "--out", str(tmp_path / "p.yaml")])
    assert "cannot read it" in err


def test_bad_flags_are_one_line_and_exit_2(run, tmp_path, capsys):
    args = ["calibrate", "--spec", str(run[0]), "--from", str(run[1])]
    assert "--metrics" in one_line_error(capsys, [*args, "--out", str(tmp_path / "p.yaml"), "--metrics", "speed"])
    assert "does not exist" in one_line_error(capsys, [*args, "--out", str(tmp_path / "no" / "p.yaml")])
    assert "at least" in one_line_error(capsys, [*args, "--out", str(tmp_path / "p.yaml"), "--evaluations", "1"])


def test_the_runs_own_spec_yaml_is_the_spec_and_a_simulator_run_is_named_as_one(run, tmp_path, capsys):
    """The run's folder keeps its resolved spec.yaml: calibrate uses it without --spec, refuses a --spec that
    differs in what the virtual core reproduces, and a run the simulator made says so in the profile."""
    spec_path, summary = run                         # the fixture's folder: spec.yaml beside summary.csv
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--from", str(summary), "--out", str(out), "--evaluations", "20"]) == 0
    printed = capsys.readouterr().out
    assert "(spec calib-tiny)" in printed
    assert "note: the run was made by the simulator (target sim in its spec.yaml)" in printed
    profile = load_profile(out)
    assert profile["source_target"] == "sim"
    from epdbench.specs.profile import cell_fingerprints, error_bar
    assert error_bar(profile).startswith("fitted to a simulator run (emulated figures, not hardware): its predictions'")
    # the profile records the cells it was fitted to: the run's spec has no others; another seed has none of them
    run_spec = load_spec(str(spec_path))
    assert profile["cells_fitted"] == cell_fingerprints(run_spec) and len(profile["cells_fitted"]) == 2
    assert "no error was measured" not in error_bar(profile, run_spec)
    assert error_bar(profile, run_spec.model_copy(update={"seed": 4})).endswith(
        "; none of this spec's cells is among the run's (their seed, suites, deployments or node differ): for them "
        "no error was measured")

    other = tmp_path / "other.yaml"                  # the same spec but for the seed and the free constants
    other.write_text(yaml.safe_dump({**tiny_spec_data(), "seed": 4, "name": "renamed",
                                     "hardware": {**tiny_spec_data()["hardware"], "tcp_gb_s": 9.0}}))
    err = one_line_error(capsys, ["calibrate", "--spec", str(other), "--from", str(summary), "--out", str(out)])
    assert err == (f"error: --spec {other} is not the spec the run used (seed: 3 → 4, against {spec_path}); leave "
                   "--spec out to fit the run's own\n")

    assert main(["calibrate", "--from", str(summary.parent), "--out", str(out), "--evaluations", "20"]) == 0
    assert f"Calibrating the virtual-time simulator to {summary}: " in capsys.readouterr().out   # the folder
    err = one_line_error(capsys, ["calibrate", "--from", str(tmp_path), "--out", str(out)])
    assert err == (f"error: --from {tmp_path}: a folder without summary.csv or records.parquet; give a run's "
                   "results folder or one of those files\n")

    table = tmp_path / "published.csv"               # a table without its run's folder needs --spec
    table.write_bytes(summary.read_bytes())
    err = one_line_error(capsys, ["calibrate", "--from", str(table), "--out", str(out)])
    assert err == f"error: --spec: give the spec the run used (no spec.yaml beside {table})\n"


@pytest.fixture
def profile_file(tmp_path, run) -> str:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({"spec": "calib-tiny", "spec_fingerprint": "0" * 16, "source": "x.csv",
                                    "created": "2026-12-01", "hardware": HIDDEN, "op_laws": "measured"}))
    return str(path)


def test_compare_applies_a_profile_to_the_simulator(run, profile_file):
    args = build_parser().parse_args(["compare", "--spec", str(run[0]), "--profile", profile_file])
    spec, profile = load_compare_spec(args)
    assert {n: getattr(spec.hardware, n) for n in HIDDEN} == HIDDEN
    assert profile["hardware"] == HIDDEN


@pytest.mark.parametrize("fitted_on, error_bar", [
    ({}, "no hold-out check in the profile: its error on cells it was not fitted to is not known (the profile "
         "does not say which GPU and model it was fitted on"),
    ({"gpu": "A100-SXM4-40GB"}, "no measured error bar: the profile was fitted to a run on GPU A100-SXM4-40GB "
                                "(this spec: "),
])
def test_compare_with_a_profile_says_what_its_error_bar_is(run, profile_file, tmp_path, capsys, compare_started,
                                                           fitted_on, error_bar):
    data = yaml.safe_load(open(profile_file))
    with open(profile_file, "w") as f:
        yaml.safe_dump({**data, **fitted_on}, f)
    with pytest.raises(compare_started):
        main(["compare", "--spec", str(run[0]), "--profile", profile_file, "--out", str(tmp_path / "out")])
    assert f"Simulator constants from profile {profile_file}; {error_bar}" in capsys.readouterr().out


def test_compare_refuses_a_profile_on_kubernetes(run, profile_file, capsys):
    err = one_line_error(capsys, ["compare", "--spec", str(run[0]), "--target", "kubernetes",
                                  "--profile", profile_file])
    assert "--profile" in err and "kubernetes" in err


@pytest.mark.faults   # a subprocess stopped mid-fit: in the faults lane for time
def test_sigterm_stops_a_calibration_with_one_line_and_no_profile(run, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    spec_path, summary = run
    out = tmp_path / "profile.yaml"
    proc = subprocess.Popen([sys.executable, "-m", "epdbench.cli", "calibrate", "--spec", str(spec_path), "--from",
                             str(summary), "--out", str(out), "--evaluations", "200"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("  run   3/") or not line:
                break
        assert line.startswith("  run   3/"), line
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert err.strip().splitlines() == [f"interrupted: every started process was stopped; no profile written to {out}"]
    assert not out.exists() and not list(tmp_path.glob("*.part"))
