"""The command lines a spec implies (pure): `vllm serve` arguments of each role and the vllm-router
command line. One source for the Kubernetes manifests, the simulator target and the report, so the
three can never drift apart."""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from epdbench.specs.gpu_share import gpu_shares, kv_cache_bytes
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, RoleSpec

ENGINE_PORT = 8000
ROUTER_PORT = 8000
ROUTER_METRICS_PORT = 29000
MOONCAKE_BOOTSTRAP_PORT = 8998
NIXL_SIDE_CHANNEL_PORT = 5600   # VLLM_NIXL_SIDE_CHANNEL_PORT (vLLM 0.12 on: one listener per engine, + DP index)
EC_SIDE_CHANNEL_PORT = 5601     # VLLM_EC_SIDE_CHANNEL_PORT (ECCPUConnector's producer, vLLM 0.30 on)
OTLP_PORT = 4318                # OTLP/HTTP's registered port: the in-cluster trace collector's
# ECCPUConnector's shared-memory buffer of encoder outputs (/dev/shm/vllm_ec_<engine id>.mmap): ec_cpu_bytes is
# mandatory (vllm/distributed/ec_transfer/ec_connector/cpu/); 8 GiB fits the default /dev/shm of 16Gi.
EC_CPU_BYTES = 8 * 1024 ** 3


def moves_kv(config: ConfigurationSpec, role: str) -> bool:
    return config.topology != "aggregated" and role in ("prefill", "decode")


KV_CONNECTORS = {"mooncake": "MooncakeConnector", "nixl": "NixlConnector"}
# How often the KV pods log their transfer windows: vLLM's NixlConnector stats (VLLM_LOG_STATS_INTERVAL, set on
# every NIXL engine we start) and Mooncake's Transfer Engine metrics (MC_TE_METRIC_INTERVAL_SECONDS on a cluster).
VLLM_STATS_INTERVAL_S = 1
MOONCAKE_METRIC_INTERVAL_S = 5


def kv_log_interval_s(config: ConfigurationSpec) -> float | None:
    """Seconds between the transfer windows the configuration's KV connector logs as we start it; none when
    aggregated (no KV moves)."""
    if config.topology == "aggregated":
        return None
    return VLLM_STATS_INTERVAL_S if config.kv_connector == "nixl" else MOONCAKE_METRIC_INTERVAL_S


def kv_connector_name(config: ConfigurationSpec) -> str:
    """vLLM's class name of the configuration's KV connector, or none (aggregated)."""
    return "none" if config.topology == "aggregated" else KV_CONNECTORS[config.kv_connector]


def kv_transfer_config(config: ConfigurationSpec, role: str, kv_buffer_device: str | None = None) -> dict | None:
    """vLLM's --kv-transfer-config of a role; `kv_buffer_device` cpu: NIXL registers host memory (vLLM's CPU build,
    whose KV cache lives there)."""
    if not moves_kv(config, role):
        return None
    if config.kv_connector == "nixl":
        # NixlConnector: the decode READs the prefill's blocks (kv_both is deprecated from vLLM 0.25); UCX picks the
        # transport itself within UCX_TLS / UCX_NET_DEVICES (manifests.render.engine_env).
        out = {"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
               "kv_connector_extra_config": {"backends": ["UCX"]}}
        return {**out, "kv_buffer_device": kv_buffer_device} if kv_buffer_device else out
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


def engine_args(spec: ExperimentSpec, config: ConfigurationSpec, role: RoleSpec, *, model: str | None = None,
                host: str = "0.0.0.0", port: int = ENGINE_PORT, kv_buffer_device: str | None = None,
                extra_args: Sequence[str] | None = None, gpu_memory_utilization: float | None = None,
                ec: dict | None = None) -> list[str]:
    """`vllm serve` arguments of one role: model, TP, the WORKLOADS.md engine limits, evidence logging. `model`: what
    the engine loads when not model.name (then served under model.name); `extra_args`: by default the Kubernetes
    engine's; `gpu_memory_utilization`: the engine's share instead of the spec's; `ec`: the role's
    --ec-transfer-config instead of the cluster's."""
    args = [model or spec.model.name, "--host", host, "--port", str(port)]
    if model and model != spec.model.name:
        args += ["--served-model-name", spec.model.name]
    args += ["--tensor-parallel-size", str(role.tp),
            "--max-model-len", str(spec.engine.max_model_len),
            "--max-num-seqs", str(spec.engine.max_num_seqs),
            "--max-num-batched-tokens", str(spec.engine.max_num_batched_tokens),
            "--gpu-memory-utilization", str(gpu_memory_utilization or spec.engine.gpu_memory_utilization),
            "--enable-request-id-headers", "--enable-log-requests", "--max-log-len", str(MAX_LOG_LEN),
            # usage.prompt_tokens_details.cached_tokens: the records' cached tokens, which the KV volume check
            # and the prefix-cache figures need (vLLM 0.33 leaves them out without it)
            "--enable-prompt-tokens-details"]
    if spec.engine.block_size is not None:
        args += ["--block-size", str(spec.engine.block_size)]
    if spec.engine.num_gpu_blocks_override is not None:
        args += ["--num-gpu-blocks-override", str(spec.engine.num_gpu_blocks_override)]
    if role.role == "encode":
        args.append("--enforce-eager")
    if role.role == "encode" or not spec.engine.enable_prefix_caching:
        args.append("--no-enable-prefix-caching")
    kv = kv_transfer_config(config, role.role, kv_buffer_device)
    if kv:
        args += ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
    ec = ec if ec is not None else ec_transfer_config(spec, config, role.role)
    if ec:
        args += ["--ec-transfer-config", json.dumps(ec, separators=(",", ":"))]
    return args + list(spec.target.kubernetes.engine.extra_args if extra_args is None else extra_args)


# The local target's UCX transports per expected transport: no shared memory (sm, cma) and no cuda_ipc, so two
# engine processes on one host cannot move KV around the transport under test; cuda_copy stages GPU memory.
LOCAL_UCX_TLS = {"tcp": "tcp", "rdma": "rc,ud"}
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def local_ec_transfer_config(config: ConfigurationSpec, role: str, shared_dir: str) -> dict | None:
    """EPD on the local target: vLLM's ECExampleConnector, the encode engine writing each image's encoder output to
    `shared_dir` (one safetensors file per mm_hash) and the prefill engine loading it from there. vLLM 0.26's
    ECCPUConnector cannot carry outputs between two engines: its index of what the shared-memory region holds
    lives in the producing engine's scheduler (ec_connector/cpu/scheduler), so a consumer never finds an entry."""
    if config.topology != "epd" or role not in ("encode", "prefill"):
        return None
    return {"ec_connector": LOCAL_EC_CONNECTOR, "ec_role": "ec_producer" if role == "encode" else "ec_consumer",
            "ec_connector_extra_config": {"shared_storage_path": shared_dir}}


LOCAL_EC_CONNECTOR = "ECExampleConnector"


def ec_path(spec: ExperimentSpec, config: ConfigurationSpec) -> str:
    """What carries an EPD configuration's encoder outputs, as the report and MLflow name it: shm (a shared folder
    in memory) on the local target, else the expected network transport; none without EPD."""
    if config.topology == "epd" and spec.target.kind == "local":
        return "shm"
    return config.ec_expected


def starts_together(spec: ExperimentSpec, config: ConfigurationSpec) -> bool:
    """Whether the configuration's engines that hold a KV cache start at the same time on the shared GPU
    (target.local.start_together, and more than one of them)."""
    return (spec.shares_one_gpu and spec.target.local.start_together
            and sum(r.replicas for r in config.roles if r.role != "encode") > 1)


def local_engine_args(spec: ExperimentSpec, config: ConfigurationSpec, role: RoleSpec, *, model: str,
                      port: int, ec_shared_dir: str | None = None) -> list[str]:
    """Arguments after `PYTHON -m vllm.entrypoints.openai.api_server` of a role on the local target: the same
    engine_args the manifests use, on a loopback port, NIXL's buffers in host memory on a CPU host, the engine's
    share of GPU 0 when the engines share it, random weights for a model made at run time, EPD's encoder outputs
    through `ec_shared_dir` and the encode engine on the vision tower alone."""
    local = spec.target.local
    share = gpu_shares(spec, config)[role.role] if spec.shares_one_gpu else None
    ec = None
    if config.topology == "epd" and role.role in ("encode", "prefill"):
        if not ec_shared_dir:
            raise ValueError(f"{config.name} {role.role}: EPD on the local target needs the encoder-output folder")
        ec = local_ec_transfer_config(config, role.role, ec_shared_dir)
    args = engine_args(spec, config, role, model=model, host=local.host, port=port,
                       kv_buffer_device="cpu" if local.device == "cpu" else None, extra_args=(),
                       gpu_memory_utilization=share, ec=ec)
    if local.made_model:
        args += ["--load-format", "dummy"]
    if starts_together(spec, config) and role.role != "encode":
        # sized, not profiled: vLLM's profiling miscounts what the engines starting beside it allocate
        args += ["--kv-cache-memory-bytes", str(kv_cache_bytes(spec, config)[role.role])]
    if role.role == "encode" and local.encode_vision_only:
        args.append("--mm-encoder-only")       # vLLM skips the language model's weights (multimodal config)
    # The module takes the model as --model (only `vllm serve` reads it as the first positional argument).
    return ["--model", *args, *local.extra_args]


MOONCAKE_CONNECTOR_LOGGER = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"
# vLLM's logging (VLLM_LOGGING_CONFIG_PATH) as its default, but the request logger at DEBUG: vLLM up to 0.32 logs a
# request's body (`Request <body request_id> JSON body:`, the client's id behind vllm-router) at DEBUG only; 0.33 at
# VLLM_REQUEST_BODY_LOG_LEVEL. The request logger's module moved between releases: both names.
VLLM_LOG_FORMAT = ("(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] "
                   "%(message)s")
VLLM_LOGGING_CONFIG = {
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"vllm": {"()": "vllm.logging_utils.NewLineFormatter", "datefmt": "%m-%d %H:%M:%S",
                            "format": VLLM_LOG_FORMAT, "log_level": "INFO"}},
    "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": "DEBUG",
                          "stream": "ext://sys.stdout"}},
    "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False},
                "vllm.entrypoints.serve.utils.request_logger": {"level": "DEBUG"},
                "vllm.entrypoints.logger": {"level": "DEBUG"},
                # EPD's encoder-cache connectors: ECExampleConnector's save and load lines per mm_hash (DEBUG)
                "vllm.distributed.ec_transfer": {"level": "DEBUG"},
                # the stat logger writes its `KV Transfer metrics` at DEBUG once the engine is idle, and resets its
                # window either way (vllm/v1/metrics/loggers.py `log`: log_fn = logger.debug if engine_is_idle):
                # at INFO a window logged idle is lost
                "vllm.v1.metrics.loggers": {"level": "DEBUG"},
                # MooncakeConnector's one line per request whose KV the prefill sends (`Sending kv_caches for
                # request R (N blocks) to H:P`, DEBUG; vLLM 0.26 mooncake_connector.py:1607): its stats count batch
                # writes, which may carry several requests
                MOONCAKE_CONNECTOR_LOGGER: {"level": "DEBUG"}}}


# vLLM before 0.32 (0.26 read): its NewLineFormatter takes (fmt, datefmt, style) only — the log_level keyword above
# makes its logging config fail and the engine with it — and its records carry no vllm_process_name: the
# `(APIServer pid=N) ` prefix is written by its decorated stdout instead (vllm/utils/system_utils.py
# `decorate_logs`). Its own default, with the same loggers.
VLLM_LEGACY_LOG_FORMAT = "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"
FIRST_PROCESS_NAME_FORMAT = (0, 32)


def vllm_logging_config(version: str) -> dict:
    """VLLM_LOGGING_CONFIG for the vLLM of `version` (e.g. 0.26.0, 0.32.0+cpu): the legacy formatter before 0.32;
    a version that cannot be read gets the current one."""
    m = re.match(r"^(\d+)\.(\d+)", version.strip())
    if m is None or (int(m.group(1)), int(m.group(2))) >= FIRST_PROCESS_NAME_FORMAT:
        return VLLM_LOGGING_CONFIG
    legacy = {"class": "vllm.logging_utils.NewLineFormatter", "datefmt": "%m-%d %H:%M:%S",
              "format": VLLM_LEGACY_LOG_FORMAT}
    return {**VLLM_LOGGING_CONFIG, "formatters": {"vllm": legacy}}


def local_engine_env(spec: ExperimentSpec, config: ConfigurationSpec, role: str, *, nixl_port: int | None,
                     gpus: Sequence[int] = (), cpus: str | None = None, logging_config: str | None = None,
                     internal_port: int | None = None, bootstrap_port: int | None = None) -> dict[str, str]:
    """Environment of a role's engine on the local target: request bodies logged with the client's id (`logging_config`:
    the path of VLLM_LOGGING_CONFIG written out); the engine's own ports scanned up from `internal_port` (VLLM_PORT);
    NIXL's side channel on its own loopback port and UCX's lanes at info level, or Mooncake's (mooncake_env; a
    prefill's bootstrap server on `bootstrap_port`) — the evidence; the KV cache's host memory and the engine's cores
    (cpu) or the replica's GPUs (cuda); then the spec's own variables."""
    local = spec.target.local
    env = {"VLLM_REQUEST_BODY_LOG_LEVEL": REQUEST_BODY_LOG_LEVEL, "PYTHONUNBUFFERED": "1"}
    if logging_config:
        env["VLLM_LOGGING_CONFIG_PATH"] = logging_config
    if internal_port is not None:
        # vLLM's get_open_port scans up from VLLM_PORT (vllm/utils/network_utils.py) for the ports it binds later
        env["VLLM_PORT"] = str(internal_port)
    if moves_kv(config, role) and config.kv_connector == "nixl":
        if nixl_port is None:
            raise ValueError(f"{config.name} {role}: NIXL needs a side-channel port")
        tls = LOCAL_UCX_TLS[config.kv_transport] + (",cuda_copy" if local.device == "cuda" else "")
        # VLLM_LOG_STATS_INTERVAL: vLLM logs its `KV Transfer metrics` (the evidence that transfers succeeded) once
        # per stats interval, at INFO only while the engine is busy (at DEBUG once idle: vllm/v1/metrics/loggers.py);
        # at the default 10 s a short cell's transfers were logged only after it, idle, and never seen
        env.update({"VLLM_NIXL_SIDE_CHANNEL_HOST": local.host, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(nixl_port),
                    "UCX_TLS": tls, "UCX_LOG_LEVEL": "info", "VLLM_LOG_STATS_INTERVAL": str(VLLM_STATS_INTERVAL_S)})
    elif moves_kv(config, role):
        env.update(mooncake_env(spec, config, role, bootstrap_port, internal_port))
    if local.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(local.cpu_kvcache_gib)
        if cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    return {**env, **local.env}


# Mooncake's RPC and TCP listeners pick random ports in [MC_MIN_RPC_PORT, MC_MAX_RPC_PORT] (default 15000-17000,
# inside the 10000-19999 the local target picks its engines', routers' and bootstrap servers' ports from before they
# are bound; mooncake-transfer-engine config.cpp and transfer_metadata_plugin.cpp `findAvailableTcpPort`): each
# engine's go to the top of its own block of 64 (tasks/proc/processes.py PORT_BLOCK), whose bottom vLLM scans up from
# for its own (VLLM_PORT). Mooncake refuses a range inside 32768-60999 (`ValidatePortRange`) and keeps its default.
MOONCAKE_RPC_PORTS = (48, 63)


def mooncake_env(spec: ExperimentSpec, config: ConfigurationSpec, role: str, bootstrap_port: int | None,
                 internal_port: int | None) -> dict[str, str]:
    """MooncakeConnector's environment of a KV engine on the local target (vLLM 0.26, Mooncake 0.3.14):
    - VLLM_HOST_IP: the worker advertises vLLM's get_ip() (VLLM_HOST_IP, else the address of the route to 8.8.8.8,
      else 0.0.0.0: vllm/utils/network_utils.py) to its transfer engine (`initialize(hostname, "P2PHANDSHAKE", ...)`)
      and binds its ZMQ side channel there (mooncake_connector.py:916, 1139): on loopback every address the engines
      exchange stays on this host. Mooncake's own listeners and the bootstrap server still bind every interface
      (INADDR_ANY in findAvailableTcpPort; MooncakeBootstrapServer("0.0.0.0", port), mooncake_connector.py:1001):
      they cannot be held to loopback, only never advertised beyond it;
    - MC_FORCE_TCP for a TCP configuration: the engine installs RDMA whenever it finds HCAs, whatever
      mooncake_protocol says (transfer_engine_impl.cpp; the Python binding ignores the protocol);
    - MC_TE_METRIC, MC_TE_METRIC_INTERVAL_SECONDS: its `[Metrics] Transfer Engine Stats` windows;
    - VLLM_LOG_STATS_INTERVAL: vLLM's `KV Transfer metrics` every second (NixlConnector's reason, local_engine_env);
    - the prefill's VLLM_MOONCAKE_BOOTSTRAP_PORT: its bootstrap server, which the decode and the router query for
      the prefill's engine id (envs.py; only a producer starts one, mooncake_connector.py:999);
    - MC_MIN_RPC_PORT, MC_MAX_RPC_PORT: the engine's own ports (MOONCAKE_RPC_PORTS)."""
    env = {"VLLM_HOST_IP": spec.target.local.host, "MC_TE_METRIC": "1",
           "MC_TE_METRIC_INTERVAL_SECONDS": str(MOONCAKE_METRIC_INTERVAL_S),
           "VLLM_LOG_STATS_INTERVAL": str(VLLM_STATS_INTERVAL_S)}
    if config.kv_transport == "tcp":
        env["MC_FORCE_TCP"] = "1"
    if role == "prefill":
        if bootstrap_port is None:
            raise ValueError(f"{config.name} prefill: MooncakeConnector needs a bootstrap port")
        env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(bootstrap_port)
    if internal_port is not None:
        env["MC_MIN_RPC_PORT"], env["MC_MAX_RPC_PORT"] = (str(internal_port + p) for p in MOONCAKE_RPC_PORTS)
    return env


def otlp_engine_args(endpoint: str) -> list[str]:
    """vLLM's arguments that export an `llm_request` span per request to the run's OTLP/HTTP receiver."""
    return ["--otlp-traces-endpoint", endpoint]


def otlp_engine_env(role: str, pod: str) -> dict[str, str]:
    """The OpenTelemetry SDK's settings for an engine that traces: protobuf over HTTP (vLLM's default is gRPC,
    vllm/tracing/otel.py get_span_exporter), the pod and its role as resource attributes (how the receiver tells
    the engines apart), and batches flushed every 200 ms instead of 5 s so a cell's spans come with it."""
    return {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": pod,
            "OTEL_RESOURCE_ATTRIBUTES": f"epdbench.role={'aggregated' if role == 'server' else role},epdbench.pod={pod}",
            "OTEL_BSP_SCHEDULE_DELAY": "200"}


def local_gpus(config: ConfigurationSpec, one_gpu: bool = False) -> dict[str, list[int]]:
    """Replica name (prefill-0) -> its GPUs on the local target: tp each, in role order from GPU 0; `one_gpu`
    (target.local.gpu_share): GPU 0 for all."""
    if one_gpu:
        return {f"{r.role}-{i}": [0] for r in config.roles for i in range(r.replicas)}
    out, nxt = {}, 0
    for role in config.roles:
        for i in range(role.replicas):
            out[f"{role.role}-{i}"] = list(range(nxt, nxt + role.tp))
            nxt += role.tp
    return out


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


def builtin_router_args(*, host: str, port: int, engines: Sequence[tuple[str, str]], kv_connector: str | None = None,
                        bootstrap_ports: Mapping[str, int] | None = None) -> list[str]:
    """Arguments after `python -m epdbench.sim.proxy` (epdbench's own router, vLLM's disagg_epd_proxy protocol):
    each engine as (role, URL), server for aggregated, else encode, prefill and decode. `kv_connector` mooncake: the
    proxy speaks MooncakeConnector's PD protocol, each prefill given with its bootstrap port (`bootstrap_ports`, by
    URL) as `--prefill URL PORT`, as vllm-router and vLLM's Mooncake proxy take it."""
    args = ["--host", host, "--port", str(port)]
    if kv_connector == "mooncake":
        args += ["--kv-connector", "mooncake"]
    for role, url in engines:
        args += [f"--{role}", url]
        if role == "prefill" and kv_connector == "mooncake":
            if url not in (bootstrap_ports or {}):
                raise ValueError(f"prefill {url}: MooncakeConnector's PD protocol needs its bootstrap port")
            args.append(str(bootstrap_ports[url]))
    return args


BUILTIN_ROUTER_MODULE = "epdbench.sim.proxy"


def local_cpu_binds(config: ConfigurationSpec, cores: Sequence[int]) -> dict[str, str]:
    """Replica name -> the cores its OpenMP threads are bound to (VLLM_CPU_OMP_THREADS_BIND) on a CPU host: the
    host's cores split into one contiguous share per engine (engines beyond the cores share them in turn), so
    engines do not spin against each other on the same cores."""
    names = [f"{r.role}-{i}" for r in config.roles for i in range(r.replicas)]
    cores = sorted(cores)
    if not cores:
        return {}
    if len(names) >= len(cores):
        return {name: str(cores[i % len(cores)]) for i, name in enumerate(names)}
    share = len(cores) // len(names)
    out = {}
    for i, name in enumerate(names):
        mine = cores[i * share:(i + 1) * share] if i < len(names) - 1 else cores[i * share:]
        out[name] = ",".join(map(str, mine))
    return out
