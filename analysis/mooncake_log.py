"""What one KV pod's log says about its Mooncake transfer engines, per TP worker (pure: lines in, a dict out).

Mooncake installs its transport itself, so each worker's transport comes from the engine's own install lines, glog
lines from the producing source file (analysis.logformats), never from vLLM's "using X as its protocol" line (a
claim from config: the Python binding ignores the protocol argument). The messages, as Mooncake writes them
(mooncake-transfer-engine/src/transfer_engine_impl.cpp, the snapshot of 2026-08, and every message below found
verbatim in the strings of mooncake-transfer-engine-cuda13 0.3.14's engine.so):
- `MC_FORCE_TCP is set, using TCP transport only` (checked before any topology discovery, then it returns: no
  `Topology discovery complete` line follows); 0.3.14 adds `MC_FORCE_SHM is set, using SHM transport only`;
- `Topology discovery complete. Found N HCAs.`, then one of `Using TCP transport (no HCA detected)`, `Using RDMA
  transport (RoCE/iWARP)`, `Using Intra-Node NVLink transport (MC_INTRANODE_NVLINK set)` (the branch the CUDA wheels
  compile, USE_INTRA_NVLINK) or, on builds of the other branch, `installTransport, type=rdma` (none of the latter
  in the 0.3.14 CUDA 13 wheel's strings but the EFA transport's `installTransport, type=efa`);
- `TcpTransport: listen on port N` (tcp_transport.cpp) and `RDMA device: mlx5_0, LID: N, GID: ...`
  (rdma_context.cpp);
- with MC_TE_METRIC=1, one window per MC_TE_METRIC_INTERVAL_SECONDS in which anything completed (idle windows are
  skipped): `[Metrics] Transfer Engine Stats (over last 5s): Throughput: 1.23 MB/s | Latency Distribution
  (count=N): 0-100μs:40.0%, ...`, each part only when it has data (v0.3.8 on), or before v0.3.8
  `[Metrics] Transfer Engine Throughput: 113.07 MB/s (over last 5s)`;
- `Transfer Engine RPC using P2P handshake, listening on HOST:PORT`: the address the engine advertises to its
  peers (vLLM passes its get_ip(), i.e. VLLM_HOST_IP where set).
vLLM's MooncakeConnector (0.26, mooncake/mooncake_connector.py) adds its own lines: its `KV Transfer metrics`
(analysis.kv_stats; the prefill pushes, so successes are counted there and failed receives on the decode), the
failures listed in VLLM_EVENTS, and at DEBUG `Sending kv_caches for request R (N blocks) to HOST:PORT` (line 1607),
once per request whose blocks the prefill sends.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from epdbench.analysis.kv_stats import MIB, kv_stats
from epdbench.analysis.logformats import WORKER_PID, LogLine, parse_line

TE_FILES = frozenset({"transfer_engine.cpp", "transfer_engine_impl.cpp"})
# kind -> (source files that write it, the message from its first character)
INSTALL = {
    "hcas": (TE_FILES, re.compile(r"Topology discovery complete\. Found (\d+) HCAs\.?")),
    "install": (TE_FILES | {"multi_transport.cpp"}, re.compile(r"installTransport, type=(\w+)")),
    "force_tcp": (TE_FILES, re.compile(r"MC_FORCE_TCP is set, using TCP transport only")),
    "tcp_listen": (frozenset({"tcp_transport.cpp"}), re.compile(r"TcpTransport: listen on port (\d+)")),
    "rdma_device": (frozenset({"rdma_context.cpp"}), re.compile(r"RDMA device: ([\w.:-]+), LID: (\d+)(?:, GID: .*)?")),
}
# The transport each whole message of transfer_engine_impl.cpp names as installed (see the module's doc).
USING = {
    "Using TCP transport (no HCA detected)": "tcp",
    "Using RDMA transport (RoCE/iWARP)": "rdma",
    "Using Intra-Node NVLink transport (MC_INTRANODE_NVLINK set)": "nvlink",
    "Using NVLink transport (forced or no HCA detected)": "nvlink",
    "MC_FORCE_SHM is set, using SHM transport only": "shm",
}
TRANSPORTS = ("nvlink", "rdma", "shm", "tcp")     # what a worker's installs may show; efa and others are not read
WINDOW_NEW = re.compile(r"\[Metrics\] Transfer Engine Stats \(over last ([\d.]+)s\):(?: Throughput: ([\d.]+) MB/s)?"
                        r"(?: \| Latency Distribution \(count=(\d+)\):.*)?")
WINDOW_OLD = re.compile(r"\[Metrics\] Transfer Engine Throughput: ([\d.]+) MB/s \(over last ([\d.]+)s\)")
P2P = re.compile(r"Transfer Engine RPC using P2P handshake, listening on (\S+):(\d+)(?:, barex use port:\d+)?")
PROTOCOL_CLAIM = re.compile(r"The Mooncake Transfer Engine is using (\w+) as its protocol\.?")
CONNECTOR_FILE = "mooncake_connector.py"
SENT = re.compile(r"Sending kv_caches for request (\S+) \((\d+) blocks\) to \S+")
# Handshake events and failures: glog (any source file) matched from the message's first character.
GLOG_EVENTS = [
    ("p2p_handshake", re.compile(r"Transfer Engine RPC using P2P handshake")),
    ("connections_established", re.compile(r"Connection has been established")),
    ("ready_acks_sent", re.compile(r"Received same peer QP numbers, sending RDMA ready ACK")),
    # whole: rdma_endpoint.cpp also warns "Received RDMA ready ACK for unconnected endpoint"
    ("ready_acks_received", re.compile(r"Received RDMA ready ACK\.$")),
    ("ready_ack_unsupported", re.compile(r"Peer does not support RDMA ready ACK")),
    ("reestablished", re.compile(r"Re-establish connection")),
    ("ready_ack_timeouts", re.compile(r"Worker: Timed out waiting for RDMA ready ACK")),
    ("failed_slices", re.compile(r"Worker: Process failed for slice")),
    ("registration_failures", re.compile(r"(?:RdmaTransport: )?Failed to register memory")),
    ("transfer_timeouts", re.compile(r"Sync batch data transfer timeout")),
    ("slice_timeouts", re.compile(r"Slice timeout detected")),
    ("connection_failures", re.compile(r"TcpTransport::getConnection failed")),
]
# MooncakeConnector's own failure lines (vLLM 0.26 mooncake_connector.py; the line each is logged at), from
# CONNECTOR_FILE only. `pulling kv_caches for %s failed` names a list of request ids (`['a', 'b']`, spaces in it).
VLLM_EVENTS = [
    ("send_failures", re.compile(r"Sending to \S+ failed \(ret=.*")),                                    # 1643
    ("pull_failures", re.compile(r"pulling kv_caches for .+ failed: .*")),                               # 1899
    ("recv_errors", re.compile(r"(?:Error happens during transferring kvcache|MooncakeXferMetadata transfer "
                               r"failed) for .+: .*")),                                                  # 1864, 1877
    ("send_errors", re.compile(r"Error (?:processing Mooncake xfer request|in _sender_worker): .*"
                               r"|Error in Mooncake sender thread: .*\. Exiting thread\.")),             # 1179, 1191, 1163
    ("ready_timeouts", re.compile(r"Timeout waiting for P side ready: .*")),                             # 1286
    ("expired_sends", re.compile(r"Request \S+ timed out after \d+ seconds without being sent\. Freeing its "
                                 r"blocks on the producer side\.")),                                     # 1765
    ("bootstrap_failures", re.compile(r"Failed to (?:connect to bootstrap server \S+: .*|find remote engine_id "
                                      r"\S+ from bootstrap server \S+)")),                               # 1923, 1980
    # the router's kv_transfer_params lacked what the connector needs: the decode prefills locally (790), or the
    # prefill holds no KV for it (801)
    ("invalid_params", re.compile(r"Got invalid KVTransferParams: .*\. This request will not utilize KVTransfer")),
    ("missing_transfer_ids", re.compile(r"Missing transfer_id in kv_transfer_params from router!")),
]
FAILURE_COUNTERS = ["ready_ack_timeouts", "failed_slices", "registration_failures", "transfer_timeouts",
                    "slice_timeouts", "connection_failures", *(name for name, _ in VLLM_EVENTS),
                    "failed_transfers", "failed_recvs"]


def new_worker() -> dict:
    return {"hcas": None, "installed": [], "force_tcp": False, "tcp_listen": False, "rdma_devices": [],
            "throughput_mb_s": [], "emulated": False, "observed": None}


def new_pod() -> dict:
    pod = {"observed": None, "workers": {}, "hcas": None, "rdma_devices": [], "force_tcp": False,
           "throughput_mb_s": [], "emulated": False, "vllm_protocol_claim": None, "successful_transfers": 0,
           "failed_transfers": 0, "failed_recvs": 0, "expired_requests": 0, "transfer_mb_s": [], "lines": 0,
           "kv_stats_lines": 0, "transfer_bytes": 0.0, "requests_sent": 0, "blocks_sent": 0,
           "connector_debug": False, "advertised": []}
    pod.update({name: 0 for name, _ in GLOG_EVENTS + VLLM_EVENTS})
    return pod


def transport_of_pod(lines: Iterable[str]) -> dict:
    """Everything one KV pod's log says about its transfer engines, per worker."""
    pod = new_pod()
    windows: list[tuple[LogLine, float]] = []
    sent: set[str] = set()
    for raw in lines:
        pod["lines"] += 1
        if (line := parse_line(raw)) is not None:
            _scan(pod, line, windows, sent)
    pod["requests_sent"] = len(sent)
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


def _scan(pod: dict, line: LogLine, windows: list[tuple[LogLine, float]], sent: set[str]) -> None:
    if line.kind == "glog":
        _scan_glog(pod, line, windows)
    elif line.kind == "vllm":
        _scan_vllm(pod, line, sent)


def _install(pod: dict, line: LogLine) -> bool:
    """An install line of the worker that wrote it; False for any other line."""
    msg = line.message
    if line.file in TE_FILES and msg in USING:
        w = pod["workers"].setdefault(line.worker, new_worker())
        w["emulated"] |= line.emulated
        w["installed"].append(USING[msg])
        return True
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
            return True
    return False


def _scan_glog(pod: dict, line: LogLine, windows: list[tuple[LogLine, float]]) -> None:
    if _install(pod, line):
        return
    msg = line.message
    if line.file in TE_FILES:
        if m := WINDOW_NEW.fullmatch(msg):
            if m.group(2) is not None:      # a window of latencies alone moved no bytes the engine counted
                windows.append((line, float(m.group(2))))
            pod["emulated"] |= line.emulated
            return
        if m := WINDOW_OLD.fullmatch(msg):
            windows.append((line, float(m.group(1))))
            pod["emulated"] |= line.emulated
            return
        if (m := P2P.fullmatch(msg)) and m.group(1) not in pod["advertised"]:
            pod["advertised"].append(m.group(1))
    for name, pattern in GLOG_EVENTS:
        if pattern.match(msg):
            pod[name] += 1
            return


def _scan_vllm(pod: dict, line: LogLine, sent: set[str]) -> None:
    msg = line.message
    if m := PROTOCOL_CLAIM.fullmatch(msg):
        pod["vllm_protocol_claim"] = m.group(1)   # a claim from config, never evidence
        return
    if (fields := kv_stats(line)) is not None:
        n = int(fields.get("Num successful transfers", 0))
        pod["kv_stats_lines"] += 1
        pod["successful_transfers"] += n
        pod["transfer_bytes"] += n * fields.get("Avg MB per transfer", 0.0) * MIB
        pod["failed_transfers"] += int(fields.get("Num failed transfers", 0))
        pod["failed_recvs"] += int(fields.get("Num failed recvs", 0))
        pod["expired_requests"] += int(fields.get("Num KV expired reqs", 0))
        if fields.get("Throughput (MB/s)"):
            pod["transfer_mb_s"].append(fields["Throughput (MB/s)"])
        pod["emulated"] |= line.emulated
        return
    if line.file != CONNECTOR_FILE:
        return
    if line.severity == "DEBUG":
        pod["connector_debug"] = True       # the connector's DEBUG lines are on: its per-request lines count
        if m := SENT.fullmatch(msg):
            sent.add(m.group(1))
            pod["blocks_sent"] += int(m.group(2))
        return
    for name, pattern in VLLM_EVENTS:
        if pattern.fullmatch(msg):
            pod[name] += 1
            return


def worker_protocol(w: dict) -> str | None:
    """What one transfer engine installed: tcp under MC_FORCE_TCP; otherwise what its install, RDMA device
    and TCP listen lines show (several: `rdma+tcp`); 0 HCAs alone means TCP. HCAs found prove nothing."""
    if w["force_tcp"]:
        return "tcp"
    kinds = {k for k in w["installed"] if k in TRANSPORTS}
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


def failures(pod: dict) -> dict[str, int]:
    """The pod's failure counts that are not zero."""
    return {k: pod[k] for k in FAILURE_COUNTERS if pod.get(k)}


def moved(pod: dict) -> bool:
    """Whether the pod's own lines prove bytes moved: a non-zero throughput window or a successful transfer."""
    return any(t > 0 for t in pod["throughput_mb_s"]) or pod["successful_transfers"] > 0
