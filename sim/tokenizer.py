"""The simulator's tokenizer: one token per whitespace-separated word, deterministic ids.

Chat requests add the model's chat-template overhead and the image tokens of every image part.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import io
import struct
import zlib

from epdbench.specs.workload import PNG_SIGNATURE

VOCAB = 151_000


def text_tokens(text: str) -> int:
    return len(text.split())


_IDS: dict[str, int] = {}     # word -> id, for words seen before (prompts repeat a small vocabulary)
_IDS_MAX = 1 << 16


def _word_id(w: str) -> int:
    i = zlib.crc32(w.encode()) % VOCAB
    if len(_IDS) < _IDS_MAX:
        _IDS[w] = i
    return i


def token_ids(text: str) -> list[int]:
    get = _IDS.get
    return [i if (i := get(w)) is not None else _word_id(w) for w in text.split()]


def decode_data_url(url: str) -> bytes:
    if not url.startswith("data:"):
        raise ValueError("only data: URLs are accepted for images")
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise ValueError("image data URL must be base64")
    return base64.b64decode(payload)


@functools.lru_cache(maxsize=64)     # the same image is sized by every replica on a request's path, every run
def image_size(data: bytes) -> tuple[int, int]:
    """(width, height): a PNG's from its IHDR chunk, which comes first (what PIL reads too), others by PIL."""
    if data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR":
        return struct.unpack(">II", data[16:24])
    from PIL import Image
    with Image.open(io.BytesIO(data)) as im:
        return im.size


def image_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def chat_parts(messages: list[dict]) -> tuple[str, list[bytes]]:
    """Concatenated text and raw image bytes of OpenAI chat messages."""
    texts: list[str] = []
    images: list[bytes] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    texts.append(part.get("text", ""))
                elif part.get("type") == "image_url":
                    url = part.get("image_url", {})
                    url = url.get("url") if isinstance(url, dict) else url
                    images.append(decode_data_url(url or ""))
    return " ".join(texts), images


def image_end_positions(images: list[tuple[str, int]], chat_overhead: int) -> list[int]:
    """Where each image's placeholder tokens end in a chat prompt built by prompt_ids: an image whose
    end lies inside the cached prefix needs no encoder work (its KV is already there)."""
    pos, out = chat_overhead * 2 // 3, []
    for _, n in images:
        pos += n
        out.append(pos)
    return out


def placeholder_ids(digest: str, n: int) -> list[int]:
    """The `n` placeholder token ids of an image: each the whole hex digest as one integer, so every KV block
    that holds any of the image's tokens — the one it starts in too, shared with the template — is keyed by
    the image, as vLLM keys such blocks by the image hash (extra keys of the block hash), and a prefix-cache
    hit can cover only the same image. (Ids of 16 bits of the digest each let two different images of a few
    hundred share the block they start in: a false 16-token hit.)"""
    return [int(digest, 16)] * n


def prompt_ids(text: str, images: list[tuple[str, int]], chat: bool, chat_overhead: int) -> list[int]:
    """Token ids of a prompt: for chat, the template's opening tokens, each image's placeholder tokens
    (ids derived from the image hash, so the same image gives the same ids), the text, the template's
    closing tokens."""
    if not chat:
        return token_ids(text)
    opening = chat_overhead * 2 // 3
    ids = list(range(VOCAB - chat_overhead, VOCAB - chat_overhead + opening))
    for digest, n in images:
        ids += placeholder_ids(digest, n)
    ids += token_ids(text)
    ids += list(range(VOCAB - chat_overhead + opening, VOCAB))
    return ids
