"""Evidence of what a configuration really did, from its logs (pure: lines in, dicts out).

Transport: which protocol the Mooncake transfer engine installed on each KV pod (HCAs, RDMA
devices and LIDs, TCP listen lines, handshakes and ready ACKs), how much moved (throughput windows,
KV Transfer metrics) and what failed. The engine picks RDMA by itself whenever it sees HCAs, so the
configuration proves nothing, and vLLM's "using X as its protocol" line is recorded but never used.
Lines marked as emulated (the simulator) give `emulated`, never `verified`.

Stages: per role, completion and render access lines and the request ids each role saw, so the
fraction of measured requests that crossed every expected stage is known.

Every function takes an iterable of lines, so multi-GB logs are streamed, never loaded whole.
"""
from __future__ import annotations

import re
from typing import Iterable

EMULATED_MARK = "[emulated by epdbench sim"
_PREFIX = re.compile(r"^\([A-Za-z_0-9]+ pid=\d+\) ")
HCAS = re.compile(r"Topology discovery complete\. Found (\d+) HCAs")
RDMA_DEV = re.compile(r"RDMA device: ([\w.-]+), LID: (\d+)")
TPUT_NEW = re.compile(r"\[Metrics\] Transfer Engine Stats \(over last ([\d.]+)s\): Throughput: ([\d.]+) MB/s"
                      r"(?: \| Latency Distribution \(count=(\d+)\))?")
TPUT_OLD = re.compile(r"\[Metrics\] Transfer Engine Throughput: ([\d.]+) MB/s")
KV_METRICS = re.compile(r"KV Transfer metrics: (.*)")
KV_FIELD = re.compile(r"(Num successful transfers|Num failed transfers|Num failed recvs|Num KV expired reqs)=(\d+)")
ACCESS = re.compile(r'INFO:\s+\S+ - "(GET|POST) (\S+) HTTP/[\d.]+" (\d{3})')
RECEIVED = re.compile(r"Received request (?:chatcmpl|cmpl)-([\w.:-]+?)[:,\s]")
LOCAL_PREFILL = re.compile(r"Request (?:chatcmpl|cmpl)-([\w.:-]+) arrived without kv_transfer_params")
CHOICE_SUFFIX = re.compile(r"-\d+$")
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")

# (counter, substring) pairs for single-line events; order does not matter.
_EVENTS = [
    ("p2p_handshake", "using P2P handshake"),
    ("connections_established", "Connection has been established"),
    ("ready_acks_sent", "sending RDMA ready ACK"),
    ("ready_acks_received", "Received RDMA ready ACK"),
    ("ready_ack_unsupported", "Peer does not support RDMA ready ACK"),
    ("reestablished", "Re-establish connection"),
    ("ready_ack_timeouts", "Timed out waiting for RDMA ready ACK"),
    ("failed_slices", "Process failed for slice"),
    ("registration_failures", "Failed to register memory"),
    ("transfer_timeouts", "data transfer timeout"),
    ("slice_timeouts", "Slice timeout detected"),
    ("connection_failures", "getConnection failed"),
    ("send_failures", "failed (ret="),
    ("pull_failures", "pulling kv_caches for"),
]
FAILURE_COUNTERS = ["ready_ack_timeouts", "failed_slices", "registration_failures", "transfer_timeouts",
                    "slice_timeouts", "connection_failures", "send_failures", "pull_failures",
                    "failed_transfers", "failed_recvs"]


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line, count=1)


def new_pod() -> dict:
    pod = {"observed": None, "hcas": None, "rdma_devices": [], "force_tcp": False, "tcp_listen": False,
           "rdma_installed": False, "throughput_mb_s": [], "emulated": False, "vllm_protocol_claim": None,
           "successful_transfers": 0, "failed_transfers": 0, "failed_recvs": 0, "expired_requests": 0,
           "lines": 0}
    pod.update({name: 0 for name, _ in _EVENTS})
    return pod


def transport_of_pod(lines: Iterable[str]) -> dict:
    """Everything one KV pod's log says about its transfer engine."""
    pod = new_pod()
    for raw in lines:
        pod["lines"] += 1
        _scan_line(pod, strip_prefix(raw.rstrip("\r\n")))
    pod["observed"] = observed_protocol(pod)
    return pod


def _scan_line(pod: dict, line: str) -> None:
    if EMULATED_MARK in line:
        pod["emulated"] = True
    if "Mooncake Transfer Engine is using" in line:
        m = re.search(r"using (\w+) as its protocol", line)
        pod["vllm_protocol_claim"] = m.group(1) if m else None
        return  # a claim from config, never evidence
    if m := HCAS.search(line):
        pod["hcas"] = int(m.group(1))
    if "MC_FORCE_TCP is set" in line:
        pod["force_tcp"] = True
    if "TcpTransport: listen on port" in line:
        pod["tcp_listen"] = True
    if "installTransport, type=rdma" in line:
        pod["rdma_installed"] = True
    if m := RDMA_DEV.search(line):
        pod["rdma_devices"].append({"name": m.group(1), "lid": int(m.group(2))})
    if m := TPUT_NEW.search(line):
        pod["throughput_mb_s"].append(float(m.group(2)))
    elif m := TPUT_OLD.search(line):
        pod["throughput_mb_s"].append(float(m.group(1)))
    if m := KV_METRICS.search(line):
        fields = dict(KV_FIELD.findall(m.group(1)))
        pod["successful_transfers"] += int(fields.get("Num successful transfers", 0))
        pod["failed_transfers"] += int(fields.get("Num failed transfers", 0))
        pod["failed_recvs"] += int(fields.get("Num failed recvs", 0))
        pod["expired_requests"] += int(fields.get("Num KV expired reqs", 0))
        return
    for name, needle in _EVENTS:
        if needle in line:
            if name == "send_failures" and "Sending to" not in line:
                continue
            if name == "pull_failures" and "failed" not in line:
                continue
            pod[name] += 1


def observed_protocol(pod: dict) -> str | None:
    """What the engine installed: RDMA needs an RDMA install or device line without MC_FORCE_TCP;
    TCP needs MC_FORCE_TCP, a TCP listen line or zero HCAs."""
    if pod["force_tcp"]:
        return "tcp"
    if pod["rdma_installed"] or pod["rdma_devices"]:
        return "rdma"
    if pod["hcas"] is not None:
        return "rdma" if pod["hcas"] > 0 else "tcp"
    if pod["tcp_listen"]:
        return "tcp"
    return None


def _failures(pod: dict) -> dict[str, int]:
    return {k: pod[k] for k in FAILURE_COUNTERS if pod.get(k)}


def verify_transport(expected: str, pods: dict[str, dict]) -> dict:
    """Verdict over the KV pods of a configuration (expected: none | tcp | rdma)."""
    base = {"expected": expected, "pods": pods, "throughput_mb_s_min": None, "throughput_mb_s_max": None,
            "failed_transfers": 0, "failed_recvs": 0, "ready_acks": 0}
    if expected == "none":
        return {**base, "verdict": "not-applicable", "reasons": ["aggregated serving moves no KV between pods"]}
    tputs = [t for p in pods.values() for t in p["throughput_mb_s"]]
    base.update({
        "throughput_mb_s_min": min(tputs) if tputs else None,
        "throughput_mb_s_max": max(tputs) if tputs else None,
        "failed_transfers": sum(p["failed_transfers"] + p["failed_slices"] + p["send_failures"] for p in pods.values()),
        "failed_recvs": sum(p["failed_recvs"] + p["pull_failures"] for p in pods.values()),
        "ready_acks": sum(p["ready_acks_received"] for p in pods.values()),
    })
    if not pods or all(p["observed"] is None for p in pods.values()):
        claims = {p["vllm_protocol_claim"] for p in pods.values() if p["vllm_protocol_claim"]}
        why = "no Mooncake transport lines in any KV pod log"
        if claims:
            why += f" (vLLM's own protocol line says {', '.join(sorted(claims))}: not evidence)"
        return {**base, "verdict": "no-evidence", "reasons": [why]}
    reasons: list[str] = []
    mismatch = False
    for name, p in sorted(pods.items()):
        if p["observed"] is None:
            reasons.append(f"{name}: no transport line")
        elif p["observed"] != expected:
            mismatch = True
            hcas = f"{p['hcas']} HCAs found" if p["hcas"] is not None else "HCAs unknown"
            extra = ", MC_FORCE_TCP set" if p["force_tcp"] else ""
            reasons.append(f"expected {expected}; {name} installed {p['observed'].upper()} ({hcas}{extra})")
        fails = _failures(p)
        if fails:
            mismatch = True
            reasons.append(f"{name}: transfers failed ({', '.join(f'{k}={v}' for k, v in fails.items())})")
    moved = bool(tputs) or any(p["successful_transfers"] for p in pods.values())
    if mismatch:
        verdict = "mismatch"
    elif any(p["observed"] is None for p in pods.values()):
        verdict = "no-evidence"
    elif not moved:
        verdict = "no-evidence"
        reasons.append(f"every KV pod installed {expected}, but no transfer activity was logged "
                       "(enable MC_TE_METRIC=1 and KV transfer stats logging)")
    else:
        verdict = "verified"
        devices = sorted({d["name"] for p in pods.values() for d in p["rdma_devices"]})
        what = f"{expected.upper()}" + (f" on {', '.join(devices)}" if devices and expected == "rdma" else "")
        reasons.append(f"every KV pod installed {what}; KV moved "
                       f"({len(tputs)} throughput windows, max {max(tputs):.1f} MB/s)" if tputs else
                       f"every KV pod installed {what}; KV moved "
                       f"({sum(p['successful_transfers'] for p in pods.values())} successful transfers)")
    if any(p["emulated"] for p in pods.values()):
        if verdict == "verified":
            verdict = "emulated"
        reasons.append(f"simulator: the {expected} transport is emulated by the cost model, no NIC used")
    return {**base, "verdict": verdict, "reasons": reasons}


def stage_counts(lines: Iterable[str]) -> dict:
    """Completion and render access lines and request ids seen in one process's log slice."""
    out = {"completions": 0, "errors": 0, "renders": 0, "request_ids": set(), "local_prefills": set()}
    for raw in lines:
        if m := ACCESS.search(raw):
            path, status = m.group(2).split("?")[0], m.group(3)
            if path in COMPLETION_PATHS:
                if status == "200":
                    out["completions"] += 1
                else:
                    out["errors"] += 1
            elif "render" in path or "tokenize" in path:
                out["renders"] += 1
        elif m := RECEIVED.search(raw):
            # vLLM logs completions as cmpl-<id>-<choice index>; keep both forms so either matches.
            out["request_ids"].update({m.group(1), CHOICE_SUFFIX.sub("", m.group(1))})
        elif m := LOCAL_PREFILL.search(raw):
            out["local_prefills"].add(m.group(1))
    return out


def merge_counts(a: dict, b: dict) -> dict:
    return {"completions": a["completions"] + b["completions"], "errors": a["errors"] + b["errors"],
            "renders": a["renders"] + b["renders"], "request_ids": a["request_ids"] | b["request_ids"],
            "local_prefills": a["local_prefills"] | b["local_prefills"]}


def verify_stages(expected_roles: dict[str, list[str]], role_counts: dict[str, dict], emulated: bool) -> dict:
    """expected_roles: measured request id -> roles it must cross; role_counts: role -> stage_counts."""
    reasons: list[str] = []
    fractions: dict[str, float | None] = {}
    skipped: list[dict] = []
    roles = sorted({r for rs in expected_roles.values() for r in rs})
    for role in roles:
        want = [rid for rid, rs in expected_roles.items() if role in rs]
        seen = role_counts.get(role, {}).get("request_ids", set())
        fractions[role] = sum(1 for rid in want if rid in seen) / len(want) if want else None
        skipped += [{"request_id": rid, "missing_role": role} for rid in want if rid not in seen]
    local = sorted(set().union(*(c.get("local_prefills", set()) for c in role_counts.values()))
                   & set(expected_roles)) if role_counts else []
    if not expected_roles:
        verdict = "no-evidence"
        reasons.append("no measured requests to correlate")
    elif not skipped and not local:
        verdict = "emulated" if emulated else "verified"
        reasons.append(f"every measured request was seen at {', '.join(roles)}")
    else:
        verdict = "mismatch"
        for role, f in fractions.items():
            if f is not None and f < 1:
                reasons.append(f"{role}: {f:.1%} of measured requests seen "
                               f"({sum(1 for s in skipped if s['missing_role'] == role)} skipped it)")
        if local:
            reasons.append(f"{len(local)} measured request(s) were prefilled on a decode pod without KV transfer")
    per_role = {r: {k: (len(v) if isinstance(v, set) else v) for k, v in c.items()} for r, c in role_counts.items()}
    return {"verdict": verdict, "reasons": reasons, "fraction_seen": fractions, "per_role": per_role,
            "skipped": skipped[:100], "n_skipped": len(skipped), "local_prefills": local[:100]}
