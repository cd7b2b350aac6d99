"""Reach a configuration from outside the cluster: a loopback URL per router and per pod, so the load
generator and the metrics scraper use plain HTTP and never hold cluster credentials.

service-proxy: a loopback relay to the API server's proxy subresources of one namespace (what
`kubectl proxy` does, limited to services/*/proxy and pods/*/proxy), streaming responses as they come.
It holds the runner's credentials, so it lets no one else in: every URL carries a per-run random token,
only GET and POST reach it, and the path is decoded (repeatedly, so double encoding cannot hide a `..`)
and checked as the API server will read it — no dot segments, no empty segments, only this namespace's
service and pod proxies, only the engine endpoints the pipeline calls — before that exact path is sent.
port-forward: one loopback listener per pod; every accepted connection gets its own port-forward stream.
"""
from __future__ import annotations

import asyncio
import hmac
import re
import secrets
import socket
import ssl
import threading
import urllib.parse

import aiohttp
from aiohttp import web
from yarl import URL

from epdbench.relay import stream_back
from epdbench.tasks.k8s.api import KubeApi

DROPPED_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding",
                   "content-encoding", "authorization"}
START_TIMEOUT_S = 10
ACCEPT_POLL_S = 0.5
CHUNK_BYTES = 65536
BRIDGE_DRAIN_S = 30


def ssl_context(cfg) -> ssl.SSLContext | bool:
    """TLS settings of the kubernetes client configuration, for aiohttp (True: defaults; http needs none)."""
    if not cfg.host.startswith("https"):
        return True
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx


METHODS = ("GET", "POST")
# What the pipeline calls on a router or an engine: serving, the probe, tokenizer calibration, metrics; and the
# spans of the trace collector beside the router (tasks.k8s.incluster_traces).
ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize", "/v1/spans")
_NAME = r"(?:https?:)?[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?(?::[a-z0-9-]+)?"
_DECODE_ROUNDS = 4


class RelayRefused(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def proxy_path_pattern(namespace: str) -> re.Pattern:
    return re.compile(rf"^/api/v1/namespaces/{re.escape(namespace)}/(services|pods)/{_NAME}/proxy"
                      rf"(?P<tail>{'|'.join(re.escape(e) for e in ENDPOINTS)})$")


def checked_proxy_path(raw_path: str, namespace: str) -> str:
    """The exact path to send to the API server for `raw_path` (as received, still percent-encoded), or
    RelayRefused. The check runs on the path as the API server will read it: fully decoded, dot segments
    and empty segments refused rather than removed, then matched whole against this namespace's proxies."""
    decoded = raw_path
    for _ in range(_DECODE_ROUNDS):
        once = urllib.parse.unquote(decoded, errors="strict")
        if once == decoded:
            break
        decoded = once
    else:
        raise RelayRefused(400, "path is encoded too many times")
    if "\\" in decoded or any(ord(c) < 0x20 for c in decoded):
        raise RelayRefused(400, "path holds a backslash or a control character")
    segments = decoded.split("/")[1:]
    if any(seg in ("", ".", "..") for seg in segments):
        raise RelayRefused(400, "path holds a dot or empty segment")
    if not proxy_path_pattern(namespace).match(decoded):
        raise RelayRefused(403, f"only {', '.join(ENDPOINTS)} of service and pod proxies in namespace "
                                f"{namespace} are relayed")
    return urllib.parse.quote(decoded, safe="/:")


class ServiceProxyAccess:
    def __init__(self, api: KubeApi):
        self.api = api
        self.token = secrets.token_urlsafe(24)   # per run: the listener answers nobody without it
        self.base_url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="epdbench-service-proxy", daemon=True)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    def start(self) -> "ServiceProxyAccess":
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=START_TIMEOUT_S)
        self.base_url = f"http://127.0.0.1:{port}/{self.token}"
        return self

    def router_url(self, service: str, pod: str, port: int) -> str:
        return f"{self.base_url}/api/v1/namespaces/{self.api.namespace}/services/{service}:{port}/proxy"

    def pod_url(self, pod: str, port: int) -> str:
        return f"{self.base_url}/api/v1/namespaces/{self.api.namespace}/pods/{pod}:{port}/proxy"

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=START_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=START_TIMEOUT_S)

    async def _serve(self) -> int:
        connector = aiohttp.TCPConnector(limit=0, ssl=ssl_context(self.api.client.configuration))
        self._session = aiohttp.ClientSession(connector=connector,
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        app = web.Application(client_max_size=256 * 1024 ** 2)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return self._runner.addresses[0][1]

    async def _shutdown(self) -> None:
        if self._runner:
            await self._runner.cleanup()
        if self._session:
            await self._session.close()

    def _upstream_url(self, request: web.Request) -> URL:
        """The API server URL of an allowed request, or RelayRefused."""
        raw = request.raw_path.split("?", 1)
        token, _, rest = raw[0].lstrip("/").partition("/")
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            raise RelayRefused(401, "this relay serves one epdbench run; its URLs carry the run's token")
        if request.method not in METHODS:
            raise RelayRefused(405, f"only {' and '.join(METHODS)} are relayed")
        path = checked_proxy_path("/" + rest, self.api.namespace)
        query = f"?{raw[1]}" if len(raw) > 1 and raw[1] else ""
        return URL(self.api.host.rstrip("/") + path + query, encoded=True)

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        try:
            url = self._upstream_url(request)
        except RelayRefused as e:
            return web.Response(status=e.status, text=f"refused: {e.reason}\n")
        except UnicodeDecodeError:
            return web.Response(status=400, text="refused: path is not valid UTF-8 once decoded\n")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED_HEADERS}
        headers.update(self.api.auth_headers())
        try:
            async with self._session.request(request.method, url, headers=headers,
                                             data=await request.read()) as upstream:
                return await stream_back(request, upstream, DROPPED_HEADERS)
        except aiohttp.ClientError as e:
            return web.Response(status=502, text=f"API server unreachable: {e}\n")


def pump(src, dst) -> None:
    """Copy bytes until src ends, then half-close dst."""
    try:
        while data := src.recv(CHUNK_BYTES):
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class PodForwarder:
    def __init__(self, api: KubeApi, pod: str, port: int):
        self.api, self.pod, self.port = api, pod, port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(ACCEPT_POLL_S)
        self.local_port = self.listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept_loop, name=f"epdbench-forward-{pod}", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._bridge, args=(conn,), daemon=True).start()

    def _bridge(self, conn: socket.socket) -> None:
        conn.settimeout(None)
        try:
            remote = self.api.port_forward(self.pod, self.port).socket(self.port)
        except Exception:  # noqa: BLE001 - a refused stream closes this one connection, like kubectl does
            conn.close()
            return
        back = threading.Thread(target=pump, args=(remote, conn), daemon=True)
        back.start()
        pump(conn, remote)
        back.join(timeout=BRIDGE_DRAIN_S)
        conn.close()
        remote.close()

    def close(self) -> None:
        self._closed.set()
        self.listener.close()


class PortForwardAccess:
    def __init__(self, api: KubeApi):
        self.api = api
        self._forwarders: list[PodForwarder] = []

    def start(self) -> "PortForwardAccess":
        return self

    def router_url(self, service: str, pod: str, port: int) -> str:
        return self.pod_url(pod, port)

    def pod_url(self, pod: str, port: int) -> str:
        forwarder = PodForwarder(self.api, pod, port)
        self._forwarders.append(forwarder)
        return f"http://127.0.0.1:{forwarder.local_port}"

    def close(self) -> None:
        for forwarder in self._forwarders:
            forwarder.close()


def open_access(api: KubeApi, kind: str) -> ServiceProxyAccess | PortForwardAccess:
    access = ServiceProxyAccess(api) if kind == "service-proxy" else PortForwardAccess(api)
    return access.start()
