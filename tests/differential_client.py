"""The protocol differential's side effects for its tests: cpu-tiny's aggregated configuration started on a target
(the local target's real vLLM engine, or the simulator) through the targets' own start/stop, the probes of
analysis.differential sent over loopback, and the raw answers kept as they came."""
from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from urllib.parse import urlsplit

from epdbench.analysis.probes import Probe, probes
from epdbench.specs.models import ExperimentSpec, load_spec, parse_spec, spec_to_yaml
from epdbench.tasks.targets import target_module

SPEC = "cpu-tiny"
CONFIG = "aggregated"
REQUEST_TIMEOUT_S = 60


def differential_spec(kind: str, vllm_python: str | None = None) -> ExperimentSpec:
    """cpu-tiny on `kind` (local or sim): the same model, engine and configuration either way."""
    data = load_spec(SPEC).model_dump(mode="json")
    data["target"]["kind"] = kind
    if vllm_python:
        data["target"]["local"]["vllm_python"] = vllm_python
    return parse_spec(data, SPEC)


def start(spec: ExperimentSpec, folder: Path):
    """The configuration's deployment (its engine and the router in front), its spec written in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec.yaml"
    spec_path.write_text(spec_to_yaml(spec))
    target = target_module(spec.target.kind)
    return target, target.start(spec, spec.configuration(CONFIG), spec_path, folder / "logs")


def send(url: str, probe: Probe) -> dict:
    """One probe's raw answer: status, content type and text, read whole."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=REQUEST_TIMEOUT_S)
    try:
        body = (json.dumps(probe.body) if isinstance(probe.body, dict) else probe.body)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(probe.method, probe.path, body=body.encode() if body is not None else None, headers=headers)
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", errors="replace")
        return {"status": resp.status, "content_type": resp.getheader("Content-Type") or "", "text": text}
    finally:
        conn.close()


def metrics_text(url: str) -> str:
    return send(url, Probe("metrics", "GET", "/metrics"))["text"]


def exchange(url: str, spec: ExperimentSpec) -> dict:
    """Every probe sent in order to the engine at `url`, then its /metrics: {answers, metrics, seconds}."""
    start_s = time.monotonic()
    answers = {p.name: send(url, p) for p in probes(spec.model.name, spec.engine.max_model_len)}
    return {"answers": answers, "metrics": metrics_text(url), "seconds": round(time.monotonic() - start_s, 1)}


def engine_log_lines(dep, since: int = 0) -> list[str]:
    """The engine's (server-0) log lines from byte offset `since`."""
    path = dep.by_role("server")[0].log_path
    with open(path, "rb") as fh:
        fh.seek(since)
        return fh.read().decode("utf-8", errors="replace").splitlines()


def log_size(dep) -> int:
    path = dep.by_role("server")[0].log_path
    return path.stat().st_size if path.exists() else 0


FIXTURES = Path(__file__).parent / "data" / "differential"
KNOWN = FIXTURES / "known_differences.yaml"


def run_exchange(kind: str, folder: Path, vllm_python: str | None = None) -> dict:
    """Start cpu-tiny's aggregated configuration on `kind`, send every probe to its engine, stop it: the exchange
    (answers, metrics, the engine's log lines over the probes) and how long the engine took to start."""
    spec = differential_spec(kind, vllm_python)
    began = time.monotonic()
    target, dep = start(spec, folder)
    try:
        started_s = round(time.monotonic() - began, 1)
        since = log_size(dep)
        out = exchange(dep.by_role("server")[0].url, spec)
        time.sleep(0.5)          # the request logger's last lines reach the file
        out["log"] = engine_log_lines(dep, since)
        out["start_seconds"] = started_s
        return out
    finally:
        target.stop(dep)


def write_capture(exchange_: dict, folder: Path = FIXTURES) -> None:
    """A real engine's exchange as the default lane's fixtures: answers, /metrics, the log over the probes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "real-answers.json").write_text(json.dumps(exchange_["answers"], indent=1, sort_keys=True) + "\n")
    (folder / "real-metrics.prom").write_text(exchange_["metrics"])
    (folder / "real-server.log").write_text("\n".join(exchange_["log"]) + "\n")


def read_capture(folder: Path = FIXTURES) -> dict:
    answers = json.loads((folder / "real-answers.json").read_text())
    order = [p.name for p in probes("m", 1)]
    return {"answers": {name: answers[name] for name in order if name in answers},
            "metrics": (folder / "real-metrics.prom").read_text(),
            "log": (folder / "real-server.log").read_text().splitlines()}
