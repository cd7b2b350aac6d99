"""What vLLM's API server spends per generated token on its way to the client, measured by running vLLM's own
code: for each engine step, the EngineCoreOutputs msgpack-decoded as the API server receives them from the
engine core (vllm.v1.serial_utils.MsgpackDecoder), processed by the OutputProcessor (incremental
detokenization, the RequestOutput, the hand-off to each request's RequestOutputCollector) as AsyncLLM's output
handler does, then each request's chat completion stream generator (vllm.entrypoints.openai.chat_completion
.serving.OpenAIServingChat.chat_completion_stream_generator: the delta, the pydantic chunk, its JSON and the SSE
frame) fed as AsyncLLM.generate feeds it — all on one asyncio event loop, as in the API server process. What
is not in it: writing the frame to the socket (uvicorn/starlette), and the engine core's own output encoding
(another process).

hardware.output_us_per_token takes the per-token figure at the batch sizes a replica streams to (it is flat
in the batch size: see the printed table).

vLLM (CPU import only, no GPU needed) runs in its own virtual environment under
~/.cache/epdbench/peers/vllm-full-<version>/ (created on first use: `pip install vllm==<version>`, about 8 GB
with its CUDA wheels). The tokenizer is Qwen's byte-level BPE from the dashscope wheel
(benchmarks/serving/tokenize_cost.py), wrapped as the PreTrainedTokenizerFast vLLM detokenizes with:

    pip download --no-deps dashscope==2.0.2 -d /tmp/dashscope
    python benchmarks/serving/output_cost.py --ranks /tmp/dashscope/dashscope-2.0.2-py3-none-any.whl \
        [--batch 1 8 64 256] [--tokens 64] [--repeats 5]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "epdbench" / "peers"
VLLM_VERSION = "0.33.0"


def peer_python() -> Path:
    """The interpreter of the venv with vLLM installed; created on first use."""
    home = PEERS / f"vllm-full-{VLLM_VERSION}"
    python = home / "bin" / "python"
    if not python.exists():
        print(f"setting up {home} (once: pip install vllm=={VLLM_VERSION}) ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"vllm=={VLLM_VERSION}"], check=True)
    return python


def tokenizer(ranks: Path):
    """Qwen's BPE (benchmarks/serving/tokenize_cost.py) as the transformers fast tokenizer vLLM's detokenizer
    expects."""
    from transformers import PreTrainedTokenizerFast
    sys.path.insert(0, str(HERE))
    from tokenize_cost import hf_tokenizer, read_ranks
    return PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer(read_ranks(ranks)))


def generated_ids(tok, n: int) -> list[int]:
    """Token ids of English text: what a model streams back (each request cycles through them)."""
    text = (HERE.parents[1] / "README.md").read_text()
    ids = tok(text)["input_ids"]
    return ids[:n] if len(ids) >= n else (ids * (n // len(ids) + 1))[:n]


def serving_chat():
    """vLLM's OpenAIServingChat with only what its stream generator reads (no engine, no model config): no
    reasoning or tool parser, no logging, default usage options."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    s = OpenAIServingChat.__new__(OpenAIServingChat)
    s.parser_cls, s.enable_auto_tools, s.enable_force_include_usage = None, False, False
    s.enable_log_deltas, s.enable_log_outputs, s.enable_per_request_metrics = True, False, False
    s.enable_prompt_tokens_details, s.request_logger, s.system_fingerprint = False, None, None
    s.response_role = "assistant"
    s._include_reasoning_tokens_details = False      # no reasoning parser
    s.default_chat_template_kwargs = None
    s.return_tokens_as_token_ids = False
    return s


async def one_run(tok, batch: int, tokens: int, ids: list[int]) -> tuple[float, float, float]:
    """Seconds spent on the API server's loop per generated token: total, of which output handling (decode and
    OutputProcessor), of which the stream generators."""
    from vllm import SamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    processor = OutputProcessor(tok, log_stats=False)
    serving = serving_chat()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    prompt = ids[:512]
    rids = [f"chatcmpl-{i}" for i in range(batch)]
    chunks = 0
    consumed = asyncio.Event()
    expected = 0

    async def outputs(q):                    # AsyncLLM.generate's loop
        finished = False
        while not finished:
            out = q.get_nowait() or await q.get()
            finished = out.finished
            yield out

    async def client(rid: str, q) -> None:   # the response writer, minus the socket
        nonlocal chunks
        request = ChatCompletionRequest(**body)
        async for frame in serving.chat_completion_stream_generator(
                request, outputs(q), rid, "m", [], tok, RequestResponseMetadata(request_id=rid)):
            chunks += 1
            frames_of[rid].append(frame)
            if chunks >= expected:
                consumed.set()

    tasks, frames_of = [], {rid: [] for rid in rids}
    for rid in rids:
        params = SamplingParams(max_tokens=tokens, output_kind=RequestOutputKind.DELTA)
        req = EngineCoreRequest(request_id=rid, prompt_token_ids=prompt, mm_features=None, sampling_params=params,
                                pooling_params=None, arrival_time=time.time(), lora_request=None, cache_salt=None,
                                data_parallel_rank=None, external_req_id=rid)
        q = RequestOutputCollector(RequestOutputKind.DELTA, rid)
        processor.add_request(req, None, None, 0, q)
        tasks.append(asyncio.create_task(client(rid, q)))
    await asyncio.sleep(0)
    enc, dec = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
    frames = []
    for k in range(tokens):
        last = k == tokens - 1
        step = EngineCoreOutputs(outputs=[EngineCoreOutput(rid, [ids[(k + i) % len(ids)]],
                                                           finish_reason=FinishReason.LENGTH if last else None)
                                          for i, rid in enumerate(rids)])
        frames.append(enc.encode(step))
    handling = serving_s = 0.0
    t0 = time.perf_counter()
    for k, frame in enumerate(frames):
        a = time.perf_counter()
        step = dec.decode(frame)
        processor.process_outputs(step.outputs, time.monotonic())
        b = time.perf_counter()
        # every request's generator turns its output into a chunk before the next step's outputs come
        # (first step: also the role chunk; last: also the finish and usage chunks and [DONE])
        expected = batch * (k + 1) + batch * (1 if k == 0 else 0)
        consumed.clear()
        if chunks < expected:
            await consumed.wait()
        serving_s += time.perf_counter() - b
        handling += b - a
    await asyncio.gather(*tasks)
    total = time.perf_counter() - t0
    check(frames_of, tokens)
    n = batch * tokens
    return total / n, handling / n, serving_s / n


def check(frames_of: dict[str, list[str]], tokens: int) -> None:
    """Each request streamed a role chunk, one chunk with text per token, the usage and [DONE]."""
    import json
    for rid, frames in frames_of.items():
        body = [json.loads(f[len("data: "):]) for f in frames if f.startswith("data: {")]
        texts = [c["choices"][0]["delta"].get("content") for c in body if c.get("choices")]
        usage = body[-1].get("usage") or {}
        if (frames[-1] != "data: [DONE]\n\n" or sum(bool(t) for t in texts) < tokens * 0.9
                or usage.get("completion_tokens") != tokens):
            raise SystemExit(f"{rid}: not what vLLM streams ({len(frames)} frames, usage {usage})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", required=True, type=Path, help="qwen.tiktoken, or the dashscope wheel holding it")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--tokens", type=int, default=64, help="tokens each request generates")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    try:
        import vllm
    except ImportError:
        return subprocess.run([str(peer_python()), __file__, *sys.argv[1:]]).returncode
    tok = tokenizer(args.ranks)
    ids = generated_ids(tok, 4096)
    print(f"vLLM {vllm.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.tokens} tokens "
          f"per request, median of {args.repeats} runs (first run of each batch discarded as warm-up)")
    print(f"{'batch':>6} {'µs/token':>9} {'min':>7} {'max':>7} {'output handler':>15} {'stream generator':>17}")
    for batch in args.batch:
        asyncio.run(one_run(tok, batch, args.tokens, ids))
        runs = [asyncio.run(one_run(tok, batch, args.tokens, ids)) for _ in range(args.repeats)]
        total = [r[0] * 1e6 for r in runs]
        print(f"{batch:>6} {statistics.median(total):>9.1f} {min(total):>7.1f} {max(total):>7.1f} "
              f"{statistics.median(r[1] * 1e6 for r in runs):>15.1f} "
              f"{statistics.median(r[2] * 1e6 for r in runs):>17.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
