"""tasks/rundir/resume.py and tasks/rundir/runstate.py: what a resumed run keeps,
the folder lock and the process registry."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from epdbench.specs.workload import build_requests, plan_cells
from epdbench.tasks.rundir.results import append_records, drop_records, read_records
from epdbench.tasks.rundir.resume import (StateError, cells_done, missing_cells, noise_of, record_attempt,
                                    validate_state_files)
from epdbench.tasks.rundir.runstate import (FolderLocked, RunFolder, end_leftovers, leftovers, process_start_time,
                                     read_registry)


def record_cell(rdir, spec, config: str, cell, trial: int = 0, status: str = "ok", drop_last: bool = False,
                bad_hash: bool = False) -> None:
    reqs = [r for r in build_requests(spec, cell, trial) if r.phase == "measured"]
    if drop_last:
        reqs = reqs[:-1]
    rows = [{"run": "r", "trial": trial, "config": config, "suite": cell.suite, "cell": cell.cell_id,
             "stream": cell.stream, "request_id": f"{config}-{cell.cell_id}-{trial}-{r.index}", "index": r.index,
             "phase": "measured", "ok": True, "prompt_hash": "x" if bad_hash and r.index == 0 else r.prompt_hash,
             "chunk_offsets_ns": [], "chunk_tokens": []} for r in reqs]
    append_records(rdir / "records.parquet", rows)
    record_attempt(rdir, config, cell.cell_id, trial, status)


@pytest.fixture
def folder(tmp_path, tiny_spec):
    (tmp_path / "calibration.json").write_text("{}")
    return tmp_path


def test_a_cell_is_done_only_when_its_attempt_ended_ok_and_its_records_are_the_plan(folder, tiny_spec):
    cells = plan_cells(tiny_spec)
    record_cell(folder, tiny_spec, "pd-tcp", cells[0])                       # complete and ok
    record_cell(folder, tiny_spec, "pd-tcp", cells[1], status="degraded")    # complete, but degraded
    record_cell(folder, tiny_spec, "pd-tcp", cells[2], drop_last=True)       # one request missing
    record_cell(folder, tiny_spec, "pd-tcp", cells[3], bad_hash=True)        # not the planned prompt
    assert cells_done(folder, tiny_spec, "pd-tcp") == {(cells[0].cell_id, 0)}
    assert (cells[1].cell_id, 0) in missing_cells(tiny_spec, cells_done(folder, tiny_spec, "pd-tcp"))
    assert cells_done(folder, tiny_spec, "epd") == set()


def test_dropping_a_cell_removes_exactly_its_rows(folder, tiny_spec):
    cells = plan_cells(tiny_spec)
    for config in ("pd-tcp", "epd"):
        record_cell(folder, tiny_spec, config, cells[0])
        record_cell(folder, tiny_spec, config, cells[1])
    before = read_records(folder / "records.parquet")
    gone = drop_records(folder / "records.parquet", "pd-tcp", {(cells[1].cell_id, 0)})
    after = read_records(folder / "records.parquet")
    assert gone == cells[1].n_measured and len(after) == len(before) - gone
    assert not ((after["config"] == "pd-tcp") & (after["cell"] == cells[1].cell_id)).any()


@pytest.mark.parametrize("name", ["state.json", "calibration.json", "evidence/x/outcome.json", "records.parquet"])
def test_an_unreadable_state_file_is_named(folder, tiny_spec, name):
    record_cell(folder, tiny_spec, "pd-tcp", plan_cells(tiny_spec)[0])
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"{\"truncated" if name.endswith(".json") else path.read_bytes()[:100])
    with pytest.raises(StateError) as e:
        validate_state_files(folder)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_the_folder_lock_refuses_a_second_holder_and_is_taken_over_from_a_dead_one(tmp_path):
    hold = RunFolder(tmp_path).acquire()
    try:
        code = (f"from epdbench.tasks.rundir.runstate import RunFolder, FolderLocked\nfrom pathlib import Path\n"
                f"try:\n    RunFolder(Path({str(tmp_path)!r})).acquire()\nexcept FolderLocked as e:\n    print(e)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
        assert f"is in use by pid {os.getpid()}" in out
    finally:
        hold.release()
    dead = subprocess.run([sys.executable, "-c", f"from epdbench.tasks.rundir.runstate import RunFolder\nfrom pathlib "
                           f"import Path\nRunFolder(Path({str(tmp_path)!r})).acquire()\nimport os\nos._exit(9)"],
                          timeout=60)
    assert dead.returncode == 9                       # died holding it: the kernel released the lock
    RunFolder(tmp_path).acquire().release()
    with pytest.raises(FolderLocked):
        a = RunFolder(tmp_path).acquire()
        try:
            RunFolder(tmp_path).acquire()
        finally:
            a.release()


def test_leftovers_are_ended_by_pid_and_start_time_only(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        hold = RunFolder(tmp_path).acquire()
        hold.register([child.pid], "pd-tcp/router")
        hold.release()
        registry = json.loads((tmp_path / "processes.json").read_text())
        [entry] = read_registry(tmp_path)
        assert entry["start"] == process_start_time(child.pid)
        stale = [{**entry, "pid": os.getpid()}, {**entry, "start": entry["start"] + 1}]
        (tmp_path / "processes.json").write_text(json.dumps(registry + stale))
        assert [e["pid"] for e in leftovers(tmp_path)] == [child.pid]   # ourselves and a reused pid are not
        ended = end_leftovers(tmp_path, grace_s=5)
        assert [e["what"] for e in ended] == ["pd-tcp/router"]
        deadline = time.monotonic() + 10
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.poll() is not None
    finally:
        if child.poll() is None:
            child.kill()


def test_the_ledger_keeps_each_attempts_noise_and_a_new_attempt_replaces_it(tmp_path):
    record_attempt(tmp_path, "pd-tcp", "fixed/4096/32/c4", 0, "ok", noise={"loop_lag_p99_ms": 3.0})
    record_attempt(tmp_path, "pd-tcp", "fixed/4096/32/c4", 1, "ok", noise={"loop_lag_p99_ms": 0.2})
    record_attempt(tmp_path, "pd-tcp", "fixed/4096/32/c4", 0, "ok",
                   noise={"loop_lag_p99_ms": 0.1, "emulation_lag_p99_ms": 0.3})   # the cell measured again
    record_attempt(tmp_path, "epd", "fixed/4096/32/c4", 0, "failed", "timed out")   # no noise figures
    assert noise_of(tmp_path, ["pd-tcp", "epd", "absent"]) == {
        ("pd-tcp", "fixed/4096/32/c4", 0): {"loop_lag_p99_ms": 0.1, "emulation_lag_p99_ms": 0.3},
        ("pd-tcp", "fixed/4096/32/c4", 1): {"loop_lag_p99_ms": 0.2}}


def test_a_run_resumes_only_with_the_spec_it_was_started_with(tmp_path, tiny_spec):
    from epdbench.specs.models import spec_to_yaml
    from epdbench.tasks.rundir.resume import check_resumable

    check_resumable(tmp_path, tiny_spec)                         # no spec.yaml yet: nothing to hold it to
    (tmp_path / "spec.yaml").write_text(spec_to_yaml(tiny_spec))
    check_resumable(tmp_path, tiny_spec)
    kube = tiny_spec.target.kubernetes.model_copy(update={"kubeconfig": "/elsewhere/config", "context": "c2",
                                                           "namespace": "other", "keep": True})
    check_resumable(tmp_path, tiny_spec.model_copy(update={"target": tiny_spec.target.model_copy(
        update={"kubernetes": kube})}))                          # how the cluster is reached may change
    with pytest.raises(StateError) as e:                         # as a UI run given an existing run key would
        check_resumable(tmp_path, tiny_spec.model_copy(update={"seed": tiny_spec.seed + 1, "trials": 3}))
    assert str(e.value) == (f"--resume {tmp_path}: the options given change the run's spec (seed: 7 → 8; trials: 1 "
                            "→ 3); a resumed run measures its remaining cells as its first attempt did: resume "
                            "without them, or start a new run")
    (tmp_path / "spec.yaml").write_text("seed: [")
    with pytest.raises(StateError, match=r"spec.yaml: cannot be read, so the run cannot be resumed"):
        check_resumable(tmp_path, tiny_spec)


def test_the_compare_flow_refuses_to_resume_a_run_with_another_spec_before_anything_starts(tmp_path, tiny_spec):
    """The path of a UI run given an existing run key (flows.deployments), without Prefect's engine."""
    from epdbench.flows.compare import compare
    from epdbench.specs.models import load_spec, spec_to_yaml

    (tmp_path / "spec.yaml").write_text(spec_to_yaml(tiny_spec))
    with pytest.raises(StateError, match=r"the options given change the run's spec \(name: \"tiny\" → \"smoke\""):
        compare.fn(load_spec("smoke"), out_dir=str(tmp_path), run_name="run", resume=True)
    hold = {".lock", "processes.json"}       # the folder's lock and registry (the run's token, no process)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in hold) == ["spec.yaml"]
    assert read_registry(tmp_path) == []
