"""sim/proxy.py with `--kv-connector mooncake`: MooncakeConnector's PD protocol (vLLM 0.26) over real HTTP on loopback,
against fake engines answering as 0.26's do — the prefill with no kv_transfer_params, its bootstrap server with its
engine id (`GET /query`, mooncake_utils.py) — and the proxy started from the command line the local target gives it."""
import asyncio
import sys
import time
import urllib.request

from aiohttp import web

from epdbench.sim.mooncake_pd import bootstrap_addr, engine_id_of
from epdbench.sim.proxy import Proxy, main
from epdbench.specs.commands import BUILTIN_ROUTER_MODULE, builtin_router_args
from tests.sim.fake_engines import Served, engine, port, post

ENGINE_ID = "8c5e7f0a-prefill-0"
LENGTH = {"choices": [{"message": {"content": "x"}, "finish_reason": "length"}]}     # stopped at max_tokens 1


def bootstrap(asked: list) -> web.Application:
    """A prefill's bootstrap server (MooncakeBootstrapServer.query: dp rank -> engine id and worker addresses)."""
    async def query(request):
        asked.append(request.path)
        return web.json_response({"0": {"engine_id": ENGINE_ID, "worker_addr": {"0": {"0": "tcp://127.0.0.1:20149"}}}})
    app = web.Application()
    app.router.add_get("/query", query)
    return app


async def served_pd(prefill_answer: dict, with_bootstrap: bool = True) -> tuple[Served, dict, list, list]:
    seen, asked, served = [], [], Served()
    urls = {role: await served.start(engine(role, seen, answer))
            for role, answer in (("prefill", prefill_answer), ("decode", {}))}
    boot = port()
    if with_bootstrap:
        await served.start(bootstrap(asked), at=boot)
    urls["bootstrap"] = bootstrap_addr(urls["prefill"], boot)
    return served, urls, seen, asked


async def pd(prefill_answer: dict, n: int = 2, with_bootstrap: bool = True) -> tuple[list, list, list, dict]:
    served, urls, seen, asked = await served_pd(prefill_answer, with_bootstrap)
    proxy = await served.start_proxy(Proxy([], [], [urls["prefill"]], [urls["decode"]],
                                           mooncake={urls["prefill"]: urls["bootstrap"]}))
    answers = [await post(proxy, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False,
                                  "max_completion_tokens": 64, "request_id": f"req-{i}"}) for i in range(n)]
    await served.close()
    return seen, asked, answers, urls


def test_each_leg_carries_what_mooncake_connector_reads_and_one_transfer_id():
    seen, asked, answers, urls = asyncio.run(pd(LENGTH))
    assert [status for status, _ in answers] == [200, 200]
    assert [(role, rid) for role, rid, _ in seen] == [("prefill", "req-0"), ("decode", "req-0"),
                                                      ("prefill", "req-1"), ("decode", "req-1")]
    prefill, decode = seen[0][2], seen[1][2]
    xfer = prefill["kv_transfer_params"]["transfer_id"]
    assert prefill["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": xfer}
    assert (prefill["max_tokens"], prefill["stream"]) == (1, False) and "max_completion_tokens" not in prefill
    assert decode["kv_transfer_params"] == {"do_remote_decode": False, "do_remote_prefill": True, "transfer_id": xfer,
                                            "remote_engine_id": ENGINE_ID, "remote_bootstrap_addr": urls["bootstrap"]}
    assert urls["bootstrap"].startswith("http://127.0.0.1:")      # the decode appends /query to it itself
    assert decode["max_completion_tokens"] == 64
    assert seen[2][2]["kv_transfer_params"]["transfer_id"] != xfer         # one per request
    assert asked == ["/query"]                                             # the engine id asked once


def test_a_prefill_that_stopped_before_its_cap_holds_no_kv_so_the_decode_prefills_itself():
    stopped = {"choices": [{"message": {"content": ""}, "finish_reason": "stop"}]}
    seen, _, answers, _ = asyncio.run(pd(stopped, n=1))
    assert answers[0][0] == 200 and seen[1][0] == "decode" and seen[1][2]["kv_transfer_params"] is None


def test_no_bootstrap_server_fails_the_request_before_the_prefill_holds_any_kv():
    seen, _, answers, urls = asyncio.run(pd(LENGTH, n=1, with_bootstrap=False))
    status, body = answers[0]
    assert status == 502 and seen == []
    assert body["error"]["message"].startswith(f"prefill {urls['prefill']}: its Mooncake bootstrap server "
                                               f"{urls['bootstrap']} named no engine (")


def test_the_engine_id_is_read_from_the_one_data_parallel_rank():
    assert engine_id_of({"0": {"engine_id": "e", "worker_addr": {}}}) == "e"
    for bad in ({}, {"1": {"engine_id": "e"}}, {"0": {"worker_addr": {}}}, ["e"]):
        try:
            engine_id_of(bad)
        except ValueError as e:
            assert str(e).startswith("no engine_id for data-parallel rank 0 in ")
        else:
            raise AssertionError(bad)


def test_prefills_without_their_bootstrap_ports_are_refused_in_one_line(capsys):
    assert main(["--port", "1", "--kv-connector", "mooncake", "--prefill", "http://p", "--decode", "http://d"]) == 2
    assert main(["--port", "1", "--prefill", "http://p", "13321", "--decode", "http://d"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "give each prefill as --prefill URL BOOTSTRAP_PORT with --kv-connector mooncake, else as --prefill URL"] * 2


async def through_the_command_line() -> tuple[list, list, int]:
    served, urls, seen, asked = await served_pd(LENGTH)
    boot = int(urls["bootstrap"].rsplit(":", 1)[1])
    at = port()
    args = builtin_router_args(host="127.0.0.1", port=at, engines=[("prefill", urls["prefill"]),
                                                                    ("decode", urls["decode"])],
                               kv_connector="mooncake", bootstrap_ports={urls["prefill"]: boot})
    proc = await asyncio.create_subprocess_exec(sys.executable, "-P", "-m", BUILTIN_ROUTER_MODULE, *args)
    try:
        deadline = time.monotonic() + 60
        while not await asyncio.to_thread(healthy, f"http://127.0.0.1:{at}/health"):
            assert time.monotonic() < deadline and proc.returncode is None
            await asyncio.sleep(0.1)
        status, _ = await post(f"http://127.0.0.1:{at}", {"model": "m", "messages": [], "request_id": "r-1"})
    finally:
        proc.terminate()
        await proc.wait()
        await served.close()
    return seen, args, status


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def test_the_local_targets_command_line_starts_a_proxy_that_speaks_it():
    seen, args, status = asyncio.run(through_the_command_line())
    assert args[4:7] == ["--kv-connector", "mooncake", "--prefill"] and args[8].isdigit()
    assert status == 200 and [s[0] for s in seen] == ["prefill", "decode"]
    assert seen[1][2]["kv_transfer_params"]["remote_engine_id"] == ENGINE_ID
