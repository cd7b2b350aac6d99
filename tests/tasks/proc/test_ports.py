"""Ports for a deployment's processes are picked before the processes bind them: below the kernel's ephemeral range
(where neither its bind(0) nor a connection's local end lands meanwhile), never one handed out before."""
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
    assert [processes.kernel_port("127.0.0.1"), processes.kernel_port("127.0.0.1")] == [5001, 5002]
    # where the ephemeral range leaves no room below it, free_port falls back to the kernel's
    monkeypatch.setattr(processes.socket, "socket", KernelPorts([5003]))
    assert processes.free_port("127.0.0.1", low=1024) == 5003


def test_no_new_port_in_64_tries_is_a_provisioning_error(monkeypatch, issued):
    monkeypatch.setattr(processes.socket, "socket", KernelPorts([5001] * 65))
    assert processes.kernel_port("127.0.0.1") == 5001
    with pytest.raises(ProvisionError, match="64 tries"):
        processes.kernel_port("127.0.0.1")


def test_real_ports_are_distinct_over_thousands_of_calls_and_below_the_ephemeral_range(issued):
    ports = [processes.free_port("127.0.0.1", low=32768) for _ in range(3000)]
    assert len(set(ports)) == len(ports) and all(p in processes.SINGLE_PORTS for p in ports)
    kernel = [processes.kernel_port("127.0.0.1") for _ in range(3000)]   # bind(0) repeats ~1 in 20,000 calls
    assert len(set(kernel)) == len(kernel)


def test_a_port_another_process_holds_is_taken_and_a_released_one_is_not():
    import socket
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert processes.port_taken("127.0.0.1", port)
    assert not processes.port_taken("127.0.0.1", port)


def test_an_engine_that_dies_on_a_taken_port_is_one_line_saying_so_with_its_last_log_lines(tmp_path):
    import subprocess
    import sys
    import time
    from epdbench.tasks.deployment import Process
    log = tmp_path / "server-0.log"
    log.write_text("INFO starting\nOSError: [Errno 98] Address already in use\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    proc.wait(timeout=30)
    with pytest.raises(ProvisionError) as e:
        processes.wait_healthy([Process("server-0", "server", "http://127.0.0.1:9", log, proc)], time.monotonic() + 5)
    line = str(e.value)
    assert "\n" not in line and line.startswith("server-0 exited with code 1: its port is taken by another process")
    assert line.endswith("INFO starting | OSError: [Errno 98] Address already in use")
    assert processes.start_failure("x", 2, "boom") == "x exited with code 2: boom"


def test_an_engines_own_ports_are_a_block_below_the_ephemeral_range_none_handed_out_twice(monkeypatch, tmp_path):
    """VLLM_PORT blocks: between free_port's ports and the ephemeral range, each apart from the others handed out,
    and free when handed out; none where the range leaves no room."""
    monkeypatch.setattr(processes, "ISSUED_BLOCKS", deque(maxlen=256))
    rng = tmp_path / "range"
    rng.write_text("32768\t60999\n")
    assert processes.ephemeral_low(rng) == 32768 and processes.ephemeral_low(tmp_path / "none") == 32768
    blocks = [processes.private_port_block("127.0.0.1", low=32768) for _ in range(40)]
    assert len(set(blocks)) == 40 and all(b % processes.PORT_BLOCK == 0 for b in blocks)
    assert all(processes.SINGLE_PORTS.stop <= b and b + processes.PORT_BLOCK <= 32768 for b in blocks)
    assert processes.private_port_block("127.0.0.1", low=20_100) is None
    taken = 20_032                                  # a block whose first port is taken is not handed out
    with processes.socket.socket() as s:
        try:
            s.bind(("127.0.0.1", taken))
            s.listen()
        except OSError:
            pass                                    # taken by another process already: as good
        monkeypatch.setattr(processes.random, "choice", lambda seq: taken)
        with pytest.raises(ProvisionError, match="no free block"):
            processes.private_port_block("127.0.0.1", low=32768)
