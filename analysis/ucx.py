"""Which transport NIXL's UCX really chose, per pod, worker and lane, from UCX's, NIXL's and vLLM's own log
lines (pure: lines in, dicts out).

UCX picks its transports itself (UCX_TLS only bounds the choice, and a transport that is not available is
dropped with a warning), so the configuration proves nothing. At UCX_LOG_LEVEL=info every UCP worker prints
each new endpoint configuration it uses (`ucp_worker_print_used_tls`, openucx/ucx src/ucp/core/ucp_worker.c):

    ucp_context_0 inter-node cfg#1 rma(rc_mlx5/mlx5_0:1)  amo(rc_mlx5/mlx5_0:1)  am(rc_mlx5/mlx5_0:1)  ka(...)

(UCX 1.15 on; up to 1.14 `ep_cfg[N]: tag(...) rma(...)`): every lane as transport/device. A lane's transport
decides its class: rc/dc/ud (InfiniBand or RoCE verbs) and srd (EFA) are RDMA, tcp is TCP, cuda_ipc is
NVLink; shared memory, self and cuda_copy never leave the host. `self` endpoints (a worker to itself) carry
nothing between pods and are kept apart. A worker is the UCX process id, as glog's thread id names a Mooncake
worker. A `verified` needs every remote lane of every worker on the expected transport and proof that bytes
moved: vLLM's `KV Transfer metrics` on the reading side (NixlConnector's decode pulls) or, for the encoder
outputs of EPD (ECCPUConnector over NIXL), its `NIXL READ completed` lines. Emulated lines give `emulated`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from epdbench.analysis.logformats import WORKER_PID, LogLine, parse_line
from epdbench.analysis.labels import named_or_counted
from epdbench.analysis.kv_stats import MIB, kv_stats
from epdbench.analysis.transport import emulated, volume_and_rate, volume_gaps, volume_line

EP_CFG = re.compile(r"(?:(\S+) )?(self|intra-node|inter-node) cfg#(\d+)((?: {1,2}\w+\([^)]*\)?)*)")
EP_CFG_LEGACY = re.compile(r"ep_cfg\[(\d+)\]:((?:;? ?\w+\([^)]*\)?)*);?")
GROUP = re.compile(r"(\w+)\(([^)]*)\)?")
RESOURCE = re.compile(r"([A-Za-z0-9_]+)/(\S+)")
UCX_VERSION = re.compile(r"Version (\d+\.\d+\.\d+)(?: \(loaded from .*\))?")
UCX_ENV = re.compile(r"UCX_\* env variables?: (.*)")
UCX_UNAVAILABLE = re.compile(r"transports? ('[\w]+'(?:,'[\w]+')*) (?:is|are) not available, please use one or more "
                             r"of: .*")
NIXL_BOUND = re.compile(r"NIXL UCX backend bound to UCX (\S+) at .*")
NIXL_BACKEND = re.compile(r"Backend (\w+) was instantiated")
NIXL_ERRORS = [re.compile(r"(?:getXferStatus|postXferReq|createXferReq|makeXferReq|prepXferDlist|loadRemoteMD"
                          r"|connect|createBackend): .*"),
               re.compile(r"Unexpected UCX error: .*"), re.compile(r"UCX AM send failed with status .*")]
NIXL_FAILURE = re.compile(r"NIXL transfer failure: ([a-z_]+)(?:\. .*?)? \| Context: \{.*\}")
NIXL_FAILURE_OLD = re.compile(r"NIXL (?:transfer failed|transfer exception|send_notif failed|transfer setup/initiation "
                              r"failed) for request .*")
NIXL_FAILED_REQUEST = re.compile(r"'request_id': '([^']+)'|for request (\S+)")   # None: a handshake's own line
# vLLM's engine id of a completion: `cmpl-<client id>-<choice>-<8 hex>` (its input processor appends the random part)
VLLM_ENGINE_ID = re.compile(r"(?:chatcmpl|cmpl)-(.+?)(?:-\d+)?-[0-9a-f]{8}")
NIXL_INIT = re.compile(r"Initializing NIXL (?:wrapper|worker.*)")
EC_READ_DONE = re.compile(r"EC (?:consumer|producer): NIXL READ completed mm_hash=\S+(?: key=\S+)?")
EC_FAILURES = re.compile(r"EC (?:consumer: (?:failed to start NIXL xfer|NIXL xfer failed)|Connector: READ for "
                         r"mm_hash=\S+ (?:from \S+ timed out|unexpected NIXL state)).*")


def lane_class(tl: str) -> str:
    """rdma | tcp | nvlink | local (shared memory, self, GPU copies: never between pods)."""
    name = tl.lower()
    if name == "tcp":
        return "tcp"
    if re.match(r"^(rc|dc|ud)(_|$)", name) or name in ("srd", "gga_mlx5", "ib"):
        return "rdma"
    if name in ("cuda_ipc", "rocm_ipc", "ze_ipc"):
        return "nvlink"
    return "local"


def parse_lanes(groups: str) -> list[dict]:
    """Lanes of an endpoint configuration's groups (`rma(rc_mlx5/mlx5_0:1)  am(tcp/eth0 ...)`)."""
    lanes = []
    for g in GROUP.finditer(groups):
        for r in RESOURCE.finditer(g.group(2)):
            lanes.append({"group": g.group(1), "tl": r.group(1), "device": r.group(2), "class": lane_class(r.group(1))})
    return lanes


def remote_lanes(worker: dict) -> list[dict]:
    """A worker's lanes to other processes that leave the host: its non-self endpoints, host-local lanes left out."""
    return [lane for c in worker["configs"] if c["scope"] != "self" for lane in c["lanes"] if lane["class"] != "local"]


def new_worker() -> dict:
    return {"configs": [], "observed": None, "emulated": False}


def new_pod() -> dict:
    return {"connector": "nixl", "observed": None, "workers": {}, "ucx_version": None, "requested": None,
            "unavailable": [], "backends": [], "emulated": False, "successful_transfers": 0, "failed_transfers": 0,
            "expired_requests": 0, "bytes": 0.0, "transfer_mb_s": [], "transfer_failures": [], "kv_lost_requests": [],
            "nixl_errors": [],
            "ec_reads": 0, "ec_failures": 0, "nixl_init": 0, "lines": 0,
            # the keys the Mooncake verdict and report read, so one view shows both connectors
            "throughput_mb_s": [], "rdma_devices": [], "hcas": None, "force_tcp": False, "ready_acks_received": 0}


def nixl_of_pod(lines: Iterable[str]) -> dict:
    """Everything one pod's log says about NIXL and UCX, per worker (UCX process) and lane."""
    pod = new_pod()
    names: dict[str, str] = {}   # `thread <pid>` (UCX's process id) -> the vLLM worker prefix of that pid
    for raw in lines:
        pod["lines"] += 1
        if (line := parse_line(raw)) is not None:
            if m := WORKER_PID.match(line.worker):
                names[f"thread {m.group(1)}"] = line.worker
            _scan(pod, line)
    pod["workers"] = {names.get(k, k): w for k, w in pod["workers"].items()}
    for w in pod["workers"].values():
        w["observed"] = "+".join(sorted({lane["class"] for lane in remote_lanes(w)})) or None
    observed = {w["observed"] for w in pod["workers"].values() if w["observed"]}
    pod["observed"] = observed.pop() if len(observed) == 1 else ("mixed" if observed else None)
    devices = {lane["device"] for w in pod["workers"].values() for lane in remote_lanes(w) if lane["class"] == "rdma"}
    pod["rdma_devices"] = [{"name": d, "lid": 0} for d in sorted(devices)]
    pod["throughput_mb_s"] = list(pod["transfer_mb_s"])
    pod["emulated"] |= any(w["emulated"] for w in pod["workers"].values())
    return pod


def _scan(pod: dict, line: LogLine) -> None:
    msg = line.message
    if line.kind == "ucx":
        if line.file == "ucp_worker.c" and (m := EP_CFG.fullmatch(msg)):
            _config(pod, line, m.group(2), int(m.group(3)), m.group(4))
        elif line.file == "ucp_worker.c" and (m := EP_CFG_LEGACY.fullmatch(msg)):
            _config(pod, line, "unknown", int(m.group(1)), m.group(2))
        elif line.file == "ucp_context.c" and (m := UCX_UNAVAILABLE.fullmatch(msg)):
            pod["unavailable"] += [t.strip("'") for t in m.group(1).split(",") if t.strip("'") not in pod["unavailable"]]
        elif line.file == "ucp_context.c" and (m := UCX_VERSION.fullmatch(msg)):
            pod["ucx_version"] = m.group(1)
        elif line.file == "parser.c" and (m := UCX_ENV.fullmatch(msg)):
            env = dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
            pod["requested"] = env.get("UCX_TLS", pod["requested"])   # a request, never evidence
    elif line.kind == "nixl":
        if line.file == "_api.py" and (m := NIXL_BACKEND.fullmatch(msg)):
            pod["backends"].append(m.group(1))
            pod["emulated"] |= line.emulated
    elif line.kind == "glog":
        if line.file == "ucx_plugin.cpp" and (m := NIXL_BOUND.fullmatch(msg)):
            pod["ucx_version"] = pod["ucx_version"] or m.group(1)
        elif line.severity in ("E", "W") and line.file.startswith(("nixl_", "ucx_")) and \
                any(p.fullmatch(msg) for p in NIXL_ERRORS):
            pod["nixl_errors"].append(f"{line.file}: {msg[:200]}")
    elif line.kind == "vllm":
        _scan_vllm(pod, line)


def _config(pod: dict, line: LogLine, scope: str, index: int, groups: str) -> None:
    w = pod["workers"].setdefault(line.worker, new_worker())
    w["emulated"] |= line.emulated
    w["configs"].append({"scope": scope, "cfg": index, "lanes": parse_lanes(groups)})


def _scan_vllm(pod: dict, line: LogLine) -> None:
    msg = line.message
    if (fields := kv_stats(line)) is not None:
        n = int(fields.get("Num successful transfers", fields.get("num_successful_transfers", 0)))
        pod["successful_transfers"] += n
        pod["failed_transfers"] += int(fields.get("Num failed transfers", 0))
        pod["expired_requests"] += int(fields.get("Num KV expired reqs", 0))
        pod["bytes"] += n * fields.get("Avg MB per transfer", 0.0) * MIB
        if fields.get("Throughput (MB/s)"):
            pod["transfer_mb_s"].append(fields["Throughput (MB/s)"])
        pod["emulated"] |= line.emulated
    elif m := NIXL_FAILURE.fullmatch(msg):
        pod["transfer_failures"].append(m.group(1))
        _lost_request(pod, msg)
    elif NIXL_FAILURE_OLD.fullmatch(msg):
        pod["transfer_failures"].append("transfer_failed")
        _lost_request(pod, msg)
    elif NIXL_INIT.fullmatch(msg):
        pod["nixl_init"] += 1
        pod["emulated"] |= line.emulated
    elif EC_READ_DONE.fullmatch(msg):
        pod["ec_reads"] += 1
        pod["emulated"] |= line.emulated
    elif EC_FAILURES.fullmatch(msg):
        pod["ec_failures"] += 1


def client_request_id(vllm_id: str) -> str:
    """The client's id of a request from vLLM's engine id of it (`cmpl-<client id>-0-1a2b3c4d`); other ids as they
    are (a line may name the client's id itself)."""
    return m.group(1) if (m := VLLM_ENGINE_ID.fullmatch(vllm_id)) else vllm_id


def _lost_request(pod: dict, msg: str) -> None:
    """The request a `NIXL transfer failure` line names, by the client's id, once (a request's KV may fail in
    several lines: its handshake, then its transfer)."""
    if ((m := NIXL_FAILED_REQUEST.search(msg))
            and (rid := client_request_id(m.group(1) or m.group(2))) not in pod["kv_lost_requests"]):
        pod["kv_lost_requests"].append(rid)


def _failure_kinds(pod: dict) -> str:
    """`handshake_failed ×2, handshake_setup_failed ×2`: NIXL's failure lines by kind."""
    kinds = sorted(set(pod["transfer_failures"]), key=lambda k: (-pod["transfer_failures"].count(k), k))
    return ", ".join(f"{k} ×{pod['transfer_failures'].count(k)}" for k in kinds)


def has_nixl_evidence(pod: dict) -> bool:
    """Whether a pod's log shows NIXL or UCX at all (verify-transport's choice of reader)."""
    return bool(pod["workers"] or pod["backends"] or pod["nixl_init"] or pod["ucx_version"])


def _lane_text(lane: dict) -> str:
    return f"{lane['group']}({lane['tl']}/{lane['device']})"


def lane_mismatches(expected: str, pods: dict[str, dict]) -> list[str]:
    """One line per distinct set of remote lanes on another transport than `expected`, with the endpoints that use
    it: UCX prints a configuration per endpoint, often the same one many times over."""
    groups: dict[tuple, list[tuple[str, str]]] = {}
    kinds: dict[tuple, list[str]] = {}
    for name, pod in sorted(pods.items()):
        for wname, w in sorted(pod["workers"].items()):
            for c in w["configs"]:
                other = [lane for lane in c["lanes"] if lane["class"] not in ("local", expected)]
                if c["scope"] != "self" and other:
                    key = tuple(_lane_text(x) for x in other)
                    groups.setdefault(key, []).append((name, f"{wname} {c['scope']} cfg#{c['cfg']}"))
                    kinds[key] = sorted({lane["class"].upper() for lane in other})
    out = []
    for lanes, endpoints in groups.items():
        missing = list(dict.fromkeys(t for name in dict.fromkeys(pod for pod, _ in endpoints)
                                     for t in pods[name]["unavailable"]))
        out.append(f"expected {expected}; {named_or_counted(endpoints, 'endpoint')}: "
                   f"lane{'s' if len(lanes) > 1 else ''} {', '.join(lanes)} on {'/'.join(kinds[lanes])}"
                   + (f" (UCX: {', '.join(missing)} not available)" if missing else ""))
    return out


# UCX's shared-memory transports: between two processes of one host they move bytes through memory, around any NIC.
SHARED_MEMORY_TLS = frozenset({"cma", "posix", "sysv", "xpmem", "knem"})


def shared_memory_lanes(expected: str, pods: dict[str, dict]) -> list[str]:
    """Engines on one host (the local target): one line per distinct set of shared-memory lanes that UCX chose for
    an endpoint to another process, with the endpoints that use it. Between pods these transports cannot connect;
    between two local processes they can, and whatever they carried did not cross the expected transport."""
    groups: dict[tuple, list[tuple[str, str]]] = {}
    for name, pod in sorted(pods.items()):
        for wname, w in sorted(pod["workers"].items()):
            for c in w["configs"]:
                shm = [lane for lane in c["lanes"] if lane["tl"].lower() in SHARED_MEMORY_TLS]
                if c["scope"] != "self" and shm:
                    key = tuple(dict.fromkeys(_lane_text(x) for x in shm))
                    groups.setdefault(key, []).append((name, f"{wname} {c['scope']} cfg#{c['cfg']}"))
    return [f"expected {expected}; {named_or_counted(endpoints, 'endpoint')}: lane{'s' if len(lanes) > 1 else ''} "
            f"{', '.join(lanes)} on shared memory: UCX chose it between two processes of this host, beside "
            f"{expected} — what it carried never used {expected.upper()} (UCX_TLS={expected} keeps it out)"
            for lanes, endpoints in groups.items()]


def _moved(pod: dict, what: str) -> bool:
    return pod["ec_reads"] > 0 if what == "ec" else pod["successful_transfers"] > 0


def verify_nixl(expected: str, pods: dict[str, dict], roles: dict[str, str] | None = None, kv: dict | None = None,
                what: str = "kv", movers: Iterable[str] = ("decode",), tcp_mb_s: float | None = None,
                same_host: bool = False) -> dict:
    """Verdict over the pods of a NIXL path (expected: none | tcp | rdma). `what`: kv (NixlConnector; `movers`,
    the reading roles, must show successful transfers) or ec (the encoder outputs, ECCPUConnector: some pod must
    log a completed NIXL READ). `kv` (analysis.transport.kv_expectation plus `transfers`, `bytes`) checks the
    volume; `tcp_mb_s` flags an RDMA transfer rate TCP could have carried. `same_host`: the engines are processes
    of one host (the local target), so shared-memory lanes between them are a mismatch, and a verified TCP says it
    ran over this host's own interfaces."""
    label = "encoder outputs" if what == "ec" else "KV"
    base = {"expected": expected, "connector": "nixl", "what": what, "pods": pods, "kv_check": kv,
            "throughput_mb_s_min": min((t for p in pods.values() for t in p["transfer_mb_s"]), default=None),
            "throughput_mb_s_max": max((t for p in pods.values() for t in p["transfer_mb_s"]), default=None),
            "failed_transfers": sum(p["failed_transfers"] + len(p["transfer_failures"]) + p["ec_failures"]
                                    for p in pods.values()),
            "failed_recvs": 0, "ready_acks": 0, "suspicious": False}
    if expected == "none":
        return {**base, "verdict": "not-applicable", "reasons": [f"no {label} moves between pods"]}
    if not pods or all(not p["workers"] for p in pods.values()):
        asked = sorted({p["requested"] for p in pods.values() if p["requested"]})
        why = (f"no UCX endpoint configuration line (ucp_worker.c, UCX_LOG_LEVEL=info) in any {label} pod log")
        if asked:
            why += f" (UCX_TLS={', '.join(asked)} was asked for: not evidence)"
        return {**base, "verdict": "no-evidence", "reasons": [why]}
    reasons: list[str] = []
    mismatch = missing = False
    for name, p in sorted(pods.items()):
        if p["observed"] is None:
            missing = True
            reasons.append(f"{name}: no UCX endpoint to another process (only self or host-local lanes)")
    if found := lane_mismatches(expected, pods) + (shared_memory_lanes(expected, pods) if same_host else []):
        mismatch = True
        reasons += found
    for name, p in sorted(pods.items()):
        fails = {k: v for k, v in (("failed_transfers", p["failed_transfers"]),
                                   ("transfer_failures", len(p["transfer_failures"])), ("ec_failures", p["ec_failures"]),
                                   ("nixl_errors", len(p["nixl_errors"]))) if v}
        if fails:
            mismatch = True
            lost = p["kv_lost_requests"]
            reasons.append(f"{name}: transfers failed ({', '.join(f'{k}={v}' for k, v in fails.items())})"
                           + (f"; NIXL's lines: {_failure_kinds(p)}" if p["transfer_failures"] else "")
                           + (f"; KV never arrived for {len(lost)} request(s) ({', '.join(lost[:3])}"
                              f"{', …' if len(lost) > 3 else ''})" if lost else "")
                           + (f"; first: {p['nixl_errors'][0]}" if p["nixl_errors"] else ""))
    readers = {n for n, r in (roles or {}).items() if r in set(movers) and n in pods}
    gaps = [f"{n}: UCX set up {pods[n]['observed'] or 'no'} lanes but no {label} transfer succeeded"
            for n in sorted(readers) if what == "kv" and not _moved(pods[n], what)]
    if (what == "ec" or not readers) and not any(_moved(p, what) for p in pods.values()):
        gaps.append("no pod shows " + ("a completed NIXL READ of encoder outputs (`EC consumer/producer: NIXL READ "
                                       "completed`, logged at DEBUG)" if what == "ec" else
                                       "a successful NIXL transfer (vLLM's `KV Transfer metrics`, --disable-log-stats "
                                       "off)"))
    if what == "kv":
        gaps += volume_gaps(kv, "nixl")
    reasons += gaps
    mismatch |= volume_and_rate(base, expected, pods, kv, tcp_mb_s, reasons)
    verdict = "mismatch" if mismatch else "no-evidence" if (missing or gaps) else "verified"
    if verdict == "verified":
        devices = sorted({d["name"] for p in pods.values() for d in p["rdma_devices"]})
        n_workers = sum(1 for p in pods.values() for w in p["workers"].values() if w["observed"])
        proof = (f"{sum(p['ec_reads'] for p in pods.values())} NIXL READs of encoder outputs completed" if what == "ec"
                 else f"{sum(p['successful_transfers'] for p in pods.values())} successful NIXL transfers")
        pods_label = "Encode and Prefill pod" if what == "ec" else "KV pod"
        reasons.insert(0, f"every {pods_label} and UCX worker ({n_workers}) used only {expected.upper()} lanes"
                          + (f" on {', '.join(devices)}" if devices and expected == "rdma" else "")
                          + f"; {label} moved ({proof})")
        reasons += volume_line(kv)
        if same_host:
            devices = sorted({lane["device"] for p in pods.values() for w in p["workers"].values()
                              for lane in remote_lanes(w)})
            reasons.append(f"one host: the engines' {expected.upper()} lanes ran over this host's own interfaces "
                           f"({', '.join(devices)}), so the KV never crossed a network")
    verdict = emulated(verdict, pods, reasons, f"NIXL over UCX {expected}")
    return {**base, "verdict": verdict, "reasons": reasons}
