"""Collect evidence from a running deployment: log offsets and /metrics before and after each suite,
then verdicts (computed by analysis.transport and analysis.stages) into evidence/<config>/. Logs are streamed."""
from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

from epdbench.analysis.prom import counter_deltas, hit_rate
from epdbench.analysis.stages import merge_counts, stage_counts, verify_stages
from epdbench.analysis.mooncake_log import transport_of_pod
from epdbench.analysis.transport import kv_expectation, verify_transport, verify_virtual
from epdbench.analysis.ucx import nixl_of_pod, verify_nixl
from epdbench.analysis.ec_files import ec_files_of_pod, verify_ec_files
from epdbench.physics.costmodel import CostModel, image_tokens, link_bytes_per_s
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec
from epdbench.tasks.deployment import Deployment
from epdbench.tasks.rundir.results import write_json


def iter_lines(path: Path, start: int = 0, end: int | None = None) -> Iterator[str]:
    """Lines of a log between two byte offsets, read incrementally (logs may be many GB)."""
    if not path.exists():
        return
    with open(path, "rb") as fh:
        fh.seek(start)
        pos = start
        for raw in fh:
            pos += len(raw)
            if end is not None and pos > end:
                break
            yield raw.decode("utf-8", errors="replace")


def archive_attempt_logs(ev_dir: Path) -> Path | None:
    """Move the process logs an earlier attempt of this configuration left (a resumed run) into
    `attempt-N/`, so this attempt's verdicts read only its own processes; returns where they went."""
    logs = sorted(ev_dir.glob("*.log")) if ev_dir.is_dir() else []
    if not logs:
        return None
    n = 1 + sum(1 for d in ev_dir.glob("attempt-*") if d.is_dir())
    dest = ev_dir / f"attempt-{n}"
    dest.mkdir()
    for log in logs:
        log.rename(dest / log.name)
    return dest


def scrape_metrics(dep: Deployment) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in dep.processes:
        if not p.metrics_url:
            continue
        try:
            with urllib.request.urlopen(p.metrics_url, timeout=5) as r:
                out[p.name] = r.read().decode()
        except (urllib.error.URLError, OSError) as e:
            out[p.name] = f"# scrape failed: {e}\n"
    return out


def snapshot(dep: Deployment) -> dict:
    """Log sizes and /metrics of every process, taken before or after a suite."""
    if dep.sync_logs:
        dep.sync_logs()
    offsets = {p.name: (p.log_path.stat().st_size if p.log_path.exists() else 0) for p in dep.processes}
    return {"offsets": offsets, "metrics": scrape_metrics(dep)}


def expected_roles(config: ConfigurationSpec, records: list[dict]) -> dict[str, list[str]]:
    """Measured request id -> roles it must be seen at (encode only for requests with an image)."""
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


def _role_counts(dep: Deployment, before: dict, after: dict | None) -> dict[str, dict]:
    counts: dict[str, dict] = {}
    for p in dep.processes:
        end = after["offsets"].get(p.name) if after else None
        c = stage_counts(iter_lines(p.log_path, before["offsets"].get(p.name, 0), end))
        counts[p.role] = merge_counts(counts[p.role], c) if p.role in counts else c
    return counts


def _metric_deltas(dep: Deployment, before: dict, after: dict) -> dict[str, dict[str, float]]:
    per_role: dict[str, dict[str, float]] = {}
    for p in dep.processes:
        if p.name not in after["metrics"]:
            continue
        d = counter_deltas(before["metrics"].get(p.name, ""), after["metrics"][p.name])
        acc = per_role.setdefault(p.role, {})
        for k, v in d.items():
            acc[k] = acc.get(k, 0.0) + v
    for acc in per_role.values():
        acc["prefix_cache_hit_rate"] = hit_rate(acc.get("prefix_cache_hits"), acc.get("prefix_cache_queries"))
        acc["mm_cache_hit_rate"] = hit_rate(acc.get("mm_cache_hits"), acc.get("mm_cache_queries"))
    return per_role


def suite_evidence(dep: Deployment, config: ConfigurationSpec, before: dict, after: dict,
                   records: list[dict], emulated: bool) -> dict:
    """Stage correlation and counter deltas of one suite's window (warm-ups and probes outside it
    are excluded by the offsets; warm-up requests inside it are not in `records` as measured)."""
    deltas = _metric_deltas(dep, before, after)
    stages = verify_stages(expected_roles(config, records), _role_counts(dep, before, after), emulated, deltas)
    stages["metrics_delta"] = deltas
    return stages


def kv_moved(spec: ExperimentSpec, config: ConfigurationSpec, deltas: dict[str, dict[str, float]],
             records: list[dict], logged: dict | None = None) -> dict | None:
    """What the records say must have moved, beside what the counting side's counters say did: Mooncake's
    sending (prefill) side, NIXL's reading (decode) side. The KV of a token fills each decode GPU's shard once,
    its replicated KV heads included (ModelSpec.kv_bytes_per_token_at). Mooncake's prefill pods without its
    Prometheus counters (vLLM 0.26 exports none) are read from their own lines instead: `logged`
    (mooncake_logged), `source` log."""
    if config.topology == "aggregated":
        return None
    kv = kv_expectation(records, spec.model.kv_bytes_per_token_at(config.role("decode").tp), spec.kv_block_tokens)
    if config.kv_connector == "nixl":
        got = deltas.get("decode") or {}
        kv.update({"transfers": got.get("nixl_transfers"), "bytes": got.get("nixl_bytes_transferred")})
        return kv
    sent = deltas.get("prefill") or {}
    kv.update({"transfers": sent.get("mooncake_transfers"), "bytes": sent.get("mooncake_bytes_transferred"),
               "source": "metrics"})
    if kv["transfers"] is None and kv["bytes"] is None and logged is not None:
        kv.update({**logged, "source": "log"})
    return kv


def mooncake_logged(dep: Deployment, pods: dict[str, dict], since: dict[str, int] | None) -> dict:
    """What the prefill engines' own lines say they sent from `since` (log offsets: the run's first snapshot) on:
    the requests whose blocks they sent (`Sending kv_caches for request`, vLLM 0.26 mooncake_connector.py:1607, at
    DEBUG: counted where the connector's DEBUG lines are on, per `pods` read whole) and the bytes of their
    `KV Transfer metrics` (where stats logging is on). None where a pod's log cannot say. Each request counts
    once: the connector's own `Num successful transfers` counts batch writes, which may carry several requests
    (one per decode scheduler step and prefill engine: `receive_kv`, `send_kv_to_decode`)."""
    out: dict = {"transfers": None, "bytes": None}
    for p in dep.processes:
        if p.role != "prefill" or p.name not in pods:
            continue
        window = transport_of_pod(iter_lines(p.log_path, (since or {}).get(p.name, 0)))
        if pods[p.name]["connector_debug"]:
            out["transfers"] = (out["transfers"] or 0) + window["requests_sent"]
        if pods[p.name]["kv_stats_lines"]:
            out["bytes"] = (out["bytes"] or 0.0) + window["transfer_bytes"]
    return out


def kv_transport(dep: Deployment, spec: ExperimentSpec, config: ConfigurationSpec, deltas: dict[str, dict[str, float]],
                 records: list[dict], since: dict[str, int] | None = None) -> dict:
    """The KV verdict from the KV pods' logs, read as the configuration's connector writes them; `since`: each
    process's log offset where the run began (its first snapshot), from which its own lines count what moved."""
    kv_pods = [p for p in dep.processes if p.role in ("prefill", "decode")]
    roles = {p.name: p.role for p in kv_pods}
    tcp_mb_s = link_bytes_per_s(spec.hardware, "tcp") / 1e6
    if config.kv_connector == "nixl" and config.topology != "aggregated":
        pods = {p.name: nixl_of_pod(iter_lines(p.log_path)) for p in kv_pods}
        return verify_nixl(config.kv_transport, pods, roles=roles, kv=kv_moved(spec, config, deltas, records),
                           tcp_mb_s=tcp_mb_s, same_host=spec.target.kind == "local")
    pods = {p.name: transport_of_pod(iter_lines(p.log_path)) for p in kv_pods}
    kv = kv_moved(spec, config, deltas, records, mooncake_logged(dep, pods, since))
    return verify_transport(config.kv_transport, pods, roles=roles, kv=kv, tcp_mb_s=tcp_mb_s)


SETTLE_MARGIN_S = 0.5    # past one logging interval: a late timer on a loaded host still logs its window in time
SETTLE_POLLS = 4         # reads per interval while waiting (each re-reads every KV pod's whole log)


def _pending(transport: dict) -> bool:
    """A verdict that its KV pods' next logging window may still change: no evidence yet, or a mismatch read from
    Mooncake's own lines (its last `KV Transfer metrics` come up to one stats interval after the transfers)."""
    from_log = (transport.get("kv_check") or {}).get("source") == "log" and transport["verdict"] == "mismatch"
    return from_log or transport["verdict"] == "no-evidence" or transport.get("ec", {}).get("verdict") == "no-evidence"


def settled_transport(dep: Deployment, spec: ExperimentSpec, config: ConfigurationSpec,
                      deltas: dict[str, dict[str, float]], records: list[dict],
                      clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                      since: dict[str, int] | None = None) -> dict:
    """The transport verdict (EPD: the encoder outputs' under `ec`), read again while it lacks evidence for up to
    one of the KV pods' logging intervals (dep.kv_log_interval_s) and a margin: their transfer windows are logged
    once per interval, so a short last cell's transfers may not be in the logs yet when it ends. A verdict with
    evidence (or a mismatch) is taken at once; one still without it after the interval stands."""
    deadline = clock() + dep.kv_log_interval_s + SETTLE_MARGIN_S if dep.kv_log_interval_s else None
    while True:
        transport = kv_transport(dep, spec, config, deltas, records, since)
        if config.topology == "epd":
            transport["ec"] = ec_transport(dep, spec, config, records)
        if deadline is None or not _pending(transport) or clock() >= deadline:
            return transport
        sleep(min(dep.kv_log_interval_s / SETTLE_POLLS, max(0.0, deadline - clock())))
        if dep.sync_logs:
            dep.sync_logs()


def ec_transport(dep: Deployment, spec: ExperimentSpec, config: ConfigurationSpec,
                 records: list[dict] | None = None) -> dict:
    """EPD: which transport carried the encoder outputs from Encode to Prefill. On a cluster (ECCPUConnector over
    NIXL), from the UCX lanes of the Encode and Prefill pods and their completed NIXL READs; when the KV connector is
    NIXL too, a Prefill pod's lanes serve both paths (UCX does not name the agent an endpoint belongs to). Another
    encoder-cache connector on a cluster (shared storage, Mooncake) is `not-read`: shown, never claimed verified. On
    the local target, the shared folder ECExampleConnector hands them over through (local_ec_transport)."""
    if spec.target.kind == "local":
        return local_ec_transport(dep, spec, records or [])
    connector = spec.target.kubernetes.engine.ec_connector
    if spec.target.kind == "kubernetes" and connector != "ECCPUConnector":
        return {"expected": config.ec_expected, "connector": connector, "what": "ec", "pods": {}, "verdict": "not-read",
                "reasons": [f"encoder outputs go through {connector}; epdbench reads ECCPUConnector's NIXL and UCX "
                            "lines only"]}
    pods = {p.name: nixl_of_pod(iter_lines(p.log_path)) for p in dep.processes if p.role in ("encode", "prefill")}
    ec = verify_nixl(config.ec_expected, pods, what="ec")
    if config.kv_connector == "nixl":
        ec["reasons"].append("the Prefill pods' UCX lanes also carry NixlConnector's KV: both verdicts read them")
    return ec


def filesystem_of(path: Path) -> str:
    """The type of the filesystem `path` is on (/proc/mounts' longest mount point above it), or unknown."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    target = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3 and (target == fields[1] or target.startswith(fields[1].rstrip("/") + "/")) \
                and len(fields[1]) >= len(best):
            best, kind = fields[1], fields[2]
    return kind


def folder_listing(path: Path | None) -> dict | None:
    """What the encoder-output folder holds now: files, bytes, and its filesystem; None when it cannot be read."""
    if path is None or not path.is_dir():
        return None
    files = [f for f in path.rglob("*") if f.is_file()]
    return {"path": str(path), "filesystem": filesystem_of(path), "files": len(files),
            "bytes": sum(f.stat().st_size for f in files)}


def local_ec_transport(dep: Deployment, spec: ExperimentSpec, records: list[dict]) -> dict:
    """The encoder outputs' verdict on the local target (analysis.ec_files): the encode and prefill engines'
    ECExampleConnector lines, and the folder they went through, read before it is removed."""
    roles = {p.name: p.role for p in dep.processes if p.role in ("encode", "prefill")}
    pods = {p.name: ec_files_of_pod(iter_lines(p.log_path)) for p in dep.processes if p.name in roles}
    return verify_ec_files(pods, roles, ec_expected(spec, records), folder_listing(dep.ec_dir))


def ec_expected(spec: ExperimentSpec, records: list[dict]) -> dict:
    """What the measured requests' distinct images must have left in the encoder-output folder: their count and
    their encoder outputs' bytes (the model's embedding of each image's tokens)."""
    images = {r["image_hash"]: r.get("image_px") for r in records if r["phase"] == "measured" and r.get("image_hash")}
    per_image = CostModel(spec.model, spec.hardware, 1).embedding_bytes
    return {"images": len(images),
            "bytes": sum(per_image(image_tokens(spec.model, px, px)) for px in images.values() if px)}


def collect(dep: Deployment, spec: ExperimentSpec, config: ConfigurationSpec, first: dict, last: dict,
            records: list[dict], suites: dict[str, dict], out_dir: Path, emulated: bool) -> tuple[dict, dict]:
    """Write transport.json (EPD: with the encoder outputs' verdict under `ec`, also ec_transport.json), stages.json
    and metrics snapshots; return the transport and stages verdict dicts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in first["metrics"].items():
        (out_dir / f"metrics-before-{name}.prom").write_text(text)
    for name, text in last["metrics"].items():
        (out_dir / f"metrics-after-{name}.prom").write_text(text)
    deltas = _metric_deltas(dep, first, last)
    transport = settled_transport(dep, spec, config, deltas, records, since=first["offsets"])
    if config.topology == "epd":
        write_json(out_dir / "ec_transport.json", transport["ec"])
    stages = verify_stages(expected_roles(config, records), _role_counts(dep, first, last), emulated, deltas)
    stages["metrics_delta"] = deltas
    stages["suites"] = suites
    if any(s["verdict"] == "mismatch" for s in suites.values()) and stages["verdict"] != "mismatch":
        stages["verdict"] = "mismatch"
        stages["reasons"].append("a suite failed stage verification")
    write_json(out_dir / "transport.json", transport)
    write_json(out_dir / "stages.json", stages)
    return transport, stages


def virtual_observation(cluster) -> dict:
    """What a virtual deployment (sim.vcluster.VirtualCluster, its replicas' `seen` kept) saw: the request ids
    admitted per role, the KV its prefill replicas sent (transfers, bytes), and its decode replicas' legs and the
    prompt tokens they computed themselves (analysis.stages.local_prefills reads them)."""
    seen: dict[str, set[str]] = {}
    kv = {"transfers": 0, "bytes": 0}
    decode = {"prompt_tokens_local_compute": 0.0, "requests_finished": 0.0}
    for rep in cluster.all():
        seen.setdefault(rep.role, set()).update(rep.seen or ())
        if rep.role == "prefill":
            kv["transfers"] += rep.counters.kv_transfers
            kv["bytes"] += rep.counters.kv_bytes
        if rep.role == "decode":
            decode["prompt_tokens_local_compute"] += rep.counters.prompt_by_source["local_compute"]
            decode["requests_finished"] += len(rep.seen or ())
    return {"request_ids": seen, "kv": kv, "decode": decode if "decode" in seen else None}


def collect_virtual(spec: ExperimentSpec, config: ConfigurationSpec, records: list[dict],
                    suites: dict[str, list[dict]], observed: dict, out_dir: Path) -> tuple[dict, dict]:
    """transport.json (EPD: with `ec`, also ec_transport.json) and stages.json of a configuration run in virtual
    time (analysis.transport.verify_virtual, analysis.stages.verify_stages on the request ids each role's
    replicas admitted, per suite and over the run); returns the transport and stages verdict dicts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {role: {"request_ids": ids} for role, ids in observed.get("request_ids", {}).items()}
    kv = None
    if config.topology != "aggregated":
        kv = {**kv_expectation(records, spec.model.kv_bytes_per_token_at(config.role("decode").tp)),
              **observed.get("kv", {})}
    transport = verify_virtual(config.kv_transport, kv)
    if config.topology == "epd":
        transport["ec"] = verify_virtual(config.ec_expected, None, what="ec")
        write_json(out_dir / "ec_transport.json", transport["ec"])
    deltas = {"decode": observed["decode"]} if observed.get("decode") else {}
    stages = verify_stages(expected_roles(config, records), counts, True, deltas)
    stages["reasons"].append("virtual clock: request ids as the modelled replicas admitted them; no logs or "
                             "/metrics exist")
    stages["metrics_delta"] = {}
    stages["suites"] = {}
    for name, rows in suites.items():
        s = verify_stages(expected_roles(config, rows), counts, True, deltas)
        stages["suites"][name] = {**s, "metrics_delta": {}}
    if any(s["verdict"] == "mismatch" for s in stages["suites"].values()) and stages["verdict"] != "mismatch":
        stages["verdict"] = "mismatch"
        stages["reasons"].append("a suite failed stage verification")
    write_json(out_dir / "transport.json", transport)
    write_json(out_dir / "stages.json", stages)
    return transport, stages
