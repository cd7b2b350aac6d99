"""`compare --resume` measures the remaining cells as the run's first attempt did: options that would change the
run's spec.yaml are refused in one line naming what they change, before anything starts."""
from __future__ import annotations

import pytest
import yaml

from epdbench.cli import main
from epdbench.specs.models import load_spec, spec_to_yaml


@pytest.fixture
def folder(tmp_path, tiny_spec_path):
    """An interrupted run's folder as far as resuming reads it first: its resolved spec.yaml."""
    rdir = tmp_path / "results" / "run"
    rdir.mkdir(parents=True)
    (rdir / "spec.yaml").write_text(spec_to_yaml(load_spec(str(tiny_spec_path))))
    return rdir


def profile(tmp_path, **hardware) -> str:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({"spec": "tiny", "spec_fingerprint": "0" * 16, "source": "x.csv",
                                    "created": "2026-12-01", "hardware": hardware,
                                    "op_laws": "measured"}))     # fitted on the laws the run's spec.yaml has
    return str(path)


@pytest.mark.parametrize("options, changed", [
    (["--seed", "9"], "seed: 7 → 9"),
    (["--configs", "aggregated,pd-tcp"], "configurations[pd-rdma]: removed; configurations[epd]: removed"),
    ("profile", "hardware.compute_efficiency: 0.5 → 0.3"),
])
def test_options_that_change_the_run_are_refused_naming_the_change(folder, tmp_path, capsys, options, changed):
    if options == "profile":
        options = ["--profile", profile(tmp_path, compute_efficiency=0.3)]
    assert main(["compare", "--resume", str(folder), *options]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --resume {folder}: the options given change the run's spec ({changed}); a resumed run "
                   "measures its remaining cells as its first attempt did: resume without them, or start a new run")
    assert sorted(p.name for p in folder.iterdir()) == ["spec.yaml"]      # nothing started, nothing written


@pytest.mark.parametrize("options", [
    [], ["--seed", "7"], ["--configs", "aggregated,pd-tcp,pd-rdma,epd"], ["--experiment", "elsewhere"],
    ["--tracking-uri", "sqlite:///elsewhere.db"], "profile",
])
def test_options_that_leave_the_run_as_it_was_resume_it(folder, tmp_path, compare_started, options):
    """The same seed or configurations, another MLflow store, or the profile the run was started with."""
    if options == "profile":       # the constants the spec.yaml already has (the first attempt applied them)
        options = ["--profile", profile(tmp_path, compute_efficiency=0.5, tcp_gb_s=3.0)]
    with pytest.raises(compare_started):
        main(["compare", "--resume", str(folder), *options])


def test_the_flags_a_resume_may_change_are_exactly_how_the_cluster_is_reached():
    from epdbench.cli.common import KUBE_FLAGS
    from epdbench.specs.models import REACH_FIELDS

    assert set(KUBE_FLAGS.values()) == set(REACH_FIELDS)
