"""Bad paths and empty lists given to `epdbench compare` (and the commands that share its flags) are one line and
exit 2 before anything starts: no folder made, no flow started."""
from __future__ import annotations

import pytest

from epdbench.cli import main


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_out_naming_a_file_is_refused(in_tmp, capsys, compare_started):
    (in_tmp / "afile").write_text("x")
    err = refused(capsys, "compare", "--out", "afile")
    assert err == "error: --out afile: is a file, not a directory; choose a directory"


def test_out_below_a_file_is_refused_naming_the_file(in_tmp, capsys, compare_started):
    (in_tmp / "afile").write_text("x")
    err = refused(capsys, "compare", "--out", "afile/sub/run")
    assert err == ("error: --out afile/sub/run: afile is a file, so no directory can be made below it; "
                   "choose another path")
    assert (in_tmp / "afile").read_text() == "x"


@pytest.mark.parametrize("value", [",", " , ", ""])
def test_a_configs_list_that_names_nothing_is_refused_not_read_as_all(in_tmp, capsys, compare_started, value):
    for command in (["compare"], ["plan"], ["whatif", "--spec", "smoke"]):
        err = refused(capsys, *command, "--configs", value)
        assert "names no configuration" in err and "leave the flag out for all" in err
    assert not (in_tmp / "results").exists()


def test_a_spec_that_is_a_directory_says_so(in_tmp, capsys, compare_started):
    (in_tmp / "specs").mkdir()
    err = refused(capsys, "compare", "--spec", "specs")
    assert err == "error: spec 'specs' is a directory: give a spec YAML file or a preset name"


def test_a_folder_named_like_a_preset_does_not_shadow_it(in_tmp, capsys, compare_started):
    (in_tmp / "smoke").mkdir()
    with pytest.raises(compare_started):
        main(["compare", "--spec", "smoke", "--clock", "virtual"])


def test_the_virtual_clock_is_the_simulators_alone(in_tmp, capsys, compare_started):
    err = refused(capsys, "compare", "--clock", "virtual", "--target", "kubernetes")
    assert err == ("error: --clock virtual: applies to --target sim only (real engines and clusters run in real "
                   "time)")


def test_an_engine_python_that_cannot_import_vllm_is_refused_before_anything_starts(in_tmp, capsys, compare_started):
    import sys

    err = refused(capsys, "compare", "--target", "local", "--spec", "cpu-tiny", "--vllm-python", sys.executable)
    assert err.startswith(f"error: --vllm-python {sys.executable} cannot import vllm (ModuleNotFoundError")
    assert err.endswith("or make one with: epdbench engine-env")
    err = refused(capsys, "compare", "--target", "local", "--spec", "cpu-tiny", "--vllm-python", "no/python")
    assert err == ("error: --vllm-python no/python: no such file; give the interpreter of a Python environment with "
                   "vLLM (make one with: epdbench engine-env)")
    assert not (in_tmp / "results").exists()


def test_vllm_python_and_the_local_targets_limits_are_said_in_one_line(in_tmp, capsys, compare_started):
    err = refused(capsys, "compare", "--vllm-python", "/usr/bin/python3")
    assert err == "error: --vllm-python: applies to --target local only (this run's target is sim)"
    err = refused(capsys, "compare", "--target", "local", "--spec", "smoke")
    assert "MooncakeConnector does not start without an accelerator" in err and "use kv_connector nixl" in err
    assert err.endswith("; for real engines on CPU take --spec cpu-tiny, the preset made for them")


def test_only_a_spec_on_cpu_engines_other_than_cpu_tiny_is_pointed_at_cpu_tiny():
    from epdbench.cli.common import local_spec_hint

    assert local_spec_hint("local", "cpu", "smoke") == (
        "; for real engines on CPU take --spec cpu-tiny, the preset made for them")
    assert local_spec_hint("local", "cpu", "specs/cpu-tiny.yaml") == ""     # the preset itself: its own error
    assert local_spec_hint("local", "cuda", "smoke") == local_spec_hint("sim", "cpu", "smoke") == ""


def test_the_trace_collector_refuses_a_bad_port_a_bound_below_one_and_a_port_taken(capsys):
    import socket
    assert refused(capsys, "collect-traces", "--port", "70000") == "error: --port 70000: a TCP port, 1 to 65535"
    assert refused(capsys, "collect-traces", "--max-spans", "0") == "error: --max-spans 0: at least 1"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert refused(capsys, "collect-traces", "--host", "127.0.0.1", "--port", str(port)) == (
            f"error: cannot listen on 127.0.0.1:{port}: Address already in use")


def test_a_local_run_without_vllms_interpreter_is_one_line_before_prefect_or_mlflow_load(tmp_path):
    """The whole command, as a user runs it: exit 2, one line naming the fix, in seconds, nothing started."""
    import subprocess
    import sys
    import time

    code = ("import sys\nfrom epdbench.cli import main\n"
            "rc = main(['compare', '--target', 'local', '--spec', 'cpu-tiny', '--vllm-python', '/nonexistent'])\n"
            "print(sorted(m for m in ('prefect', 'mlflow') if m in sys.modules))\nsys.exit(rc)\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and time.monotonic() - start < 60
    assert done.stderr.strip() == ("error: --vllm-python /nonexistent: no such file; give the interpreter of a Python "
                                   "environment with vLLM (make one with: epdbench engine-env)")
    assert done.stdout.strip() == "[]"                   # neither Prefect nor MLflow was imported
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("given, looked_in", [("results/nope", "results/nope"), ("nope", "results/nope"),
                                              ("elsewhere/nope", "elsewhere/nope")])
def test_a_resume_of_no_run_names_the_folder_it_looked_in_once(in_tmp, capsys, compare_started, given, looked_in):
    err = refused(capsys, "compare", "--resume", given)
    assert err == f"error: {given}: no results directory with a spec.yaml (looked in {looked_in})"


def test_cleanup_takes_the_run_as_readme_writes_it_or_as_run_flag(in_tmp, capsys):
    (in_tmp / "results" / "r1").mkdir(parents=True)        # a run whose processes all ended: nothing to end
    for argv in (["cleanup", "r1"], ["cleanup", "--run", "r1"], ["cleanup", "results/r1", "--run", "results/r1"]):
        assert main(argv) == 0
        assert "on this machine: 0 leftover process(es) ended" in capsys.readouterr().out
    assert refused(capsys, "cleanup", "r1", "--run", "r2") == (
        "error: cleanup: two runs given (r1 and --run r2); name one")
    assert refused(capsys, "cleanup") == (
        "error: cleanup: which run? epdbench cleanup RUN (or --run RUN), RUN as compare printed it")
