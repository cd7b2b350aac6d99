"""Mooncake's transfer engine moving GPU memory over TCP on one GPU host, as vLLM's MooncakeConnector does for a PD
pair sharing a GPU (`pd-mooncake-tcp` of gpu-qwen25vl): two processes, each with one CUDA buffer registered with its
own engine (P2P handshake on loopback, MC_FORCE_TCP=1, MC_TE_METRIC=1), the sender writing a prompt's KV-sized
blocks into the receiver's buffer; every write's bytes checked on the GPU. Prints the time per write and the rate
per size; the engines' own log lines (glog, to stderr) are what the transport verifier reads (analysis/
mooncake_log.py), so its stderr is kept as a fixture of the real CUDA 13 build's lines.

    MC_FORCE_TCP=1 MC_TE_METRIC=1 MC_TE_METRIC_INTERVAL_SECONDS=1 \
        python benchmarks/transport/mooncake_gpu_tcp.py [--sizes-mib 1,14,57,228] [--repeats 5] 2>engine.log

Needs torch with CUDA and mooncake-transfer-engine-cuda13 (the GPU bundle carries it); nothing of epdbench.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

HOST = "127.0.0.1"
MiB = 2 ** 20


def engine_with_buffer(n_bytes: int):
    """A transfer engine on loopback with one registered CUDA buffer: (engine, tensor, session)."""
    import torch
    from mooncake.engine import TransferEngine
    buf = torch.zeros(n_bytes, dtype=torch.uint8, device="cuda")
    engine = TransferEngine()
    if engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("TransferEngine.initialize failed")
    if engine.register_memory(buf.data_ptr(), n_bytes) != 0:
        raise RuntimeError("register_memory of the CUDA buffer failed")
    return engine, buf, f"{HOST}:{engine.get_rpc_port()}"


def receiver(conn, n_bytes: int) -> None:
    """The decode's side: a registered buffer; answers each ("sum", n) with the sum of its first n bytes."""
    import torch
    _engine, buf, session = engine_with_buffer(n_bytes)
    conn.send((session, buf.data_ptr()))
    while (msg := conn.recv()) != "stop":
        torch.cuda.synchronize()
        conn.send(int(buf[: msg[1]].to(torch.int64).sum().item()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="1,14,57,228",
                    help="write sizes (57 MiB: one 1k-token prompt's KV of Qwen2.5-VL-7B, 57,344 bytes a token)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    import torch
    sizes = [int(float(s) * MiB) for s in args.sizes_mib.split(",")]
    top = max(sizes)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}; MC_FORCE_TCP={os.environ.get('MC_FORCE_TCP')}",
          flush=True)
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    peer = ctx.Process(target=receiver, args=(theirs, top), daemon=True)
    peer.start()
    try:
        session, addr = mine.recv()
        engine, buf, _ = engine_with_buffer(top)
        gen = torch.Generator(device="cuda").manual_seed(0)
        for n in sizes:
            times = []
            for r in range(args.repeats):
                buf[:n] = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=gen)
                want = int(buf[:n].to(torch.int64).sum().item())
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if engine.transfer_sync_write(session, buf.data_ptr(), addr, n) != 0:
                    raise RuntimeError(f"write of {n} bytes failed")
                times.append(time.perf_counter() - t0)
                mine.send(("sum", n))
                if mine.recv() != want:
                    raise RuntimeError(f"write {r} of {n} bytes: the receiver's bytes differ")
            med = statistics.median(times)
            print(f"{n / MiB:8.1f} MiB: median {med * 1e3:8.2f} ms ({n / med / 1e6:7.0f} MB/s), "
                  f"min {min(times) * 1e3:.2f} ms, max {max(times) * 1e3:.2f} ms over {len(times)}; bytes checked",
                  flush=True)
        time.sleep(float(os.environ.get("MC_TE_METRIC_INTERVAL_SECONDS", "1")) + 0.5)   # the last metrics window
    finally:
        mine.send("stop")
        peer.join(timeout=30)
        if peer.is_alive():
            peer.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
