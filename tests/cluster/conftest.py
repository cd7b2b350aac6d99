"""The `cluster` tier: a real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok)
started once per test session from the binaries `python tests/cluster/build.py` makes. Without them the tier
skips itself in one line that says how to build them."""
from __future__ import annotations

import pytest

from tests.cluster import build, netns
from tests.cluster.controlplane import ControlPlane

ISOLATION: dict[str, str | None] = {}


def pytest_configure(config):
    """A session that selects the tier runs in a network namespace with loopback alone (tests/cluster/netns.py);
    entered here, at collection, before the session has started a thread or a child."""
    expr = config.option.markexpr or ""
    if "cluster" in expr.replace("not cluster", "") and "isolated" not in ISOLATION:
        ISOLATION["isolated"] = netns.isolate()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    gone = build.missing()
    if gone:
        pytest.skip(f"no control plane binaries under {build.bin_dir()} ({', '.join(p.name for p in gone[:3])} "
                    f"missing): build them with `python tests/cluster/build.py` (Go and the Go module proxy)")
    cp = ControlPlane(build.bin_dir(), tmp_path_factory.mktemp("control-plane"),
                      node_rdma={"rdma/rdma_shared_device_a": 16},
                      node_labels={"nvidia.com/gpu.present": "true"})
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


from tests.cluster.space import space  # noqa: E402,F401  (a test's own namespace: the fixture of the tier's tests)
