"""manifests/podsecurity.py: the Pod Security Standards controls on small pod specs, what the presets' rendered
pods meet, and the preflight's warning lines from a namespace's labels."""
from __future__ import annotations

import pytest

from epdbench.manifests.podsecurity import namespace_warnings, pod_templates, violations
from epdbench.manifests.render import render_loadgen, render_manifests
from tests.manifests.test_manifests_render import CASES, on_kubernetes

RESTRICTED_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
RESTRICTED_POD = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def pod(pod_context: dict | None = None, volumes: list | None = None, init: list | None = None, **container) -> dict:
    """A restricted-compliant pod with one container `app`, changed by the arguments."""
    context = {**RESTRICTED_CONTEXT, **container.pop("securityContext", {})}
    spec = {"securityContext": {**RESTRICTED_POD, **(pod_context or {})},
            "containers": [{"name": "app", "image": "x", "securityContext": context, **container}],
            "volumes": volumes or [{"name": "tmp", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}]}
    if init is not None:
        spec["initContainers"] = init
    return spec


def test_a_restricted_pod_meets_every_level():
    assert [violations(pod(), level) for level in ("privileged", "baseline", "restricted")] == [[], [], []]


@pytest.mark.parametrize("spec,found", [
    ({**pod(), "hostNetwork": True, "hostPID": True}, ["hostNetwork is true", "hostPID is true"]),
    (pod(securityContext={"privileged": True}), ["container app is privileged"]),
    (pod(securityContext={"capabilities": {"add": ["IPC_LOCK", "CHOWN"], "drop": ["ALL"]}}),
     ["container app adds capability IPC_LOCK"]),
    (pod(volumes=[{"name": "models", "hostPath": {"path": "/data"}}]), ["volume models is a hostPath"]),
    (pod(ports=[{"containerPort": 80, "hostPort": 80}]), ["container app uses hostPort 80"]),
    (pod(pod_context={"seccompProfile": {"type": "Unconfined"}}), ["pod seccomp profile is Unconfined"]),
    (pod(securityContext={"procMount": "Unmasked"}), ["container app procMount is Unmasked"]),
    (pod(pod_context={"sysctls": [{"name": "net.core.somaxconn", "value": "1024"},
                                  {"name": "net.ipv4.tcp_syncookies", "value": "1"}]}),
     ["sysctl net.core.somaxconn is not a safe sysctl"]),
    (pod(init=[{"name": "setup", "image": "x", "securityContext": {**RESTRICTED_CONTEXT, "privileged": True}}]),
     ["init container setup is privileged"]),
], ids=["host-namespaces", "privileged", "capability", "host-path", "host-port", "seccomp", "proc-mount", "sysctl",
        "init-container"])
def test_baseline_controls(spec, found):
    assert violations(spec, "baseline") == found
    assert violations(spec, "restricted")[:len(found)] == found   # restricted includes baseline


@pytest.mark.parametrize("spec,found", [
    (pod(volumes=[{"name": "share", "nfs": {"server": "s", "path": "/"}}]), ["volume share is of type nfs"]),
    (pod(securityContext={"allowPrivilegeEscalation": True}),
     ["container app does not set allowPrivilegeEscalation: false"]),
    (pod(pod_context={"runAsNonRoot": None}), ["container app lacks runAsNonRoot: true (container or pod)"]),
    (pod(pod_context={"runAsNonRoot": None}, securityContext={"runAsNonRoot": True}), []),
    (pod(securityContext={"runAsNonRoot": False}), ["container app lacks runAsNonRoot: true (container or pod)"]),
    (pod(pod_context={"runAsUser": 0}), ["pod runs as user 0"]),
    (pod(pod_context={"seccompProfile": None}),
     ["container app has no seccomp profile RuntimeDefault or Localhost (container or pod)"]),
    (pod(pod_context={"seccompProfile": None}, securityContext={"seccompProfile": {"type": "Localhost"}}), []),
    (pod(securityContext={"capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"]}}),
     ["container app does not drop ALL capabilities", "container app adds capability CHOWN"]),
], ids=["volume-type", "escalation", "non-root-unset", "non-root-by-container", "non-root-false", "root-user",
        "seccomp-unset", "seccomp-by-container", "capabilities"])
def test_restricted_controls_beyond_baseline(spec, found):
    assert violations(spec, "baseline") == []
    assert violations(spec, "restricted") == found


def test_an_unknown_level_is_refused():
    with pytest.raises(ValueError, match="privileged, baseline or restricted"):
        violations(pod(), "strict")


def rendered_pods(preset: str, config: str, **kube) -> dict[str, dict]:
    spec = on_kubernetes(preset, **kube)
    conf = spec.configuration(config)
    return dict(pod_templates(render_manifests(spec, conf, "r") + render_loadgen(spec, conf, "r", "")))


@pytest.mark.parametrize("preset,config", CASES)
def test_rendered_pods_meet_baseline_except_rdma_engines_ipc_lock_and_loadgen_jobs_meet_restricted(preset, config):
    conf = on_kubernetes(preset).configuration(config)
    pods = rendered_pods(preset, config)
    assert {what.split()[0] for what in pods} == {"StatefulSet", "Deployment", "Job"}
    for what, spec in pods.items():
        rdma = conf.kv_transport == "rdma" and what.rsplit("-", 1)[-1] in ("prefill", "decode")
        assert violations(spec, "baseline") == (["container engine adds capability IPC_LOCK"] if rdma else [])
        if what.startswith("Job"):
            assert violations(spec, "restricted") == []
        else:   # the vLLM image runs as root, with no seccomp profile and the runtime's default capabilities
            container = spec["containers"][0]["name"]
            assert violations(spec, "restricted")[-3:] == [
                f"container {container} lacks runAsNonRoot: true (container or pod)",
                f"container {container} has no seccomp profile RuntimeDefault or Localhost (container or pod)",
                f"container {container} does not drop ALL capabilities"]


def test_a_host_path_model_cache_fails_baseline():
    pods = rendered_pods("epd-multimodal", "aggregated", model_cache={"kind": "host-path", "path": "/data/hf"})
    assert violations(pods["StatefulSet aggregated-server"], "baseline") == ["volume model-cache is a hostPath"]


ENFORCE, WARN = "pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/warn"


def objects(preset: str = "pd-text", config: str = "pd-rdma") -> list[dict]:
    spec = on_kubernetes(preset)
    return render_manifests(spec, spec.configuration(config), "r")


def test_an_enforced_level_names_each_rejected_workload_and_the_fix():
    lines = namespace_warnings("bench", {ENFORCE: "baseline", f"{ENFORCE}-version": "latest"}, objects())
    assert lines == [f'warning: namespace bench enforces Pod Security "baseline": the pods of StatefulSet '
                     f'pd-rdma-{role} would be rejected: container engine adds capability IPC_LOCK; label the '
                     f'namespace {ENFORCE}=privileged or ask the cluster admin for an exemption'
                     for role in ("prefill", "decode")]


def test_restricted_enforcement_suggests_baseline_when_that_is_enough():
    lines = namespace_warnings("bench", {ENFORCE: "restricted"}, objects("pd-text", "pd-tcp"))
    assert len(lines) == 3 and all(f"label the namespace {ENFORCE}=baseline or" in line for line in lines)


def test_a_warn_level_says_the_api_server_will_warn_unless_enforce_covers_it():
    lines = namespace_warnings("bench", {ENFORCE: "baseline", WARN: "restricted"}, objects())
    warned = [line for line in lines if "warns at" in line]
    assert len(lines) == 5 and len(warned) == 3
    assert warned[-1].startswith('warning: namespace bench warns at Pod Security "restricted": the API server will '
                                 'warn about the pods of Deployment pd-rdma-router: container router lacks')
    assert namespace_warnings("bench", {ENFORCE: "restricted", WARN: "baseline"}, objects()) == \
        namespace_warnings("bench", {ENFORCE: "restricted"}, objects())


@pytest.mark.parametrize("labels", [None, {}, {ENFORCE: "privileged", WARN: "privileged"},
                                    {"pod-security.kubernetes.io/audit": "restricted"}, {ENFORCE: "Restricted!"}])
def test_no_warning_without_an_enforce_or_warn_level_above_privileged(labels):
    assert namespace_warnings("bench", labels, objects()) == []
