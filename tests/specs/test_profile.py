"""Calibration profiles (specs.profile): written, read back, validated and applied to a spec's hardware."""
from __future__ import annotations

from datetime import date

import pytest
import yaml

from epdbench.specs.models import SpecError, load_spec, spec_fingerprint
from epdbench.specs.profile import FREE_CONSTANTS, CalibrationProfile, apply_profile, load_profile, profile_to_yaml


def a_profile(**changes) -> dict:
    spec = load_spec("smoke")
    data = {"spec": spec.name, "spec_fingerprint": spec_fingerprint(spec), "source": "results/run/summary.csv",
            "created": "2026-12-01", "hardware": {"compute_efficiency": 0.42, "tcp_gb_s": 1.7},
            "left_as_in_spec": ["rdma_latency_ms"], "evaluations": 60,
            "fit_error": {"ttft_p50_ms": 0.02, "req_s": None}, "holdout_seed": 0,
            "holdout_error": {"ttft_p50_ms": 0.04, "req_s": None}}
    return {**data, **changes}


def test_a_profile_round_trips_through_yaml(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(profile_to_yaml(a_profile()))
    loaded = load_profile(path)
    assert loaded == CalibrationProfile.model_validate(a_profile()).model_dump(mode="json")
    assert loaded["created"] == "2026-12-01" and loaded["hardware"] == {"compute_efficiency": 0.42, "tcp_gb_s": 1.7}
    assert path.read_text().startswith("# epdbench calibration profile")


def test_applying_a_profile_replaces_only_its_hardware_fields():
    spec = load_spec("smoke")
    applied = apply_profile(spec, a_profile())
    assert applied.hardware.compute_efficiency == 0.42 and applied.hardware.tcp_gb_s == 1.7
    # a profile that does not say which operator laws it was fitted on was fitted before the measured ones: its
    # constants act on the roofline's, as they were fitted
    assert (spec.hardware.op_laws, applied.hardware.op_laws) == ("measured", "roofline")
    untouched = set(type(spec.hardware).model_fields) - {"compute_efficiency", "tcp_gb_s", "op_laws"}
    assert all(getattr(applied.hardware, f) == getattr(spec.hardware, f) for f in untouched)
    assert applied.model_dump(exclude={"hardware"}) == spec.model_dump(exclude={"hardware"})
    assert spec.hardware.compute_efficiency != 0.42                      # a copy: the spec is unchanged


@pytest.mark.parametrize("changes, message", [
    ({"hardware": {"compute_efficiency": 1.5}},
     "field 'hardware': compute_efficiency: Input should be less than or equal to 1"),
    ({"hardware": {"tcp_latency_ms": -0.1}}, "tcp_latency_ms: Input should be greater than or equal to 0"),
    ({"hardware": {"tcp_gb_s": 0}}, "tcp_gb_s: Input should be greater than 0"),
    ({"hardware": {"hbm_tb_s": 3.0}}, "'hbm_tb_s' is not a free constant"),
    ({"left_as_in_spec": ["gpu"]}, "not free constants: gpu"),
    ({"colour": "blue"}, "field 'colour': Extra inputs are not permitted"),
    ({"sourse": "x.csv"}, "field 'sourse': Extra inputs are not permitted (did you mean 'source'?)"),
    ({"created": "yesterday"}, "field 'created'"),
])
def test_a_bad_profile_is_one_line_naming_the_field(tmp_path, changes, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(a_profile(**changes)))
    with pytest.raises(SpecError) as e:
        load_profile(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, message", [("just words", "expected a mapping"), ("a: [1,", "not valid YAML")])
def test_a_file_that_is_no_profile_is_an_error(tmp_path, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_profile(path)


def test_a_missing_profile_says_how_to_make_one(tmp_path):
    with pytest.raises(SpecError, match="no such file.*epdbench calibrate"):
        load_profile(tmp_path / "none.yaml")


def test_every_free_constant_is_a_hardware_field_a_profile_may_set():
    spec = load_spec("smoke")
    values = {n: getattr(spec.hardware, n) for n in FREE_CONSTANTS}
    profile = a_profile(hardware=values, created=date(2026, 1, 2), op_laws=spec.hardware.op_laws)
    assert apply_profile(spec, profile).hardware == spec.hardware


def test_the_error_bar_of_a_prediction_is_the_profiles_measured_hold_out_error_or_says_there_is_none():
    from epdbench.specs.profile import error_bar

    text = error_bar(a_profile())
    assert "on cells it was not fitted to" in text and "ttft_p50_ms 4.0%" in text and "req_s" not in text
    assert "not known" in error_bar(a_profile(holdout_error={}, holdout_seed=None))
    assert "not known" in error_bar(a_profile(holdout_error={"req_s": None}))
    assert error_bar(None).startswith("uncalibrated: the spec's hardware constants, no measured error bar")


def test_a_profile_fitted_on_another_gpu_or_model_has_no_measured_error_bar_for_this_spec():
    from epdbench.specs.profile import error_bar, fitted_elsewhere

    spec = load_spec("smoke")
    same = a_profile(gpu=spec.hardware.gpu, model=spec.model.name)
    assert fitted_elsewhere(spec, same) == [] and error_bar(same, spec) == error_bar(same)
    assert "ttft_p50_ms 4.0%" in error_bar(same, spec) and "does not say" not in error_bar(same, spec)

    other = a_profile(gpu="A100-SXM4-40GB", model=spec.model.name)
    assert fitted_elsewhere(spec, other) == [f"GPU A100-SXM4-40GB (this spec: {spec.hardware.gpu})"]
    text = error_bar(other, spec)
    assert text.startswith("no measured error bar: the profile was fitted to a run on GPU A100-SXM4-40GB (this spec: ")
    assert "(ttft_p50_ms 4.0%) was measured there, not for this spec" in text
    assert error_bar(other) == error_bar(same)          # no spec to check against: as measured

    both = a_profile(gpu="A100-SXM4-40GB", model="other/model", holdout_error={}, holdout_seed=None)
    assert len(fitted_elsewhere(spec, both)) == 2
    assert error_bar(both, spec).endswith("and model other/model (this spec: " + spec.model.name
                                          + "), and has no hold-out check")
    # applying it still replaces only the fitted constants: the GPU and model stay the spec's
    applied = apply_profile(spec, both)
    assert (applied.hardware.gpu, applied.model.name) == (spec.hardware.gpu, spec.model.name)


def test_a_profile_that_does_not_record_its_gpu_and_model_says_so_with_its_error_bar():
    from epdbench.specs.profile import error_bar, fitted_elsewhere

    spec = load_spec("smoke")
    old = a_profile()                               # written before the GPU and model were recorded
    assert "gpu" not in old and fitted_elsewhere(spec, old) == []
    assert load_profile_dict(old)["gpu"] is None
    assert error_bar(old, spec) == error_bar(old) + (" (the profile does not say which GPU and model it was fitted "
                                                     "on: this holds only if they are this spec's)")


def load_profile_dict(data: dict) -> dict:
    return CalibrationProfile.model_validate(data).model_dump(mode="json")


def test_a_profile_whose_fit_predicted_held_out_cells_worse_than_the_spec_says_so_in_its_error_bar():
    from epdbench.specs.profile import error_bar

    checked = a_profile(holdout_error={"ttft_p50_ms": 0.061, "tpot_p50_ms": 0.001},
                        holdout_spec_error={"ttft_p50_ms": 0.019, "tpot_p50_ms": 0.012},
                        holdout_verdict={"ttft_p50_ms": "worse", "tpot_p50_ms": "better"})
    text = error_bar(checked)
    assert text.endswith("; on those cells the spec's own constants predicted better for ttft_p50_ms (6.1% against "
                         "1.9%)")
    assert "tpot_p50_ms 0.1%" in text
    fine = a_profile(holdout_verdict={"ttft_p50_ms": "no clear difference"})
    assert error_bar(fine) == error_bar(a_profile())          # only a worse verdict adds to the error bar
    assert load_profile_dict(a_profile())["holdout_verdict"] == {}          # older profiles: no verdict
    with pytest.raises(SpecError, match="holdout_verdict"):
        from epdbench.specs.profile import parse_profile
        parse_profile(a_profile(holdout_verdict={"ttft_p50_ms": "great"}))


def test_the_error_bar_gives_the_p90_and_the_worst_cell_beside_the_median_where_the_profile_keeps_them():
    from epdbench.specs.profile import error_bar

    tail = {"ttft_p50_ms": {"p90_error": 0.12, "worst_cell": "aggregated fixed 512/64 c=8", "worst_ratio": 0.81}}
    text = error_bar(a_profile(holdout_tail=tail))
    assert ("(median |predicted/observed − 1|; p90 and the worst cell beside it): ttft_p50_ms 4.0% (p90 12.0%, "
            "worst aggregated fixed 512/64 c=8 at 0.810)") in text
    assert error_bar(a_profile()).count("p90") == 0                     # older profiles: the median alone
    assert load_profile_dict(a_profile())["holdout_tail"] == {}
    with pytest.raises(SpecError, match="p90_error"):
        from epdbench.specs.profile import parse_profile
        parse_profile(a_profile(holdout_tail={"ttft_p50_ms": {**tail["ttft_p50_ms"], "p90_error": -1}}))


def test_a_profile_fitted_to_a_run_of_another_spec_says_its_error_was_measured_on_that_specs_cells():
    from epdbench.specs.profile import error_bar

    smoke, pd_text = load_spec("smoke"), load_spec("pd-text")
    fitted = a_profile(gpu=smoke.hardware.gpu, model=smoke.model.name)        # fitted to a run of smoke
    assert "runs others" not in error_bar(fitted, smoke) and "runs others" not in error_bar(fitted)
    same_node = pd_text.model_copy(update={"model": smoke.model, "hardware": smoke.hardware})
    text = error_bar(fitted, same_node)
    assert text.startswith(error_bar(fitted, smoke))
    assert text.endswith("; those were cells of a run of spec smoke, and this spec (pd-text) runs others: for them no "
                         "error was measured")


def test_a_profile_that_records_its_cells_says_which_of_a_specs_cells_its_error_was_not_measured_on():
    from epdbench.specs.profile import cell_fingerprints, error_bar

    smoke = load_spec("smoke")
    fitted = a_profile(gpu=smoke.hardware.gpu, model=smoke.model.name, cells_fitted=cell_fingerprints(smoke))
    plain = error_bar(fitted, smoke)
    assert "no error was measured" not in plain
    # the same cells under another name, target, trial count or free constants: the same error bar
    renamed = smoke.model_copy(update={"name": "copy", "trials": 3,
                                       "hardware": smoke.hardware.model_copy(update={"tcp_gb_s": 9.0})})
    assert error_bar(fitted, renamed) == plain
    # the same name and another seed: no cell is the run's (before, the name alone said they were)
    reseeded = smoke.model_copy(update={"seed": smoke.seed + 1})
    assert error_bar(fitted, reseeded) == plain + (
        "; none of this spec's cells is among the run's (their seed, suites, deployments or node differ): for them "
        "no error was measured")
    # one suite's shape doubled: its pairs are named, the rest keep the measured error
    suites = [s.model_copy(update={"shapes": [x.model_copy(update={"input_tokens": 2 * x.input_tokens})
                                              for x in s.shapes]}) if s.name == "fixed" else s
              for s in smoke.suites]
    doubled = smoke.model_copy(update={"suites": suites})
    n = len(cell_fingerprints(smoke))
    assert error_bar(fitted, doubled) == plain + (
        f"; for 4 of this spec's {n} configuration-suite pairs (aggregated in fixed, pd-tcp in fixed, pd-rdma in "
        "fixed and 1 more) no error was measured: their seed, suite, deployment or node differ from the run's")
    # another deployment of a configuration (a whatif variant): its pairs, not the others
    more = [c.model_copy(update={"roles": [r.model_copy(update={"replicas": 3}) for r in c.roles]})
            if c.name == "aggregated" else c for c in smoke.configurations]
    assert "(aggregated in fixed, aggregated in mm-context, aggregated in mixed)" in error_bar(
        fitted, smoke.model_copy(update={"configurations": more}))


def test_what_a_spec_changes_of_a_runs_spec_yaml_for_calibration_leaves_out_the_free_constants_name_and_target():
    from epdbench.specs.profile import calibration_changes

    run = load_spec("smoke")
    same = run.model_copy(update={"name": "copy", "hardware": run.hardware.model_copy(update={"tcp_gb_s": 9.0}),
                                  "target": run.target.model_copy(update={"kind": "kubernetes"})})
    assert calibration_changes(run, same) == []
    other = same.model_copy(update={"seed": run.seed + 1,
                                    "hardware": run.hardware.model_copy(update={"gpus_per_node": 4})})
    assert sorted(calibration_changes(run, other)) == [f"hardware.gpus_per_node: {run.hardware.gpus_per_node} → 4",
                                                       f"seed: {run.seed} → {run.seed + 1}"]


def test_a_profile_may_set_the_vision_factor_which_leaves_the_fingerprints_of_specs_and_cells_as_they_were():
    from epdbench.specs.profile import cell_fingerprints

    spec = load_spec("vllm-truth")
    faster = apply_profile(spec, a_profile(hardware={"measured_vision_factor": 0.8}, op_laws="measured"))
    assert faster.hardware.measured_vision_factor == 0.8
    assert cell_fingerprints(faster) == cell_fingerprints(spec)       # a free constant: where a fit starts
    assert spec_fingerprint(faster) != spec_fingerprint(spec)
