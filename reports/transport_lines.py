"""The text `epdbench verify-transport` prints per pod log: what each log says about its transport (pure)."""
from __future__ import annotations


def known(value) -> str:
    """A figure the log gave, or '?' where it gave none (never Python's None)."""
    return "?" if value is None else str(value)


def counted(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def mooncake_pod_lines(name: str, pod: dict) -> list[str]:
    """A pod's Mooncake transfer engines in one line, then one line per worker."""
    if not pod["workers"] and pod["observed"] is None and pod["hcas"] is None and not pod["throughput_mb_s"]:
        return [f"  {name}: no line of Mooncake's transfer engine among its {counted(pod['lines'], 'line')} "
                "(is it a prefill or decode engine's log?)"]
    devices = ", ".join(f"{d['name']} (LID {d['lid']})" for d in pod["rdma_devices"]) or "none"
    lines = [f"  {name}: installed {known(pod['observed'])}, HCAs {known(pod['hcas'])}, RDMA devices {devices}, "
             f"{len(pod['throughput_mb_s'])} throughput windows, ready ACKs {pod['ready_acks_received']}"]
    for wname, w in sorted(pod["workers"].items()):
        windows = ", ".join(f"{t:.2f}" for t in w["throughput_mb_s"]) or "none attributed"
        lines.append(f"    {wname}: installed {known(w['observed'])}, HCAs {known(w['hcas'])}, "
                     f"windows (MB/s) {windows}")
    return lines


def nixl_pod_lines(name: str, pod: dict) -> list[str]:
    """A pod's UCX choice under NIXL in one line, then one line per worker configuration and its lanes."""
    if not pod["workers"] and pod["observed"] is None and pod["ucx_version"] is None and pod["requested"] is None:
        return [f"  {name}: no UCX or NIXL line among its {counted(pod['lines'], 'line')} "
                "(is it a KV engine's log, written with UCX_LOG_LEVEL=info?)"]
    unavailable = f", not available: {', '.join(pod['unavailable'])}" if pod["unavailable"] else ""
    lines = [f"  {name}: UCX chose {known(pod['observed'])} (UCX {known(pod['ucx_version'])}, UCX_TLS asked "
             f"{known(pod['requested'])}{unavailable}), {pod['successful_transfers']} successful transfers, "
             f"{pod['ec_reads']} encoder-output reads"]
    for wname, w in sorted(pod["workers"].items()):
        for c in w["configs"]:
            lanes = " ".join(f"{x['group']}({x['tl']}/{x['device']})" for x in c["lanes"]) or "no lanes"
            lines.append(f"    {wname} {c['scope']} cfg#{c['cfg']}: {lanes}")
    return lines
