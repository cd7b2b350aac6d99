"""MooncakeConnector's PD protocol, as a router speaks it to real vLLM engines (0.26, distributed/kv_transfer/
kv_connector/v1/mooncake/): what the proxy (sim/proxy.py, `--kv-connector mooncake`) puts in each leg's
kv_transfer_params.

- The router makes the transfer id and gives it to both legs: the prefill leg carries `do_remote_decode: true` and
  `transfer_id` (mooncake_connector.py:798-804: without it the prefill logs "Missing transfer_id in
  kv_transfer_params from router!" and holds no KV for the decode); the decode leg carries `do_remote_prefill:
  true`, the same `transfer_id`, `remote_engine_id` and `remote_bootstrap_addr` (772-796: without all three the
  decode logs "Got invalid KVTransferParams" and prefills the prompt itself; 455-463 read them).
- The prefill answers no kv_transfer_params (`request_finished` returns `delay_free_blocks, None`, 892), unlike
  NixlConnector: the router learns the prefill's engine id from the prefill's bootstrap server, `GET
  http://HOST:VLLM_MOONCAKE_BOOTSTRAP_PORT/query` -> `{dp_rank: {"engine_id": ..., "worker_addr": {...}}}`
  (mooncake_utils.py `MooncakeBootstrapServer.query`), as vLLM's own Mooncake proxy does
  (examples/.../mooncake_connector/mooncake_connector_proxy.py `get_prefiller_info`), and hands the decode that
  server's address, which the decode queries itself for the prefill's workers (`_connect_to_prefiller_bootstrap`,
  1905: `remote_bootstrap_addr + "/query"`, so a URL with its scheme).
- The prefill keeps the blocks for the decode only when it stopped at its one-token cap: `request_finished` sends
  them only for FINISHED_LENGTH_CAPPED (876-879), i.e. finish_reason `length`. A prefill that stopped otherwise
  (its first token an end of sequence) holds nothing, and a decode sent to pull it would wait
  VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (480 s) for blocks that never come: that decode gets no kv_transfer_params
  and prefills the prompt itself (the stage verdict sees it).
- Either leg may come first (the prefill's `send_kv_to_decode` makes the transfer's entry when the decode asks
  first, 1253; `record_send_reqs` when the prefill finishes first, 2000): the proxy sends the prefill leg first and
  waits for it, as it does for NIXL, so a failed prefill stops the request before a decode waits on it.
Mooncake 0.3.14's own `vllm_v1_proxy_server.py` is a copy of vLLM's NIXL toy proxy (no transfer id, decode params
from the prefill's answer): it cannot drive this connector.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp

DP_RANK = "0"      # the local target runs one data-parallel rank per engine


class BootstrapError(RuntimeError):
    """A prefill's bootstrap server did not name its engine; the message says which and why."""


def prefill_params(transfer_id: str) -> dict:
    """The prefill leg's kv_transfer_params (NixlConnector's prefill takes the same)."""
    return {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}


def decode_params(transfer_id: str, bootstrap_addr: str, engine_id: str) -> dict:
    """The decode leg's kv_transfer_params: pull the KV the prefill engine `engine_id` holds for `transfer_id`."""
    return {"do_remote_decode": False, "do_remote_prefill": True, "transfer_id": transfer_id,
            "remote_engine_id": engine_id, "remote_bootstrap_addr": bootstrap_addr}


def holds_kv(prefill_answer: dict) -> bool:
    """Whether the prefill stopped at its length cap, the only finish after which it keeps the KV for a decode."""
    choices = prefill_answer.get("choices") or []
    return bool(choices) and all(c.get("finish_reason") == "length" for c in choices)


def bootstrap_addr(prefill_url: str, port: int) -> str:
    """The prefill's bootstrap server as the decode reaches it: the prefill's host, the bootstrap port."""
    return f"http://{urlsplit(prefill_url).hostname}:{port}"


def engine_id_of(answer: object) -> str:
    """The engine id in a bootstrap server's /query answer (its one data-parallel rank); ValueError otherwise."""
    entry = answer.get(DP_RANK) if isinstance(answer, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("engine_id"), str):
        raise ValueError(f"no engine_id for data-parallel rank {DP_RANK} in {str(answer)[:200]}")
    return entry["engine_id"]


class Bootstraps:
    """Each prefill's bootstrap server (prefill URL -> its address), and the engine id each names, asked once."""

    def __init__(self, addrs: dict[str, str]):
        self.addrs = addrs
        self.engine_ids: dict[str, str] = {}

    async def engine_id(self, session: aiohttp.ClientSession, prefill_url: str) -> str:
        if prefill_url in self.engine_ids:
            return self.engine_ids[prefill_url]
        addr = self.addrs[prefill_url]
        try:
            async with session.get(addr + "/query", timeout=aiohttp.ClientTimeout(total=30)) as r:
                r.raise_for_status()
                engine = engine_id_of(await r.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise BootstrapError(f"prefill {prefill_url}: its Mooncake bootstrap server {addr} named no engine "
                                 f"({e})") from None
        self.engine_ids[prefill_url] = engine
        return engine
