"""What the API server's tokenizer costs per request: Qwen's real byte-level BPE (151,643 ranks, the vocabulary
Qwen2/Qwen2.5 share with Qwen 1) run through Hugging Face `tokenizers`, the Rust tokenizer vLLM uses for these
models (Qwen2TokenizerFast), with Qwen2's pre-tokenizer (NFC, the split regex, byte-level). Encodes prompts of
rising length, fits a fixed part plus a cost per token, and times the incremental detokenizer vLLM steps once
per generated token (tokenizers' DecodeStream, vLLM's FastIncrementalDetokenizer).

The ranks ship in the `dashscope` wheel (dashscope/resources/qwen.tiktoken); the tokenizer is only a
measurement tool, not a dependency of epdbench:

    pip install tokenizers && pip download --no-deps dashscope==2.0.2 -d /tmp/dashscope
    python benchmarks/serving/tokenize_cost.py --ranks /tmp/dashscope/dashscope-2.0.2-py3-none-any.whl [--repeats 30]

Prompts: the load generator's own (what epdbench sends a real server: specs.workload text) and, with --text
FILE, any natural-language file. Prints per length the median encode time, the fit, and the µs per decoded
token; hardware.tokenize_us_per_token takes the fitted slope.
"""
from __future__ import annotations

import argparse
import base64
import statistics
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from epdbench.tasks.local.qwen_vocab import bytes_to_unicode

# Qwen2's pre-tokenizer split (tokenizer.json of Qwen/Qwen2.5-*): digits one by one, letters with one leading
# non-letter, punctuation runs, newlines, spaces.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192]


def read_ranks(path: Path) -> dict[bytes, int]:
    """token bytes → rank from a .tiktoken file (base64 token, space, rank per line), or from inside a wheel."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            text = z.read("dashscope/resources/qwen.tiktoken").decode()
    else:
        text = path.read_text()
    ranks = {}
    for line in text.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[1]):
                best = (i, r)
        if best is None:
            return parts
        i = best[0]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]


def hf_tokenizer(ranks: dict[bytes, int]):
    """A `tokenizers` byte-level BPE equal to the ranks (merges recovered as Hugging Face's TikTokenConverter)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    byte = bytes_to_unicode()
    text = lambda b: "".join(byte[x] for x in b)   # noqa: E731
    vocab = {text(t): r for t, r in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            parts = _split(ranks, token, rank)
            if len(parts) == 2:
                merges.append((text(parts[0]), text(parts[1])))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def agrees_with_ranks(tok, ranks: dict[bytes, int], text: str) -> bool:
    """Whether the tokenizer's ids equal a plain rank-ordered BPE over each pre-tokenized piece of `text`."""
    unbyte = {c: b for b, c in bytes_to_unicode().items()}
    pieces = tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text))
    expected = [ranks[part] for piece, _ in pieces
                for part in _split(ranks, bytes(unbyte[c] for c in piece), len(ranks) + 1)]
    return tok.encode(text).ids == expected


def loadgen_text(words: int) -> str:
    """The load generator's prompt text of about `words` words (specs.workload, seed 0)."""
    from epdbench.specs.workload import _rng, synth_text
    return synth_text(_rng("tokenize-cost", 0), words, "0")


def cut(tok, text: str, tokens: int) -> str:
    """A prefix of `text` that tokenizes to about `tokens` tokens."""
    enc = tok.encode(text)
    if len(enc.ids) <= tokens:
        return text
    return text[: enc.offsets[tokens - 1][1]]


def time_encode(tok, text: str, repeats: int) -> float:
    tok.encode(text)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        tok.encode(text)
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(samples)


def time_decode_stream(tok, ids: list[int], repeats: int) -> float:
    """µs per DecodeStream.step, the median over `repeats` passes over `ids`."""
    from tokenizers.decoders import DecodeStream
    per = []
    for _ in range(repeats):
        stream = DecodeStream(skip_special_tokens=True)
        t0 = time.perf_counter_ns()
        for i in ids:
            stream.step(tok, i)
        per.append((time.perf_counter_ns() - t0) / 1e3 / len(ids))
    return statistics.median(per)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", required=True, type=Path, help="qwen.tiktoken, or the dashscope wheel holding it")
    ap.add_argument("--text", type=Path, default=None, help="a natural-language file to tokenize as well")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    if not args.ranks.exists():
        raise SystemExit(f"{args.ranks}: no such file (see the usage at the top of this script)")
    t0 = time.monotonic()
    ranks = read_ranks(args.ranks)
    tok = hf_tokenizer(ranks)
    print(f"# {len(ranks)} ranks; tokenizer built in {time.monotonic() - t0:.1f} s; tokenizers "
          f"{__import__('tokenizers').__version__}; {args.repeats} repeats per point, median")
    sources = {"load generator prompts": loadgen_text(2 * max(LENGTHS))}
    if args.text:
        sources[args.text.name] = args.text.read_text(errors="replace")
    hello = tok.encode("Hello world").ids
    same = all(agrees_with_ranks(tok, ranks, text[:20000]) for text in sources.values())
    print(f"# check: 'Hello world' -> {hello} (Qwen2: [9707, 1879]); equal to a plain rank-BPE over the first 20,000 "
          f"characters of each text: {same}")
    if hello != [9707, 1879] or not same:
        raise SystemExit("the tokenizer built from the ranks is not Qwen's: not measuring it")
    for name, text in sources.items():
        xs, ys = [], []
        print(f"\n{name}:\n  {'tokens':>7} {'encode µs':>10} {'µs/token':>9}")
        for n in LENGTHS:
            piece = cut(tok, text, n)
            got = len(tok.encode(piece).ids)
            if got < n * 0.9:
                print(f"  {n:>7}: the text has only {got} tokens")
                continue
            us = time_encode(tok, piece, args.repeats)
            xs.append(got)
            ys.append(us)
            print(f"  {got:>7} {us:>10.1f} {us / got:>9.3f}")
        if len(xs) >= 2:
            slope, fixed = np.polyfit(xs, ys, 1)
            print(f"  fit: {fixed:.1f} µs + {slope:.3f} µs/token")
        ids = tok.encode(cut(tok, text, 512)).ids
        print(f"  incremental detokenizer (DecodeStream.step): {time_decode_stream(tok, ids, args.repeats):.2f} "
              f"µs/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
