"""The fake API server's way in to pods: the services/pods proxy subresource and the port-forward websocket
(v4.channel.k8s.io), both to the simulator process behind a ready pod."""
from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from epdbench.relay import stream_back
from tests.k8s.fake_kubelet import Kubelet
from tests.k8s.fake_objects import ObjectStore, status_body

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "authorization", "accept-encoding",
               "content-encoding", "keep-alive"}


class PodProxy:
    def __init__(self, store: ObjectStore, kubelet: Kubelet, session: aiohttp.ClientSession):
        self.store, self.kubelet, self.session = store, kubelet, session

    def backend_port(self, plural: str, ns: str, name: str) -> int | None:
        """Port of the process behind a pod (pods/NAME:PORT) or a ready pod of a service (services/NAME:PORT)."""
        name, _, port = name.partition(":")
        port = int(port) if port.isdigit() else None

        def behind(life) -> int | None:   # the container port's process (a sidecar's), else the pod's own
            return life.ports.get(port, life.port) if life else None
        with self.store.lock:
            if plural == "pods":
                return behind(self.kubelet.ready_life(name))
            service = self.store.get("services", ns, name)
            if service is None:
                return None
            selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
            for pod in self.store.find("pods", ns, selector=selector):
                life = self.kubelet.ready_life(pod["metadata"]["name"])
                if life:
                    return behind(life)
        return None

    async def proxy(self, request: web.Request, plural: str, ns: str, name: str, tail: str) -> web.StreamResponse:
        port = self.backend_port(plural, ns, name)
        if port is None:
            return status_body(503, "ServiceUnavailable", f'no endpoints available for {plural[:-1]} "{name}"')
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        query = f"?{request.query_string}" if request.query_string else ""
        async with self.session.request(request.method, f"http://127.0.0.1:{port}{tail}{query}", headers=headers,
                                        data=await request.read()) as upstream:
            return await stream_back(request, upstream, HOP_HEADERS)

    async def portforward(self, request: web.Request, ns: str, name: str) -> web.StreamResponse:
        """v4.channel.k8s.io: per port a data channel (0) and an error channel (1), each opened with
        a frame carrying the port number (little endian); then data frames prefixed by their channel."""
        port = int(request.query.get("ports", "0"))
        backend = self.backend_port("pods", ns, f"{name}:{port}")
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        await ws.send_bytes(bytes([0]) + port.to_bytes(2, "little"))
        await ws.send_bytes(bytes([1]) + port.to_bytes(2, "little"))
        if backend is None:
            await ws.send_bytes(bytes([1]) + f"pod {name} is not running".encode())
            await ws.close()
            return ws
        reader, writer = await asyncio.open_connection("127.0.0.1", backend)

        async def to_pod() -> None:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY and msg.data[:1] == b"\x00":
                    writer.write(msg.data[1:])
                    await writer.drain()
            writer.close()

        async def from_pod() -> None:
            while data := await reader.read(65536):
                await ws.send_bytes(b"\x00" + data)
            await ws.close()

        await asyncio.gather(to_pod(), from_pod(), return_exceptions=True)
        return ws
