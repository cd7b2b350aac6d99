"""Kubernetes manifests of one configuration (pure): spec → template context → objects → strict schema check.

No cluster access here: tasks/k8s/target.py applies what this module returns. Templates live in
manifests/templates/ and are rendered with the project's one Jinja environment (epdbench.templating.make_env).
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path

import kubernetes_validate
import yaml

from epdbench.specs import commands
from epdbench.specs.commands import (EC_SIDE_CHANNEL_PORT, ENGINE_PORT, MOONCAKE_BOOTSTRAP_PORT, NIXL_SIDE_CHANNEL_PORT,
                                     OTLP_PORT, ROUTER_METRICS_PORT, ROUTER_PORT, ec_transfer_config, engine_args,
                                     moves_kv, otlp_engine_args, otlp_engine_env)
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, KubernetesTargetSpec, RoleSpec
from epdbench.templating import make_env

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
HF_HOME = "/root/.cache/huggingface"
DEFAULT_SCHEMA_VERSION = "1.31"
LABEL_RUN, LABEL_CONFIG, LABEL_ROLE = "epdbench/run", "epdbench/config", "epdbench/role"
EPD_PROXY = "/vllm-workspace/examples/online_serving/disaggregated_encoder/disagg_epd_proxy.py"
_LABEL_VALUE_MAX = 63


class ManifestError(ValueError):
    """Manifests that must not be applied; the message is one line naming the object and the field."""


def label_value(text: str) -> str:
    """A valid label value for any run name: invalid characters become '-', long names keep a hash."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", text).strip("-_.") or "run"
    if len(clean) <= _LABEL_VALUE_MAX:
        return clean
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{clean[:_LABEL_VALUE_MAX - 9].rstrip('-_.')}-{digest}"


def run_selector(run: str, config: str | None = None) -> str:
    """Label selector of every object of a run (or of one configuration of it)."""
    selector = f"{LABEL_RUN}={label_value(run)}"
    return selector if config is None else f"{selector},{LABEL_CONFIG}={config}"


def object_name(config: ConfigurationSpec, role: str) -> str:
    return f"{config.name}-{role}"


def pod_url(config: ConfigurationSpec, role: str, replica: int) -> str:
    """In-cluster URL of one engine pod (StatefulSet pod behind its headless Service)."""
    name = object_name(config, role)
    return f"http://{name}-{replica}.{name}:{ENGINE_PORT}"


def role_urls(config: ConfigurationSpec, role: str) -> list[str]:
    spec = config.role(role)
    return [] if spec is None else [pod_url(config, role, i) for i in range(spec.replicas)]


def labels(run: str, config: ConfigurationSpec, role: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "epdbench", LABEL_RUN: label_value(run),
            LABEL_CONFIG: config.name, LABEL_ROLE: role}


def selector_labels(config: ConfigurationSpec, role: str) -> dict[str, str]:
    return {LABEL_CONFIG: config.name, LABEL_ROLE: role}


POD_IP = {"valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
# UCX transports per expected transport (UCX_TLS). TCP: tcp lanes only, with cuda_copy to stage GPU memory, as
# MC_FORCE_TCP does for Mooncake. RDMA: verbs (rc, ud) and GPU copies but no tcp, so UCX cannot fall back to TCP in
# silence (without HCAs the pod fails at start instead); sm and self for the pod's own processes.
UCX_TLS = {"tcp": "tcp,cuda_copy,sm,self", "rdma": "rc,ud,cuda_copy,sm,self"}


def ucx_env(spec: ExperimentSpec, transport: str) -> list[dict]:
    """UCX's environment of a NIXL pod: the transports it may choose, the NICs (when the spec names them), and the
    info-level lines that name each endpoint's lanes (the evidence analysis.ucx reads); and vLLM's KV transfer stats
    logged every second, as the local target's (specs.commands.local_engine_env: at INFO only while the engine is
    busy, so a short cell's transfers at the default 10 s were logged at DEBUG, once idle)."""
    env = [{"name": "UCX_TLS", "value": UCX_TLS[transport]}, {"name": "UCX_LOG_LEVEL", "value": "info"},
           {"name": "VLLM_LOG_STATS_INTERVAL", "value": str(commands.VLLM_STATS_INTERVAL_S)}]
    devices = spec.target.kubernetes.node.ucx_net_devices.get(transport)
    if devices:
        env.append({"name": "UCX_NET_DEVICES", "value": devices})
    return env


def uses_nixl_kv(config: ConfigurationSpec, role: str) -> bool:
    return config.kv_connector == "nixl" and moves_kv(config, role)


def engine_env(spec: ExperimentSpec, config: ConfigurationSpec, role: str) -> list[dict]:
    """Environment that makes pods produce the evidence we verify (request bodies with the client's id,
    Mooncake metrics, forced TCP; UCX's lanes for NIXL)."""
    env = [{"name": "HF_HOME", "value": HF_HOME},
           {"name": "VLLM_REQUEST_BODY_LOG_LEVEL", "value": commands.REQUEST_BODY_LOG_LEVEL}]
    secret = spec.target.kubernetes.engine.hf_token_secret
    if secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "HF_TOKEN"}}})
    ucx = None
    if uses_nixl_kv(config, role):
        env += [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", **POD_IP},
                {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)}]
        ucx = config.kv_transport
    elif moves_kv(config, role):
        env += [{"name": "MC_TE_METRIC", "value": "1"},
                {"name": "MC_TE_METRIC_INTERVAL_SECONDS", "value": str(commands.MOONCAKE_METRIC_INTERVAL_S)},
                {"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": str(MOONCAKE_BOOTSTRAP_PORT)}]
        if config.kv_transport == "tcp":
            # Mooncake installs RDMA by itself whenever it discovers HCAs, whatever vLLM's config says.
            env.append({"name": "MC_FORCE_TCP", "value": "1"})
    if ec_transfer_config(spec, config, role):
        # ECCPUConnector (vLLM 0.30 on) needs the V2 model runner; its producer announces this address to consumers.
        env += [{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"},
                {"name": "VLLM_EC_SIDE_CHANNEL_HOST", **POD_IP},
                {"name": "VLLM_EC_SIDE_CHANNEL_PORT", "value": str(EC_SIDE_CHANNEL_PORT)}]
        if role == "encode" and "VLLM_LOGGING_LEVEL" not in spec.target.kubernetes.engine.env:
            # vLLM logs each completed NIXL READ of encoder outputs at DEBUG only: the proof that they moved.
            env.append({"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"})
        if ucx is None or ucx == config.ec_expected:
            ucx = config.ec_expected
        else:
            raise ManifestError(f"{config.name}: the prefill pod's UCX serves KV over {ucx} and encoder outputs over "
                                f"{config.ec_expected}; one UCX_TLS cannot force both: use one transport")
    if ucx:
        env += ucx_env(spec, ucx)
    if spec.tracing.enabled:
        env += otlp_env(role)
    env += [{"name": k, "value": v} for k, v in sorted(spec.target.kubernetes.engine.env.items())]   # the spec's own
    return env


def traces_endpoint(config: ConfigurationSpec) -> str:
    """Where the configuration's pods export spans: the trace collector beside the router (its Service's port)."""
    return f"http://{object_name(config, 'router')}:{OTLP_PORT}/v1/traces"


def otlp_env(role: str) -> list[dict]:
    """The OpenTelemetry SDK's settings of a pod that traces (specs.commands.otlp_engine_env), its pod named by
    the Downward API (the runner renames it to the process, prefill-0, as on the other targets)."""
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    return env + [{"name": k, "value": v} for k, v in otlp_engine_env(role, "$(POD_NAME)").items()]


def traces_context(spec: ExperimentSpec) -> dict | None:
    """The trace collector container beside the router (tasks.k8s.incluster_traces), when the spec traces."""
    if not spec.tracing.enabled:
        return None
    return {"image": spec.target.kubernetes.runner_image, "port": OTLP_PORT,
            "args": ["--host", "0.0.0.0", "--port", str(OTLP_PORT)]}


def engine_ports(spec: ExperimentSpec, config: ConfigurationSpec, role: str) -> list[dict]:
    ports = [{"name": "http", "containerPort": ENGINE_PORT}]
    if uses_nixl_kv(config, role):
        ports.append({"name": "nixl-side", "containerPort": NIXL_SIDE_CHANNEL_PORT})
    elif moves_kv(config, role) and role == "prefill":
        ports.append({"name": "kv-bootstrap", "containerPort": MOONCAKE_BOOTSTRAP_PORT})
    if ec_transfer_config(spec, config, role) and role == "encode":
        ports.append({"name": "ec-side", "containerPort": EC_SIDE_CHANNEL_PORT})
    return ports


def uses_rdma(config: ConfigurationSpec, role: str) -> bool:
    """RDMA NICs for the KV roles of an RDMA configuration, and for Encode and Prefill when encoder outputs go
    over RDMA."""
    return ((config.kv_transport == "rdma" and moves_kv(config, role))
            or (config.ec_expected == "rdma" and role in ("encode", "prefill")))


def cpu_memory(cpu: str | None, memory: str | None) -> dict[str, str]:
    """The spec's CPU and memory that are set, as a requests or limits map."""
    return {name: value for name, value in (("cpu", cpu), ("memory", memory)) if value is not None}


def engine_resources(target: KubernetesTargetSpec, config: ConfigurationSpec, role: RoleSpec) -> dict[str, dict]:
    """GPUs and RDMA interfaces as limits (extended resources' requests default to them), plus the spec's
    CPU and memory, when set, as both request and limit."""
    limits: dict = {target.node.gpu_resource: role.tp}
    if uses_rdma(config, role.role):
        if not target.node.rdma_resource:
            raise ManifestError(f"{config.name}: KV over RDMA needs target.kubernetes.node.rdma_resource")
        limits[target.node.rdma_resource] = role.rdma_interfaces
    fixed = cpu_memory(target.engine.cpu, target.engine.memory)
    return ({"requests": fixed} if fixed else {}) | {"limits": limits | fixed}


def router_resources(target: KubernetesTargetSpec) -> dict[str, dict]:
    fixed = cpu_memory(target.router.cpu, target.router.memory)
    return {"requests": fixed, "limits": dict(fixed)} if fixed else {}


def role_context(spec: ExperimentSpec, config: ConfigurationSpec, role: RoleSpec, run: str) -> dict:
    target = spec.target.kubernetes
    rdma = uses_rdma(config, role.role)
    return {
        "name": object_name(config, role.role), "role": role.role, "replicas": role.replicas,
        "labels": labels(run, config, role.role), "selector": selector_labels(config, role.role),
        "annotations": dict(target.node.rdma_pod_annotations) if rdma else {},
        "args": engine_args(spec, config, role) + (otlp_engine_args(traces_endpoint(config))
                                                   if spec.tracing.enabled else []),
        "env": engine_env(spec, config, role.role),
        "ports": engine_ports(spec, config, role.role),
        "resources": engine_resources(target, config, role),
        "capabilities": ["IPC_LOCK"] if rdma else [],
    }


def router_urls_env(config: ConfigurationSpec) -> list[dict]:
    """Worker URLs for routers that take them from the environment ($(PREFILL_URLS) in args)."""
    return [{"name": f"{r.role.upper()}_URLS", "value": ",".join(role_urls(config, r.role))} for r in config.roles]


def vllm_router_args(spec: ExperimentSpec, config: ConfigurationSpec) -> list[str]:
    return commands.vllm_router_args(
        config, host="0.0.0.0", port=ROUTER_PORT, prometheus_port=ROUTER_METRICS_PORT,
        startup_timeout_s=spec.target.kubernetes.ready_timeout_s, servers=role_urls(config, "server"),
        prefills=[(url, MOONCAKE_BOOTSTRAP_PORT) for url in role_urls(config, "prefill")],   # NIXL: URL alone
        decodes=role_urls(config, "decode"))


def epd_proxy_args() -> list[str]:
    return ["--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--encode-servers-urls", "$(ENCODE_URLS)",
            "--prefill-servers-urls", "$(PREFILL_URLS)", "--decode-servers-urls", "$(DECODE_URLS)"]


def router_command(spec: ExperimentSpec, config: ConfigurationSpec) -> tuple[str, list[str], list[str]]:
    """(router name, command, args): the spec's router, vLLM's EPD proxy, or vllm-router in PD mode."""
    router = spec.target.kubernetes.router
    if router.command is not None:
        return "custom", list(router.command), list(router.args or [])
    if config.topology == "epd":
        return "vllm-epd-proxy", ["python3", EPD_PROXY], epd_proxy_args()
    command = ["vllm-router"]
    if router.pip_install:
        script = f"pip install --quiet --no-cache-dir {shlex.quote(router.pip_install)} && exec vllm-router \"$@\""
        command = ["sh", "-c", script, "vllm-router"]
    return "vllm-router", command, vllm_router_args(spec, config)


def router_context(spec: ExperimentSpec, config: ConfigurationSpec, run: str) -> dict:
    target = spec.target.kubernetes
    name, command, args = router_command(spec, config)
    return {"name": object_name(config, "router"), "kind": name,
            "labels": labels(run, config, "router"), "selector": selector_labels(config, "router"),
            "image": target.router.image or target.engine.image,
            "command": command, "args": args, "resources": router_resources(target),
            "env": router_urls_env(config) + (router_otlp_env(config) if spec.tracing.enabled else []),
            "traces": traces_context(spec)}


def router_otlp_env(config: ConfigurationSpec) -> list[dict]:
    """The standard OpenTelemetry variables, for a router that exports spans of its own (vllm-router 0.1.17 and
    vLLM's EPD proxy make none; they pass the client's `traceparent` on)."""
    return [{"name": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "value": traces_endpoint(config)}, *otlp_env("router")]


def dns_label(text: str, limit: int = 63) -> str:
    """A DNS-1123 label from any text (object names built from suite names)."""
    clean = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"
    if len(clean) <= limit:
        return clean
    return f"{clean[:limit - 9].rstrip('-')}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def loadgen_affinity(placement: str, router_selector: dict) -> dict | None:
    """Pod (anti-)affinity to the router's pod: on its node, on another node, or none."""
    if placement == "any":
        return None
    term = [{"labelSelector": {"matchLabels": router_selector}, "topologyKey": "kubernetes.io/hostname"}]
    key = "podAffinity" if placement == "router-node" else "podAntiAffinity"
    return {key: {"requiredDuringSchedulingIgnoredDuringExecution": term}}


def loadgen_context(spec: ExperimentSpec, config: ConfigurationSpec, run: str, spec_yaml: str,
                    calibration: dict | None) -> dict:
    """The in-cluster load generator: its ConfigMap and one Job per suite, against the router's Service."""
    target = spec.target.kubernetes
    lg = target.loadgen
    url = f"http://{object_name(config, 'router')}:{ROUTER_PORT}"
    jobs = []
    for suite in spec.suites:
        args = ["--spec", "/etc/epdbench/spec.yaml", "--calibration", "/etc/epdbench/calibration.json",
                "--suite", suite.name, "--url", url, "--run", run]
        jobs.append({"name": loadgen_job_name(config, suite.name), "suite": suite.name, "args": args})
    return {"config_map": object_name(config, "loadgen"), "labels": labels(run, config, "loadgen"),
            "image": target.runner_image, "jobs": jobs, "cpu": lg.cpu, "memory": lg.memory,
            "node_selector": dict(lg.node_selector),
            "affinity": loadgen_affinity(lg.placement, selector_labels(config, "router")),
            "deadline_s": int(spec.configuration_timeout_s) if spec.configuration_timeout_s else None,
            "spec_yaml": spec_yaml, "calibration_json": json.dumps(calibration or {}, sort_keys=True)}


def loadgen_job_name(config: ConfigurationSpec, suite: str) -> str:
    return dns_label(f"{config.name}-loadgen-{suite}")


def manifest_context(spec: ExperimentSpec, config: ConfigurationSpec, run: str) -> dict:
    target = spec.target.kubernetes
    return {
        "namespace": target.namespace, "config": config.name,
        "service_account": f"epdbench-{config.name}",
        "rbac_labels": labels(run, config, "rbac"),
        "router_discovery": target.router.discovery,
        "engine": target.engine, "node": target.node, "model_cache": target.model_cache, "hf_home": HF_HOME,
        "engine_port": ENGINE_PORT, "router_port": ROUTER_PORT,
        "roles": [role_context(spec, config, r, run) for r in config.roles],
        "router": router_context(spec, config, run),
    }


def render_manifests(spec: ExperimentSpec, config: ConfigurationSpec, run: str) -> list[dict]:
    """Every object of one configuration, in apply order: RBAC, engines (Service, StatefulSet), router."""
    env = make_env(TEMPLATE_DIR)
    ctx = manifest_context(spec, config, run)
    texts = [env.get_template("rbac.yaml.j2").render(**ctx)]
    texts += [env.get_template("engine.yaml.j2").render(**ctx, role=role) for role in ctx["roles"]]
    texts.append(env.get_template("router.yaml.j2").render(**ctx))
    return [obj for text in texts for obj in yaml.safe_load_all(text) if obj]


def render_loadgen(spec: ExperimentSpec, config: ConfigurationSpec, run: str, spec_yaml: str,
                   calibration: dict | None = None) -> list[dict]:
    """The in-cluster load generator objects of one configuration: its ConfigMap, then one Job per suite."""
    ctx = {**manifest_context(spec, config, run), "loadgen": loadgen_context(spec, config, run, spec_yaml, calibration)}
    text = make_env(TEMPLATE_DIR).get_template("loadgen.yaml.j2").render(**ctx)
    return [obj for obj in yaml.safe_load_all(text) if obj]


def manifests_yaml(objects: list[dict]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, width=120)


def manifest_files(objects: list[dict]) -> dict[str, str]:
    """One YAML file per object, numbered in apply order: 00-serviceaccount-epdbench-pd-tcp.yaml …"""
    return {f"{i:02d}-{o['kind'].lower()}-{o['metadata']['name']}.yaml": manifests_yaml([o])
            for i, o in enumerate(objects)}


def schema_version_for(cluster_version: str) -> str:
    """The bundled schema version to validate against: the cluster's, or the newest bundled if newer."""
    bundled = kubernetes_validate.utils.all_versions()
    wanted = _version_tuple(cluster_version)
    oldest, newest = _version_tuple(bundled[0]), _version_tuple(bundled[-1])
    if wanted < oldest:
        raise ManifestError(f"Kubernetes {cluster_version} is older than the oldest schema bundled with "
                            f"kubernetes-validate ({bundled[0]}): upgrade the cluster")
    return "%d.%d" % min(wanted, newest)


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = re.match(r"^v?(\d+)\.(\d+)", version).groups()
    return int(major), int(minor)


def validate_manifests(objects: list[dict], version: str) -> None:
    """Strict OpenAPI-schema validation of every object; raises ManifestError naming object and field."""
    for obj in objects:
        what = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.absolute_path) or "(object)"
            raise ManifestError(f"{what}: field '{where}': {e.message.splitlines()[0]} "
                                f"(Kubernetes {version} schema)") from None
        except kubernetes_validate.SchemaNotFoundError as e:
            raise ManifestError(f"{what}: {e.message}") from None

