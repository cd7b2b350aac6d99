"""Faults an operator meets, on the simulator with small specs. Each ends with the finished records kept
exactly once, MLflow equal to the results folder (after resume or sync), one clear line, a documented
exit code, and no process of the run alive afterwards (every process started by a test carries a mark in
its environment, inherited by everything it starts)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml

from epdbench.specs.models import load_spec
from epdbench.specs.workload import plan_cells
from epdbench.tasks.proc.lifeline import SIGKILL_AT_SPAWN
from epdbench.tasks.rundir.runstate import process_start_time, read_registry
from tests.processes import marked_processes, processes_naming

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def env(mark: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "EPDBENCH_TEST_MARK": mark,
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "3"}


def small_spec(tmp_path: Path, configs: list[str], name: str = "spec.yaml", **changes) -> Path:
    """tests/data/tiny.yaml with only `configs` and its fixed suite; `changes` set top-level or nested keys."""
    spec = yaml.safe_load((DATA / "tiny.yaml").read_text())
    spec["configurations"] = [c for c in spec["configurations"] if c["name"] in configs]
    spec["suites"] = [s for s in spec["suites"] if s["kind"] == "fixed"]
    for key, value in changes.items():
        node = spec
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    out = tmp_path / name
    out.write_text(yaml.safe_dump(spec))
    return out


class Run:
    """`epdbench compare` (or another command) of one test, its output and its marked processes."""

    def __init__(self, tmp_path: Path):
        self.tmp_path, self.mark = tmp_path, uuid.uuid4().hex
        self.out, self.db = tmp_path / "results" / "run", tmp_path / "mlflow.db"

    def cmd(self, *args, timeout: float = 400) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdbench.cli", *args], cwd=self.tmp_path, capture_output=True,
                              text=True, timeout=timeout, env=env(self.mark))

    def compare(self, *args) -> subprocess.CompletedProcess:
        return self.cmd("compare", *args, "--tracking-uri", f"sqlite:///{self.db}")

    def resume(self) -> subprocess.CompletedProcess:
        return self.compare("--resume", str(self.out))

    def start(self, spec: Path, until: str, timeout_s: float = 240) -> tuple[subprocess.Popen, list[str]]:
        """Start compare in the background; return once a stdout line contains `until`."""
        proc = subprocess.Popen([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(spec), "--out",
                                 str(self.out), "--tracking-uri", f"sqlite:///{self.db}"], cwd=self.tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(self.mark))
        seen: list[str] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if until in line:
                return proc, seen
        proc.kill()
        raise AssertionError(f"never saw {until!r}:\n" + "".join(seen)[-3000:] + proc.stderr.read()[-2000:])

    def assert_no_process_left(self) -> None:
        deadline = time.monotonic() + 15
        while marked_processes(self.mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marked_processes(self.mark) == []

    def records(self) -> pd.DataFrame:
        return pd.read_parquet(self.out / "records.parquet")

    def assert_exactly_once(self, spec_path: Path) -> None:
        """Every planned measured request of every configuration recorded once, with its planned hash."""
        spec = load_spec(str(spec_path))
        rec = self.records()
        measured = rec[rec["phase"] == "measured"]
        assert measured.groupby(["config", "cell", "trial"]).size().to_dict() == {
            (c.name, cell.cell_id, t): cell.n_measured for c in spec.configurations for cell in plan_cells(spec)
            for t in range(spec.trials)}
        assert not rec.duplicated(["config", "cell", "trial", "phase", "index"]).any()
        assert rec["request_id"].is_unique
        assert measured["ok"].all()
        hashes = measured.groupby("config")["prompt_hash"].apply(lambda s: tuple(sorted(s)))
        assert hashes.nunique() == 1                      # the same prompts reached every configuration

    def assert_mlflow_matches(self) -> None:
        from epdbench.tasks.publishing.mlflow_check import mlflow_matches_results
        assert mlflow_matches_results(f"sqlite:///{self.db}", self.out) == []


def one_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    assert len(lines) == 1, text[-3000:]
    assert "Traceback" not in text
    return lines[0]


def outcome(run: Run) -> dict:
    return json.loads((run.out / "outcome.json").read_text())


# --- a replica or the router dies --------------------------------------------------------------------

def test_a_dead_replica_fails_the_configuration_and_resume_measures_it_again(tmp_path):
    run = Run(tmp_path)
    spec = small_spec(tmp_path, ["aggregated", "pd-tcp"], **{
        "configurations": [{"name": "aggregated", "topology": "aggregated",
                            "roles": [{"role": "server", "replicas": 2, "tp": 1}]},
                           {"name": "pd-tcp", "topology": "pd", "kv_transport": "tcp",
                            "roles": [{"role": "prefill", "tp": 1}, {"role": "decode", "tp": 1}]}],
        "target.sim.faults": {"kill_replica": "server-1", "kill_after_requests": 3}})
    first = run.compare("--spec", str(spec), "--out", str(run.out))
    assert first.returncode == 3, first.stdout[-3000:] + first.stderr[-3000:]
    agg = outcome(run)["configs"]["aggregated"]
    assert not agg["ok"] and "server-1 (pid" in agg["error"] and "killed by SIGKILL" in agg["error"]
    assert outcome(run)["configs"]["pd-tcp"]["ok"]           # the other configuration still ran
    run.assert_no_process_left()
    fixed = yaml.safe_load((run.out / "spec.yaml").read_text())   # the operator replaces the broken node
    fixed["target"]["sim"]["faults"]["kill_replica"] = None
    (run.out / "spec.yaml").write_text(yaml.safe_dump(fixed))
    resumed = run.resume()
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "[pd-tcp] already finished in this run, skipped (resume)" in resumed.stdout
    run.assert_exactly_once(run.out / "spec.yaml")
    run.assert_mlflow_matches()
    run.assert_no_process_left()


def test_a_dead_router_fails_the_configuration_naming_it(tmp_path):
    run = Run(tmp_path)
    spec = small_spec(tmp_path, ["pd-tcp"], **{"suites": [{"kind": "fixed", "name": "fixed", "n_warmup": 0,
                                                           "n_measured": 60, "concurrencies": [2],
                                                           "shapes": [{"input_tokens": 512, "output_tokens": 64}]}]})
    proc, _ = run.start(spec, "[pd-tcp] serving at")
    router = next(e for e in read_registry(run.out) if e["what"] == "pd-tcp/router")
    time.sleep(1.0)                                            # inside the cell
    os.kill(router["pid"], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 3, stdout[-3000:] + stderr[-3000:]
    error = outcome(run)["configs"]["pd-tcp"]["error"]
    assert f"router (pid {router['pid']}) killed by SIGKILL" in error
    ledger = json.loads((run.out / "evidence" / "pd-tcp" / "cells.json").read_text())
    assert [v["status"] for v in ledger.values()] == ["failed"]      # resume will measure it again
    run.assert_no_process_left()


# --- the run itself is killed or stopped ----------------------------------------------------------------

def run_processes(run: Run, registered: list[dict], also: list[str] = ()) -> list[int]:
    """What of the run still runs, however found: processes carrying the test's mark, registered ones (same pid and
    start time), and any whose command line names the run's folder or one of `also` (its ports)."""
    alive = {e["pid"] for e in registered if process_start_time(e["pid"]) == e["start"]}
    return sorted((set(marked_processes(run.mark)) | alive | set(processes_naming([str(run.out), *also])))
                  - {os.getpid()})


def seconds_until_gone(run: Run, registered: list[dict], t0: float, also: list[str] = (),
                       limit_s: float = 15.0) -> dict:
    """Seconds from `t0` (monotonic) until the run's processes other than its guard are gone ("children"), and
    until the guard is gone too ("all"); polled every 5 ms, for at most `limit_s`."""
    took: dict = {}
    while time.monotonic() - t0 < limit_s and "all" not in took:
        left = run_processes(run, registered, also)
        if "children" not in took and all(b"epdbench.tasks.proc.runguard" in cmdline(pid) for pid in left):
            took["children"] = time.monotonic() - t0
        if not left:
            took["all"] = time.monotonic() - t0
        time.sleep(0.005)
    return took


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def replica_ports(run: Run, config: str) -> list[str]:
    """':PORT' of each replica that logged its address (the router names them on its command line)."""
    logs = (run.out / "evidence" / config).glob("*-[0-9].log")
    return [f":{m}" for log in logs for m in re.findall(r"Starting vLLM API server \d+ on http://[\d.]+:(\d+)",
                                                         log.read_text(errors="replace"))]


def test_sigkill_mid_cell_leaves_no_process_and_resume_finishes_exactly_once(tmp_path):
    """The run dies by SIGKILL while a cell runs on two load generator processes: its replicas, router, load
    generator workers, Prefect's temporary server and guard are all gone within seconds (parent-death signal and
    the guard), so the resume finds nothing to end."""
    run = Run(tmp_path)
    spec = small_spec(tmp_path, ["aggregated", "pd-tcp"], client_processes=2)
    proc, _ = run.start(spec, "[pd-tcp] serving at")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:                   # the pd-tcp cell's load generator workers have started
        whats = [e["what"] for e in read_registry(run.out)]
        if "pd-tcp/router" in whats and any(w.startswith("loadgen/") for w in whats[whats.index("pd-tcp/router"):]):
            break
        time.sleep(0.02)
    killed = time.monotonic()
    proc.kill()
    proc.wait(timeout=30)
    registered = read_registry(run.out)
    assert {"pd-tcp/prefill-0", "pd-tcp/decode-0", "pd-tcp/router", "loadgen/0", "loadgen/1"} <= {
        e["what"] for e in registered}
    took = seconds_until_gone(run, registered, killed, replica_ports(run, "pd-tcp"))
    print(f"after SIGKILL mid-cell: children gone in {took.get('children')} s, guard in {took.get('all')} s")
    assert "all" in took, run_processes(run, registered)
    resumed = run.resume()
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "Ended" not in resumed.stdout and "[aggregated] already finished" in resumed.stdout
    run.assert_exactly_once(spec)
    run.assert_mlflow_matches()
    run.assert_no_process_left()


@pytest.mark.parametrize("at", ["pd-tcp/prefill-0", "pd-tcp/router"])
def test_sigkill_between_a_processs_start_and_its_registration_leaves_no_process(tmp_path, at):
    """The run's main process SIGKILLs itself the instant a configuration's process is forked, before its pid is
    written (lifeline's fault hook): the first replica, or the router with both replicas serving. Every process of
    the run, the unregistered one too, is gone within seconds; `cleanup` then finds nothing, and the resume
    finishes the run exactly once."""
    run = Run(tmp_path)
    spec = small_spec(tmp_path, ["pd-tcp"])
    with open(tmp_path / "output.txt", "w") as output:      # not a pipe: its children would hold it open
        proc = subprocess.Popen([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(spec), "--out",
                                 str(run.out), "--tracking-uri", f"sqlite:///{run.db}"], cwd=tmp_path,
                                stdout=output, stderr=subprocess.STDOUT, env={**env(run.mark), SIGKILL_AT_SPAWN: at})
        proc.wait(timeout=300)
    killed = time.monotonic()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "output.txt").read_text()[-3000:]
    registered = read_registry(run.out)
    assert at not in {e["what"] for e in registered}           # it died inside the window
    took = seconds_until_gone(run, registered, killed, replica_ports(run, "pd-tcp"))
    print(f"after SIGKILL at the start of {at}: children gone in {took.get('children')} s, "
          f"guard in {took.get('all')} s")
    assert "all" in took, run_processes(run, registered, replica_ports(run, "pd-tcp"))
    cleanup = run.cmd("cleanup", "--run", str(run.out))
    assert cleanup.returncode == 0 and "0 leftover process(es) ended" in cleanup.stdout, cleanup.stdout
    resumed = run.resume()
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "Ended" not in resumed.stdout
    run.assert_exactly_once(spec)
    run.assert_mlflow_matches()
    run.assert_no_process_left()


@pytest.mark.parametrize("until, after_s", [("[pd-tcp] serving at", 0.0),
                                            ("Prompt calibration against", 0.5)],   # in the cell's event loop
                         ids=["provisioned", "mid-cell"])
def test_sigterm_stops_like_ctrl_c_with_one_line_and_nothing_left(tmp_path, until, after_s):
    run = Run(tmp_path)
    proc, _ = run.start(small_spec(tmp_path, ["pd-tcp"]), until)
    time.sleep(after_s)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    line = one_line(stderr)
    assert line.startswith("interrupted: every started process was stopped") and "--resume" in line
    run.assert_no_process_left()


def test_a_second_run_on_the_same_folder_is_refused_naming_the_holder(tmp_path):
    run = Run(tmp_path)
    spec = small_spec(tmp_path, ["aggregated"])
    proc, _ = run.start(spec, "[aggregated] serving at")
    try:
        second = run.resume()
        assert second.returncode == 2
        assert f"is in use by pid {proc.pid}" in one_line(second.stderr)
    finally:
        stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-2000:]
    run.assert_exactly_once(spec)
    run.assert_no_process_left()


# --- the results folder is damaged ----------------------------------------------------------------------

def test_deleted_records_are_measured_again_on_resume(tmp_path):
    run = Run(tmp_path)
    spec = small_spec(tmp_path, ["aggregated", "pd-tcp"])
    assert run.compare("--spec", str(spec), "--out", str(run.out)).returncode == 0
    (run.out / "records.parquet").unlink()
    resumed = run.resume()
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "cell(s) are missing from records.parquet" in resumed.stdout
    run.assert_exactly_once(spec)
    summary = pd.read_csv(run.out / "summary.csv")
    assert set(summary["config"]) == {"aggregated", "pd-tcp"}
    run.assert_mlflow_matches()


@pytest.fixture(scope="module")
def finished_aggregated(tmp_path_factory) -> Path:
    """One finished run of the aggregated configuration; each test that damages it works on its own copy."""
    work = tmp_path_factory.mktemp("finished")
    run = Run(work)
    done = run.compare("--spec", str(small_spec(work, ["aggregated"])), "--out", str(run.out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run.assert_no_process_left()
    return run.out


@pytest.mark.parametrize("damage", ["state.json", "records.parquet", "evidence/aggregated/outcome.json"])
def test_a_truncated_state_file_is_one_line_and_exit_2(tmp_path, damage, finished_aggregated):
    run = Run(tmp_path)
    shutil.copytree(finished_aggregated, run.out)
    path = run.out / damage
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    resumed = run.resume()
    assert resumed.returncode == 2
    line = one_line(resumed.stderr)
    assert str(path) in line and "unreadable" in line
    run.assert_no_process_left()


def test_a_full_disk_is_one_line_and_resume_continues_once_space_is_back(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        run = Run(tmp_path)
        run.out = mount / "run"
        spec = small_spec(tmp_path, ["aggregated", "pd-tcp"])
        proc, _ = run.start(spec, "[pd-tcp] serving at")
        filler = mount / "filler"
        # take every byte left; unbuffered, so closing the file has nothing left to write (a buffered file's close
        # flushed its last block into the full disk once, raising outside the loop)
        with open(filler, "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
            except OSError:
                pass
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 6, stderr[-3000:]
        assert "cannot write results: No space left on device" in one_line(stderr)
        run.assert_no_process_left()
        filler.unlink()
        resumed = run.resume()
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        run.assert_exactly_once(spec)
        run.assert_mlflow_matches()
        run.assert_no_process_left()
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
