"""Evidence of what a configuration really did, from its logs (pure: text in, dicts out).

Transport: which protocol the Mooncake engine installed on each KV pod, HCAs, RDMA devices,
throughput windows and failed transfers. Lines marked as emulated make the verdict `emulated`,
never `verified`. vLLM's "using X as its protocol" line is never evidence.
Stages: per role, completion access lines and which measured request ids each role saw.
"""
from __future__ import annotations

import re
from typing import Iterable

EMULATED_MARK = "[emulated by epdbench sim"
_PREFIX = re.compile(r"^\([A-Za-z_0-9]+ pid=\d+\) ")
GLOG = re.compile(r"^([IWEF])(\d{4}) (\d\d:\d\d:\d\d\.\d{6})\s+(\d+) ([\w.]+):(\d+)\] (.*)$")
HCAS = re.compile(r"Topology discovery complete\. Found (\d+) HCAs")
RDMA_DEV = re.compile(r"RDMA device: (\S+), LID: (\d+)")
TPUT_NEW = re.compile(r"\[Metrics\] Transfer Engine Stats \(over last [\d.]+s\): Throughput: ([\d.]+) MB/s")
TPUT_OLD = re.compile(r"\[Metrics\] Transfer Engine Throughput: ([\d.]+) MB/s")
KV_METRICS = re.compile(r"KV Transfer metrics: .*?Num successful transfers=(\d+).*?Num failed transfers=(\d+), "
                        r"Num failed recvs=(\d+)")
ACCESS = re.compile(r'INFO:\s+\S+ - "POST (/v1/(?:chat/)?completions) HTTP/1\.1" (\d{3})')
RECEIVED = re.compile(r"Received request (?:chatcmpl|cmpl)-(\S+?):")


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line, count=1)


def transport_of_pod(lines: Iterable[str]) -> dict:
    pod = {"observed": None, "hcas": None, "rdma_devices": [], "throughput_mb_s": [], "emulated": False,
           "successful_transfers": 0, "failed_transfers": 0, "failed_recvs": 0, "force_tcp": False,
           "tcp_listen": False}
    for raw in lines:
        line = strip_prefix(raw.rstrip("\n"))
        if EMULATED_MARK in line and ("transfer_engine" in line or "Transfer" in line or "KV" in line):
            pod["emulated"] = True
        if m := HCAS.search(line):
            pod["hcas"] = int(m.group(1))
        if "MC_FORCE_TCP is set" in line:
            pod["force_tcp"] = True
            pod["observed"] = "tcp"
        if "TcpTransport: listen on port" in line and pod["observed"] is None:
            pod["tcp_listen"] = True
            pod["observed"] = "tcp"
        if "installTransport, type=rdma" in line:
            pod["observed"] = "rdma"
        if m := RDMA_DEV.search(line):
            pod["rdma_devices"].append({"name": m.group(1), "lid": int(m.group(2))})
            if not pod["force_tcp"]:
                pod["observed"] = "rdma"
        if m := (TPUT_NEW.search(line) or TPUT_OLD.search(line)):
            pod["throughput_mb_s"].append(float(m.group(1)))
        if m := KV_METRICS.search(line):
            pod["successful_transfers"] += int(m.group(1))
            pod["failed_transfers"] += int(m.group(2))
            pod["failed_recvs"] += int(m.group(3))
    if pod["observed"] is None and pod["hcas"] is not None:
        pod["observed"] = "rdma" if pod["hcas"] > 0 else "tcp"
    return pod


def verify_transport(expected: str, pods: dict[str, dict]) -> dict:
    """Verdict over the KV pods of a configuration (expected: none | tcp | rdma)."""
    if expected == "none":
        return {"expected": "none", "pods": pods, "verdict": "not-applicable",
                "reasons": ["aggregated serving moves no KV between pods"]}
    reasons: list[str] = []
    verdict = "verified"
    if not pods or all(p["observed"] is None for p in pods.values()):
        return {"expected": expected, "pods": pods, "verdict": "no-evidence",
                "reasons": ["no Mooncake transport lines in any KV pod log"]}
    for name, p in pods.items():
        if p["observed"] is None:
            verdict = "no-evidence" if verdict == "verified" else verdict
            reasons.append(f"{name}: no transport line")
        elif p["observed"] != expected:
            verdict = "mismatch"
            reasons.append(f"expected {expected}; {name} installed {p['observed'].upper()} "
                           f"({p['hcas'] if p['hcas'] is not None else '?'} HCAs found)")
        if p["failed_transfers"] or p["failed_recvs"]:
            verdict = "mismatch" if verdict != "no-evidence" else verdict
            reasons.append(f"{name}: {p['failed_transfers']} failed transfers, {p['failed_recvs']} failed receives")
    if verdict == "verified" and any(p["emulated"] for p in pods.values()):
        verdict = "emulated"
        reasons.append(f"simulator: {expected} transport emulated by the cost model, no NIC used")
    elif verdict == "verified":
        reasons.append(f"every KV pod installed {expected}")
    tputs = [t for p in pods.values() for t in p["throughput_mb_s"]]
    return {"expected": expected, "pods": pods, "verdict": verdict, "reasons": reasons,
            "throughput_mb_s_min": min(tputs) if tputs else None,
            "throughput_mb_s_max": max(tputs) if tputs else None,
            "failed_transfers": sum(p["failed_transfers"] for p in pods.values()),
            "failed_recvs": sum(p["failed_recvs"] for p in pods.values())}


def stage_counts(lines: Iterable[str]) -> dict:
    """Completion access lines (by status) and request ids seen in one process's log slice."""
    completions = 0
    errors = 0
    ids: set[str] = set()
    for raw in lines:
        if m := ACCESS.search(raw):
            if m.group(2) == "200":
                completions += 1
            else:
                errors += 1
        if m := RECEIVED.search(raw):
            ids.add(m.group(1))
    return {"completions": completions, "errors": errors, "request_ids": ids}


def verify_stages(expected_roles: dict[str, list[str]], role_counts: dict[str, dict], emulated: bool) -> dict:
    """expected_roles: measured request id -> roles it must cross; role_counts: role -> stage_counts."""
    reasons: list[str] = []
    fractions: dict[str, float | None] = {}
    skipped: list[dict] = []
    roles = sorted({r for rs in expected_roles.values() for r in rs})
    for role in roles:
        want = [rid for rid, rs in expected_roles.items() if role in rs]
        seen = role_counts.get(role, {}).get("request_ids", set())
        hit = [rid for rid in want if rid in seen]
        fractions[role] = len(hit) / len(want) if want else None
        for rid in want:
            if rid not in seen:
                skipped.append({"request_id": rid, "missing_role": role})
    ok = bool(roles) and all(f == 1.0 for f in fractions.values() if f is not None)
    if not expected_roles:
        verdict = "no-evidence"
        reasons.append("no measured requests to correlate")
    elif ok:
        verdict = "emulated" if emulated else "verified"
        reasons.append(f"every measured request was seen at {', '.join(roles)}")
    else:
        verdict = "mismatch"
        for role, f in fractions.items():
            if f is not None and f < 1:
                reasons.append(f"{role}: {f:.0%} of measured requests seen")
    return {"verdict": verdict, "reasons": reasons, "fraction_seen": fractions,
            "per_role": {r: {k: v for k, v in c.items() if k != "request_ids"} for r, c in role_counts.items()},
            "skipped": skipped[:100], "n_skipped": len(skipped)}
