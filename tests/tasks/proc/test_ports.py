"""Ports for a deployment's processes are picked before the processes bind them: free_port never hands out one
it handed out before, though the kernel's bind(0) can return it again meanwhile."""
from collections import deque

import pytest

from epdbench.tasks.proc import processes
from epdbench.tasks.deployment import ProvisionError


class KernelPorts:
    """socket.socket whose bind(0) hands out the given ports in turn."""

    def __init__(self, ports):
        self.ports = iter(ports)

    def __call__(self, *args):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def bind(self, address):
        self.port = next(self.ports)

    def getsockname(self):
        return ("127.0.0.1", self.port)


@pytest.fixture
def issued(monkeypatch):
    ports: deque = deque(maxlen=4096)
    monkeypatch.setattr(processes, "ISSUED_PORTS", ports)
    return ports


def test_a_port_the_kernel_hands_out_again_is_skipped(monkeypatch, issued):
    monkeypatch.setattr(processes.socket, "socket", KernelPorts([5001, 5001, 5001, 5002]))
    assert [processes.free_port("127.0.0.1"), processes.free_port("127.0.0.1")] == [5001, 5002]


def test_no_new_port_in_64_tries_is_a_provisioning_error(monkeypatch, issued):
    monkeypatch.setattr(processes.socket, "socket", KernelPorts([5001] * 65))
    assert processes.free_port("127.0.0.1") == 5001
    with pytest.raises(ProvisionError, match="64 tries"):
        processes.free_port("127.0.0.1")


def test_real_ports_are_distinct_over_thousands_of_calls(issued):
    ports = [processes.free_port("127.0.0.1") for _ in range(3000)]   # bind(0) repeats ~1 in 20,000 calls
    assert len(set(ports)) == len(ports)
