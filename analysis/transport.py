"""Which KV transport really carried the KV, over the KV pods of a configuration, from what their own log lines
say per pod and TP worker (analysis.mooncake_log) and, for the volume, from the sending side's counters (pure:
dicts in, a verdict out).

Mooncake installs RDMA by itself whenever it discovers HCAs, so the configuration proves nothing and vLLM's "using X
as its protocol" line is recorded but never used. A `verified` needs every worker on the expected transport and
proof that KV moved: non-zero throughput windows or successful transfers on the sending pods, and, when the caller
knows the run's records, at least one transfer per measured request and bytes consistent with the prompts' KV size.
Lines marked as emulated (the simulator) give `emulated`, never `verified`.
"""
from __future__ import annotations

from collections.abc import Iterable

from epdbench.analysis.labels import named_or_counted
from epdbench.analysis.mooncake_log import failures, moved

# Relative tolerance between the KV bytes moved and the KV of the prompts (kv bytes per token × prompt
# tokens not already cached on the decode side): per-block rounding, probes and TP shards stay inside it.
KV_BYTES_TOLERANCE = 0.25


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


# Where vLLM 0.26's MooncakeConnector says what it sent (it exports no Prometheus metrics: mooncake/stats.py:15,
# "TODO(mooncake-stats): add MooncakePromMetrics"): the Prefill engines' own lines, kv["source"] == "log".
MOONCAKE_LINES = {"transfers": "`Sending kv_caches for request` lines (MooncakeConnector at DEBUG)",
                  "bytes": "`KV Transfer metrics` lines"}


def volume_gaps(kv: dict | None, connector: str) -> list[str]:
    """On a run (`kv` given): why the KV volume could not be checked — the counting side's /metrics (or, for
    Mooncake under vLLM 0.26, its log) gave no transfer count or no bytes (a scrape that failed, or connector stats
    off) — so KV is not verified."""
    if kv is None:
        return []
    if connector == "mooncake" and kv.get("source") == "log":
        absent = [what for key, what in MOONCAKE_LINES.items() if kv.get(key) is None]
        return [f"KV volume not checked: the Prefill pods export no vllm:mooncake_* metrics (vLLM 0.26) and their "
                f"logs gave no {' and no '.join(absent)} over the run"] if absent else []
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
    if kv.get("source") == "log":
        moved_in = f"({kv.get('transfers') or 0:.0f} requests' KV sent)"
    else:
        moved_in = f"in {kv.get('transfers') or 0:.0f} transfers"
    line = (f"{kv['bytes'] / 1e6:.1f} MB moved {moved_in} for {kv['measured_requests']} measured requests, within "
            f"± {kv['tolerance']:.0%} of their prompts' KV")
    if kv.get("source") == "log":
        line += f" (from the Prefill engines' {' and '.join(MOONCAKE_LINES.values())})"
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
        if fails := failures(p):
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
