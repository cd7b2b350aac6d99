"""The PD KV handoff of the Mooncake or NIXL connector: the prefill holds a finished prompt's KV, the decode pulls it
over HTTP (timed by the cost model), optionally moving real bytes through the genuine Mooncake engine."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from epdbench.physics.costmodel import kv_descriptors, link_bytes_per_s, peer_lanes, setup_seconds, transfer_seconds
from epdbench.sim import logfmt
from epdbench.sim.metrics import TransferWindow
from epdbench.sim.nixl_kv import NixlLog

if TYPE_CHECKING:
    from epdbench.sim.replica import Replica


class KVHandoff:
    def __init__(self, replica: Replica):
        self.replica = replica
        self.transfers: dict[str, tuple[int, str]] = {}  # transfer id -> (prompt tokens, request id)
        self.window = TransferWindow()
        self.connector = replica.config.kv_connector
        self.genuine = (replica.spec.target.sim.kv_engine == "mooncake" and replica.moves_kv
                        and self.connector == "mooncake")
        self.mooncake = None  # sim.mooncake_kv.MooncakeKV once serving, in genuine mode
        self.nixl = NixlLog(replica, replica.transport) if self.connector == "nixl" else None
        self.log_file = "pull_worker.py" if self.nixl else "mooncake_connector.py"
        # Every line about KV movement carries the emulated mark, unless real bytes move (genuine mode).
        self.mark = "" if self.genuine else f" {logfmt.EMULATED_MARK}"

    def startup_lines(self) -> None:
        """The KV connector's start-up lines (and, in genuine mode, the Mooncake engine's start)."""
        r = self.replica
        if self.nixl:
            self.nixl.startup_lines()
            return
        kv_role = "kv_producer" if r.role == "prefill" else "kv_consumer"
        r.engine_log(f"Creating v1 connector with name: MooncakeConnector and engine_id: {r.engine_id} "
                     f"(kv_role={kv_role}){self.mark}", file="factory.py")
        r.engine_log("Registering KV_Caches. use_mla: False", file="mooncake_connector.py")
        if self.genuine:
            from epdbench.sim.mooncake_kv import MooncakeKV
            self.mooncake = MooncakeKV(r.host, r.spec.target.sim.kv_buffer_mb * 1024 ** 2)
            r.engine_log(f"Genuine KV transport: Mooncake transfer engine session {self.mooncake.session}, "
                         f"moving {r.spec.target.sim.kv_scale:g} of modelled KV bytes",
                         file="mooncake_connector.py")
        elif r.transport == "tcp":
            r.mc_log("MC_FORCE_TCP is set, using TCP transport only")
            r.mc_log("No RDMA devices found, check your device installation", "W", "topology.cpp")
            r.mc_log("Topology discovery complete. Found 0 HCAs.")
            r.mc_log(f"TcpTransport: listen on port {r.port + 10000}", file="tcp_transport.cpp")
        else:
            n = r.role_spec.rdma_interfaces
            r.mc_log(f"Topology discovery complete. Found {n} HCAs.")
            r.mc_log("installTransport, type=rdma", file="transfer_engine_impl.cpp")
            for i in range(n):
                r.mc_log(f"RDMA device: sim_mlx5_{i}, LID: 0, GID: (GID_Index 0) "
                         "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00", file="rdma_context.cpp")
        if not self.genuine:
            r.mc_log(f"Transfer Engine RPC using P2P handshake, listening on {r.host}:{r.port + 10000}")

    def hold(self, kvp: dict, rid: str, prompt_tokens: int, cached: int = 0) -> dict:
        """Prefill side, after a prefill-only request: keep its KV for the decode; return the
        kv_transfer_params that tell the decode where to pull it from, with the prefill's prefix-cache hit
        (`cached`), which the decode reports as its usage's cached tokens (vLLM 0.33 v1/core/sched/scheduler.py:
        remote_prefill_cached_tokens)."""
        r = self.replica
        xfer = kvp.get("transfer_id") or rid
        self.transfers[xfer] = (prompt_tokens, rid)
        return {
            "do_remote_prefill": True, "do_remote_decode": False, "transfer_id": xfer,
            "remote_engine_id": r.engine_id,
            "remote_bootstrap_addr": f"{r.host}:{r.bootstrap_port}",
            "remote_host": r.host, "remote_port": r.bootstrap_port, "remote_prefill_cached_tokens": cached,
        }

    async def pull_kv(self, rid: str, kvp: dict, tokens: int) -> bool:
        """Decode side of a KV handoff: ask the prefill to push `tokens` tokens of KV (those of the prompt
        not already in this replica's prefix cache)."""
        r, c = self.replica, self.replica.counters
        addr = kvp.get("remote_bootstrap_addr") or (
            f"{kvp.get('remote_host')}:{kvp.get('remote_port')}" if kvp.get("remote_host") else None)
        if not addr:
            c.kv_failed_recvs += 1
            self.pull_failed(rid, "no remote bootstrap address")
            return False
        url = addr if addr.startswith("http") else f"http://{addr}"
        xfer = kvp.get("transfer_id") or rid
        t0 = time.perf_counter()
        assert r.session is not None
        try:
            body = {"transfer_id": xfer, "request_id": rid, "tokens": tokens, "engine_id": r.engine_id}
            if self.mooncake:
                body.update({"mooncake_session": self.mooncake.session, "mooncake_addr": self.mooncake.addr})
            async with r.session.post(f"{url}/epdbench/kv_pull", json=body) as resp:
                ok = resp.status == 200
                detail = await resp.json() if ok else await resp.text()
        except aiohttp.ClientError as e:
            ok, detail = False, str(e)
        if not ok:
            c.kv_failed_recvs += 1
            self.pull_failed(rid, f"{detail}; recomputing prefill locally")
            return False
        c.kv_transfers += 1
        c.kv_bytes += detail["bytes"]
        took_s = (time.perf_counter() - t0) / r.time_scale   # modelled time
        c.kv_xfer_seconds += took_s
        if self.nixl:   # NixlConnector's decode READs the KV, so it counts the transfer (nixl/stats.py)
            self.nixl.peer(kvp.get("remote_engine_id"))
            # NIXL times the READ from its post to its completion: the link's part, not this HTTP exchange
            link_ms = detail.get("link_ms")
            self.window.record(detail["bytes"], took_s * 1e3 if link_ms is None else link_ms,
                               detail.get("descriptors", 1))
        r.engine_log(f"Received KV for {rid} (transfer {xfer}): {detail['bytes']} bytes over "
                     f"{r.transport} in {took_s * 1e3:.1f} ms{self.mark}", file=self.log_file)
        return True

    def pull_failed(self, rid: str, why: str) -> None:
        """The decode's line of a failed KV pull, in its connector's format."""
        if self.nixl:
            self.replica.engine_log(f"NIXL transfer failure: transfer_failed | Context: {{'failure_type': "
                                    f"'transfer_failed', 'request_id': '{rid}', 'xfer_state': 'ERR', 'detail': "
                                    f"{why[:200]!r}}}", level="ERROR", file="base_worker.py")
        else:
            self.replica.engine_log(f"pulling kv_caches for {rid} failed: {why}", level="ERROR",
                                    file="mooncake_connector.py")

    async def kv_pull(self, request: web.Request) -> web.Response:
        """Prefill side of a KV handoff: push the held KV of a transfer to the asking decode."""
        r, c = self.replica, self.replica.counters
        body = await request.json()
        xfer = body.get("transfer_id", "")
        held = self.transfers.pop(xfer, None)
        if held is None:
            c.kv_failed_transfers += 1
            r.engine_log(f"Sending to {body.get('engine_id')} failed (ret=-1) after 0.0 ms "
                         f"(0 descriptors, 0 bytes): unknown transfer {xfer}", level="ERROR",
                         file="mooncake_connector.py")
            return web.json_response({"error": f"unknown transfer {xfer}"}, status=404)
        tokens, rid = held
        tokens = min(tokens, int(body.get("tokens", tokens)))   # the decode already holds its cached prefix
        # the bytes fill the decode's shards (ModelSpec.kv_bytes_per_token_at: its TP decides them)
        n_bytes = tokens * r.spec.model.kv_bytes_per_token_at(r.config.role("decode").tp)
        n_desc = kv_descriptors(r.cost, self.connector, tokens)
        hw, n_if = r.spec.hardware, r.role_spec.rdma_interfaces
        seconds = transfer_seconds(hw, r.transport, n_bytes, n_if, n_desc, self.connector)   # alone on the link
        if self.nixl:
            self.nixl.peer(body.get("engine_id"))
        t0 = time.perf_counter()
        real = None
        if self.mooncake and body.get("mooncake_session"):
            n_real = int(n_bytes * r.spec.target.sim.kv_scale)
            real = asyncio.create_task(asyncio.to_thread(
                self.mooncake.write, body["mooncake_session"], int(body["mooncake_addr"]), n_real))
        await r.link.send(setup_seconds(hw, r.transport, n_desc, self.connector),
                          n_bytes / link_bytes_per_s(hw, r.transport, n_if),
                          peer=body.get("engine_id"), lanes=peer_lanes(r.transport, n_desc, self.connector))
        if real is not None and await real != 0:
            c.kv_failed_transfers += 1
            r.engine_log(f"Sending to {body.get('engine_id')} failed (ret=-1) after "
                         f"{(time.perf_counter() - t0) / r.time_scale * 1e3:.1f} ms: Mooncake write of {rid} failed",
                         level="ERROR", file="mooncake_connector.py")
            return web.json_response({"error": "mooncake transfer failed"}, status=500)
        latency_ms = (time.perf_counter() - t0) / r.time_scale * 1e3   # modelled time, shared link included
        c.kv_transfers += 1
        c.kv_bytes += n_bytes
        c.kv_xfer_seconds += latency_ms / 1e3
        if not self.nixl:   # Mooncake's sending engine reports its windows (MC_TE_METRIC)
            self.window.record(n_bytes, latency_ms, n_desc)
        r.engine_log(f"Sent KV of {rid} (transfer {xfer}) to {body.get('engine_id')}: {n_bytes} bytes over "
                     f"{r.transport} in {latency_ms:.1f} ms{self.mark}", file=self.log_file)
        return web.json_response({"bytes": n_bytes, "seconds": seconds, "descriptors": n_desc,
                                  "link_ms": latency_ms})

    async def bootstrap_query(self, request: web.Request) -> web.Response:
        return web.json_response({"0": {"engine_id": self.replica.engine_id}})
