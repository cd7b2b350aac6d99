"""Collect evidence from a running deployment: log offsets around the measured suites,
/metrics before and after, then verdicts (computed by analysis.evidence) into evidence/<config>/."""
from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from analysis.evidence import stage_counts, transport_of_pod, verify_stages, verify_transport
from specs.models import ConfigurationSpec
from tasks.results import write_json
from tasks.sim_target import Deployment


def log_offsets(dep: Deployment) -> dict[str, int]:
    return {p.name: (p.log_path.stat().st_size if p.log_path.exists() else 0) for p in dep.processes}


def read_slice(path: Path, start: int, end: int | None = None) -> list[str]:
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read() if end is None else fh.read(max(0, end - start))
    return data.decode("utf-8", errors="replace").splitlines()


def scrape_metrics(dep: Deployment) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in dep.engines:
        try:
            with urllib.request.urlopen(p.metrics_url, timeout=5) as r:
                out[p.name] = r.read().decode()
        except (urllib.error.URLError, OSError) as e:
            out[p.name] = f"# scrape failed: {e}\n"
    return out


def expected_roles(config: ConfigurationSpec, records: list[dict]) -> dict[str, list[str]]:
    """Measured request id -> roles it must be seen at."""
    out: dict[str, list[str]] = {}
    for r in records:
        if r["phase"] != "measured":
            continue
        if config.topology == "aggregated":
            roles = ["server"]
        elif config.topology == "pd":
            roles = ["prefill", "decode"]
        else:
            roles = (["encode"] if r.get("image_hash") else []) + ["prefill", "decode"]
        out[r["request_id"]] = roles
    return out


def collect(dep: Deployment, config: ConfigurationSpec, before: dict[str, int], metrics_before: dict[str, str],
            records: list[dict], out_dir: Path, emulated: bool) -> tuple[dict, dict]:
    """Write transport.json, stages.json, logs and metrics snapshots; return the two verdict dicts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_after = scrape_metrics(dep)
    for name, text in metrics_before.items():
        (out_dir / f"metrics-before-{name}.prom").write_text(text)
    for name, text in metrics_after.items():
        (out_dir / f"metrics-after-{name}.prom").write_text(text)
    pods: dict[str, dict] = {}
    role_counts: dict[str, dict] = {}
    for p in dep.processes:
        if not p.log_path.exists():
            continue
        whole = read_slice(p.log_path, 0)
        if p.role in ("prefill", "decode"):
            pods[p.name] = transport_of_pod(whole)
        window = read_slice(p.log_path, before.get(p.name, 0))
        counts = stage_counts(window)
        agg = role_counts.setdefault(p.role, {"completions": 0, "errors": 0, "request_ids": set()})
        agg["completions"] += counts["completions"]
        agg["errors"] += counts["errors"]
        agg["request_ids"] |= counts["request_ids"]
    transport = verify_transport(config.kv_transport, pods)
    stages = verify_stages(expected_roles(config, records), role_counts, emulated)
    write_json(out_dir / "transport.json", transport)
    write_json(out_dir / "stages.json", stages)
    return transport, stages
