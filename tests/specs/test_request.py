"""specs/request.py: what a Prefect UI form asks for becomes a spec, a calibration profile's constants included."""
from __future__ import annotations

import pytest

from epdbench.specs.models import SpecError, load_spec
from epdbench.specs.profile import profile_to_yaml
from epdbench.specs.request import RunRequest, request_profile, resolve_request

from tests.specs.test_profile import a_profile


def test_a_request_without_a_profile_runs_the_presets_constants():
    spec = resolve_request(RunRequest(preset="smoke", configurations=["pd-tcp"]))
    assert spec.hardware == load_spec("smoke").hardware and [c.name for c in spec.configurations] == ["pd-tcp"]
    assert request_profile(RunRequest()) is None


def test_a_profile_named_in_the_form_sets_the_simulators_constants(tmp_path):
    path = tmp_path / "h100.yaml"
    path.write_text(profile_to_yaml(a_profile()))
    req = RunRequest(preset="smoke", profile=str(path))
    spec = resolve_request(req)
    assert (spec.hardware.compute_efficiency, spec.hardware.tcp_gb_s) == (0.42, 1.7)
    assert spec.hardware.hbm_efficiency == load_spec("smoke").hardware.hbm_efficiency     # the rest as in the preset
    assert request_profile(req)["hardware"] == {"compute_efficiency": 0.42, "tcp_gb_s": 1.7}


def test_a_profile_that_cannot_apply_is_one_line_before_anything_runs(tmp_path):
    missing = r"^profile /nowhere/p.yaml: no such file \(write one with epdbench calibrate\)$"
    with pytest.raises(SpecError, match=missing):
        resolve_request(RunRequest(profile="/nowhere/p.yaml"))
    path = tmp_path / "h100.yaml"
    path.write_text(profile_to_yaml(a_profile()))
    with pytest.raises(SpecError, match="sets the simulator's physics; it does not apply to target kubernetes"):
        resolve_request(RunRequest(target="kubernetes", profile=str(path)))
    path.write_text("hardware: {warp_factor: 9}\n")
    with pytest.raises(SpecError, match="h100.yaml"):
        resolve_request(RunRequest(profile=str(path)))


def test_the_form_runs_a_preset_in_virtual_time_on_the_simulator_only():
    spec = resolve_request(RunRequest(preset="smoke", clock="virtual"))
    assert spec.virtual and spec.target.sim.clock == "virtual"
    assert resolve_request(RunRequest(preset="smoke")).virtual            # the quick start's preset is virtual
    assert not resolve_request(RunRequest(preset="smoke", clock="real")).virtual
    assert not resolve_request(RunRequest(preset="pd-text")).virtual
    from epdbench.specs.request import run_name
    assert run_name(RunRequest(preset="smoke", clock="virtual"), "2026-12-04") == "smoke-sim-virtual-2026-12-04"
    assert run_name(RunRequest(preset="smoke"), "2026-12-04") == "smoke-sim-virtual-2026-12-04"
    assert run_name(RunRequest(preset="smoke", clock="real"), "2026-12-04") == "smoke-sim-2026-12-04"
    assert run_name(RunRequest(preset="smoke", target="kubernetes"), "2026-12-04") == "smoke-kubernetes-2026-12-04"
    with pytest.raises(SpecError, match="clock: virtual time is the simulator's; target kubernetes runs in real"):
        resolve_request(RunRequest(preset="smoke", clock="virtual", target="kubernetes"))


def test_the_form_prices_a_gpu_hour_and_scales_to_a_gpu_budget():
    spec = resolve_request(RunRequest(preset="epd-multimodal", configurations=["aggregated", "pd-tcp"],
                                      gpu_hour_usd=2.5, gpu_budget=4))
    assert spec.cost.gpu_hour_usd == 2.5
    assert {c.name: c.gpus for c in spec.configurations} == {"aggregated": 4, "pd-tcp": 4}
    assert {s.configuration: s.scale for s in spec.cost.budget_scales} == {"aggregated": 4, "pd-tcp": 2}
    plain = resolve_request(RunRequest(preset="epd-multimodal", configurations=["aggregated"]))
    assert plain.cost.gpu_budget is None and plain.configurations[0].gpus == 1
    with pytest.raises(SpecError, match=r"^gpu_budget 1: pd-tcp \(2\) needs more GPUs than the budget"):
        resolve_request(RunRequest(preset="epd-multimodal", configurations=["aggregated", "pd-tcp"], gpu_budget=1))
    with pytest.raises(ValueError):
        RunRequest(gpu_hour_usd=-1)


def test_history_reads_a_preset_on_its_own_clock():
    from epdbench.cli.commands import preset_clock
    assert [preset_clock(n) for n in ("smoke", "pd-text", "tiny", "nope")] == ["virtual", "real", "real", "real"]


def test_the_quick_start_is_smoke_in_virtual_time_with_three_trials_and_the_processes_one_flag_away(started_with):
    quick = started_with()
    assert (quick.name, quick.virtual, quick.trials) == ("smoke", True, 3)
    real = started_with("--clock", "real")
    assert (real.name, real.virtual, real.trials, real.target.kind) == ("smoke", False, 3, "sim")
