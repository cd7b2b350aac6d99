"""The command lines a spec implies (pure): `vllm serve` arguments of each role and the vllm-router
command line. One source for the Kubernetes manifests, the simulator target and the report, so the
three can never drift apart."""
from __future__ import annotations

import json
from collections.abc import Sequence

from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, RoleSpec

ENGINE_PORT = 8000
ROUTER_PORT = 8000
ROUTER_METRICS_PORT = 29000
MOONCAKE_BOOTSTRAP_PORT = 8998
NIXL_SIDE_CHANNEL_PORT = 5600   # VLLM_NIXL_SIDE_CHANNEL_PORT (vLLM 0.12 on: one listener per engine, + DP index)
EC_SIDE_CHANNEL_PORT = 5601     # VLLM_EC_SIDE_CHANNEL_PORT (ECCPUConnector's producer, vLLM 0.30 on)
# ECCPUConnector's shared-memory buffer of encoder outputs (/dev/shm/vllm_ec_<engine id>.mmap): ec_cpu_bytes is
# mandatory (vllm/distributed/ec_transfer/ec_connector/cpu/); 8 GiB fits the default /dev/shm of 16Gi.
EC_CPU_BYTES = 8 * 1024 ** 3


def moves_kv(config: ConfigurationSpec, role: str) -> bool:
    return config.topology != "aggregated" and role in ("prefill", "decode")


KV_CONNECTORS = {"mooncake": "MooncakeConnector", "nixl": "NixlConnector"}


def kv_connector_name(config: ConfigurationSpec) -> str:
    """vLLM's class name of the configuration's KV connector, or none (aggregated)."""
    return "none" if config.topology == "aggregated" else KV_CONNECTORS[config.kv_connector]


def kv_transfer_config(config: ConfigurationSpec, role: str) -> dict | None:
    if not moves_kv(config, role):
        return None
    if config.kv_connector == "nixl":
        # NixlConnector: the decode READs the prefill's blocks (kv_both is deprecated from vLLM 0.25); UCX picks the
        # transport itself within UCX_TLS / UCX_NET_DEVICES (manifests.render.engine_env).
        return {"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
                "kv_connector_extra_config": {"backends": ["UCX"]}}
    return {"kv_connector": "MooncakeConnector",
            "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
            "kv_connector_extra_config": {"mooncake_protocol": config.kv_transport}}


def ec_transfer_config(spec: ExperimentSpec, config: ConfigurationSpec, role: str) -> dict | None:
    if config.topology != "epd" or role not in ("encode", "prefill"):
        return None
    connector = spec.target.kubernetes.engine.ec_connector
    out = {"ec_connector": connector, "ec_role": "ec_producer" if role == "encode" else "ec_consumer"}
    if connector == "ECCPUConnector":
        # Encoder outputs over NIXL (the consumer READs them); without ec_enable_nixl they never leave the pod.
        out["ec_connector_extra_config"] = {"ec_enable_nixl": True, "ec_cpu_bytes": EC_CPU_BYTES}
    return out


MAX_LOG_LEN = 256      # logged request bodies cut to this many characters (an image's base64 stays out of the log)
# vLLM logs each request body (with the client's request_id) at this level; INFO puts it in the pod log.
REQUEST_BODY_LOG_LEVEL = "INFO"


def engine_args(spec: ExperimentSpec, config: ConfigurationSpec, role: RoleSpec) -> list[str]:
    """`vllm serve` arguments of one role: model, TP, the WORKLOADS.md engine limits, evidence logging."""
    args = [spec.model.name, "--host", "0.0.0.0", "--port", str(ENGINE_PORT),
            "--tensor-parallel-size", str(role.tp),
            "--max-model-len", str(spec.engine.max_model_len),
            "--max-num-seqs", str(spec.engine.max_num_seqs),
            "--max-num-batched-tokens", str(spec.engine.max_num_batched_tokens),
            "--gpu-memory-utilization", str(spec.engine.gpu_memory_utilization),
            "--enable-request-id-headers", "--enable-log-requests", "--max-log-len", str(MAX_LOG_LEN),
            # usage.prompt_tokens_details.cached_tokens: the records' cached tokens, which the KV volume check
            # and the prefix-cache figures need (vLLM 0.33 leaves them out without it)
            "--enable-prompt-tokens-details"]
    if spec.engine.num_gpu_blocks_override is not None:
        args += ["--num-gpu-blocks-override", str(spec.engine.num_gpu_blocks_override)]
    if role.role == "encode":
        args.append("--enforce-eager")
    if role.role == "encode" or not spec.engine.enable_prefix_caching:
        args.append("--no-enable-prefix-caching")
    kv = kv_transfer_config(config, role.role)
    if kv:
        args += ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
    ec = ec_transfer_config(spec, config, role.role)
    if ec:
        args += ["--ec-transfer-config", json.dumps(ec, separators=(",", ":"))]
    return args + list(spec.target.kubernetes.engine.extra_args)


def vllm_router_args(config: ConfigurationSpec, *, host: str, port: int, prometheus_port: int,
                     startup_timeout_s: float, servers: Sequence[str] = (),
                     prefills: Sequence[tuple[str, int]] = (), decodes: Sequence[str] = ()) -> list[str]:
    """vllm-router's arguments: round robin over `servers` (aggregated), or PD mode over `prefills`
    (URL, Mooncake bootstrap port; NIXL needs none) and `decodes` with the configuration's KV connector."""
    args = ["--host", host, "--port", str(port), "--prometheus-port", str(prometheus_port),
            "--policy", "round_robin", "--worker-startup-timeout-secs", str(int(startup_timeout_s))]
    if config.topology == "aggregated":
        return args + ["--worker-urls", *servers]
    args += ["--vllm-pd-disaggregation", "--kv-connector", config.kv_connector]
    for url, bootstrap_port in prefills:
        args += ["--prefill", url] + ([str(bootstrap_port)] if config.kv_connector == "mooncake" else [])
    for url in decodes:
        args += ["--decode", url]
    return args
