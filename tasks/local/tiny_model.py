"""A tiny model made from code, for real vLLM engines on a CPU host: nothing downloaded, the same files every time.

From the spec's model figures, a Qwen2ForCausalLM `config.json`, a byte-level BPE `tokenizer.json` trained with
`tokenizers` on a seeded synthetic corpus (the load generator's own words among others), and a
`tokenizer_config.json` with a ChatML chat template. vLLM serves it with random weights (`--load-format dummy`):
its outputs are noise, its timings, KV and log lines are the engine's own."""
from __future__ import annotations

import json
import random
from pathlib import Path

from epdbench.specs.node import ModelSpec
from epdbench.specs.workload import WORDS

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CORPUS_SEED = 0
CORPUS_LINES = 2000
FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
# ChatML, as Qwen2's own template writes it; a message's content may be a string or a list of text parts.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class TinyModelError(ValueError):
    """The spec's model figures cannot make a Qwen2 model; the message names the field."""


def model_config(model: ModelSpec, max_position: int, vocab_size: int = VOCAB_SIZE) -> dict:
    """Hugging Face config.json of a Qwen2ForCausalLM with the spec's layers, widths and heads."""
    if model.n_heads * model.head_dim != model.hidden_size:
        raise TinyModelError(f"model.head_dim {model.head_dim}: Qwen2 derives it as hidden_size / n_heads "
                             f"({model.hidden_size} / {model.n_heads}); make them agree")
    if model.n_heads % model.n_kv_heads:
        raise TinyModelError(f"model.n_kv_heads {model.n_kv_heads} must divide model.n_heads {model.n_heads}")
    if model.dtype_bytes not in (2, 4):
        raise TinyModelError(f"model.dtype_bytes {model.dtype_bytes}: 2 (bfloat16) or 4 (float32)")
    ids = special_token_ids()
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
            "hidden_size": model.hidden_size, "intermediate_size": 4 * model.hidden_size,
            "num_hidden_layers": model.n_layers, "num_attention_heads": model.n_heads,
            "num_key_value_heads": model.n_kv_heads, "vocab_size": vocab_size,
            "max_position_embeddings": max_position, "max_window_layers": model.n_layers,
            "use_sliding_window": False, "sliding_window": None, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "tie_word_embeddings": True, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
            "torch_dtype": "bfloat16" if model.dtype_bytes == 2 else "float32",
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]}


def special_token_ids() -> dict[str, int]:
    """The trainer puts the special tokens first, in order."""
    return {t: i for i, t in enumerate(SPECIAL_TOKENS)}


def corpus(seed: int = CORPUS_SEED, lines: int = CORPUS_LINES) -> list[str]:
    """Seeded text: the load generator's words, made-up syllable words, numbers and punctuation."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    made_up = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(400)]
    out = []
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(6, 18)):
            pick = rng.random()
            words.append(rng.choice(WORDS) if pick < 0.5 else rng.choice(made_up) if pick < 0.9
                         else str(rng.randint(0, 9999)))
        out.append(" ".join(words).capitalize() + rng.choice(".!?,;:"))
    return out


def train_tokenizer(vocab_size: int = VOCAB_SIZE, seed: int = CORPUS_SEED) -> str:
    """tokenizer.json of a byte-level BPE trained on `corpus(seed)` (every byte has a token, so any text encodes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(seed), trainer)
    return tok.to_str()


def tokenizer_config(max_length: int) -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
            "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE}


def tiny_model_files(model: ModelSpec, max_model_len: int) -> dict[str, str]:
    """File name -> text of the whole model folder."""
    ids = special_token_ids()
    generation = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"], "do_sample": False}
    return {"config.json": json.dumps(model_config(model, max_model_len), indent=2),
            "tokenizer.json": train_tokenizer(),
            "tokenizer_config.json": json.dumps(tokenizer_config(max_model_len), indent=2),
            "generation_config.json": json.dumps(generation, indent=2)}


def write_tiny_model(model: ModelSpec, max_model_len: int, folder: Path) -> Path:
    """The model folder, written whole (files already there with the same text are left alone)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in tiny_model_files(model, max_model_len).items():
        path = folder / name
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
    return folder
