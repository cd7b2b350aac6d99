"""Which KV transport really carried the KV, per pod and per TP worker, from Mooncake's and vLLM's own
log lines (pure: lines in, dicts out).

Mooncake installs RDMA by itself whenever it discovers HCAs, so the configuration proves nothing and
vLLM's "using X as its protocol" line is recorded but never used. Each worker's transport comes from
its own install lines (MC_FORCE_TCP, `installTransport`, RDMA device and TCP listen lines; 0 HCAs
means TCP), matched whole in glog format from the producing source file (analysis.logformats). A
`verified` needs every worker on the expected transport and proof that KV moved: non-zero
throughput windows or successful transfers on the sending pods, and, when the caller knows the run's
records, at least one transfer per measured request and bytes consistent with the prompts' KV size.
Lines marked as emulated (the simulator) give `emulated`, never `verified`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from epdbench.analysis.labels import named_or_counted
from epdbench.analysis.logformats import WORKER_PID, LogLine, parse_line

# Relative tolerance between the KV bytes moved and the KV of the prompts (kv bytes per token × prompt
# tokens not already cached on the decode side): per-block rounding, probes and TP shards stay inside it.
KV_BYTES_TOLERANCE = 0.25

TE_FILES = frozenset({"transfer_engine.cpp", "transfer_engine_impl.cpp"})
# kind -> (source files that write it, the message from its first character)
INSTALL = {
    "hcas": (TE_FILES, re.compile(r"Topology discovery complete\. Found (\d+) HCAs\.?")),
    "install": (TE_FILES | {"multi_transport.cpp"}, re.compile(r"installTransport, type=(\w+)")),
    "force_tcp": (TE_FILES, re.compile(r"MC_FORCE_TCP is set, using TCP transport only")),
    "tcp_listen": (frozenset({"tcp_transport.cpp"}), re.compile(r"TcpTransport: listen on port (\d+)")),
    "rdma_device": (frozenset({"rdma_context.cpp"}), re.compile(r"RDMA device: ([\w.:-]+), LID: (\d+)(?:, GID: .*)?")),
}
WINDOW_NEW = re.compile(r"\[Metrics\] Transfer Engine Stats \(over last ([\d.]+)s\): Throughput: ([\d.]+) MB/s"
                        r"(?: \| Latency Distribution \(count=(\d+)\).*)?")
WINDOW_OLD = re.compile(r"\[Metrics\] Transfer Engine Throughput: ([\d.]+) MB/s \(over last ([\d.]+)s\)")
KV_METRICS = re.compile(r"KV Transfer metrics: (.*)")
KV_METRICS_FILES = frozenset({"metrics.py", "loggers.py"})
KV_FIELD = re.compile(r"(Num successful transfers|Num failed transfers|Num failed recvs|Num KV expired reqs"
                      r"|Throughput \(MB/s\))=([\d.]+)")
PROTOCOL_CLAIM = re.compile(r"The Mooncake Transfer Engine is using (\w+) as its protocol\.?")
# Handshake events and failures: glog (any source file) or vLLM messages, matched from their first character.
GLOG_EVENTS = [
    ("p2p_handshake", re.compile(r"Transfer Engine RPC using P2P handshake")),
    ("connections_established", re.compile(r"Connection has been established")),
    ("ready_acks_sent", re.compile(r"Received same peer QP numbers, sending RDMA ready ACK")),
    ("ready_acks_received", re.compile(r"Received RDMA ready ACK")),
    ("ready_ack_unsupported", re.compile(r"Peer does not support RDMA ready ACK")),
    ("reestablished", re.compile(r"Re-establish connection")),
    ("ready_ack_timeouts", re.compile(r"Worker: Timed out waiting for RDMA ready ACK")),
    ("failed_slices", re.compile(r"Worker: Process failed for slice")),
    ("registration_failures", re.compile(r"(?:RdmaTransport: )?Failed to register memory")),
    ("transfer_timeouts", re.compile(r"Sync batch data transfer timeout")),
    ("slice_timeouts", re.compile(r"Slice timeout detected")),
    ("connection_failures", re.compile(r"TcpTransport::getConnection failed")),
]
VLLM_EVENTS = [
    ("send_failures", re.compile(r"Sending to \S+ failed \(ret=")),
    ("pull_failures", re.compile(r"pulling kv_caches for \S+ failed")),
]
FAILURE_COUNTERS = ["ready_ack_timeouts", "failed_slices", "registration_failures", "transfer_timeouts",
                    "slice_timeouts", "connection_failures", "send_failures", "pull_failures",
                    "failed_transfers", "failed_recvs"]


def new_worker() -> dict:
    return {"hcas": None, "installed": [], "force_tcp": False, "tcp_listen": False, "rdma_devices": [],
            "throughput_mb_s": [], "emulated": False, "observed": None}


def new_pod() -> dict:
    pod = {"observed": None, "workers": {}, "hcas": None, "rdma_devices": [], "force_tcp": False,
           "throughput_mb_s": [], "emulated": False, "vllm_protocol_claim": None, "successful_transfers": 0,
           "failed_transfers": 0, "failed_recvs": 0, "expired_requests": 0, "transfer_mb_s": [], "lines": 0}
    pod.update({name: 0 for name, _ in GLOG_EVENTS + VLLM_EVENTS})
    return pod


def transport_of_pod(lines: Iterable[str]) -> dict:
    """Everything one KV pod's log says about its transfer engines, per worker."""
    pod = new_pod()
    windows: list[tuple[LogLine, float]] = []
    for raw in lines:
        pod["lines"] += 1
        if (line := parse_line(raw)) is not None:
            _scan(pod, line, windows)
    alias = _merge_aliases(pod["workers"])
    for line, mb_s in windows:   # windows go to the worker whose install lines share their thread or prefix
        worker = pod["workers"].get(alias.get(line.worker, line.worker))
        (worker or pod)["throughput_mb_s"].append(mb_s)
    for w in pod["workers"].values():
        w["observed"] = worker_protocol(w)
    _summarise(pod)
    return pod


def _merge_aliases(workers: dict[str, dict]) -> dict[str, str]:
    """One worker under two names (`Worker_TP0 pid=801` on prefixed lines, `thread 801` on glog lines
    written straight to the process's stderr) becomes one, under the prefix name; returns the aliases."""
    alias = {f"thread {m.group(1)}": name for name in workers if (m := WORKER_PID.match(name))}
    for thread, name in alias.items():
        if (other := workers.pop(thread, None)) is not None:
            w = workers[name]
            w["hcas"] = w["hcas"] if other["hcas"] is None else other["hcas"]
            w["installed"] += other["installed"]
            w["rdma_devices"] += other["rdma_devices"]
            for flag in ("force_tcp", "tcp_listen", "emulated"):
                w[flag] = w[flag] or other[flag]
    return alias


def _scan(pod: dict, line: LogLine, windows: list[tuple[LogLine, float]]) -> None:
    if line.kind == "glog":
        _scan_glog(pod, line, windows)
    elif line.kind == "vllm":
        _scan_vllm(pod, line)


def _scan_glog(pod: dict, line: LogLine, windows: list[tuple[LogLine, float]]) -> None:
    msg = line.message
    for kind, (files, pattern) in INSTALL.items():
        if line.file in files and (m := pattern.fullmatch(msg)):
            w = pod["workers"].setdefault(line.worker, new_worker())
            w["emulated"] |= line.emulated
            if kind == "hcas":
                w["hcas"] = int(m.group(1))
            elif kind == "install":
                w["installed"].append(m.group(1).lower())
            elif kind == "force_tcp":
                w["force_tcp"] = True
            elif kind == "tcp_listen":
                w["tcp_listen"] = True
            else:
                w["rdma_devices"].append({"name": m.group(1), "lid": int(m.group(2))})
            return
    if line.file in TE_FILES:
        if m := WINDOW_NEW.fullmatch(msg):
            windows.append((line, float(m.group(2))))
            pod["emulated"] |= line.emulated
            return
        if m := WINDOW_OLD.fullmatch(msg):
            windows.append((line, float(m.group(1))))
            pod["emulated"] |= line.emulated
            return
    for name, pattern in GLOG_EVENTS:
        if pattern.match(msg):
            pod[name] += 1
            return


def _scan_vllm(pod: dict, line: LogLine) -> None:
    msg = line.message
    if m := PROTOCOL_CLAIM.fullmatch(msg):
        pod["vllm_protocol_claim"] = m.group(1)   # a claim from config, never evidence
        return
    if line.file in KV_METRICS_FILES and (m := KV_METRICS.fullmatch(msg)):
        fields = {k: float(v) for k, v in KV_FIELD.findall(m.group(1))}
        pod["successful_transfers"] += int(fields.get("Num successful transfers", 0))
        pod["failed_transfers"] += int(fields.get("Num failed transfers", 0))
        pod["failed_recvs"] += int(fields.get("Num failed recvs", 0))
        pod["expired_requests"] += int(fields.get("Num KV expired reqs", 0))
        if fields.get("Throughput (MB/s)"):
            pod["transfer_mb_s"].append(fields["Throughput (MB/s)"])
        pod["emulated"] |= line.emulated
        return
    for name, pattern in VLLM_EVENTS:
        if pattern.match(msg):
            pod[name] += 1
            return


def worker_protocol(w: dict) -> str | None:
    """What one transfer engine installed: tcp under MC_FORCE_TCP; otherwise what its install, RDMA device
    and TCP listen lines show (both: `rdma+tcp`); 0 HCAs alone means TCP. HCAs found prove nothing."""
    if w["force_tcp"]:
        return "tcp"
    kinds = {k for k in w["installed"] if k in ("rdma", "tcp")}
    if w["rdma_devices"]:
        kinds.add("rdma")
    if w["tcp_listen"]:
        kinds.add("tcp")
    if not kinds and w["hcas"] == 0:
        kinds.add("tcp")
    return "+".join(sorted(kinds)) or None


def _summarise(pod: dict) -> None:
    workers = [w for w in pod["workers"].values() if w["observed"]]
    observed = {w["observed"] for w in workers}
    pod["observed"] = observed.pop() if len(observed) == 1 else ("mixed" if observed else None)
    pod["hcas"] = max((w["hcas"] for w in pod["workers"].values() if w["hcas"] is not None), default=None)
    pod["rdma_devices"] = [d for w in pod["workers"].values() for d in w["rdma_devices"]]
    pod["force_tcp"] = any(w["force_tcp"] for w in pod["workers"].values())
    pod["throughput_mb_s"] = pod["throughput_mb_s"] + [t for w in pod["workers"].values()
                                                       for t in w["throughput_mb_s"]]
    pod["emulated"] |= any(w["emulated"] for w in pod["workers"].values())


def _failures(pod: dict) -> dict[str, int]:
    return {k: pod[k] for k in FAILURE_COUNTERS if pod.get(k)}


def moved(pod: dict) -> bool:
    """Whether the pod's own lines prove bytes moved: a non-zero throughput window or a successful transfer."""
    return any(t > 0 for t in pod["throughput_mb_s"]) or pod["successful_transfers"] > 0


def kv_expectation(records: Iterable[dict], kv_bytes_per_token: int, block_tokens: int = 1) -> dict:
    """What the run's records say must have moved: one transfer per measured request that succeeded, and
    the KV of every prompt token the decode side did not hold (measured only, and with warm-ups). A response
    without cached_tokens (vLLM reports them only with --enable-prompt-tokens-details) may have moved any part
    of its prompt's KV: it counts whole at the high end and not at the low end, and `cached_unknown` says how
    many there were. KV moves in whole blocks of `block_tokens`: the high end rounds each request's tokens up to
    them (a 122-token prompt moves one 128-token block)."""
    measured = every = unknown = 0
    bytes_measured = bytes_all = 0.0
    for r in records:
        if not r.get("ok") or not r.get("prompt_tokens"):
            continue
        cached = r.get("cached_tokens")
        known = cached is not None and cached == cached       # a missing value may come back as NaN
        tokens = max(0, int(r["prompt_tokens"]) - (int(cached) if known else 0))
        kv = tokens * kv_bytes_per_token
        every += 1
        bytes_all += -(-tokens // block_tokens) * block_tokens * kv_bytes_per_token
        if r.get("phase") == "measured":
            measured += 1
            if known:
                bytes_measured += kv
            else:
                unknown += 1
    return {"measured_requests": measured, "requests": every, "expected_bytes_min": bytes_measured,
            "expected_bytes_max": bytes_all, "tolerance": KV_BYTES_TOLERANCE, "cached_unknown": unknown}


def check_kv_volume(kv: dict) -> list[str]:
    """Problems between what moved (`transfers`, `bytes` from the sending side's counters) and what the
    records say must have moved; empty when consistent."""
    problems = []
    transfers, moved_bytes = kv.get("transfers"), kv.get("bytes")
    if transfers is not None and transfers < kv["measured_requests"]:
        problems.append(f"{transfers:.0f} successful KV transfers for {kv['measured_requests']} measured "
                        "requests: some requests did not move their KV")
    if moved_bytes is not None and kv["expected_bytes_max"] > 0:
        low = kv["expected_bytes_min"] * (1 - kv["tolerance"])
        high = kv["expected_bytes_max"] * (1 + kv["tolerance"])
        if not low <= moved_bytes <= high:
            problems.append(f"{moved_bytes / 1e6:.1f} MB of KV moved, but the prompts' KV is "
                            f"{kv['expected_bytes_min'] / 1e6:.1f}–{kv['expected_bytes_max'] / 1e6:.1f} MB "
                            f"(± {kv['tolerance']:.0%})")
    return problems


def volume_and_rate(base: dict, expected: str, pods: dict[str, dict], kv: dict | None, tcp_mb_s: float | None,
                    reasons: list[str]) -> bool:
    """The checks both connectors' verdicts share: the KV volume against the records (True: a mismatch), and an
    RDMA transfer rate TCP could have carried (flagged `suspicious` in `base`, with a reason)."""
    volume = check_kv_volume(kv) if kv else []
    reasons += volume
    rates = [r for p in pods.values() for r in p["transfer_mb_s"]]
    if expected == "rdma" and tcp_mb_s and rates and max(rates) < tcp_mb_s:
        base["suspicious"] = True
        reasons.append(f"suspicious: RDMA transfers ran at most {max(rates):.0f} MB/s, no faster than TCP "
                       f"carries ({tcp_mb_s:.0f} MB/s)")
    return bool(volume)


def volume_gaps(kv: dict | None, connector: str) -> list[str]:
    """On a run (`kv` given): why the KV volume could not be checked — the counting side's /metrics gave no
    transfer count or no bytes (a scrape that failed, or connector stats off) — so KV is not verified."""
    if kv is None:
        return []
    names = {"mooncake": ("vllm:mooncake_xfer_time_seconds_count", "vllm:mooncake_bytes_transferred_sum", "Prefill"),
             "nixl": ("vllm:nixl_xfer_time_seconds_count", "vllm:nixl_bytes_transferred_sum", "Decode")}[connector]
    absent = [name for key, name in zip(("transfers", "bytes"), names) if kv.get(key) is None]
    if not absent:
        return []
    return [f"KV volume not checked: the {names[2]} pods' /metrics gave no {' and no '.join(absent)} over the run "
            "(its scrape failed, or the connector's stats are off)"]


def volume_line(kv: dict | None) -> list[str]:
    """The verified volume, when the sending or reading side's counters gave one."""
    if not kv or kv.get("bytes") is None:
        return []
    line = (f"{kv['bytes'] / 1e6:.1f} MB moved in {kv.get('transfers') or 0:.0f} transfers for "
            f"{kv['measured_requests']} measured requests, within ± {kv['tolerance']:.0%} of their prompts' KV")
    if kv.get("cached_unknown"):
        line += (f" (at most: {kv['cached_unknown']} responses did not report their cached tokens, so the low end "
                 "leaves them out; vLLM reports them with --enable-prompt-tokens-details)")
    return [line]


def emulated(verdict: str, pods: dict[str, dict], reasons: list[str], what: str) -> str:
    """On the simulator's lines a verified verdict is `emulated`, and the reasons say so."""
    if not any(p["emulated"] for p in pods.values()):
        return verdict
    reasons.append(f"simulator: {what} is emulated by the cost model, no NIC used")
    return "emulated" if verdict == "verified" else verdict


def _install_detail(w: dict) -> str:
    hcas = f"{w['hcas']} HCAs found" if w["hcas"] is not None else "HCAs unknown"
    return hcas + (", MC_FORCE_TCP set" if w["force_tcp"] else ", no MC_FORCE_TCP line")


def worker_mismatches(expected: str, pods: dict[str, dict]) -> list[str]:
    """One line per distinct install on another transport than `expected` (what was installed, HCAs found,
    MC_FORCE_TCP) with the workers that made it (a TP8 pod has eight alike)."""
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for name, p in sorted(pods.items()):
        for wname, w in sorted(p["workers"].items()):
            if w["observed"] and w["observed"] != expected:
                groups.setdefault((w["observed"].upper(), _install_detail(w)), []).append((name, wname))
    return [f"expected {expected}; {named_or_counted(workers, 'worker')} installed {installed} ({detail})"
            for (installed, detail), workers in groups.items()]


def _movement_gaps(name: str, pod: dict, sender: bool) -> list[str]:
    """Pods and workers that installed a transport but whose own lines show nothing moving."""
    gaps = []
    if sender and not moved(pod):
        windows = len(pod["throughput_mb_s"])
        gaps.append(f"{name}: installed {pod['observed']} but nothing moved ({windows} throughput windows, "
                    f"max {max(pod['throughput_mb_s'], default=0):.2f} MB/s; "
                    f"{pod['successful_transfers']} successful transfers)")
    attributed = [w for w in pod["workers"].values() if w["throughput_mb_s"]]
    if attributed:
        for wname, w in sorted(pod["workers"].items()):
            if w["observed"] and not any(t > 0 for t in w["throughput_mb_s"]):
                gaps.append(f"{name} {wname}: installed {w['observed']} but none of its throughput windows "
                            "shows KV moving")
    return gaps


def verify_transport(expected: str, pods: dict[str, dict], roles: dict[str, str] | None = None,
                     kv: dict | None = None, tcp_mb_s: float | None = None) -> dict:
    """Verdict over the KV pods of a configuration (expected: none | tcp | rdma). `roles` (pod → prefill |
    decode) names the sending pods, each of which must show KV moving (else at least one pod must); `kv`
    (kv_expectation plus the sending side's `transfers` and `bytes`) checks the volume; `tcp_mb_s` flags
    an RDMA transfer rate that TCP could have carried."""
    tputs = [t for p in pods.values() for t in p["throughput_mb_s"]]
    base = {"expected": expected, "pods": pods, "throughput_mb_s_min": min(tputs) if tputs else None,
            "throughput_mb_s_max": max(tputs) if tputs else None,
            "failed_transfers": sum(p["failed_transfers"] + p["failed_slices"] + p["send_failures"]
                                    for p in pods.values()),
            "failed_recvs": sum(p["failed_recvs"] + p["pull_failures"] for p in pods.values()),
            "ready_acks": sum(p["ready_acks_received"] for p in pods.values()), "kv_check": kv,
            "suspicious": False}
    if expected == "none":
        return {**base, "verdict": "not-applicable", "reasons": ["aggregated serving moves no KV between pods"]}
    if not pods or all(p["observed"] is None for p in pods.values()):
        claims = {p["vllm_protocol_claim"] for p in pods.values() if p["vllm_protocol_claim"]}
        why = "no Mooncake transport install line in any KV pod log"
        if claims:
            why += f" (vLLM's own protocol line says {', '.join(sorted(claims))}: not evidence)"
        return {**base, "verdict": "no-evidence", "reasons": [why]}
    reasons: list[str] = []
    mismatch = missing = False
    for name, p in sorted(pods.items()):
        if p["observed"] is None:
            missing = True
            reasons.append(f"{name}: no transport install line")
    if found := worker_mismatches(expected, pods):
        mismatch = True
        reasons += found
    for name, p in sorted(pods.items()):
        if fails := _failures(p):
            mismatch = True
            reasons.append(f"{name}: transfers failed ({', '.join(f'{k}={v}' for k, v in fails.items())})")
    senders = {n for n, r in (roles or {}).items() if r == "prefill" and n in pods}
    gaps = [g for n, p in sorted(pods.items()) if p["observed"] for g in _movement_gaps(n, p, n in senders)]
    if not senders and not any(moved(p) for p in pods.values()):
        gaps.append("no KV pod shows KV moving: every throughput window is 0 MB/s or absent and no transfer "
                    "succeeded (enable MC_TE_METRIC=1 and KV transfer stats logging)")
    gaps += volume_gaps(kv, "mooncake")
    reasons += gaps
    mismatch |= volume_and_rate(base, expected, pods, kv, tcp_mb_s, reasons)
    if mismatch:
        verdict = "mismatch"
    elif missing or gaps:
        verdict = "no-evidence"
    else:
        verdict = "verified"
        devices = sorted({d["name"] for p in pods.values() for d in p["rdma_devices"]})
        what = expected.upper() + (f" on {', '.join(devices)}" if devices and expected == "rdma" else "")
        n_workers = sum(1 for p in pods.values() for w in p["workers"].values() if w["observed"])
        proof = (f"{len(tputs)} throughput windows, max {max(tputs):.1f} MB/s" if tputs else
                 f"{sum(p['successful_transfers'] for p in pods.values())} successful transfers")
        reasons.insert(0, f"every KV pod and worker ({n_workers}) installed {what}; KV moved ({proof})")
        reasons += volume_line(kv)
    verdict = emulated(verdict, pods, reasons, f"the {expected} transport")
    return {**base, "verdict": verdict, "reasons": reasons}


def verify_virtual(expected: str, kv: dict | None, what: str = "kv") -> dict:
    """The verdict of a configuration run in virtual time (`compare --clock virtual`): no process ran and no
    transport line exists, so nothing is verified; the cost model's own transfers (`kv`: kv_expectation plus the
    sending replicas' `transfers` and `bytes`) are still held to the records' volume, and a gap is a mismatch
    of the model itself. `what`: kv, or ec (the encoder outputs, whose transfers are not counted)."""
    base = {"expected": expected, "what": what, "pods": {}, "throughput_mb_s_min": None, "throughput_mb_s_max": None,
            "failed_transfers": 0, "failed_recvs": 0, "ready_acks": 0, "kv_check": kv, "suspicious": False,
            "clock": "virtual"}
    if expected == "none":
        return {**base, "verdict": "not-applicable", "reasons": ["aggregated serving moves no KV between pods"]}
    reasons = [f"virtual clock: no process ran and no transport line exists; the cost model moved the "
               f"{'encoder outputs' if what == 'ec' else 'KV'} as {expected} transfers"]
    problems = check_kv_volume(kv) if kv else []
    if kv and not problems:
        reasons.append(f"{kv['transfers']:.0f} modelled KV transfers of {kv['bytes'] / 1e6:.1f} MB for "
                       f"{kv['measured_requests']} measured requests, as the prompts' KV")
    return {**base, "verdict": "mismatch" if problems else "emulated", "reasons": reasons + problems}
