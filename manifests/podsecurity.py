"""Pod Security Standards (pure): which controls of a level a pod spec fails, and the preflight's warnings for a
namespace's Pod Security Admission labels. The controls a pod spec can fail here: host namespaces, privileged
containers, capabilities, hostPath volumes, host ports, seccomp, /proc mount, sysctls (baseline); volume types,
privilege escalation, non-root, capabilities, seccomp (restricted). Not checked: AppArmor, SELinux, Windows.
https://kubernetes.io/docs/concepts/security/pod-security-standards/
"""
from __future__ import annotations

LEVELS = ("privileged", "baseline", "restricted")
LABEL_PREFIX = "pod-security.kubernetes.io/"
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
TEMPLATED_KINDS = {"StatefulSet", "Deployment", "ReplicaSet", "DaemonSet", "Job"}
_CONTAINER_KINDS = (("initContainers", "init container"), ("containers", "container"),
                    ("ephemeralContainers", "ephemeral container"))


def containers(pod: dict) -> list[tuple[str, dict]]:
    """(label, container) of every container of a pod spec, init and ephemeral ones included."""
    return [(f"{kind} {c.get('name')}", c) for key, kind in _CONTAINER_KINDS for c in pod.get(key) or []]


def _context(obj: dict) -> dict:
    return obj.get("securityContext") or {}


def _seccomp(context: dict) -> str | None:
    return (context.get("seccompProfile") or {}).get("type")


def _volume_type(volume: dict) -> str:
    return next((key for key in volume if key != "name"), "emptyDir")   # the API's default source


def baseline(pod: dict) -> list[str]:
    pod_context = _context(pod)
    found = [f"{key} is true" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    if _seccomp(pod_context) == "Unconfined":
        found.append("pod seccomp profile is Unconfined")
    found += [f"sysctl {s.get('name')} is not a safe sysctl" for s in pod_context.get("sysctls") or []
              if s.get("name") not in SAFE_SYSCTLS]
    found += [f"volume {v.get('name')} is a hostPath" for v in pod.get("volumes") or [] if "hostPath" in v]
    for name, container in containers(pod):
        context = _context(container)
        if context.get("privileged"):
            found.append(f"{name} is privileged")
        found += [f"{name} adds capability {cap}" for cap in (context.get("capabilities") or {}).get("add") or []
                  if cap not in BASELINE_CAPABILITIES]
        found += [f"{name} uses hostPort {p['hostPort']}" for p in container.get("ports") or [] if p.get("hostPort")]
        if _seccomp(context) == "Unconfined":
            found.append(f"{name} seccomp profile is Unconfined")
        if context.get("procMount") not in (None, "Default"):
            found.append(f"{name} procMount is {context['procMount']}")
    return found


def restricted_only(pod: dict) -> list[str]:
    """The restricted controls beyond baseline (what baseline already reports is not repeated)."""
    pod_context = _context(pod)
    found = [f"volume {v.get('name')} is of type {_volume_type(v)}" for v in pod.get("volumes") or []
             if _volume_type(v) not in RESTRICTED_VOLUMES | {"hostPath"}]
    if pod_context.get("runAsNonRoot") is False:
        found.append("pod sets runAsNonRoot: false")
    if pod_context.get("runAsUser") == 0:
        found.append("pod runs as user 0")
    for name, container in containers(pod):
        context = _context(container)
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name} does not set allowPrivilegeEscalation: false")
        non_root = context.get("runAsNonRoot")
        if non_root is False or (non_root is None and pod_context.get("runAsNonRoot") is not True):
            found.append(f"{name} lacks runAsNonRoot: true (container or pod)")
        if context.get("runAsUser") == 0:
            found.append(f"{name} runs as user 0")
        if (_seccomp(context) or _seccomp(pod_context)) is None:   # Unconfined is a baseline violation
            found.append(f"{name} has no seccomp profile RuntimeDefault or Localhost (container or pod)")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name} does not drop ALL capabilities")
        found += [f"{name} adds capability {cap}" for cap in capabilities.get("add") or []
                  if cap in BASELINE_CAPABILITIES - {"NET_BIND_SERVICE"}]
    return found


def violations(pod: dict, level: str) -> list[str]:
    """What in a pod spec the Pod Security Standard `level` forbids, one short phrase each; [] when compliant."""
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r}: privileged, baseline or restricted")
    if level == "privileged":
        return []
    return baseline(pod) + (restricted_only(pod) if level == "restricted" else [])


def pod_templates(objects: list[dict]) -> list[tuple[str, dict]]:
    """("StatefulSet pd-tcp-prefill", pod spec) of every object that makes pods: workloads' templates, Pods."""
    found = []
    for obj in objects:
        what, spec = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}", obj.get("spec") or {}
        if obj.get("kind") in TEMPLATED_KINDS:
            found.append((what, (spec.get("template") or {}).get("spec") or {}))
        elif obj.get("kind") == "Pod":
            found.append((what, spec))
    return found


def namespace_warnings(namespace: str, labels: dict[str, str] | None, objects: list[dict]) -> list[str]:
    """One line per object and mode (enforce, warn) whose level the object's pods fail. Ignored: audit (not
    shown to clients); privileged, missing or unknown levels; warn when enforce is at least as strict."""
    labels = labels or {}
    enforce, warn = (labels.get(LABEL_PREFIX + mode) for mode in ("enforce", "warn"))
    enforce = enforce if enforce in LEVELS[1:] else None
    warn = warn if warn in LEVELS[1:] and LEVELS.index(warn) > LEVELS.index(enforce or "privileged") else None
    lines = []
    for what, pod in pod_templates(objects):
        if enforce and (found := violations(pod, enforce)):
            admits = "baseline" if not violations(pod, "baseline") else "privileged"
            lines.append(f'warning: namespace {namespace} enforces Pod Security "{enforce}": the pods of {what} '
                         f'would be rejected: {", ".join(found)}; label the namespace '
                         f'{LABEL_PREFIX}enforce={admits} or ask the cluster admin for an exemption')
        if warn and (found := violations(pod, warn)):
            lines.append(f'warning: namespace {namespace} warns at Pod Security "{warn}": the API server will '
                         f'warn about the pods of {what}: {", ".join(found)}')
    return lines
