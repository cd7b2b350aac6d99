"""Experiment spec: strict Pydantic models, one per concern, loadable from YAML.

Every field carries a title and a description (a test checks it) so the same models
drive the CLI, the YAML presets and the Prefect UI form.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PRESET_DIR = Path(__file__).resolve().parent

RoleName = Literal["server", "prefill", "decode", "encode"]
Topology = Literal["aggregated", "pd", "epd"]
KvTransport = Literal["none", "tcp", "rdma"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VisionSpec(Strict):
    params_b: float = Field(gt=0, title="Vision encoder parameters (billions)",
                            description="Parameter count of the vision tower, from the model config.")
    pixels_per_token: int = Field(28, ge=1, title="Pixels per image token (edge)",
                                  description="Edge length in pixels covered by one image token "
                                              "(Qwen2.5-VL: 14-px patches merged 2x2 = 28).")
    embed_dim: int = Field(gt=0, title="Image embedding width",
                           description="Width of one image token's embedding handed to the language model.")


class ModelSpec(Strict):
    name: str = Field(title="Model", description="Hugging Face model id served by every configuration.")
    params_b: float = Field(gt=0, title="Language-model parameters (billions)",
                            description="Parameters read per decode step and multiplied per prefill token.")
    n_layers: int = Field(gt=0, title="Layers", description="Transformer layers (model config num_hidden_layers).")
    hidden_size: int = Field(gt=0, title="Hidden size", description="Model config hidden_size.")
    n_heads: int = Field(gt=0, title="Attention heads", description="Model config num_attention_heads.")
    n_kv_heads: int = Field(gt=0, title="KV heads", description="Model config num_key_value_heads (GQA).")
    head_dim: int = Field(gt=0, title="Head dimension", description="Model config head_dim.")
    dtype_bytes: int = Field(2, ge=1, le=4, title="Bytes per weight/KV element",
                             description="2 for bf16/fp16.")
    chat_overhead_tokens: int = Field(23, ge=0, title="Chat template tokens",
                                      description="Tokens the chat template adds around one user message.")
    vision: VisionSpec | None = Field(None, title="Vision tower",
                                      description="Present for multimodal models; absent for text-only ones.")

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes


class HardwareSpec(Strict):
    gpu: str = Field(title="GPU", description="GPU model of the node, e.g. H100-SXM5-80GB.")
    gpus_per_node: int = Field(8, ge=1, le=16, title="GPUs on the node",
                               description="A configuration may not use more GPUs than this.")
    bf16_tflops: float = Field(gt=0, title="Peak dense BF16 TFLOP/s per GPU", description="From the datasheet.")
    hbm_tb_s: float = Field(gt=0, title="HBM bandwidth (TB/s) per GPU", description="From the datasheet.")
    hbm_gb: float = Field(80, gt=0, title="HBM capacity (GB) per GPU",
                          description="From the datasheet; bounds the KV cache (and so the prefix cache).")
    nvlink_gb_s: float = Field(gt=0, title="NVLink bandwidth (GB/s) per GPU",
                               description="From the datasheet; carries tensor-parallel all-reduces.")
    compute_efficiency: float = Field(0.5, gt=0, le=1, title="Achievable fraction of peak FLOP/s",
                                      description="Model FLOPs utilisation assumed for prefill (compute-bound).")
    hbm_efficiency: float = Field(0.8, gt=0, le=1, title="Achievable fraction of HBM bandwidth",
                                  description="Assumed for decode (bandwidth-bound).")
    step_overhead_ms: float = Field(1.0, ge=0, title="Per-step overhead (ms)",
                                    description="Scheduling and launch overhead of one engine step.")
    tcp_gb_s: float = Field(gt=0, title="KV transfer bandwidth over TCP (GB/s)",
                            description="Effective Mooncake TCP transport bandwidth between pods of the node.")
    tcp_latency_ms: float = Field(0.5, ge=0, title="TCP transfer latency (ms)",
                                  description="Fixed cost per KV transfer over TCP (connection, handshake, copies).")
    rdma_nic_gbit_s: float = Field(gt=0, title="RDMA NIC line rate (Gbit/s)",
                                   description="Per interface, e.g. 400 for ConnectX-7 NDR.")
    rdma_efficiency: float = Field(0.8, gt=0, le=1, title="Achievable fraction of RDMA line rate",
                                   description="Applied to the sum of the interfaces of the sending pod.")
    rdma_latency_ms: float = Field(0.05, ge=0, title="RDMA transfer latency (ms)",
                                   description="Fixed cost per KV transfer over RDMA.")


class EngineSpec(Strict):
    max_num_batched_tokens: int = Field(8192, ge=16, title="Token budget per step",
                                        description="vLLM max_num_batched_tokens: decodes plus prefill chunk.")
    max_num_seqs: int = Field(256, ge=1, title="Max running sequences", description="vLLM max_num_seqs.")
    max_model_len: int = Field(32768, ge=64, title="Max model length", description="vLLM --max-model-len.")
    enable_prefix_caching: bool = Field(True, title="Prefix caching",
                                        description="vLLM automatic prefix caching (on by default in vLLM; the "
                                                    "Encode role never prefills).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, title="GPU memory utilisation",
                                          description="vLLM --gpu-memory-utilization: weights plus KV cache.")


class RoleSpec(Strict):
    role: RoleName = Field(title="Role", description="server (aggregated), prefill, decode or encode.")
    replicas: int = Field(1, ge=1, le=16, title="Replicas", description="Pods (or simulator processes) of this role.")
    tp: int = Field(1, ge=1, le=8, title="Tensor parallel size", description="GPUs per replica.")
    rdma_interfaces: int = Field(0, ge=0, le=8, title="RDMA interfaces",
                                 description="RDMA NICs per replica (KV over RDMA only).")


_ROLES_BY_TOPOLOGY: dict[str, set[str]] = {
    "aggregated": {"server"},
    "pd": {"prefill", "decode"},
    "epd": {"encode", "prefill", "decode"},
}


class ConfigurationSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Name",
                      description="Short name used in results, e.g. pd-tcp.")
    topology: Topology = Field(title="Topology", description="aggregated, pd or epd.")
    kv_transport: KvTransport = Field("none", title="KV transport",
                                      description="How KV moves from Prefill to Decode: none, tcp or rdma.")
    roles: list[RoleSpec] = Field(min_length=1, title="Roles", description="Role replicas and their TP.")

    @model_validator(mode="after")
    def _check_roles(self) -> "ConfigurationSpec":
        have = {r.role for r in self.roles}
        want = _ROLES_BY_TOPOLOGY[self.topology]
        if have != want:
            raise ValueError(f"topology {self.topology} needs roles {sorted(want)}, got {sorted(have)}")
        if len(self.roles) != len(have):
            raise ValueError("each role may appear once; use replicas for more pods")
        if self.topology == "aggregated" and self.kv_transport != "none":
            raise ValueError("aggregated serving moves no KV: set kv_transport: none")
        if self.topology != "aggregated" and self.kv_transport == "none":
            raise ValueError(f"{self.topology} needs kv_transport tcp or rdma")
        if self.kv_transport == "rdma":
            for r in self.roles:
                if r.role in ("prefill", "decode") and r.rdma_interfaces < 1:
                    raise ValueError(f"kv_transport rdma needs rdma_interfaces >= 1 on role {r.role}")
        return self

    @property
    def gpus(self) -> int:
        return sum(r.replicas * r.tp for r in self.roles)

    def role(self, name: str) -> RoleSpec | None:
        return next((r for r in self.roles if r.role == name), None)


class Shape(Strict):
    input_tokens: int = Field(ge=1, title="Input tokens", description="Target prompt length in tokens.")
    output_tokens: int = Field(ge=1, title="Output tokens", description="Requested output tokens (max_tokens).")

    @property
    def workload(self) -> str:
        return f"{self.input_tokens}/{self.output_tokens}"


class CellCounts(Strict):
    n_warmup: int = Field(2, ge=0, le=1000, title="Warm-up requests per cell",
                          description="Sent first and excluded from statistics.")
    n_measured: int = Field(8, ge=1, le=100000, title="Measured requests per cell",
                            description="Default number of measured requests of a cell.")
    n_measured_by_concurrency: dict[int, int] = Field(
        default_factory=dict, title="Measured requests by concurrency",
        description="Overrides n_measured for the given concurrencies, e.g. {16: 64}.")

    def measured_for(self, concurrency: int) -> int:
        return self.n_measured_by_concurrency.get(concurrency, self.n_measured)


class FixedSuite(CellCounts):
    kind: Literal["fixed"] = Field("fixed", title="Kind", description="Fixed text shapes at fixed concurrency.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Suite name", description="e.g. fixed.")
    shapes: list[Shape] = Field(min_length=1, title="Shapes", description="input/output token shapes.")
    concurrencies: list[int] = Field(min_length=1, title="Concurrencies",
                                     description="Closed-loop worker counts; each shape runs at each.")


class ImageCell(Strict):
    name: str = Field(title="Cell name", description="e.g. 1k.")
    image_px: int = Field(ge=28, le=4096, title="Image edge (px)", description="Square image edge length.")
    text_tokens: int = Field(ge=1, title="Text tokens", description="Target text tokens besides the image.")
    output_tokens: int = Field(ge=1, title="Output tokens", description="max_tokens of each request.")

    @property
    def workload(self) -> str:
        return f"{self.name}:{self.image_px}px+{self.text_tokens}/{self.output_tokens}"


class MultimodalSuite(CellCounts):
    kind: Literal["multimodal"] = Field("multimodal", title="Kind",
                                        description="One image plus text per request, chat API.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Suite name", description="e.g. mm-context.")
    cells: list[ImageCell] = Field(min_length=1, title="Cells", description="Image size and text per cell.")
    concurrencies: list[int] = Field(min_length=1, title="Concurrencies", description="Closed-loop worker counts.")
    reuse_image: bool = Field(False, title="Reuse one image",
                              description="Send the same image with every request (encoder-cache reuse).")
    image_format: Literal["png", "jpeg"] = Field("png", title="Image format",
                                                 description="Encoding of the synthetic images in the data URL.")


class StreamSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Stream name", description="e.g. steady, burst.")
    input_tokens: int | None = Field(None, ge=1, title="Input tokens",
                                     description="Fixed prompt length (text tokens when an image is sent).")
    input_tokens_min: int | None = Field(None, ge=1, title="Input tokens (min)",
                                         description="With input_tokens_max: lengths drawn uniformly from the seed.")
    input_tokens_max: int | None = Field(None, ge=1, title="Input tokens (max)",
                                         description="Upper bound of the seeded uniform prompt length.")
    output_tokens: int = Field(ge=1, title="Output tokens", description="max_tokens of each request.")
    n_requests: int = Field(ge=1, le=100000, title="Requests", description="Measured requests of this stream.")
    concurrency: int = Field(ge=1, le=4096, title="Concurrency", description="Workers of this stream.")
    arrival: Literal["closed", "burst"] = Field(
        "closed", title="Arrival pattern",
        description="closed: each worker sends as soon as its last request ends; burst: groups of burst_size "
                    "requests released every burst_interval_s (still at most `concurrency` in flight).")
    burst_size: int = Field(4, ge=1, title="Burst size", description="Requests released together (burst arrival).")
    burst_interval_s: float = Field(2.0, ge=0, le=3600, title="Burst interval (s)",
                                    description="Time between the starts of two bursts.")
    image_px: int | None = Field(None, ge=28, le=4096, title="Image edge (px)",
                                 description="Send one square image per request (chat API); none: text only.")

    @model_validator(mode="after")
    def _lengths(self) -> "StreamSpec":
        ranged = self.input_tokens_min is not None or self.input_tokens_max is not None
        if ranged == (self.input_tokens is not None):
            raise ValueError(f"stream {self.name}: give input_tokens, or input_tokens_min and input_tokens_max")
        if ranged and (self.input_tokens_min is None or self.input_tokens_max is None
                       or self.input_tokens_min > self.input_tokens_max):
            raise ValueError(f"stream {self.name}: input_tokens_min must be <= input_tokens_max, both set")
        return self

    @property
    def workload(self) -> str:
        tokens = (f"{self.input_tokens}" if self.input_tokens is not None
                  else f"{self.input_tokens_min}-{self.input_tokens_max}")
        return (f"{self.image_px}px+" if self.image_px else "") + f"{tokens}/{self.output_tokens}"


class MixedSuite(Strict):
    kind: Literal["mixed"] = Field("mixed", title="Kind",
                                   description="Streams running at the same time; throughput over the whole window.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Suite name", description="e.g. mixed.")
    streams: list[StreamSpec] = Field(min_length=1, title="Streams", description="Concurrent request streams.")
    n_warmup: int = Field(0, ge=0, le=1000, title="Warm-up requests per stream",
                          description="Sent (closed loop) before the window opens; excluded from statistics.")

    @model_validator(mode="after")
    def _unique(self) -> "MixedSuite":
        names = [s.name for s in self.streams]
        if len(set(names)) != len(names):
            raise ValueError(f"stream names must be unique: {names}")
        return self


Suite = Annotated[Union[FixedSuite, MultimodalSuite, MixedSuite], Field(discriminator="kind")]


class SimFaults(Strict):
    skip_prefill_fraction: float = Field(0.0, ge=0, le=1, title="Skip-prefill fraction",
                                         description="Fault injection: the router sends this fraction of PD/EPD "
                                                     "requests straight to decode, which prefills locally.")


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
    kv_scale: float = Field(1 / 16, gt=0, le=1, title="Genuine KV scale",
                            description="Fraction of the modelled KV bytes really moved when kv_engine is mooncake.")
    kv_buffer_mb: int = Field(64, ge=1, le=4096, title="Genuine KV buffer (MB)",
                              description="Registered buffer per KV process; larger transfers are capped to it.")


K8S_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
K8S_QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"


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
    rdma_pod_annotations: dict[str, str] = Field(
        default_factory=dict, title="RDMA pod annotations",
        description="Annotations of RDMA pods, e.g. k8s.v1.cni.cncf.io/networks for a secondary RDMA network.")


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
                                   description="Interval between readiness and teardown checks.")
    engine: KubeEngineSpec = Field(default_factory=KubeEngineSpec, title="Engine",
                                   description="vLLM image and pod settings.")
    router: KubeRouterSpec = Field(default_factory=KubeRouterSpec, title="Router",
                                   description="Router pod in front of each configuration.")
    node: KubeNodeSpec = Field(default_factory=KubeNodeSpec, title="GPU node",
                               description="Where engine pods run and which device-plugin resources they request.")
    model_cache: ModelCache = Field(default_factory=PvcModelCache, title="Model cache",
                                    description="Volume mounted as the Hugging Face cache of every engine.")


class TargetSpec(Strict):
    kind: Literal["sim", "kubernetes"] = Field("sim", title="Target",
                                               description="sim: local simulator processes; kubernetes: a cluster.")
    sim: SimTargetSpec = Field(default_factory=SimTargetSpec, title="Simulator settings",
                               description="Used when kind is sim.")
    kubernetes: KubernetesTargetSpec = Field(default_factory=KubernetesTargetSpec, title="Kubernetes settings",
                                             description="Used when kind is kubernetes.")


class TrackingSpec(Strict):
    experiment: str = Field("epdbench", min_length=1, title="MLflow experiment",
                            description="Experiment the comparison is logged under.")
    tracking_uri: str | None = Field(None, title="Tracking URI",
                                     description="MLflow tracking URI; default a SQLite store under .epdbench/.")


class ExperimentSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,60}$", title="Spec name", description="e.g. smoke.")
    description: str = Field("", title="Description", description="What this spec compares.")
    seed: int = Field(0, ge=0, title="Seed", description="Seeds prompts and images; same seed, same requests.")
    trials: int = Field(1, ge=1, le=20, title="Trials", description="Repetitions of every cell.")
    cell_timeout_s: float | None = Field(None, ge=1, title="Cell timeout (s)",
                                         description="A cell (or mixed window) running longer fails its "
                                                     "configuration; the other configurations still run. "
                                                     "Empty: no limit.")
    configuration_timeout_s: float | None = Field(None, ge=1, title="Configuration timeout (s)",
                                                  description="Limit on all the suites of one configuration. "
                                                              "Empty: no limit.")
    request_timeout_s: float = Field(300, gt=0, le=3600, title="Request timeout (s)",
                                     description="A request slower than this is recorded as an error.")
    model: ModelSpec = Field(title="Model", description="Served model and its architecture figures.")
    hardware: HardwareSpec = Field(title="Hardware", description="The GPU node.")
    engine: EngineSpec = Field(default_factory=EngineSpec, title="Engine limits", description="vLLM limits.")
    configurations: list[ConfigurationSpec] = Field(min_length=1, title="Configurations",
                                                    description="Deployments to compare.")
    suites: list[Suite] = Field(min_length=1, title="Suites", description="Workloads every configuration runs.")
    target: TargetSpec = Field(default_factory=TargetSpec, title="Target", description="Where it runs.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, title="Tracking", description="MLflow settings.")

    @model_validator(mode="after")
    def _check(self) -> "ExperimentSpec":
        names = [c.name for c in self.configurations]
        if len(set(names)) != len(names):
            raise ValueError(f"configuration names must be unique: {names}")
        suites = [s.name for s in self.suites]
        if len(set(suites)) != len(suites):
            raise ValueError(f"suite names must be unique: {suites}")
        for i, c in enumerate(self.configurations):
            if c.gpus > self.hardware.gpus_per_node:
                raise ValueError(f"field 'configurations.{i}' ({c.name}) needs {c.gpus} GPUs but "
                                 f"'hardware.gpus_per_node' is {self.hardware.gpus_per_node}: "
                                 "lower replicas or tp, or use a bigger node")
        for i, s in enumerate(self.suites):
            images = isinstance(s, MultimodalSuite) or (isinstance(s, MixedSuite)
                                                         and any(st.image_px for st in s.streams))
            if images and self.model.vision is None:
                raise ValueError(f"field 'suites.{i}' ({s.name}) sends images but 'model.vision' is not set: "
                                 "use a multimodal model or drop the suite")
        if self.target.kind == "kubernetes":
            self._check_kubernetes()
        return self

    def _check_kubernetes(self) -> None:
        for i, c in enumerate(self.configurations):
            if c.kv_transport == "rdma" and not self.target.kubernetes.node.rdma_resource:
                raise ValueError(f"field 'configurations.{i}' ({c.name}) moves KV over RDMA but "
                                 "'target.kubernetes.node.rdma_resource' is not set: name the RDMA device "
                                 "plugin's resource, e.g. rdma/rdma_shared_device_a")

    def configuration(self, name: str) -> ConfigurationSpec:
        for c in self.configurations:
            if c.name == name:
                return c
        raise KeyError(name)


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the field and the fix."""


def describe_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    where = f"field '{loc}': " if loc else ""
    return f"{source}: {where}{msg}{more}"


def resolve_spec_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.exists():
        return p
    preset = PRESET_DIR / f"{name_or_path}.yaml"
    if preset.exists():
        return preset
    presets = ", ".join(sorted(x.stem for x in PRESET_DIR.glob("*.yaml")))
    raise SpecError(f"spec '{name_or_path}' not found: give a YAML path or a preset ({presets})")


def load_spec(name_or_path: str = "smoke") -> ExperimentSpec:
    path = resolve_spec_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level")
    return parse_spec(data, str(path))


def parse_spec(data: dict, source: str = "spec") -> ExperimentSpec:
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(describe_validation_error(e, source)) from None


def select_configurations(spec: ExperimentSpec, names: list[str] | None) -> ExperimentSpec:
    if not names:
        return spec
    known = [c.name for c in spec.configurations]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SpecError(f"--configs: unknown configuration(s) {', '.join(unknown)}; "
                        f"this spec has {', '.join(known)}")
    chosen = [c for c in spec.configurations if c.name in names]
    return spec.model_copy(update={"configurations": chosen})


def spec_to_yaml(spec: ExperimentSpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
