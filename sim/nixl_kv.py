"""The lines a NIXL pod writes, for what the simulator emulates: vLLM's NixlConnector (KV) or ECCPUConnector (encoder
outputs) over NIXL, UCX underneath. Formats as the real ones (analysis.ucx reads them), every line marked emulated.

Each TP worker of a real pod runs its own NIXL agent and UCX worker; the simulator is one process, so its workers are
labelled with the replica's pid plus the TP rank. A UCX worker prints an endpoint configuration the first time it
connects to a peer: here the first transfer with each peer. The lanes are those UCX chooses for the transport the
configuration asks for (`rma`/`amo` on rc_mlx5 for RDMA, emulated over active messages on tcp for TCP).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from epdbench.sim import logfmt

if TYPE_CHECKING:
    from epdbench.sim.replica import Replica

UCX_VERSION = "1.19.0"   # what the NIXL wheels of vLLM 0.11-0.19 images bundle (nixl 0.5.1-0.7.1)


def lanes(transport: str, rank: int) -> str:
    """An endpoint configuration's groups for the transport, as UCX 1.15+ prints them."""
    if transport == "rdma":
        dev = f"rc_mlx5/sim_mlx5_{rank}:1"
        return f"rma({dev})  amo({dev})  am({dev})  ka({dev})"
    return "rma_am(tcp/eth0)  amo_am(tcp/eth0)  am(tcp/eth0)  ka(tcp/eth0)"


class NixlLog:
    """One replica's NIXL and UCX lines for one path (`kv`: NixlConnector; `ec`: ECCPUConnector over NIXL)."""

    def __init__(self, replica: Replica, transport: str, path: str = "kv"):
        self.replica, self.transport, self.path = replica, transport, path
        self.peers: set[str] = set()
        self.workers = max(1, replica.role_spec.tp) if path == "kv" else 1

    def pid(self, rank: int) -> int:
        return self.replica.pid + rank

    def ucx(self, rank: int, msg: str, level: str = "INFO", file: str = "ucp_worker.c", line: int = 1903,
            indent: int = 1) -> None:
        print(logfmt.ucx_line(level, self.pid(rank), file, line, msg, indent=indent), flush=True)

    def startup_lines(self) -> None:
        r = self.replica
        if self.path == "kv":
            kv_role = "kv_producer" if r.role == "prefill" else "kv_consumer"
            r.engine_log(f"Creating v1 connector with name: NixlConnector and engine_id: {r.engine_id} "
                         f"(kv_role={kv_role}) {logfmt.EMULATED_MARK}", file="factory.py")
            r.engine_log(f"NIXL is available {logfmt.EMULATED_MARK}", file="nixl_utils.py")
        for rank in range(self.workers):
            print(logfmt.nixl_py_line("INFO", "_api.py", 405, "Backend UCX was instantiated"), flush=True)
            self.ucx(rank, f"Version {UCX_VERSION} (loaded from /usr/local/lib/python3.12/dist-packages/"
                           "nixl.libs/libucp.so.0)", file="ucp_context.c", line=2339, indent=0)
            self.ucx(rank, "ucp_context_0 self cfg#0 rma(self/memory)  amo(self/memory)  am(self/memory)")
            if self.path == "kv":
                r.engine_log(f"Initializing NIXL wrapper {logfmt.EMULATED_MARK}", file="base_worker.py")
                r.engine_log(f"Initializing NIXL worker {r.engine_id} {logfmt.EMULATED_MARK}", file="base_worker.py")
        if self.path == "kv":
            r.engine_log("Registering KV_Caches. use_mla: False, kv_buffer_device: cuda, use_host_buffer: False",
                         file="base_worker.py")

    def peer(self, peer: str | None) -> None:
        """The endpoint lines of a first transfer with `peer` (once per peer and worker)."""
        key = peer or "?"
        if key in self.peers:
            return
        self.peers.add(key)
        for rank in range(self.workers):
            self.ucx(rank, f"ucp_context_0 intra-node cfg#{len(self.peers)} {lanes(self.transport, rank)}")

    def ec_read_done(self, side: str, mm_hash: str) -> None:
        """ECCPUConnector's DEBUG line of a completed NIXL READ of one encoder output (cpu/session.py)."""
        self.replica.engine_log(f"EC {side}: NIXL READ completed mm_hash={mm_hash} {logfmt.EMULATED_MARK}",
                                level="DEBUG", file="session.py")
