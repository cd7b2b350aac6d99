"""The lines `compare` prints as it goes: a configuration starting, a cell's host-load note (pure)."""
from __future__ import annotations

CONNECTORS = {"mooncake": "Mooncake", "nixl": "NIXL"}


def starting_line(spec, config, roles: str) -> str:
    """'[pd-tcp] starting 1×prefill TP1 + 1×decode TP1 (2 GPUs, KV over TCP)', in what the target has: CPU
    engines on a CPU host, GPUs emulated by the simulator, GPUs of a host or a cluster."""
    kind = spec.target.kind
    by = f" by {CONNECTORS[config.kv_connector]}" if kind != "sim" else ""
    kv = "no KV transfer" if config.topology == "aggregated" else f"KV over {config.kv_transport.upper()}{by}"
    if kind == "local" and spec.target.local.device == "cpu":
        engines = sum(r.replicas for r in config.roles)
        where = f"{engines} CPU engine{'s' * (engines != 1)} on this host"
    else:
        gpus = spec.gpus_used(config)
        where = f"{gpus} {'simulated ' if kind == 'sim' else ''}GPU{'s' * (gpus != 1)}"
    return f"[{config.name}] starting {roles} ({where}, {kv})"


def host_load_note(summary: dict) -> str:
    """' — contaminated by host load (lag p99: …)' with the lags a cell has: the simulator's emulation lag and the
    load generator's client lag; real engines have no emulation, so the client's alone. '' for a clean cell."""
    if not summary.get("contaminated"):
        return ""
    lags = [f"{who} {summary[key]:.1f} ms" for who, key in (("emulation", "emulation_lag_p99_ms"),
                                                            ("client", "loop_lag_p99_ms"))
            if summary.get(key) is not None]
    return " — contaminated by host load" + (f" (lag p99: {', '.join(lags)})" if lags else "")
