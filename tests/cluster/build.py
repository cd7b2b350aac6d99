"""Build the control plane the `cluster` tests run against, from the Go modules, into a cache.

    python tests/cluster/build.py            # build what is missing, print the folder
    python tests/cluster/build.py --check    # exit 1 (one line) when something is missing; build nothing

Into ``~/.cache/epdbench/k8s-bin/<kubernetes version>/`` (``EPDBENCH_K8S_BIN`` overrides the root):

- ``kube-apiserver``, ``kube-controller-manager``, ``kube-scheduler`` of ``k8s.io/kubernetes`` at KUBERNETES.
  That module's go.mod requires its ~33 staging modules (``k8s.io/api``, ``client-go``, ...) at ``v0.0.0`` with
  ``=> ./staging/...`` replaces, which a module depending on it does not see. The build runs in a small wrapper
  module whose ``replace`` lines map each of them to its ``v0.<minor>.<patch>`` release: the list is read from
  the go.mod of ``k8s.io/kubernetes`` itself (``go mod download -json``), never written by hand. Static
  (``CGO_ENABLED=0``) and stamped through the ``-X`` ldflags of upstream's ``hack/lib/version.sh``, so
  ``/version`` answers the release.
- ``etcd``: ``go.etcd.io/etcd/server/v3`` (its root package is etcd's main) at the version that
  ``k8s.io/kubernetes``' go.mod requires (Kubernetes' own etcd).
- ``kwok``: ``sigs.k8s.io/kwok/cmd/kwok`` at KWOK, and its stock stages (``kustomize/stage/``) copied to
  ``stages/``.

Each binary is built only when absent; a ``versions.json`` beside them records what was built, from what,
how long it took and how large it is. Needs Go (``go`` on PATH) and the Go module proxy; the module and build
caches are Go's own (``go env GOMODCACHE GOCACHE``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KUBERNETES = "v1.37.2"
KWOK = "v0.8.0"
# kube-apiserver, -controller-manager and -scheduler; the kubelet is played by the tests (kwok writes status).
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
# The stages of kwok's own "fast" setup (kustomize/stage/fast): nodes initialised and heart-beating, pods ready,
# complete, deleted; and the CRDs of its per-pod logs and port-forwards.
KWOK_STAGES = ("node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
               "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml")
KWOK_CRDS = ("kwok.x-k8s.io_logs.yaml", "kwok.x-k8s.io_portforwards.yaml")


def cache_root() -> Path:
    root = os.environ.get("EPDBENCH_K8S_BIN")
    return Path(root) if root else Path.home() / ".cache" / "epdbench" / "k8s-bin"


def bin_dir(version: str = KUBERNETES) -> Path:
    return cache_root() / version


def expected(version: str = KUBERNETES) -> list[Path]:
    d = bin_dir(version)
    return [d / c for c in KUBE_COMMANDS] + [d / "etcd", d / "kwok"] + \
        [d / "stages" / Path(s).name for s in KWOK_STAGES] + [d / "crds" / c for c in KWOK_CRDS]


def missing(version: str = KUBERNETES) -> list[Path]:
    return [p for p in expected(version) if not p.exists()]


def _go(args: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
    out = subprocess.run(["go", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"go {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return out.stdout


def download(module: str, version: str) -> dict:
    return json.loads(_go(["mod", "download", "-json", f"{module}@{version}"]))


def staging_replaces(gomod: str) -> list[str]:
    """The modules a go.mod replaces with a local path (``./staging/src/...``): the staging modules."""
    names = []
    for line in gomod.splitlines():
        m = re.match(r"^\s*(?:replace\s+)?(\S+)(?:\s+v\S+)?\s+=>\s+(\./\S+)\s*$", line)
        if m:
            names.append(m.group(1))
    return names


def required(gomod: str, module: str) -> str:
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", gomod, re.M)
    if not m:
        raise SystemExit(f"{module} is not required by the go.mod read")
    return m.group(1)


def staging_version(kube: str) -> str:
    """k8s.io/kubernetes v1.M.P publishes its staging modules as v0.M.P."""
    m = re.fullmatch(r"v1\.(\d+)\.(\d+)", kube)
    if not m:
        raise SystemExit(f"not a Kubernetes release: {kube}")
    return f"v0.{m.group(1)}.{m.group(2)}"


def wrapper_gomod(kube: str, gomod: str) -> str:
    go = re.search(r"^go\s+(\S+)", gomod, re.M).group(1)
    sv = staging_version(kube)
    lines = [f"module epdbench.local/k8sbuild\n\ngo {go}\n", f"require k8s.io/kubernetes {kube}\n", "replace ("]
    lines += [f"\t{name} => {name} {sv}" for name in staging_replaces(gomod)]
    lines.append(")\n")
    godebug = re.search(r"^godebug\s+.*$", gomod, re.M)
    if godebug:
        lines.append(godebug.group(0) + "\n")
    return "\n".join(lines)


def version_ldflags(kube: str, commit: str) -> str:
    """hack/lib/version.sh's kube::version::ldflags, for a release build from the module."""
    major, minor = re.fullmatch(r"v(\d+)\.(\d+)\.\d+", kube).groups()
    values = {"buildDate": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gitCommit": commit,
              "gitTreeState": "clean", "gitVersion": kube, "gitMajor": major, "gitMinor": minor}
    flags = [f"-X '{pkg}.{k}={v}'" for k, v in values.items()
             for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version")]
    return " ".join(["-s", "-w", *flags])


def _build_env() -> dict:
    return {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false -mod=mod"}


def _in_module(gomod: str, version: str, packages: list[tuple[str, Path]], ldflags: str = "-s -w") -> None:
    """Build each (package, output) of the module at `version` inside a scratch module with `gomod`."""
    with tempfile.TemporaryDirectory(prefix="epdbench-k8sbuild-") as tmp:
        (Path(tmp) / "go.mod").write_text(gomod)
        env = _build_env()
        # Resolve what the commands import at the pinned version (writes go.sum); then build each. A bare
        # `go get PKG` would take the module's latest release instead.
        for pkg, out in packages:
            _go(["get", f"{pkg}@{version}"], cwd=Path(tmp), env=env)
        for pkg, out in packages:
            t0 = time.monotonic()
            tmp_out = out.with_name(out.name + ".part")
            _go(["build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp_out), pkg], cwd=Path(tmp), env=env)
            tmp_out.rename(out)
            print(f"  built {out.name} in {time.monotonic() - t0:.0f} s ({out.stat().st_size / 2**20:.0f} MiB)",
                  flush=True)


def build(version: str = KUBERNETES) -> Path:
    if shutil.which("go") is None:
        raise SystemExit("go is not on PATH: install Go 1.26 or later to build the control plane")
    d = bin_dir(version)
    d.mkdir(parents=True, exist_ok=True)
    record_path = d / "versions.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    t_all = time.monotonic()
    kube = download("k8s.io/kubernetes", version)
    gomod = Path(kube["GoMod"]).read_text()
    etcd_version = required(gomod, "go.etcd.io/etcd/server/v3")

    todo = [c for c in KUBE_COMMANDS if not (d / c).exists()]
    if todo:
        print(f"building {', '.join(todo)} {version} (wrapper module, "
              f"{len(staging_replaces(gomod))} staging modules at {staging_version(version)})", flush=True)
        t0 = time.monotonic()
        _in_module(wrapper_gomod(version, gomod), version,
                   [(f"k8s.io/kubernetes/cmd/{c}", d / c) for c in todo],
                   version_ldflags(version, kube["Sum"]))
        record["kubernetes"] = {"module": "k8s.io/kubernetes", "version": version, "sum": kube["Sum"],
                                "build_s": round(time.monotonic() - t0)}
    if not (d / "etcd").exists():
        print(f"building etcd {etcd_version} (go.etcd.io/etcd/server/v3, as {version} requires)", flush=True)
        t0 = time.monotonic()
        go = re.search(r"^go\s+(\S+)", gomod, re.M).group(1)
        _in_module(f"module epdbench.local/etcdbuild\n\ngo {go}\n\nrequire go.etcd.io/etcd/server/v3 {etcd_version}\n",
                   etcd_version, [("go.etcd.io/etcd/server/v3", d / "etcd")])
        record["etcd"] = {"module": "go.etcd.io/etcd/server/v3", "version": etcd_version,
                          "build_s": round(time.monotonic() - t0)}
    if not (d / "kwok").exists() or any(not p.exists() for p in expected(version) if p.parent.name in ("stages", "crds")):
        print(f"building kwok {KWOK} (sigs.k8s.io/kwok/cmd/kwok)", flush=True)
        t0 = time.monotonic()
        kw = download("sigs.k8s.io/kwok", KWOK)
        kgomod = Path(kw["GoMod"]).read_text()
        go = re.search(r"^go\s+(\S+)", kgomod, re.M).group(1)
        if not (d / "kwok").exists():
            _in_module(f"module epdbench.local/kwokbuild\n\ngo {go}\n\nrequire sigs.k8s.io/kwok {KWOK}\n",
                       KWOK, [("sigs.k8s.io/kwok/cmd/kwok", d / "kwok")])
            record["kwok"] = {"module": "sigs.k8s.io/kwok", "version": KWOK,
                              "build_s": round(time.monotonic() - t0)}
        for folder, names, source in (("stages", KWOK_STAGES, "kustomize/stage"),
                                      ("crds", KWOK_CRDS, "kustomize/crd/bases")):
            (d / folder).mkdir(exist_ok=True)
            for name in names:
                shutil.copyfile(Path(kw["Dir"], source, name), d / folder / Path(name).name)
    record["sizes_mib"] = {p.name: round(p.stat().st_size / 2**20, 1) for p in expected(version)
                           if p.parent == d}
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"control plane {version} in {d} ({time.monotonic() - t_all:.0f} s)", flush=True)
    return d


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="report what is missing; build nothing")
    p.add_argument("--version", default=KUBERNETES)
    a = p.parse_args(argv)
    if a.check:
        gone = missing(a.version)
        if gone:
            print(f"missing under {bin_dir(a.version)}: {', '.join(p.name for p in gone)}")
            return 1
        print(bin_dir(a.version))
        return 0
    print(build(a.version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
