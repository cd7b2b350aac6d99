"""Each port-forward gets an ApiClient of its own. The client library's portforward() swaps the `call_api` of the
ApiClient it is given for the call's length; two opened at once from two threads leave the swap in place, and
every later call on that client goes over the websocket and fails. The access layer opens one port-forward per
accepted connection, from several threads, so a shared client broke the teardown after an interrupt on the real
control plane (tests/cluster/test_interrupt_cluster.py)."""
from __future__ import annotations

import importlib
import threading

from kubernetes import client as k8s_client

from epdbench.tasks.k8s.api import KubeApi


class Generated:
    """A generated API method's owner: the ApiClient it calls through."""

    def __init__(self, api_client, entered: threading.Event, release: threading.Event):
        self.api_client, self.entered, self.release = api_client, entered, release

    def connect(self, *args, **kwargs):
        self.entered.set()
        self.release.wait(5)
        return "ok"


def test_two_overlapping_port_forwards_leave_a_shared_client_swapped():
    k8s_stream = importlib.import_module("kubernetes.stream.stream")     # the package's `stream` is a function
    shared = k8s_client.ApiClient(k8s_client.Configuration())
    original = shared.call_api
    a_in, a_go, b_in, b_go = (threading.Event() for _ in range(4))
    a = threading.Thread(target=k8s_stream.portforward, args=(Generated(shared, a_in, a_go).connect,))
    b = threading.Thread(target=k8s_stream.portforward, args=(Generated(shared, b_in, b_go).connect,))
    a.start(); a_in.wait(5)          # A swapped the client's call_api
    b.start(); b_in.wait(5)          # B took A's swap for the original
    a_go.set(); a.join(5)            # A puts the original back ...
    b_go.set(); b.join(5)            # ... and B puts A's swap back over it
    assert shared.call_api != original and "_websocket_request" in shared.call_api.__qualname__


def test_each_port_forward_is_opened_on_a_client_of_its_own(monkeypatch):
    import kubernetes.stream
    api = KubeApi(k8s_client.ApiClient(k8s_client.Configuration()), "ns")
    before = api.client.call_api
    used = []
    monkeypatch.setattr(kubernetes.stream, "portforward",
                        lambda method, *a, **k: used.append(method.__self__.api_client) or "pf")
    assert api.port_forward("pod", 8000) == "pf" and api.port_forward("pod", 8000) == "pf"
    assert len(used) == 2 and used[0] is not used[1] and api.client not in used
    assert used[0].configuration is api.client.configuration and api.client.call_api == before
