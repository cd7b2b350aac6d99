"""Mooncake's TCP transport as it really behaves, measured with the real transfer engine over loopback.

A sender and two receivers on 127.0.0.1, each a `sim.mooncake_kv.MooncakeKV` (P2P handshake, one registered
buffer) in its own process; every time runs from the submit to the engine's completion status. Four measurements:
1. one transfer (`transfer_sync_write`, as the simulator's genuine mode moves KV) of 64 KiB to 512 MiB: the fitted
   intercept is the engine's setup per transfer, the slope its throughput on one connection;
2. N = 2, 4, 8 one-descriptor transfers submitted at once to one peer (`transfer_submit_write`, one thread polling
   them all): do they add up (aggregate throughput × N), share (all end together after about N × one) or
   serialise (one after another)? "ends together" counts those that end within 25% of the first;
3. one transfer split into D descriptors (`batch_transfer_sync_write`): the slope over D is what each further
   descriptor costs (vLLM's MooncakeConnector sends a request's KV as one descriptor per layer and K/V);
4. two such transfers of 56 descriptors (a 28-layer model's KV) submitted at once (`batch_transfer_async_write`),
   to one peer and to two peers.

Loopback is not a pod network: this measures the engine's own setup and its own serialisation, not a link. The
link bandwidth in the spec (`hardware.tcp_gb_s`) stays a figure of the pod network; the throughput printed here is
only what one engine pushes through loopback on this host. Other work on the host slows the engine's threads: the
load average is printed at the start and the end.

    python benchmarks/transport/mooncake_tcp.py [--max-mib 512] [--quick] 2>/dev/null
"""
from __future__ import annotations

import argparse
import importlib.metadata
import multiprocessing
import os
import platform
import statistics
import time
from collections.abc import Callable

from epdbench.sim.mooncake_kv import MooncakeKV

KiB, MiB = 1024, 1024 ** 2
HOST = "127.0.0.1"
Clock = Callable[[], int]


def receiver(conn, buffer_bytes: int) -> None:
    """A peer: an engine with one registered buffer; sends (session, buffer address), waits for 'stop'."""
    kv = MooncakeKV(HOST, buffer_bytes)
    conn.send((kv.session, kv.addr))
    conn.recv()


def time_one(kv: MooncakeKV, peer: str, peer_addr: int, n_bytes: int, repeats: int,
             clock: Clock = time.perf_counter_ns) -> list[float]:
    """Seconds of each of `repeats` single blocking transfers of n_bytes."""
    out = []
    for _ in range(repeats):
        t0 = clock()
        if kv.engine.transfer_sync_write(peer, kv.addr, peer_addr, n_bytes) != 0:
            raise RuntimeError(f"transfer of {n_bytes} bytes failed")
        out.append((clock() - t0) / 1e9)
    return out


def time_concurrent(kv: MooncakeKV, peer: str, peer_addr: int, n_bytes: int, n: int,
                    clock: Clock = time.perf_counter_ns) -> list[float]:
    """Seconds from the first submit to each of n concurrent transfers' completion, in completion order.
    Each writes its own region of the peer's buffer; one thread polls them all (no thread per transfer)."""
    t0 = clock()
    batches = [kv.engine.transfer_submit_write(peer, kv.addr, peer_addr + i * n_bytes, n_bytes) for i in range(n)]
    if 0 in batches:
        raise RuntimeError("transfer_submit_write failed")
    done: dict[int, float] = {}
    while len(done) < n:
        for b in batches:
            if b in done:
                continue
            status = kv.engine.transfer_check_status(b)
            if status < 0:
                raise RuntimeError(f"concurrent transfer failed (status {status})")
            if status == 1:
                done[b] = (clock() - t0) / 1e9
    return sorted(done.values())


def descriptors(base: int, n_bytes: int, n_desc: int) -> list[int]:
    return [base + i * (n_bytes // n_desc) for i in range(n_desc)]


def time_descriptors(kv: MooncakeKV, peer: str, peer_addr: int, n_bytes: int, n_desc: int, repeats: int,
                     clock: Clock = time.perf_counter_ns) -> list[float]:
    """Seconds of each of `repeats` batch transfers of n_bytes split into n_desc equal descriptors."""
    src, dst, lengths = descriptors(kv.addr, n_bytes, n_desc), descriptors(peer_addr, n_bytes, n_desc), \
        [n_bytes // n_desc] * n_desc
    out = []
    for _ in range(repeats):
        t0 = clock()
        if kv.engine.batch_transfer_sync_write(peer, src, dst, lengths) != 0:
            raise RuntimeError(f"batch of {n_desc} descriptors failed")
        out.append((clock() - t0) / 1e9)
    return out


def time_batches(kv: MooncakeKV, targets: list[tuple[str, int]], n_bytes: int, n_desc: int,
                 clock: Clock = time.perf_counter_ns) -> list[float]:
    """Seconds from the first submit to the end of each batch (n_bytes in n_desc descriptors), one per target,
    all submitted before any is awaited; the waits go in submission order (a batch that ended earlier than the one
    before it is reported at that one's end)."""
    t0 = clock()
    ids = [kv.engine.batch_transfer_async_write(peer, descriptors(kv.addr, n_bytes, n_desc),
                                                descriptors(addr + i * n_bytes, n_bytes, n_desc),
                                                [n_bytes // n_desc] * n_desc)
           for i, (peer, addr) in enumerate(targets)]
    ends = []
    for b in ids:
        if b == 0 or kv.engine.get_batch_transfer_status([b]) != 0:
            raise RuntimeError("batch transfer failed")
        ends.append((clock() - t0) / 1e9)
    return ends


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of y = a + b·x by least squares on relative residuals (weights 1/y²), so the small
    transfers that carry the intercept count as much as the large ones that carry the slope."""
    w = [1 / y ** 2 for y in ys]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, xs)) / sw
    my = sum(wi * y for wi, y in zip(w, ys)) / sw
    b = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys)) / sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
    return my - b * mx, b


def ending_together(ends: list[float]) -> int:
    """How many transfers end within 25% of the first one's end."""
    return sum(e <= 1.25 * ends[0] for e in ends)


def verdict(n: int, one_s: float, ends: list[float]) -> str:
    """Add up, share or serialise, from n transfers' completion times against one transfer alone."""
    if n * one_s / ends[-1] > 0.75 * n:
        return "add up"
    together = ending_together(ends)
    return "share" if together == n else "serialise" if together == 1 else f"share {together} at a time"


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    return (f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}, "
            f"mooncake-transfer-engine-non-cuda {importlib.metadata.version('mooncake-transfer-engine-non-cuda')}")


def start_peer(ctx, buffer_bytes: int):
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=receiver, args=(child, buffer_bytes), daemon=True)
    proc.start()
    return parent, proc, parent.recv()


def single_transfers(kv: MooncakeKV, peer: str, addr: int, sizes: list[int], quick: bool) -> None:
    print("\n## 1. One transfer (transfer_sync_write), median of repeats")
    print(f"{'size':>10} {'repeats':>8} {'median ms':>10} {'p10 ms':>8} {'p90 ms':>8} {'GB/s':>7}")
    medians = []
    for n in sizes:
        repeats = 3 if quick else max(5, min(50, (256 * MiB) // n))
        ts = sorted(time_one(kv, peer, addr, n, repeats))
        medians.append(statistics.median(ts))
        print(f"{n // KiB:>7} KiB {repeats:>8} {medians[-1] * 1e3:>10.3f} {ts[len(ts) // 10] * 1e3:>8.3f} "
              f"{ts[-1 - len(ts) // 10] * 1e3:>8.3f} {n / medians[-1] / 1e9:>7.2f}")
    setup_s, s_per_byte = fit_line([float(n) for n in sizes], medians)
    print(f"fit: setup {setup_s * 1e3:.3f} ms per transfer, {1 / s_per_byte / 1e9:.2f} GB/s on one connection "
          f"(loopback on this host, not a link)")


def concurrent_transfers(kv: MooncakeKV, peer: str, addr: int, quick: bool) -> None:
    print("\n## 2. N one-descriptor transfers at once from one engine to one peer, median of repeats")
    print(f"{'size':>10} {'N':>3} {'alone ms':>9} {'first ms':>9} {'last ms':>9} {'last/(N·alone)':>15} "
          f"{'agg GB/s':>9} {'ends together':>14}  verdict")
    for n in [1 * MiB, 16 * MiB, 64 * MiB]:
        repeats = 3 if quick else 7
        alone = statistics.median(time_concurrent(kv, peer, addr, n, 1)[0] for _ in range(repeats))
        for c in (2, 4, 8):
            runs = [time_concurrent(kv, peer, addr, n, c) for _ in range(repeats)]
            ends = [statistics.median(r[i] for r in runs) for i in range(c)]
            print(f"{n // MiB:>6} MiB {c:>3} {alone * 1e3:>9.3f} {ends[0] * 1e3:>9.3f} {ends[-1] * 1e3:>9.3f} "
                  f"{ends[-1] / (c * alone):>15.2f} {c * n / ends[-1] / 1e9:>9.2f} "
                  f"{ending_together(ends):>11} of {c}  {verdict(c, alone, ends)}")


def descriptor_cost(kv: MooncakeKV, peer: str, addr: int, quick: bool) -> None:
    print("\n## 3. One transfer split into D descriptors (batch_transfer_sync_write), median of repeats")
    print(f"{'size':>10} {'D':>4} {'median ms':>10}")
    for n in [1 * MiB, 16 * MiB]:
        repeats = 3 if quick else 9
        ds = [1, 8, 56, 128]
        meds = [statistics.median(time_descriptors(kv, peer, addr, n, d, repeats)) for d in ds]
        for d, med in zip(ds, meds):
            print(f"{n // MiB:>6} MiB {d:>4} {med * 1e3:>10.3f}")
        _, per_desc = fit_line([float(d) for d in ds], meds)
        print(f"fit at {n // MiB} MiB: {per_desc * 1e3:.3f} ms per further descriptor")


def two_requests(kv: MooncakeKV, peers: list[tuple[str, int]], quick: bool) -> None:
    print("\n## 4. Two transfers of 56 descriptors at once (batch_transfer_async_write), median of repeats")
    print(f"{'size':>10} {'to':>9} {'alone ms':>9} {'first/alone':>12} {'second/alone':>13}  verdict")
    for n in [4 * MiB, 32 * MiB]:
        repeats = 3 if quick else 9
        alone = statistics.median(time_batches(kv, peers[:1], n, 56)[0] for _ in range(repeats))
        for label, targets in (("one peer", [peers[0], peers[0]]), ("two peers", peers[:2])):
            runs = [time_batches(kv, targets, n, 56) for _ in range(repeats)]
            ends = [statistics.median(r[i] for r in runs) for i in range(2)]
            print(f"{n // MiB:>6} MiB {label:>9} {alone * 1e3:>9.3f} {ends[0] / alone:>12.2f} {ends[1] / alone:>13.2f}"
                  f"  {verdict(2, alone, sorted(ends))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-mib", type=int, default=512, help="largest single transfer (MiB)")
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke check, not a measurement)")
    args = ap.parse_args()
    sizes = [64 * KiB * 4 ** i for i in range(10) if 64 * KiB * 4 ** i <= args.max_mib * MiB]
    if sizes[-1] < args.max_mib * MiB:
        sizes.append(args.max_mib * MiB)
    buffer_bytes = max(sizes[-1], 8 * 64 * MiB)
    ctx = multiprocessing.get_context("spawn")
    peers = [start_peer(ctx, buffer_bytes), start_peer(ctx, 2 * 32 * MiB)]
    try:
        kv = MooncakeKV(HOST, buffer_bytes)
        targets = [session for _, _, session in peers]
        for peer, addr in targets:
            time_one(kv, peer, addr, 1 * MiB, 3)          # opens each segment (handshake) before any timing
        print(f"# Mooncake TCP over loopback, {time.strftime('%Y-%m-%d')}: {machine()}; "
              f"load average {os.getloadavg()[0]:.2f} at the start")
        single_transfers(kv, *targets[0], sizes, args.quick)
        concurrent_transfers(kv, *targets[0], args.quick)
        descriptor_cost(kv, *targets[0], args.quick)
        two_requests(kv, targets, args.quick)
        print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    finally:
        for conn, proc, _ in peers:
            conn.send("stop")
            proc.join(timeout=10)


if __name__ == "__main__":
    main()
