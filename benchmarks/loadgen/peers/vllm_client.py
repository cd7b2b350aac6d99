"""vLLM's benchmark client request loop, driven as `vllm bench serve` drives it, for benchmarks/loadgen/loadgen.py.

Runs inside the peer's own virtual environment (benchmarks/loadgen/loadgen.py --peer vllm sets it up): loads
vllm/benchmarks/lib/endpoint_request_func.py from the vllm wheel (the file alone; it imports only aiohttp,
regex and tqdm), makes the session as vllm/benchmarks/serve.py does (TCPConnector limit = concurrency) and
sends N requests through an asyncio.Semaphore(concurrency), all tasks created up front. Prints one JSON
line: wall seconds, CPU seconds of this process, and per request its id and the receipt time of every
token chunk (start + ttft, then + each itl, perf_counter ns — CLOCK_MONOTONIC, comparable with the server's).

    python vllm_client.py --module PATH --url URL --concurrency C --requests N --max-tokens T --first-id K
"""
import argparse
import asyncio
import importlib.util
import json
import time

import aiohttp


def load(path: str):
    spec = importlib.util.spec_from_file_location("endpoint_request_func", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def run(a) -> dict:
    erf = load(a.module)
    connector = aiohttp.TCPConnector(limit=a.concurrency, limit_per_host=a.concurrency, ttl_dns_cache=300,
                                     use_dns_cache=True, keepalive_timeout=60, enable_cleanup_closed=True,
                                     force_close=False, ssl=False)
    session = aiohttp.ClientSession(connector=connector, trust_env=True,
                                    timeout=aiohttp.ClientTimeout(total=6 * 60 * 60))
    semaphore = asyncio.Semaphore(a.concurrency)
    prompt = "benchmark prompt alpha bravo charlie"

    async def limited(i: int):
        inp = erf.RequestFuncInput(prompt=prompt, api_url=a.url + "/v1/completions", prompt_len=5,
                                   output_len=a.max_tokens, model="bench-model", request_id=f"vllm-{a.first_id + i}")
        async with semaphore:
            return inp.request_id, await erf.async_request_openai_completions(inp, session)

    cpu0, t0 = time.process_time(), time.perf_counter()
    outs = await asyncio.gather(*(asyncio.create_task(limited(i)) for i in range(a.requests)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await session.close()
    reqs = []
    for rid, o in outs:
        stamps = []
        if o.success:
            t = o.start_time + o.ttft
            stamps.append(int(t * 1e9))
            for gap in o.itl:
                t += gap
                stamps.append(int(t * 1e9))
        reqs.append({"id": rid, "ok": o.success, "stamps": stamps})
    return {"wall": wall, "cpu": cpu, "requests": reqs}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for flag in ("--module", "--url"):
        p.add_argument(flag, required=True)
    for flag in ("--concurrency", "--requests", "--max-tokens", "--first-id"):
        p.add_argument(flag, type=int, required=True)
    print(json.dumps(asyncio.run(run(p.parse_args()))))
