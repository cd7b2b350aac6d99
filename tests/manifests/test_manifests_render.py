"""manifests/render.py: golden files per configuration, strict schema validation of both presets, and
the properties the cluster relies on (GPU counts, forced TCP, RDMA resources, no host namespaces).

Regenerate the golden files after an intended change: UPDATE_GOLDEN=1 python -m pytest tests/manifests
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import jinja2
import kubernetes_validate
import pytest

from epdbench.cli import main as cli_main
from epdbench.manifests.render import (LABEL_CONFIG, LABEL_ROLE, LABEL_RUN, TEMPLATE_DIR, ManifestError, label_value,
                              manifests_yaml, render_loadgen, render_manifests, schema_version_for,
                              validate_manifests)
from epdbench.templating import make_env
import yaml

from epdbench.specs.models import SpecError, load_spec, parse_spec, spec_to_yaml

GOLDEN = Path(__file__).parent / "golden"
RUN = "golden"
PRESET_CONFIGS = {"pd-text": ["aggregated", "pd-tcp", "pd-rdma"],
                  "epd-multimodal": ["aggregated", "pd-tcp", "epd", "epd-rdma"],
                  "pd-nixl": ["pd-nixl-tcp", "pd-nixl-rdma"]}
CASES = [(preset, config) for preset, configs in PRESET_CONFIGS.items() for config in configs]
EXPECTED_GPUS = {("pd-text", c): 6 for c in PRESET_CONFIGS["pd-text"]} | {
    ("epd-multimodal", "aggregated"): 1, ("epd-multimodal", "pd-tcp"): 2,
    ("epd-multimodal", "epd"): 3, ("epd-multimodal", "epd-rdma"): 3} | {
    ("pd-nixl", c): 2 for c in PRESET_CONFIGS["pd-nixl"]}
SCHEMA_VERSIONS = ["1.31", kubernetes_validate.latest_version()]


def on_kubernetes(preset: str, **kube) -> object:
    data = load_spec(preset).model_dump(mode="json")
    data["target"]["kind"] = "kubernetes"
    data["target"]["kubernetes"].update(kube)
    return parse_spec(data, preset)


def render(preset: str, config: str, **kube) -> list[dict]:
    spec = on_kubernetes(preset, **kube)
    return render_manifests(spec, spec.configuration(config), RUN)


def workloads(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in ("StatefulSet", "Deployment")]


def engine_containers(objects: list[dict]) -> list[tuple[str, int, dict]]:
    """(role, replicas, container) of every engine StatefulSet."""
    return [(o["metadata"]["labels"][LABEL_ROLE], o["spec"]["replicas"], c)
            for o in objects if o["kind"] == "StatefulSet" for c in o["spec"]["template"]["spec"]["containers"]]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def flag_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


@pytest.mark.parametrize("preset,config", CASES)
def test_rendered_manifests_match_golden_file(preset, config):
    text = manifests_yaml(render(preset, config))
    golden = GOLDEN / preset / f"{config}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}: run with UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{golden} differs: review, then UPDATE_GOLDEN=1"


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("preset,config", CASES)
def test_every_object_validates_strictly(preset, config, version):
    validate_manifests(render(preset, config), version)


@pytest.mark.parametrize("preset,config", CASES)
def test_gpu_count_matches_workloads_md(preset, config):
    gpus = sum(replicas * int(c["resources"]["limits"]["nvidia.com/gpu"])
               for _, replicas, c in engine_containers(render(preset, config)))
    assert gpus == EXPECTED_GPUS[(preset, config)]


@pytest.mark.parametrize("preset,config", CASES)
def test_kv_pods_force_tcp_exactly_when_kv_goes_over_tcp(preset, config):
    spec = on_kubernetes(preset)
    conf = spec.configuration(config)
    transport = conf.kv_transport
    for role, _, container in engine_containers(render(preset, config)):
        env = env_of(container)
        kv_pod = role in ("prefill", "decode") and transport != "none"
        mooncake, nixl = kv_pod and conf.kv_connector == "mooncake", kv_pod and conf.kv_connector == "nixl"
        assert (env.get("MC_FORCE_TCP") == "1") == (mooncake and transport == "tcp"), (role, env)
        assert (env.get("MC_TE_METRIC") == "1") == mooncake
        ec_pod = conf.topology == "epd" and role in ("encode", "prefill")
        ucx = transport if nixl else conf.ec_expected if ec_pod else None
        # UCX forced to the transport of the path the pod serves (no tcp lane to fall back on for RDMA), at info
        # level so that its endpoint lines name every lane
        assert env.get("UCX_TLS") == {"tcp": "tcp,cuda_copy,sm,self", "rdma": "rc,ud,cuda_copy,sm,self",
                                      None: None}[ucx], (role, env)
        assert (env.get("UCX_LOG_LEVEL") == "info") == (ucx is not None)
        assert ("VLLM_NIXL_SIDE_CHANNEL_PORT" in env) == nixl


@pytest.mark.parametrize("preset,config", CASES)
def test_rdma_pods_request_rdma_and_ipc_lock_and_nothing_else_does(preset, config):
    spec = on_kubernetes(preset)
    conf = spec.configuration(config)
    for role, _, container in engine_containers(render(preset, config)):
        limits = container["resources"]["limits"]
        added = container["securityContext"].get("capabilities", {}).get("add", [])
        if (conf.kv_transport == "rdma" and role in ("prefill", "decode")) or (
                conf.ec_expected == "rdma" and role in ("encode", "prefill")):
            assert int(limits["rdma/rdma_shared_device_a"]) == conf.role(role).rdma_interfaces >= 1
            assert added == ["IPC_LOCK"]
        else:
            assert not any(k.startswith("rdma/") for k in limits) and added == []


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_engine_cpu_and_memory_are_request_and_limit_next_to_device_limits(version):
    objects = render("pd-text", "pd-rdma", engine={"cpu": "8", "memory": "96Gi"})
    validate_manifests(objects, version)
    for _, _, container in engine_containers(objects):
        assert container["resources"]["requests"] == {"cpu": "8", "memory": "96Gi"}   # devices: limits only
        assert container["resources"]["limits"] == {"nvidia.com/gpu": 2, "rdma/rdma_shared_device_a": 2,
                                                     "cpu": "8", "memory": "96Gi"}
    for _, _, container in engine_containers(render("pd-text", "pd-rdma")):   # unset by default
        assert "requests" not in container["resources"] and "cpu" not in container["resources"]["limits"]


def test_router_cpu_and_memory_are_request_and_limit_and_can_be_unset():
    assert router_of(render("pd-text", "pd-tcp"))["resources"] == {"requests": {"cpu": "2", "memory": "1Gi"},
                                                                  "limits": {"cpu": "2", "memory": "1Gi"}}
    objects = render("pd-text", "pd-tcp", router={"cpu": "2500m", "memory": None})
    validate_manifests(objects, "1.31")
    assert router_of(objects)["resources"] == {"requests": {"cpu": "2500m"}, "limits": {"cpu": "2500m"}}
    objects = render("pd-text", "pd-tcp", router={"cpu": None, "memory": None})
    validate_manifests(objects, "1.31")
    assert router_of(objects)["resources"] == {}


@pytest.mark.parametrize("preset,config", CASES)
def test_no_pod_shares_host_namespaces_or_runs_privileged(preset, config):
    for workload in workloads(render(preset, config)):
        pod = workload["spec"]["template"]["spec"]
        assert pod.get("hostIPC") is False and pod.get("hostNetwork") is False and pod.get("hostPID") is False
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
            assert container["readinessProbe"]["httpGet"]["path"] == "/health"


@pytest.mark.parametrize("preset,config", CASES)
def test_engines_get_memory_shm_gpu_node_and_model_cache(preset, config):
    for workload in workloads(render(preset, config)):
        if workload["kind"] != "StatefulSet":
            continue
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
        assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == "hf-cache"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("preset,config", CASES)
def test_no_pod_holds_api_rights_it_does_not_use(preset, config):
    objects = render(preset, config)
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")]
    pods = [w["spec"]["template"]["spec"] for w in workloads(objects)]
    assert all(pod["automountServiceAccountToken"] is False for pod in pods)


def test_a_discovering_router_alone_gets_read_only_rights_in_its_namespace():
    objects = render("pd-text", "pd-tcp", router={"command": ["my-router"], "args": ["--discover"],
                                                  "discovery": True})
    role = next(o for o in objects if o["kind"] == "Role")
    assert role["metadata"]["namespace"] == "epdbench"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods", "services", "endpoints"],
                              "verbs": ["get", "list", "watch"]}]
    assert next(o for o in objects if o["kind"] == "RoleBinding")["roleRef"]["name"] == role["metadata"]["name"]
    mounts = {w["metadata"]["name"]: w["spec"]["template"]["spec"]["automountServiceAccountToken"]
              for w in workloads(objects)}
    assert mounts == {"pd-tcp-prefill": False, "pd-tcp-decode": False, "pd-tcp-router": True}
    validate_manifests(objects, "1.31")


@pytest.mark.parametrize("preset,config", CASES)
def test_every_object_carries_run_config_and_role_labels(preset, config):
    for obj in render(preset, config):
        labels = obj["metadata"]["labels"]
        assert labels[LABEL_RUN] == RUN and labels[LABEL_CONFIG] == config and labels[LABEL_ROLE]
        assert obj["metadata"]["namespace"] == "epdbench"
    for workload in workloads(render(preset, config)):
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert pod_labels[LABEL_RUN] == RUN and pod_labels[LABEL_CONFIG] == config


@pytest.mark.parametrize("preset,config", CASES)
def test_engine_args_carry_role_connectors_tp_and_limits(preset, config):
    spec = on_kubernetes(preset)
    conf = spec.configuration(config)
    for role, _, container in engine_containers(render(preset, config)):
        args = container["args"]
        assert container["command"] == ["vllm", "serve"] and args[0] == spec.model.name
        assert flag_value(args, "--tensor-parallel-size") == str(conf.role(role).tp)
        assert flag_value(args, "--max-model-len") == str(spec.engine.max_model_len)
        assert flag_value(args, "--gpu-memory-utilization") == str(spec.engine.gpu_memory_utilization)
        assert ("--no-enable-prefix-caching" in args) == (role == "encode" or not spec.engine.enable_prefix_caching)
        kv = flag_value(args, "--kv-transfer-config")
        ec = flag_value(args, "--ec-transfer-config")
        if role in ("prefill", "decode") and conf.topology != "aggregated":
            want = "kv_producer" if role == "prefill" else "kv_consumer"
            connector = {"mooncake": "MooncakeConnector", "nixl": "NixlConnector"}[conf.kv_connector]
            assert json.loads(kv)["kv_connector"] == connector and json.loads(kv)["kv_role"] == want
        else:
            assert kv is None
        if conf.topology == "epd" and role in ("encode", "prefill"):
            assert json.loads(ec)["ec_role"] == ("ec_producer" if role == "encode" else "ec_consumer")
            # ECCPUConnector moves encoder outputs over NIXL only when asked, and needs its buffer's size
            assert json.loads(ec)["ec_connector_extra_config"]["ec_enable_nixl"] is True
            assert json.loads(ec)["ec_connector_extra_config"]["ec_cpu_bytes"] > 0
        else:
            assert ec is None
        assert ("--enforce-eager" in args) == (role == "encode")
        assert flag_value(args, "--num-gpu-blocks-override") is None


def test_a_kv_block_override_reaches_vllm_as_the_simulator_uses_it():
    from epdbench.specs.commands import engine_args
    spec = load_spec("pd-text")
    spec = spec.model_copy(update={"engine": spec.engine.model_copy(update={"num_gpu_blocks_override": 512})})
    conf = spec.configuration("aggregated")
    assert flag_value(engine_args(spec, conf, conf.roles[0]), "--num-gpu-blocks-override") == "512"


def router_of(objects: list[dict]) -> dict:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_pd_router_is_vllm_router_in_pd_mode_with_every_worker():
    router = router_of(render("pd-text", "pd-tcp"))
    args = router["args"]
    assert "vllm-router==0.1.17" in router["command"][2] and "--vllm-pd-disaggregation" in args
    assert args[args.index("--prefill") + 1:args.index("--prefill") + 3] == [
        "http://pd-tcp-prefill-0.pd-tcp-prefill:8000", "8998"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--decode"] == [
        "http://pd-tcp-decode-0.pd-tcp-decode:8000", "http://pd-tcp-decode-1.pd-tcp-decode:8000"]


def test_nixl_router_names_the_nixl_connector_and_prefills_without_a_bootstrap_port():
    args = router_of(render("pd-nixl", "pd-nixl-tcp"))["args"]
    assert args[args.index("--kv-connector") + 1] == "nixl"
    assert args[args.index("--prefill") + 1:args.index("--prefill") + 3] == [
        "http://pd-nixl-tcp-prefill-0.pd-nixl-tcp-prefill:8000", "--decode"]


def test_nixl_pods_announce_their_pod_ip_and_the_encode_pod_logs_its_nixl_reads():
    for role, _, container in engine_containers(render("pd-nixl", "pd-nixl-rdma")):
        host = next(e for e in container["env"] if e["name"] == "VLLM_NIXL_SIDE_CHANNEL_HOST")
        assert host["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert any(p["containerPort"] == 5600 for p in container["ports"])
    for role, _, container in engine_containers(render("epd-multimodal", "epd")):
        env = env_of(container)
        assert (env.get("VLLM_LOGGING_LEVEL") == "DEBUG") == (role == "encode")
        assert (env.get("VLLM_USE_V2_MODEL_RUNNER") == "1") == (role in ("encode", "prefill"))


def test_one_prefill_pod_cannot_force_two_ucx_transports():
    spec = on_kubernetes("epd-multimodal")
    data = json.loads(spec.model_dump_json())
    conf = next(c for c in data["configurations"] if c["name"] == "epd-rdma")
    conf.update({"kv_connector": "nixl"})
    for r in conf["roles"]:
        r["rdma_interfaces"] = 1
    bad = parse_spec(data)
    with pytest.raises(ManifestError, match="one UCX_TLS cannot force both"):
        render_manifests(bad, bad.configuration("epd-rdma"), RUN)


def test_epd_router_is_vllms_epd_proxy_fed_from_the_environment():
    router = router_of(render("epd-multimodal", "epd"))
    assert router["command"][1].endswith("disaggregated_encoder/disagg_epd_proxy.py")
    assert "$(ENCODE_URLS)" in router["args"]
    assert env_of(router)["ENCODE_URLS"] == "http://epd-encode-0.epd-encode:8000"


def test_a_clusters_own_router_can_be_swapped_in():
    objects = render("pd-text", "pd-tcp", router={"image": "ghcr.io/llm-d/router:v1", "command": ["/router"],
                                                  "args": ["--prefill=$(PREFILL_URLS)", "--decode=$(DECODE_URLS)"]})
    router = router_of(objects)
    assert router["image"] == "ghcr.io/llm-d/router:v1" and router["command"] == ["/router"]
    assert router["args"] == ["--prefill=$(PREFILL_URLS)", "--decode=$(DECODE_URLS)"]
    validate_manifests(objects, "1.31")


@pytest.mark.parametrize("cache,volume_key", [({"kind": "host-path", "path": "/data/hf"}, "hostPath"),
                                              ({"kind": "empty-dir"}, "emptyDir"),
                                              ({"kind": "pvc", "claim_name": "models"}, "persistentVolumeClaim")])
def test_model_cache_volume_kinds_render_and_validate(cache, volume_key):
    objects = render("epd-multimodal", "aggregated", model_cache=cache)
    validate_manifests(objects, "1.31")
    pod = next(o for o in objects if o["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    assert volume_key in next(v for v in pod["volumes"] if v["name"] == "model-cache")


def test_rdma_pod_annotations_reach_rdma_pods_only():
    objects = render("pd-text", "pd-rdma", node={"rdma_pod_annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"}})
    for o in workloads(objects):
        annotations = o["spec"]["template"]["metadata"].get("annotations", {})
        assert ("k8s.v1.cni.cncf.io/networks" in annotations) == (o["kind"] == "StatefulSet")


def test_rdma_configuration_without_rdma_resource_fails_as_a_spec_error():
    with pytest.raises(SpecError) as exc:
        on_kubernetes("pd-text", node={"rdma_resource": None})
    msg = str(exc.value)
    assert "\n" not in msg and "configurations.2" in msg and "rdma_resource" in msg


def test_custom_router_command_needs_args():
    with pytest.raises(SpecError) as exc:
        on_kubernetes("pd-text", router={"command": ["/router"]})
    assert "target.kubernetes.router" in str(exc.value)


def test_invalid_object_fails_validation_naming_object_and_field():
    objects = render("pd-text", "pd-tcp")
    objects[2]["spec"]["replicass"] = 1
    with pytest.raises(ManifestError) as exc:
        validate_manifests(objects, "1.31")
    msg = str(exc.value)
    assert "\n" not in msg and "StatefulSet pd-tcp-prefill" in msg and "replicass" in msg


def test_templates_reject_undefined_variables():
    with pytest.raises(jinja2.UndefinedError):
        make_env(TEMPLATE_DIR).get_template("rbac.yaml.j2").render(namespace="x")


@pytest.mark.parametrize("name", ["pd-text-kubernetes-20260101-120000", "x" * 100, "Weird name/with:chars"])
def test_run_labels_are_valid_label_values(name):
    value = label_value(name)
    assert len(value) <= 63 and re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?", value)
    assert label_value(name) == value


def test_long_run_names_stay_distinct():
    assert label_value("a" * 80 + "1") != label_value("a" * 80 + "2")


def test_schema_version_follows_the_cluster_within_the_bundled_range():
    assert schema_version_for("1.31") == "1.31"
    assert schema_version_for("v1.33.4-gke.100") == "1.33"
    assert schema_version_for("1.99") == kubernetes_validate.latest_version().rsplit(".", 1)[0]
    with pytest.raises(ManifestError):
        schema_version_for("1.20")


def test_manifests_command_renders_every_configuration_of_the_presets(tmp_path, capsys):
    for preset in PRESET_CONFIGS:
        assert cli_main(["manifests", "--spec", preset, "--out", str(tmp_path / preset)]) == 0
        assert sorted(p.name for p in (tmp_path / preset).iterdir()) == sorted(
            c.name for c in load_spec(preset).configurations)
    files = sorted(p.name for p in (tmp_path / "pd-text" / "pd-rdma").iterdir())
    assert files[0] == "00-serviceaccount-epdbench-pd-rdma.yaml" and files[6] == "06-deployment-pd-rdma-router.yaml"
    # then the in-cluster load generator: its ConfigMap and one Job per suite (fixed, mixed, capacity)
    assert files[7:] == ["07-configmap-pd-rdma-loadgen.yaml", "08-job-pd-rdma-loadgen-fixed.yaml",
                         "09-job-pd-rdma-loadgen-mixed.yaml", "10-job-pd-rdma-loadgen-capacity.yaml"]
    assert "pd-rdma/: 11 objects (3 load generator Jobs), 6 GPUs, valid for Kubernetes 1.31" in capsys.readouterr().out


def test_loadgen_jobs_run_the_spec_they_carry_against_the_routers_service_with_no_rights(tmp_path):
    spec = load_spec("pd-text")
    config = spec.configuration("pd-tcp")
    objects = render_loadgen(spec, config, "nightly-1", spec_to_yaml(spec), {"chat": [23, 1.0]})
    validate_manifests(objects, "1.31")
    config_map, *jobs = objects
    assert parse_spec(yaml.safe_load(config_map["data"]["spec.yaml"])) == spec   # the resolved spec itself
    assert json.loads(config_map["data"]["calibration.json"]) == {"chat": [23, 1.0]}
    assert [j["metadata"]["annotations"]["epdbench/suite"] for j in jobs] == [s.name for s in spec.suites]
    for job in jobs:
        assert job["spec"]["backoffLimit"] == 0                                  # never re-measured behind the back
        pod = job["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
        c = pod["containers"][0]
        assert c["image"] == spec.target.kubernetes.runner_image and c["command"] == ["epdbench", "loadgen"]
        assert c["args"][c["args"].index("--url") + 1] == "http://pd-tcp-router:8000"
        term = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["labelSelector"]["matchLabels"] == {"epdbench/config": "pd-tcp", "epdbench/role": "router"}
    data = spec.model_dump(mode="json")
    data["target"]["kubernetes"]["loadgen"]["placement"] = "other-node"
    pod = render_loadgen(parse_spec(data), config, "r", "x")[1]["spec"]["template"]["spec"]
    assert "podAntiAffinity" in pod["affinity"]


def test_manifests_command_rejects_an_unknown_configuration_in_one_line(tmp_path, capsys):
    assert cli_main(["manifests", "--spec", "pd-text", "--config", "epd", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "--config epd" in err


def test_extra_engine_environment_reaches_every_engine_and_cannot_override_the_evidence_switches():
    data = load_spec("pd-text").model_dump(mode="json")
    data["target"]["kubernetes"]["engine"]["env"] = {"MC_GID_INDEX": "3", "NCCL_IB_GID_INDEX": "3"}
    spec = parse_spec(data)
    objects = render_manifests(spec, spec.configuration("pd-rdma"), "r1")
    validate_manifests(objects, "1.31")
    for sts in (o for o in objects if o["kind"] == "StatefulSet"):
        env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["MC_GID_INDEX"] == "3" and env["NCCL_IB_GID_INDEX"] == "3" and env["MC_TE_METRIC"] == "1"
    for bad, why in [({"MC_FORCE_TCP": "0"}, "MC_FORCE_TCP is set by epdbench"), ({"1X": "a"}, "not an environment")]:
        data["target"]["kubernetes"]["engine"]["env"] = bad
        with pytest.raises(SpecError, match=why):
            parse_spec(data)
