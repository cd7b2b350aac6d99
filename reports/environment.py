"""The report's Environment section from the resolved spec (pure): hardware, engine image and flags,
placement, and per configuration its roles, connectors and transport. Every figure comes from the spec, and on
the simulator the calibration profile its constants came from (`compare --profile`), with its error bar."""
from __future__ import annotations

from epdbench.physics import allreduce
from epdbench.physics.measured import describe
from epdbench.specs.commands import (ENGINE_PORT, LOCAL_EC_CONNECTOR, VLLM_SERVER_MODULE, ec_path, engine_args,
                                     kv_transfer_config, local_engine_args)
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec
from epdbench.specs.profile import error_bar, profile_origin


def hardware_text(spec: ExperimentSpec) -> str:
    hw = spec.hardware
    node = (f"{hw.gpus_per_node} × {hw.gpu}: {hw.bf16_tflops:g} TFLOP/s BF16, HBM {hw.hbm_tb_s:g} TB/s, "
            f"NVLink {hw.nvlink_gb_s:g} GB/s per GPU; GPU operators: {describe(spec.model, hw)}; "
            f"{allreduce.describe(hw)}; "
            f"KV over TCP {hw.tcp_gb_s:g} GB/s + {hw.tcp_setup_ms + hw.tcp_latency_ms:g} ms + "
            f"{hw.tcp_descriptor_ms:g} ms per further descriptor, over RDMA {hw.rdma_nic_gbit_s:g} Gbit/s "
            f"(×{hw.rdma_efficiency:g}) + {hw.rdma_latency_ms:g} ms")
    if spec.target.kind == "sim":
        return f"Simulated node (cost-model figures, no GPU used): {node}"
    if spec.target.kind == "local" and spec.target.local.device == "cpu":
        return f"This host's CPU ({hw.gpu} in the spec; its figures are used for estimates only, no GPU used)"
    return f"GPU node ({hw.gpus_per_node} × {hw.gpu}; figures from the spec, used for estimates only)"


def engine_image(spec: ExperimentSpec) -> str:
    if spec.target.kind == "sim":
        return "epdbench simulator (epdbench.sim: vLLM HTTP API and log formats, step-level cost model)"
    if spec.target.kind == "local":
        local = spec.target.local
        python = local.vllm_python or "the environment of `epdbench engine-env`"
        model = (" serving a tiny model made at run time (random weights)" if local.made_model == "tiny" else
                 f" serving {spec.model.name}'s real shapes made at run time (random weights)"
                 if local.made_model == "real-shapes" else
                 f" serving {local.model_path}" if local.model_path else "")
        return f"vLLM ({VLLM_SERVER_MODULE}) from {python}{model}"
    return spec.target.kubernetes.engine.image


def role_flags(spec: ExperimentSpec, config: ConfigurationSpec) -> dict[str, str]:
    """role → the `vllm serve` flags it runs with (model, host and port left out)."""
    if spec.target.kind == "local":
        ec_dir = f"{spec.target.local.ec_shared_dir.rstrip('/')}/epdbench-ec-RUN-{config.name}"
        flags = {r.role: local_engine_args(spec, config, r, model=spec.model.name, port=ENGINE_PORT,
                                           ec_shared_dir=ec_dir) for r in config.roles}
        skip = {"--model", spec.model.name, "--host", spec.target.local.host, "--port", str(ENGINE_PORT)}
    else:
        flags = {r.role: engine_args(spec, config, r) for r in config.roles}
        skip = {spec.model.name, "--host", "0.0.0.0", "--port", str(ENGINE_PORT)}
    return {role: " ".join(a for a in args if a not in skip) for role, args in flags.items()}


def engine_flags(spec: ExperimentSpec) -> str:
    e = spec.engine
    return (f"--max-model-len {e.max_model_len} --max-num-seqs {e.max_num_seqs} "
            f"--max-num-batched-tokens {e.max_num_batched_tokens}"
            + ("" if e.enable_prefix_caching else " --no-enable-prefix-caching"))


def placement_text(spec: ExperimentSpec) -> str:
    if spec.target.kind == "sim":
        return (f"local processes on {spec.target.sim.host}, one per role replica, the router in front; "
                "GPUs and NICs are modelled, not used")
    if spec.target.kind == "local":
        local = spec.target.local
        where = ("each engine's OpenMP threads on its own share of the host's cores" if local.device == "cpu"
                 else "every engine on GPU 0, each with its share of its memory (--gpu-memory-utilization), "
                      "started one after another" if local.gpu_share
                 else "each role replica on its own GPUs (CUDA_VISIBLE_DEVICES, from GPU 0)")
        router = ("epdbench's proxy in front" if local.router == "builtin"
                  else "vllm-router in front (epdbench's proxy for EPD)")
        return (f"one vLLM OpenAI-server process per role replica on {local.host}, {router}; {where}; "
                "NIXL's side channels on loopback ports")
    k = spec.target.kubernetes
    selector = ", ".join(f"{key}={value}" for key, value in k.node.selector.items()) or "none"
    return (f"namespace {k.namespace}; node selector {selector}; GPUs via {k.node.gpu_resource}; "
            f"RDMA via {k.node.rdma_resource or 'none'} with IPC_LOCK on RDMA roles; /dev/shm a memory emptyDir "
            f"of {k.engine.shm_size}; hostIPC off")


def connectors_text(spec: ExperimentSpec, config: ConfigurationSpec) -> str:
    kv = next((kv_transfer_config(config, r.role) for r in config.roles if kv_transfer_config(config, r.role)), None)
    parts = [f"{kv['kv_connector']} ({config.kv_transport})"] if kv else ["none"]
    if config.topology == "epd" and spec.target.kind == "local":
        parts.append(f"encoder cache: {LOCAL_EC_CONNECTOR} through a shared folder under "
                     f"{spec.target.local.ec_shared_dir} ({ec_path(spec, config)})")
    elif config.topology == "epd":
        parts.append(f"encoder cache: {spec.target.kubernetes.engine.ec_connector} over NIXL ({config.ec_expected})")
    return ", ".join(parts)


def calibration_text(spec: ExperimentSpec, profile: dict | str | None) -> str | None:
    """On the simulator, where its constants came from when a profile was applied (`profile`: the profile, or
    why the run's copy could not be read), with the model's error bar for this spec; else None."""
    if profile is None or spec.target.kind != "sim":
        return None
    if isinstance(profile, str):
        return f"from a calibration profile whose copy in the run could not be read ({profile})"
    return f"from calibration profile profile.yaml, {profile_origin(profile)}; model error: {error_bar(profile, spec)}"


def environment(spec: ExperimentSpec, profile: dict | str | None = None) -> dict:
    """JSON-able: hardware, image, flags, placement, the simulator's calibration (calibration_text); per
    configuration roles, GPUs, connectors, flags."""
    return {
        "hardware": hardware_text(spec), "engine_image": engine_image(spec), "engine_flags": engine_flags(spec),
        "placement": placement_text(spec), "calibration": calibration_text(spec, profile),
        "configurations": {c.name: {"connectors": connectors_text(spec, c),
                                    "rdma_interfaces": sum(r.rdma_interfaces * r.replicas for r in c.roles),
                                    "role_flags": role_flags(spec, c) if spec.target.kind != "sim" else {}}
                           for c in spec.configurations},
    }
