"""tasks/local/model_files.py: the folder the local target's engines load when it is made at run time — the tiny
model, or Qwen2.5-VL-7B's real shapes with Qwen's real tokenizer — written once, left alone after."""
import json

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from epdbench.specs.models import load_spec
from epdbench.tasks.local.model_files import ModelFilesError, made_model_folder, write_real_shapes_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return made_model_folder(load_spec("gpu-qwen25vl"), tmp_path_factory.mktemp("run"))


def test_the_real_shapes_folder_holds_every_file_vllm_reads(folder):
    assert folder.name == "real-shapes-model"
    assert sorted(p.name for p in folder.iterdir()) == [
        "chat_template.json", "config.json", "generation_config.json", "preprocessor_config.json",
        "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((folder / "config.json").read_text())["vision_config"]["out_hidden_size"] == 3584
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.token_to_id("<|image_pad|>") == json.loads((folder / "config.json").read_text())["image_token_id"]


def test_the_chat_template_adds_about_the_specs_chat_tokens_around_a_message_with_an_image(folder):
    spec = load_spec("gpu-qwen25vl")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    template = ImmutableSandboxedEnvironment().from_string(
        json.loads((folder / "tokenizer_config.json").read_text())["chat_template"])
    parts = [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "alpha bravo charlie"}]
    ids = tok.encode(template.render(messages=[{"role": "user", "content": parts}], add_generation_prompt=True)).ids
    overhead = len(ids) - len(tok.encode("alpha bravo charlie").ids) - ids.count(151655)
    assert overhead == 21            # system message, roles, vision markers (WORKLOADS.md measured about 23)
    assert abs(overhead - spec.model.chat_overhead_tokens) <= 2


def test_a_second_write_leaves_the_files_alone(folder):
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    write_real_shapes_model(load_spec("gpu-qwen25vl"), folder)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before


def test_what_is_made_follows_the_spec(tmp_path):
    assert made_model_folder(load_spec("cpu-tiny"), tmp_path).name == "tiny-model"
    data = load_spec("cpu-tiny")
    plain = data.model_copy(update={"target": data.target.model_copy(
        update={"local": data.target.local.model_copy(update={"tiny_model": False})})})
    assert made_model_folder(plain, tmp_path / "none") is None


def test_a_model_it_cannot_make_is_one_line(tmp_path):
    spec = load_spec("gpu-qwen25vl")
    other = spec.model_copy(update={"model": spec.model.model_copy(update={"name": "org/other"})})
    with pytest.raises(ModelFilesError, match=r"^target.local.model_files real-shapes: model.name org/other: "):
        write_real_shapes_model(other, tmp_path)
