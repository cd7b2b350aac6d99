"""What the pod network between two pods on one node adds to a Mooncake TCP transfer, measured with the real
transfer engine: the source of `hardware.tcp_latency_ms`.

Kubernetes joins the pods of one node as the CNI bridge plugin does (kindnet, flannel, the reference `bridge`
plugin): each pod is a network namespace whose eth0 is one end of a veth pair, the other end a port of a bridge in
the host's namespace. This script builds exactly that — a bridge and two namespaces, "pod A" and "pod B", each on a
veth port — and runs one sender engine in pod A against two receivers: one in pod A itself, reached over loopback
(the path benchmarks/transport/mooncake_tcp.py measures tcp_setup_ms on), and one in pod B, reached over veth → bridge →
veth. Each single transfer (`transfer_sync_write`, 64 KiB to --max-mib) alternates between the two receivers, so
host drift falls on both alike. Per size: the median of each path and the pod path's extra time; the fitted
intercept of each path is its fixed cost per transfer, and the pod path's intercept minus loopback's is what the
pod network adds per transfer — `tcp_latency_ms` — with the spread of that difference over rounds of the whole
sweep. The slope is each path's throughput on one connection: a figure of this host's CPU (a veth moves bytes by
copying them), printed, not a default (`tcp_gb_s` stays the spec's).

Pods on different nodes cross a NIC and the fabric instead: not measured here (the presets are one node).
Needs root (it creates namespaces, a bridge and veths, all named epdb-*, removed at the end, also on Ctrl-C) and
the `[mooncake]` extra with Debian's libibverbs1:

    sudo python benchmarks/transport/pod_network.py [--max-mib 64] [--rounds 5] [--quick]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

KiB, MiB = 1024, 1024 ** 2
SUBNET = "10.244.77"                 # a pod CIDR's /24 that a node's own routes are unlikely to hold
POD_A, POD_B, BRIDGE = "epdb-pod-a", "epdb-pod-b", "epdb-br0"
HERE = Path(__file__).resolve().parent


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def build() -> None:
    """The bridge, the two pod namespaces and their veths, as the CNI bridge plugin sets up two pods."""
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for ns, host_end, ip in ((POD_A, "epdb-veth-a", f"{SUBNET}.2"), (POD_B, "epdb-veth-b", f"{SUBNET}.3")):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", host_end, "master", BRIDGE)
        sh("ip", "link", "set", host_end, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")


def tear_down() -> None:
    """Remove what build() made (each step whether or not the one before it worked)."""
    for args in (("ip", "netns", "del", POD_A), ("ip", "netns", "del", POD_B),
                 ("ip", "link", "del", "epdb-veth-a"), ("ip", "link", "del", "epdb-veth-b"),
                 ("ip", "link", "del", BRIDGE)):
        subprocess.run(args, capture_output=True)


def in_pod(ns: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(Path(__file__).resolve()), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kw)


# -- the two roles, each run inside a pod namespace ----------------------------------------------------------------
def receiver(host: str, buffer_bytes: int) -> None:
    """An engine with one registered buffer: prints its session and buffer address, then waits for stdin's end."""
    from epdbench.sim.mooncake_kv import MooncakeKV
    kv = MooncakeKV(host, buffer_bytes)
    print(f"READY {kv.session} {kv.addr}", flush=True)
    sys.stdin.read()


def sender(host: str, targets: list[tuple[str, int]], sizes: list[int], rounds: int, repeats: int) -> None:
    """Single transfers to each target, alternating target every transfer; prints one line per round, size and
    target: `T round size target_index seconds...`."""
    sys.path.insert(0, str(HERE))
    from mooncake_tcp import time_one

    from epdbench.sim.mooncake_kv import MooncakeKV
    kv = MooncakeKV(host, max(sizes))
    for peer, addr in targets:
        time_one(kv, peer, addr, 1 * MiB, 3)              # opens each segment (handshake) before any timing
    for r in range(rounds):
        for n in sizes:
            times: list[list[float]] = [[] for _ in targets]
            for _ in range(repeats):
                for i, (peer, addr) in enumerate(targets):
                    times[i] += time_one(kv, peer, addr, n, 1)
            for i, ts in enumerate(times):
                print("T", r, n, i, *(f"{t:.9f}" for t in ts), flush=True)


# -- the orchestration, in the host's namespace --------------------------------------------------------------------
def measure(sizes: list[int], rounds: int, repeats: int) -> dict[tuple[int, int, int], list[float]]:
    """{(round, size, path): seconds of each transfer}; path 0 loopback, 1 pod network."""
    peers = [in_pod(POD_A, "--role", "receiver", "--host", f"{SUBNET}.2", "--buffer", str(max(sizes))),
             in_pod(POD_B, "--role", "receiver", "--host", f"{SUBNET}.3", "--buffer", str(max(sizes)))]
    try:
        targets = []
        for p in peers:
            line = p.stdout.readline().split()
            if not line or line[0] != "READY":
                raise RuntimeError("a receiver did not start (is the mooncake extra installed?)")
            targets.append(f"{line[1]},{line[2]}")
        cmd = ["--role", "sender", "--host", f"{SUBNET}.2", "--targets", ";".join(targets),
               "--sizes", ",".join(map(str, sizes)), "--rounds", str(rounds), "--repeats", str(repeats)]
        out: dict[tuple[int, int, int], list[float]] = {}
        s = in_pod(POD_A, *cmd)
        for line in s.stdout:
            f = line.split()
            if f and f[0] == "T":
                out[(int(f[1]), int(f[2]), int(f[3]))] = [float(x) for x in f[4:]]
                if int(f[3]) == 1 and int(f[2]) == sizes[-1]:
                    print(f"  round {int(f[1]) + 1} of {rounds} done", file=sys.stderr, flush=True)
        if s.wait(timeout=60) != 0:
            raise RuntimeError(f"the sender failed (exit {s.returncode})")
        return out
    finally:
        for p in peers:
            p.stdin.close()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def report(times: dict[tuple[int, int, int], list[float]], sizes: list[int], rounds: int) -> None:
    from mooncake_tcp import fit_line, machine
    print(f"# Mooncake TCP, loopback vs two pods on one node (veth + bridge), {time.strftime('%Y-%m-%d')}: "
          f"{machine()}; load average {os.getloadavg()[0]:.2f} at the end")
    print(f"\n{'size':>10} {'loopback ms':>12} {'pod net ms':>11} {'extra ms':>9} {'loopback GB/s':>14} "
          f"{'pod net GB/s':>13}   (medians over all rounds)")
    for n in sizes:
        lo = statistics.median(t for r in range(rounds) for t in times[(r, n, 0)])
        pod = statistics.median(t for r in range(rounds) for t in times[(r, n, 1)])
        print(f"{n // KiB:>7} KiB {lo * 1e3:>12.3f} {pod * 1e3:>11.3f} {(pod - lo) * 1e3:>9.3f} "
              f"{n / lo / 1e9:>14.2f} {n / pod / 1e9:>13.2f}")
    fits = []
    for r in range(rounds):
        per_path = [fit_line([float(n) for n in sizes], [statistics.median(times[(r, n, p)]) for n in sizes])
                    for p in (0, 1)]
        fits.append(per_path)
    extra = sorted((f[1][0] - f[0][0]) * 1e3 for f in fits)
    setup = [[f[p][0] * 1e3 for f in fits] for p in (0, 1)]
    gbs = [[1 / f[p][1] / 1e9 for f in fits] for p in (0, 1)]
    print(f"\nfixed cost per transfer (fit intercept, per round): loopback {_span(setup[0])} ms, "
          f"pod network {_span(setup[1])} ms")
    print(f"what the pod network adds per transfer (tcp_latency_ms): median {statistics.median(extra):.3f} ms, "
          f"rounds {extra[0]:.3f} to {extra[-1]:.3f} ms")
    print(f"throughput on one connection (fit slope): loopback {_span(gbs[0], '.2f')} GB/s, "
          f"pod network {_span(gbs[1], '.2f')} GB/s (this host's CPU copying bytes, not a NIC)")


def _span(xs: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-mib", type=int, default=64, help="largest single transfer (MiB)")
    ap.add_argument("--rounds", type=int, default=5, help="sweeps of every size; the spread is over these")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 3 repeats (a smoke check, not a measurement)")
    ap.add_argument("--role", choices=["receiver", "sender"], help=argparse.SUPPRESS)
    ap.add_argument("--host", help=argparse.SUPPRESS)
    ap.add_argument("--buffer", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--targets", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=9, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "receiver":
        receiver(args.host, args.buffer)
        return 0
    if args.role == "sender":
        targets = [(t.split(",")[0], int(t.split(",")[1])) for t in args.targets.split(";")]
        sender(args.host, targets, [int(x) for x in args.sizes.split(",")], args.rounds, args.repeats)
        return 0
    if os.geteuid() != 0:
        print("pod_network.py: needs root (it creates network namespaces, a bridge and veths)", file=sys.stderr)
        return 2
    if not 1 <= args.max_mib <= 1024 or not 1 <= args.rounds <= 50:
        print("pod_network.py: --max-mib 1..1024, --rounds 1..50", file=sys.stderr)
        return 2
    sizes = [64 * KiB * 4 ** i for i in range(10) if 64 * KiB * 4 ** i <= args.max_mib * MiB]
    rounds, repeats = (2, 3) if args.quick else (args.rounds, args.repeats)
    sys.path.insert(0, str(HERE))
    tear_down()                                           # what an earlier run killed with SIGKILL left
    try:
        build()
        print(f"pod A {SUBNET}.2 and pod B {SUBNET}.3 on bridge {BRIDGE}; {rounds} rounds of {len(sizes)} sizes × "
              f"{repeats} transfers per path", file=sys.stderr, flush=True)
        times = measure(sizes, rounds, repeats)
    except KeyboardInterrupt:
        print("interrupted: namespaces, bridge and veths removed", file=sys.stderr)
        return 130
    finally:
        tear_down()
    report(times, sizes, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
