"""Genuine KV transport for the simulator: real byte buffers moved by the real Mooncake transfer
engine (P2P handshake). Optional: needs `pip install -e '.[mooncake]'` and Debian's libibverbs1.

The engine chooses its transport itself (RDMA only when it finds HCAs), and with MC_TE_METRIC=1 it
logs its own lines, which the transport verifier reads as it would on real hardware.
"""
from __future__ import annotations

import ctypes


class MooncakeUnavailable(RuntimeError):
    pass


class MooncakeKV:
    def __init__(self, host: str, buffer_bytes: int):
        try:
            from mooncake.engine import TransferEngine
        except ImportError as e:  # missing wheel or libibverbs.so.1
            raise MooncakeUnavailable(
                f"kv_engine mooncake needs mooncake-transfer-engine-non-cuda and libibverbs1: {e}") from None
        self.engine = TransferEngine()
        if self.engine.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
            raise MooncakeUnavailable("Mooncake TransferEngine.initialize failed")
        self.buffer_bytes = buffer_bytes
        self._buf = ctypes.create_string_buffer(buffer_bytes)
        self.addr = ctypes.addressof(self._buf)
        if self.engine.register_memory(self.addr, buffer_bytes) != 0:
            raise MooncakeUnavailable("Mooncake register_memory failed")
        self.session = f"{host}:{self.engine.get_rpc_port()}"

    def write(self, peer_session: str, peer_addr: int, n_bytes: int) -> int:
        """Blocking write of n_bytes of our buffer into the peer's; 0 on success."""
        return self.engine.transfer_sync_write(peer_session, self.addr, peer_addr, min(n_bytes, self.buffer_bytes))
