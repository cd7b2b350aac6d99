"""What a target hands back once a configuration serves: the endpoint, the router, and every
engine/router 'pod' with its log file and metrics URL. Shared by the sim and Kubernetes targets."""
from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


class ProvisionError(RuntimeError):
    """A configuration that could not be brought up; the message says why."""


@dataclass
class Process:
    name: str                  # e.g. prefill-0, router
    role: str                  # server | prefill | decode | encode | router
    url: str                   # base URL reachable from the runner
    log_path: Path             # local file holding this process's log (synced for remote targets)
    popen: subprocess.Popen | None = None   # local process (sim target) or None
    metrics_url: str | None = None
    bootstrap_port: int | None = None      # a Mooncake prefill engine's bootstrap server (local target)


@dataclass
class Deployment:
    config: str
    endpoint: str
    router: str
    processes: list[Process] = field(default_factory=list)
    sync_logs: Callable[[], None] | None = None   # refresh log files before they are read (remote targets)
    health: Callable[[], list[str]] | None = None  # what died since start ("router (pid 7) killed by SIGKILL")
    pull_spans: Callable[[], list[dict]] | None = None   # spans of a collector the pods export to (remote targets)
    ec_dir: Path | None = None     # EPD on the local target: the folder the encoder outputs go through
    # GPU telemetry while it serves (tasks/local/nvml.py): .cell(records) → a cell's figures, .stop()
    telemetry: object | None = None
    telemetry_note: str | None = None   # why there is none, where a GPU target has none
    # how often the KV pods log their transfer windows (Mooncake's MC_TE_METRIC_INTERVAL_SECONDS, vLLM's
    # VLLM_LOG_STATS_INTERVAL for NixlConnector): the evidence of a cell's last transfers comes up to this late
    kv_log_interval_s: float | None = None

    def by_role(self, role: str) -> list[Process]:
        return [p for p in self.processes if p.role == role]

    @property
    def engines(self) -> list[Process]:
        return [p for p in self.processes if p.role != "router"]


def probe_until_served(url: str, body: dict, headers: dict, deadline: float, interval_s: float) -> None:
    """POST a tiny request to `url` until it answers 200; ProvisionError with the last failure at `deadline`."""
    data = json.dumps(body).encode()
    last = "no answer"
    while time.monotonic() < deadline:
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                if r.status == 200:
                    return
                last = f"HTTP {r.status}"
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(interval_s)
    raise ProvisionError(f"router did not serve a probe request at {url} in time: {last}")


TAIL_LINES = 3          # a process that died: its last log lines, in the one-line error
TAIL_BYTES = 65536      # read from the end of its log: an engine's log grows to megabytes


def log_tail(path: Path, n: int = TAIL_LINES) -> str:
    """The last `n` non-empty lines of a log, joined by ' | ', each cut to 300 characters."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - TAIL_BYTES))
            text = fh.read().decode(errors="replace")
    except OSError:
        text = ""
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return " | ".join(x.strip()[:300] for x in lines[-n:]) or "(empty log)"


def exited(processes: list[Process]) -> list[str]:
    """Local processes that are no longer running, each with its exit code or signal and its log's last lines."""
    out = []
    for p in processes:
        code = p.popen.poll() if p.popen is not None else None
        if code is None:
            continue
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        out.append(f"{p.name} (pid {p.popen.pid}) {how}, found at {time.strftime('%H:%M:%S')} "
                   f"(last lines of its log: {log_tail(p.log_path)})")
    return out
