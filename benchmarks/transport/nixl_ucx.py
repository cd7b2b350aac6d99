"""NIXL over UCX as it really behaves, measured with the real library over loopback, and its real log lines.

Two processes on this host, each a NIXL agent with the UCX backend and one registered DRAM buffer: the "prefill"
agent only holds its buffer; the "decode" agent READs from it, as vLLM's NixlConnector pulls a prompt's KV. Every
time runs from `initialize_xfer` to the state DONE. Two measurements:
1. one READ of one descriptor, 64 KiB to 256 MiB: the fitted intercept is NIXL/UCX's setup per transfer, the slope
   its throughput on loopback;
2. one READ split into D descriptors (1 to 1024) at 16 MiB and 64 MiB: the slope over D is what each further
   descriptor costs (NixlConnector reads one descriptor per KV block, layer and K/V: a 4096-token prompt of a
   28-layer model is 14336 descriptors of 16 KiB).

Both processes' stderr (UCX at UCX_LOG_LEVEL=info, NIXL at NIXL_LOG_LEVEL=INFO) is kept in --logs: the lines are
the real formats the transport verifier reads (`ucp_worker.c` endpoint configurations naming each lane's transport
and device). `--tls` sets UCX_TLS: `tcp` forces TCP as a pd-nixl-tcp pod does; `rc,ud,tcp` asks for RDMA and, on a
host without HCAs, shows UCX falling back to TCP (what `verify-transport --expect rdma` must call a mismatch).

Loopback is not a pod network: the throughput printed is what UCX pushes through loopback on this host, not a link.
Needs the NIXL wheel (bundling UCX), outside the project's dependencies:

    pip install --no-deps nixl-cu12==1.5.1 numpy
    python benchmarks/transport/nixl_ucx.py [--tls tcp] [--max-mib 256] [--quick] [--logs DIR]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path

KiB, MiB = 1024, 1024 ** 2


def _agent(name: str):
    from nixl_cu12._api import nixl_agent, nixl_agent_config
    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def _buffer(agent, n_bytes: int):
    import numpy as np
    buf = np.zeros(n_bytes, dtype=np.uint8)
    agent.register_memory(agent.get_reg_descs([(buf.ctypes.data, n_bytes, 0, "")], "DRAM"))
    return buf


def _output_to(log: str | None) -> None:
    """The process's stdout and stderr (where UCX, NIXL and glog write, as in a pod's log) into `log`."""
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)


def holder(conn, n_bytes: int, log: str | None) -> None:
    """The prefill side: an agent with one registered buffer; sends (metadata, address), waits for 'stop'."""
    _output_to(log)
    agent = _agent("prefill-agent")
    buf = _buffer(agent, n_bytes)
    buf[:] = 7
    conn.send((agent.get_agent_metadata(), buf.ctypes.data))
    conn.recv()
    sys.stdout.flush()
    os._exit(0)   # NIXL's teardown at interpreter exit may crash; the measurement is over


def read_once(agent, local: list[tuple[int, int]], remote: list[tuple[int, int]], peer: str) -> float:
    """Seconds of one READ of the descriptor lists (address, length), from initialize to DONE."""
    t0 = time.perf_counter_ns()
    handle = agent.initialize_xfer("READ", agent.get_xfer_descs([(a, n, 0) for a, n in local], "DRAM"),
                                   agent.get_xfer_descs([(a, n, 0) for a, n in remote], "DRAM"), peer, b"kv")
    state = agent.transfer(handle)
    deadline = time.monotonic() + 60
    while state not in ("DONE", "ERR") and time.monotonic() < deadline:
        state = agent.check_xfer_state(handle)
    took = (time.perf_counter_ns() - t0) / 1e9
    agent.release_xfer_handle(handle)
    if state != "DONE":
        raise RuntimeError(f"READ ended {state}")
    return took


def split(base: int, n_bytes: int, n_desc: int) -> list[tuple[int, int]]:
    return [(base + i * (n_bytes // n_desc), n_bytes // n_desc) for i in range(n_desc)]


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of y = a + b·x by least squares on relative residuals (weights 1/y²)."""
    w = [1 / y ** 2 for y in ys]
    sw, sx, sy = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * y for wi, y in zip(w, ys))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys))
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return (sy - slope * sx) / sw, slope


def reader(conn, metadata: bytes, remote_addr: int, n_bytes: int, quick: bool, log: str | None) -> None:
    """The decode side: READs from the prefill agent; every printed line goes back through `conn`."""
    _output_to(log)

    def say(text: str) -> None:
        conn.send(text)

    agent = _agent("decode-agent")
    peer = agent.add_remote_agent(metadata)
    peer = peer.decode() if isinstance(peer, bytes) else peer
    local = _buffer(agent, n_bytes)
    read_once(agent, [(local.ctypes.data, 4096)], [(remote_addr, 4096)], peer)   # connects the endpoints
    repeats = 3 if quick else 7
    sizes = [64 * KiB * 4 ** i for i in range(8) if 64 * KiB * 4 ** i <= n_bytes]
    xs, ys = [], []
    say("1. one READ, one descriptor: size, median ms, MB/s")
    for size in sizes:
        t = statistics.median(read_once(agent, [(local.ctypes.data, size)], [(remote_addr, size)], peer)
                              for _ in range(repeats))
        xs.append(size)
        ys.append(t)
        say(f"   {size / KiB:>9.0f} KiB  {t * 1e3:8.3f} ms  {size / t / 1e6:9.1f} MB/s")
    if not (local == 7).all():
        raise RuntimeError("READ did not bring the prefill agent's bytes")
    a, b = fit_line(xs, ys)
    say(f"   fit: setup {a * 1e3:.3f} ms per transfer, {1 / b / 1e6:.0f} MB/s")
    say("2. one READ split into D descriptors: total, D, median ms")
    for total in (t for t in (16 * MiB, 64 * MiB) if t <= n_bytes):
        dx, dy = [], []
        for d in (1, 16, 128, 1024):
            t = statistics.median(read_once(agent, split(local.ctypes.data, total, d),
                                            split(remote_addr, total, d), peer) for _ in range(repeats))
            dx.append(d)
            dy.append(t)
            say(f"   {total / MiB:>4.0f} MiB  D={d:<4d} {t * 1e3:8.3f} ms")
        say(f"   fit at {total / MiB:.0f} MiB: {fit_line(dx, dy)[1] * 1e3:.4f} ms per further descriptor")
    conn.send(None)
    sys.stdout.flush()
    os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tls", default="tcp", help="UCX_TLS of both agents (default tcp)")
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    ap.add_argument("--logs", default=None, help="folder for both agents' UCX/NIXL log lines")
    args = ap.parse_args()
    os.environ.update({"UCX_TLS": args.tls, "UCX_LOG_LEVEL": "info", "NIXL_LOG_LEVEL": "INFO"})
    logs = Path(args.logs) if args.logs else None
    if logs:
        logs.mkdir(parents=True, exist_ok=True)
    n_bytes = args.max_mib * MiB
    print(f"host {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"UCX_TLS={args.tls}", flush=True)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    procs = [ctx.Process(target=holder, args=(child, n_bytes, str(logs / "prefill.log") if logs else None))]
    procs[0].start()
    try:
        if not parent.poll(120):
            raise RuntimeError("the prefill agent did not start")
        metadata, remote_addr = parent.recv()
        out, into = ctx.Pipe()
        procs.append(ctx.Process(target=reader, args=(into, metadata, remote_addr, n_bytes, args.quick,
                                                      str(logs / "decode.log") if logs else None)))
        procs[1].start()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and out.poll(deadline - time.monotonic()):
            line = out.recv()
            if line is None:
                break
            print(line, flush=True)
        else:
            raise RuntimeError("the decode agent stopped or timed out (see its log)")
    finally:
        parent.send("stop")
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    print(f"load at the end {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
