"""Faults with real vLLM engines (the local target: vLLM's CPU build, NIXL over UCX, vllm-router or epdbench's
proxy, all on loopback). Each ends as on the simulator (tests/faults/test_faults.py): finished records kept exactly
once, MLflow equal to the results folder, one line naming what failed, a documented exit code, and nothing of the
run left — every engine's own children included (vLLM's engine core, its worker and its resource tracker), found
by the test's mark, the run's registry, each engine's process tree as it ran and the ports its engines and router
listened on — nor the shared memory its engines mapped (vLLM's message queues in /dev/shm). Each test prints how
long its fault took to be detected and cleaned up.

Run in CI's real-engine lane (EPDBENCH_VLLM_PYTHON set); skipped without it, so the `faults or slow` lane passes
them by. Engines start in 40-140 s each on 2 cores: the tests share start-ups (one compare hosts two faults)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from epdbench.analysis.ucx import client_request_id
from epdbench.sim.proxy import FAULT_KV_UNREACHABLE_EVERY
from epdbench.tasks.rundir.runstate import descendants_of, process_start_time, read_registry
from tests.faults.test_faults import Run, env

pytestmark = [pytest.mark.realengine, pytest.mark.faults, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 45.0      # an engine's stop: SIGTERM, vLLM's own shutdown, SIGKILL after the target's 30 s grace


def engine_python() -> str:
    python = os.environ.get("EPDBENCH_VLLM_PYTHON")
    if not python:
        pytest.skip("real-engine faults run with EPDBENCH_VLLM_PYTHON naming vLLM's interpreter (CI's realengine lane)")
    return python


def local_spec(tmp_path: Path, configs: list[dict], n_measured: int = 8, **changes) -> Path:
    """specs/cpu-tiny.yaml with `configs`, one fixed cell (128 in, 32 out, concurrency 2); `changes` set nested keys
    (`target.local.router`)."""
    spec = yaml.safe_load((ROOT / "specs" / "cpu-tiny.yaml").read_text())
    spec["configurations"] = configs
    spec["suites"] = [{"kind": "fixed", "name": "fixed", "shapes": [{"input_tokens": 128, "output_tokens": 32}],
                       "concurrencies": [2], "n_warmup": 1, "n_measured": n_measured}]
    spec["request_timeout_s"] = 60
    for key, value in changes.items():
        node = spec
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    out = tmp_path / "spec.yaml"
    out.write_text(yaml.safe_dump(spec))
    return out


def pd_config(name: str) -> dict:
    return {"name": name, "topology": "pd", "kv_connector": "nixl", "kv_transport": "tcp",
            "roles": [{"role": "prefill", "tp": 1}, {"role": "decode", "tp": 1}]}


AGGREGATED = {"name": "aggregated", "topology": "aggregated", "roles": [{"role": "server", "tp": 1}]}


class EngineRun(Run):
    """A compare --target local in the background, its output in a file (a pipe would be held open by its
    children), and what it started as it ran: every registered process's tree and listening port."""

    def __init__(self, tmp_path: Path):
        super().__init__(tmp_path)
        self.python = engine_python()
        self.seen: dict[int, tuple[int, str]] = {}     # pid -> (start time, command) of every process seen
        self.ports: set[int] = set()
        self.shm: set[str] = set()        # the shared memory the run's processes mapped (vLLM's message queues)

    def compare(self, *args) -> subprocess.CompletedProcess:
        return self.cmd("compare", "--target", "local", "--vllm-python", self.python, *args,
                        "--tracking-uri", f"sqlite:///{self.db}", timeout=900)

    def launch(self, spec: Path | None, extra_env: dict | None = None) -> subprocess.Popen:
        """compare (spec given) or compare --resume (None), in a process group of its own (as a terminal's job)."""
        what = ["--spec", str(spec), "--out", str(self.out)] if spec else ["--resume", str(self.out)]
        self.output = self.tmp_path / f"output-{time.monotonic_ns()}.txt"
        with open(self.output, "w") as fh:
            return subprocess.Popen([sys.executable, "-m", "epdbench.cli", "compare", "--target", "local",
                                     "--vllm-python", self.python, *what, "--tracking-uri", f"sqlite:///{self.db}"],
                                    cwd=self.tmp_path, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**env(self.mark), **(extra_env or {})})

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def watch(self) -> None:
        """Remember every registered process's tree (pid, start time, command) and listening ports, now."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):              # one pass over /proc for every tree
            try:
                children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(
                    int(stat.parent.name))
            except (OSError, IndexError, ValueError):
                continue
        for e in read_registry(self.out):
            tree, todo = [], [e["pid"]]
            while todo and len(tree) < 1000:
                pid = todo.pop()
                tree.append(pid)
                todo += children.get(pid, [])
            for pid in tree:
                start, command = process_start_time(pid), cmdline(pid)
                if start is not None and command:          # the latest: vLLM renames its processes once started
                    self.seen[pid] = (start, command)
                self.ports |= set(map(int, re.findall(r"--port (\d+)", cmdline(pid))))
                self.shm |= shared_memory_of(pid)

    def wait_for(self, what: str, done, proc: subprocess.Popen | None, timeout_s: float = 600) -> float:
        """Poll `done()` every 50 ms (watching the run every 10th time) until true; the monotonic time it came
        true."""
        deadline, n = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            if n % 10 == 0:
                self.watch()
            n += 1
            if done():
                return time.monotonic()
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"compare ended (exit {proc.returncode}) before {what}:\n{self.text()[-4000:]}")
            time.sleep(0.05)
        raise AssertionError(f"never saw {what} in {timeout_s:.0f} s:\n{self.text()[-4000:]}")

    def alive(self) -> list[str]:
        """What the run started that still runs, however found: its mark, its registry, every process seen in an
        engine's or router's tree while it ran (same pid and start time), a process listening on their ports."""
        left = {pid for pid, (start, _) in self.seen.items() if process_start_time(pid) == start}
        left |= {e["pid"] for e in read_registry(self.out) if process_start_time(e["pid"]) == e["start"]}
        left |= set(marked(self.mark))
        out = [f"pid {pid} ({cmdline(pid)[:80]})" for pid in sorted(left - {os.getpid()})]
        return (out + [f"port {p} still listened on" for p in sorted(self.ports & listening_ports())]
                + [f"{path} still in memory" for path in sorted(self.shm) if Path(path).exists()])

    def seconds_until_gone(self, t0: float, limit_s: float = GONE_WITHIN_S) -> float:
        while self.alive() and time.monotonic() - t0 < limit_s:
            time.sleep(0.05)
        assert self.alive() == [], self.alive()
        return time.monotonic() - t0

    def engine_children(self) -> list[str]:
        """The commands seen below the engines: vLLM's engine cores and workers among them."""
        return [cmd for _, cmd in self.seen.values() if cmd.startswith("VLLM::")]

    def log(self, config: str, name: str) -> str:
        path = self.out / "evidence" / config / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def shared_memory_of(pid: int) -> set[str]:
    """The POSIX shared memory segments (/dev/shm) a process maps."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return set(re.findall(r"(/dev/shm/psm_\w+)", maps))


def marked(mark: str) -> list[int]:
    from tests.processes import marked_processes
    return marked_processes(mark)


def listening_ports() -> set[int]:
    """TCP ports some process of this host listens on (IPv4 and IPv6)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":                                   # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def requests_received(log: str) -> int:
    """Requests an engine received (vLLM's request log, one line each)."""
    return len(re.findall(r"Received request ", log))


def one_failed_line(text: str, config: str) -> str:
    lines = [x for x in text.splitlines() if x.startswith(f"[{config}] FAILED") or x.startswith(f"[{config}] DEGRADED")]
    assert len(lines) == 1, text[-4000:]
    return lines[0]


# --- 1. an engine of a PD pair killed mid-cell ------------------------------------------------------------------

def test_a_prefill_or_decode_killed_mid_cell_fails_its_configuration_and_the_next_one_runs(tmp_path):
    """One compare, two PD configurations: the first's prefill engine SIGKILLed while the cell runs, then the
    second's decode engine. Each: the requests in flight recorded failed with their error, the cell failed in the
    ledger, the configuration failed naming the dead engine (pid, signal, its last log lines), its engine core and
    worker ended with it (they outlive their API server otherwise), and the next configuration runs."""
    run = EngineRun(tmp_path)
    spec = local_spec(tmp_path, [pd_config("pd-prefill-dies"), pd_config("pd-decode-dies")], n_measured=24)
    proc = run.launch(spec)
    killed: dict[str, dict] = {}
    for config, victim in (("pd-prefill-dies", "prefill-0"), ("pd-decode-dies", "decode-0")):
        run.wait_for(f"[{config}] serving at", lambda: f"[{config}] serving at" in run.text(), proc)
        before = requests_received(run.log(config, victim))
        run.wait_for(f"measured requests at {victim}",          # the probe and warm-up came before
                     lambda: requests_received(run.log(config, victim)) >= before + 3, proc, timeout_s=120)
        entry = next(e for e in read_registry(run.out) if e["what"] == f"{config}/{victim}")
        tree = [entry["pid"], *descendants_of(entry["pid"])]
        assert any(cmdline(p).startswith("VLLM::EngineCore") for p in tree), [cmdline(p) for p in tree]
        starts = {p: process_start_time(p) for p in tree}
        t0 = time.monotonic()
        os.kill(entry["pid"], signal.SIGKILL)
        detected = run.wait_for(f"{config}'s cell failed", lambda: f"[{config}] fixed 128/32 c=2 trial 0: failed:"
                                in run.text(), proc, 120)           # the cell stopped, the death named
        tree_gone = run.wait_for(f"{victim}'s engine core and worker gone", lambda: not any(
            process_start_time(p) == s for p, s in starts.items() if s is not None), proc, GONE_WITHIN_S)
        failed = run.wait_for(f"[{config}] FAILED", lambda: f"[{config}] FAILED" in run.text(), proc, 120)
        killed[config] = {"victim": victim, "pid": entry["pid"], "tree": len(tree), "detected_s": detected - t0,
                          "engine_gone_s": tree_gone - t0, "configuration_over_s": failed - t0}
    proc.wait(timeout=600)
    text = run.text()
    assert proc.returncode == 3, text[-4000:]
    assert "Traceback" not in text
    print(f"engine killed mid-cell (s from the SIGKILL): {json.dumps(killed)}")
    assert text.index("[pd-prefill-dies] FAILED") < text.index("[pd-decode-dies] starting")   # the next one ran
    outcome = json.loads((run.out / "outcome.json").read_text())
    records = run.records()
    for config, k in killed.items():
        line = one_failed_line(text, config)
        assert f"{k['victim']} (pid {k['pid']}) killed by SIGKILL" in line and "last lines of its log:" in line, line
        assert outcome["configs"][config]["status"] == "failed"
        ledger = json.loads((run.out / "evidence" / config / "cells.json").read_text())
        assert [(v["status"], v["reason"].split(",")[0]) for v in ledger.values()] == [
            ("failed", f"{k['victim']} (pid {k['pid']}) killed by SIGKILL")]
        measured = records[(records.config == config) & (records.phase == "measured")]
        assert len(measured) == 24 and measured["request_id"].is_unique      # every request once, none lost
        failed = measured[~measured.ok]
        # each with its reason: the router's error (the engine refused the connection or cut the stream) or, once
        # the cell was stopped at the death, `not completed:` naming the engine
        assert len(failed) > 0 and failed["error"].fillna("").str.len().gt(0).all(), failed["error"].tolist()
        unfinished = failed[failed["error"].str.startswith("not completed: ")]
        assert unfinished["error"].str.startswith(f"not completed: {k['victim']} (pid {k['pid']})").all()
    run.assert_mlflow_matches()
    assert run.seconds_until_gone(time.monotonic()) < GONE_WITHIN_S
    assert len(run.engine_children()) >= 4            # the four engines' engine cores (and workers) were watched


# --- 2. a KV transfer that never arrives --------------------------------------------------------------------------

def test_a_kv_transfer_that_never_arrives_is_counted_from_nixls_lines_and_not_verified(tmp_path):
    """PD behind epdbench's proxy, every third decode leg told of a prefill whose NIXL side channel no one listens
    on: the decode's handshake fails, its KV never arrives and vLLM fails the request (kv_load_failure_policy
    `fail`). The transport verdict is not `verified` though the other requests' KV moved over TCP, the failed
    transfers are counted from NIXL's own `NIXL transfer failure` lines, one per request whose KV never came."""
    run = EngineRun(tmp_path)
    spec = local_spec(tmp_path, [pd_config("pd-kv-lost")], n_measured=6, **{"target.local.router": "builtin"})
    t0 = time.monotonic()
    proc = run.launch(spec, {FAULT_KV_UNREACHABLE_EVERY: "3"})
    run.wait_for("the run's end", lambda: proc.poll() is not None, None, 900)
    text = run.text()
    print(f"PD with unreachable side channels: {time.monotonic() - t0:.0f} s")
    assert proc.returncode == 3, text[-4000:]
    line = one_failed_line(text, "pd-kv-lost")
    assert "DEGRADED" in line and "measured requests failed" in line, line
    transport = json.loads((run.out / "evidence" / "pd-kv-lost" / "transport.json").read_text())
    assert transport["verdict"] == "mismatch", transport["reasons"]
    # the decode's own lines, by vLLM's id (`cmpl-<client id>-0-<8 hex>`); the pipeline's probe and warm-up requests
    # cross the same decode leg, so the fault may take some of them too
    nixl_ids = re.findall(r"NIXL transfer failure: handshake_failed \| Context: \{'failure_type': 'handshake_failed', "
                          r"'request_id': '([^']+)'", run.log("pd-kv-lost", "decode-0"))
    nixl_failed = {client_request_id(i) for i in nixl_ids}
    records = run.records()
    lost = set(records.loc[~records.ok, "request_id"])
    assert lost == nixl_failed & set(records["request_id"]) and lost, (records["error"].tolist(), nixl_ids)
    pod = transport["pods"]["decode-0"]
    assert set(pod["kv_lost_requests"]) == nixl_failed and len(pod["kv_lost_requests"]) == len(nixl_failed)
    assert pod["transfer_failures"].count("handshake_failed") == len(nixl_ids)
    reason = next(r for r in transport["reasons"] if r.startswith("decode-0: transfers failed"))
    assert f"KV never arrived for {len(nixl_failed)} request(s)" in reason and "handshake_failed ×" in reason, reason
    assert (records.ok | records["error"].fillna("").str.len().gt(0)).all()
    run.assert_mlflow_matches()
    assert run.alive() == []


# --- 3. an engine that never becomes ready ------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["bad-argument", "start-timeout"])
def test_an_engine_that_never_becomes_ready_is_one_line_with_its_last_log_lines_and_leaves_nothing(tmp_path, how):
    """An engine refusing an argument it does not know exits at once; a PD pair that is not healthy within
    startup_timeout_s (40 s: two CPU engines registering their KV caches with NIXL take longer) is stopped with its
    engine cores. Either way one line names the engine with its last log lines, the configuration fails (exit 3) and
    nothing is left."""
    run = EngineRun(tmp_path)
    if how == "bad-argument":
        spec = local_spec(tmp_path, [AGGREGATED], **{"target.local.extra_args": ["--enforce-eager",
                                                                                 "--no-such-argument"]})
    else:
        spec = local_spec(tmp_path, [pd_config("pd-slow")], **{"target.local.startup_timeout_s": 40})
    t0 = time.monotonic()
    proc = run.launch(spec)
    run.wait_for("the run's end", lambda: proc.poll() is not None, None, 600)
    took = time.monotonic() - t0
    text = run.text()
    assert proc.returncode == 3, text[-4000:]
    config = "aggregated" if how == "bad-argument" else "pd-slow"
    line = one_failed_line(text, config)
    if how == "bad-argument":
        assert "provisioning failed: server-0 exited with code" in line and "--no-such-argument" in line, line
    else:
        assert "provisioning failed: not healthy in time: " in line and "(last lines of " in line, line
        assert any(c.startswith("VLLM::EngineCore") for c in run.engine_children()), run.seen   # it had started
    seen_at_end = time.monotonic()
    assert run.seconds_until_gone(seen_at_end) < GONE_WITHIN_S
    print(f"engine never ready ({how}): run over in {took:.0f} s, {len(run.seen)} processes seen, "
          f"none left {time.monotonic() - seen_at_end:.2f} s after its end")
    run.assert_mlflow_matches()


# --- 4. the run itself SIGKILLed, then resumed and cleaned up -------------------------------------------------------

def test_a_run_killed_while_engines_start_and_while_they_serve_leaves_nothing_and_resumes_exactly_once(tmp_path):
    """SIGKILL to compare while its engine starts (its engine core up), then to the resumed run while it serves (the
    cell's requests reaching the engine): each time the engine, its engine core and worker, and the router are gone
    within seconds (the run's guard ends every process carrying the run's token), `cleanup` finds nothing, and the
    last resume records each planned request once, MLflow equal to the folder."""
    run = EngineRun(tmp_path)
    spec = local_spec(tmp_path, [AGGREGATED], n_measured=12)
    timings = {}
    for step in ("starting", "serving"):
        proc = run.launch(spec if step == "starting" else None)
        if step == "starting":
            run.wait_for("the engine core", lambda: any(c.startswith("VLLM::EngineCore")
                                                        for c in run.engine_children()), proc)
        else:
            run.wait_for("[aggregated] serving at", lambda: "[aggregated] serving at" in run.text(), proc)
            run.wait_for("measured requests", lambda: requests_received(run.log("aggregated", "server-0")) >= 4,
                         proc, 120)
        t0 = time.monotonic()
        proc.kill()
        proc.wait(timeout=30)
        timings[step] = round(run.seconds_until_gone(t0), 2)
        cleanup = run.cmd("cleanup", "--run", str(run.out))
        assert cleanup.returncode == 0 and "0 leftover process(es) ended" in cleanup.stdout, cleanup.stdout
    print(f"run SIGKILLed: every process gone in {json.dumps(timings)} s")
    assert {"router", "server-0"} <= {e["what"].split("/")[-1] for e in read_registry(run.out)}
    assert sum(c.startswith("VLLM::EngineCore") for c in run.engine_children()) >= 2
    resumed = run.compare("--resume", str(run.out))
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert "Ended" not in resumed.stdout                     # the guard had ended everything already
    run.assert_exactly_once(spec)
    run.assert_mlflow_matches()
    assert run.alive() == []


# --- 5. SIGTERM and Ctrl-C while an engine starts -------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_sigterm_or_ctrl_c_while_an_engine_profiles_ends_every_child_of_every_engine(tmp_path, sig):
    """The signal comes once the engine's worker has loaded the model and vLLM profiles it (the PD pair's engines
    set up their KV caches meanwhile); Ctrl-C goes to the whole process group, as a terminal sends it. compare
    stops every engine with its engine core and worker within the bounded stop, and exits 130 with one line."""
    run = EngineRun(tmp_path)
    spec = local_spec(tmp_path, [pd_config("pd")])
    proc = run.launch(spec)
    run.wait_for("both engines' models loaded", lambda: all("Initializing model took" in run.log("pd", name)
                                                            for name in ("prefill-0", "decode-0")), proc)
    assert not any("Starting vLLM server" in run.log("pd", name) for name in ("prefill-0", "decode-0"))
    t0 = time.monotonic()
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    proc.wait(timeout=120)
    exited = time.monotonic() - t0
    gone = run.seconds_until_gone(t0)
    text = run.text()
    assert proc.returncode == 130, text[-4000:]
    lines = [x for x in text.splitlines() if x.startswith("interrupted")]
    assert len(lines) == 1 and lines[0].startswith("interrupted: every started process was stopped") \
        and "--resume" in lines[0], text[-3000:]
    assert "Traceback" not in text
    assert sum(c.startswith("VLLM::EngineCore") for c in run.engine_children()) == 2
    print(f"{sig.name} while the engines start: compare exited in {exited:.2f} s, every process gone in {gone:.2f} s")
