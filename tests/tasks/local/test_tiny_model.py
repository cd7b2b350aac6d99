"""tasks/local/tiny_model.py: the tiny model the local target serves on a CPU host, made from the spec's figures, the
same files on every run, without vLLM."""
import json

from jinja2.sandbox import ImmutableSandboxedEnvironment
import pytest
from tokenizers import Tokenizer

from epdbench.specs.models import load_spec
from epdbench.specs.workload import WORDS
from epdbench.tasks.local.tiny_model import (CHAT_TEMPLATE, SPECIAL_TOKENS, VOCAB_SIZE, TinyModelError, model_config,
                                       tiny_model_files, train_tokenizer, write_tiny_model)


@pytest.fixture(scope="module")
def spec():
    return load_spec("cpu-tiny")


def test_the_config_is_a_qwen2_with_the_specs_figures(spec):
    c = model_config(spec.model, spec.engine.max_model_len)
    assert c["architectures"] == ["Qwen2ForCausalLM"] and c["model_type"] == "qwen2"
    m = spec.model
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]) == \
        (m.hidden_size, m.n_layers, m.n_heads, m.n_kv_heads)
    assert c["hidden_size"] // c["num_attention_heads"] == m.head_dim     # Qwen2 derives the head width
    assert c["vocab_size"] == VOCAB_SIZE and c["max_position_embeddings"] == spec.engine.max_model_len
    assert c["torch_dtype"] == "bfloat16" and c["eos_token_id"] == SPECIAL_TOKENS.index("<|im_end|>")


def test_figures_qwen2_cannot_hold_are_one_line_naming_the_field(spec):
    with pytest.raises(TinyModelError, match=r"^model.head_dim 64: Qwen2 derives it as hidden_size / n_heads"):
        model_config(spec.model.model_copy(update={"head_dim": 64}), 1024)
    with pytest.raises(TinyModelError, match=r"^model.n_kv_heads 3 must divide model.n_heads 4"):
        model_config(spec.model.model_copy(update={"n_kv_heads": 3}), 1024)


def test_the_tokenizer_is_the_same_every_time_and_encodes_any_text():
    first = train_tokenizer()
    assert train_tokenizer() == first
    tok = Tokenizer.from_str(first)
    assert tok.get_vocab_size() == VOCAB_SIZE
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    words = "".join(f" {w}" for w in WORDS)
    assert len(tok.encode(words).ids) == len(WORDS)      # the load generator's words (after a space): a token each
    text = "Ünïcode, 12345 and émojis 🙂 still encode byte by byte"
    assert tok.decode(tok.encode(text).ids) == text


def test_the_chat_template_renders_string_and_text_part_messages():
    template = ImmutableSandboxedEnvironment().from_string(CHAT_TEMPLATE)
    plain = template.render(messages=[{"role": "user", "content": "alpha bravo"}], add_generation_prompt=True)
    assert plain == "<|im_start|>user\nalpha bravo<|im_end|>\n<|im_start|>assistant\n"
    parts = [{"type": "text", "text": "alpha "}, {"type": "image_url", "image_url": {"url": "x"}},
             {"type": "text", "text": "bravo"}]
    assert template.render(messages=[{"role": "user", "content": parts}], add_generation_prompt=False) == \
        "<|im_start|>user\nalpha bravo<|im_end|>\n"


def test_the_model_folder_is_written_once_and_left_alone_after(spec, tmp_path):
    folder = write_tiny_model(spec.model, spec.engine.max_model_len, tmp_path / "m")
    files = tiny_model_files(spec.model, spec.engine.max_model_len)
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    write_tiny_model(spec.model, spec.engine.max_model_len, folder)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
