"""specs/real_shapes.py: Qwen2.5-VL-7B-Instruct's model folder made from the spec's figures — config.json as
transformers 4 and 5 and vLLM read it, the image processor's and generation configs, and Qwen2-VL's chat template;
a model it cannot make is one line."""
import json

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from epdbench.physics.costmodel import image_tokens
from epdbench.specs.models import load_spec, parse_spec, SpecError
from epdbench.specs.real_shapes import (CHAT_TEMPLATE, model_config, preprocessor_config, real_shapes_files,
                                        real_shapes_problem, tokenizer_config)


@pytest.fixture(scope="module")
def model():
    return load_spec("epd-multimodal").model


def test_the_config_carries_the_specs_figures_and_the_published_ones(model):
    c = model_config(model)
    assert c["architectures"] == ["Qwen2_5_VLForConditionalGeneration"] and c["model_type"] == "qwen2_5_vl"
    text = c["text_config"]
    assert {k: v for k, v in text.items() if k != "model_type"} == {k: c[k] for k in text if k != "model_type"}
    assert text["model_type"] == "qwen2_5_vl_text"
    assert (text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"],
            text["num_key_value_heads"]) == (model.hidden_size, model.n_layers, model.n_heads, model.n_kv_heads)
    assert text["hidden_size"] // text["num_attention_heads"] == model.head_dim == 128
    assert (text["intermediate_size"], text["vocab_size"], text["rope_theta"], text["max_position_embeddings"],
            text["tie_word_embeddings"]) == (18944, 152064, 1e6, 128000, False)
    assert text["rope_scaling"] == {"type": "mrope", "mrope_section": [16, 24, 24]}
    v, spec_v = c["vision_config"], model.vision
    assert (v["depth"], v["hidden_size"], v["intermediate_size"], v["num_heads"], v["out_hidden_size"],
            v["patch_size"], v["spatial_merge_size"], v["temporal_patch_size"], v["window_size"],
            v["fullatt_block_indexes"], v["tokens_per_second"]) == \
        (32, 1280, 3420, 16, 3584, 14, 2, 2, 112, [7, 15, 23, 31], 2)
    assert (v["depth"], v["hidden_size"], v["out_hidden_size"], tuple(v["fullatt_block_indexes"])) == \
        (spec_v.depth, spec_v.hidden_size, spec_v.embed_dim, spec_v.fullatt_block_indexes)
    assert {k: c[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
                              "vision_token_id", "bos_token_id", "eos_token_id")} == \
        {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
         "vision_end_token_id": 151653, "vision_token_id": 151654, "bos_token_id": 151643, "eos_token_id": 151645}
    # transformers 5 takes a local config.json without a version for a Mistral one (and warns about its tokenizer)
    assert c["transformers_version"].startswith("4.")


def test_the_image_processor_makes_the_workloads_image_tokens(model):
    p = preprocessor_config(model)
    assert (p["image_processor_type"], p["processor_class"]) == ("Qwen2VLImageProcessor", "Qwen2_5_VLProcessor")
    assert (p["min_pixels"], p["max_pixels"], p["patch_size"], p["temporal_patch_size"], p["merge_size"]) == \
        (3136, 12845056, 14, 2, 2)
    assert p["size"] == {"shortest_edge": 3136, "longest_edge": 12845056}
    assert p["image_mean"] == [0.48145466, 0.4578275, 0.40821073]
    # one token per (patch × merge)² pixels: WORKLOADS.md's 560² → 400 (transformers 5.17's processor agrees)
    per_token = p["patch_size"] * p["merge_size"]
    assert (560 // per_token) ** 2 == image_tokens(model, 560, 560) == 400


def test_the_chat_template_renders_an_image_between_vision_markers_after_the_default_system_message():
    template = ImmutableSandboxedEnvironment().from_string(CHAT_TEMPLATE)
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,x"}},
             {"type": "text", "text": "What is in it?"}]
    text = template.render(messages=[{"role": "user", "content": parts}], add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                    "<|vision_start|><|image_pad|><|vision_end|>What is in it?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert text.count("<|image_pad|>") == 1
    own = template.render(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                          add_generation_prompt=False)
    assert own == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_the_tokenizer_config_names_qwen2s_class_and_markers():
    t = tokenizer_config()
    assert (t["tokenizer_class"], t["eos_token"], t["pad_token"], t["model_max_length"]) == \
        ("Qwen2Tokenizer", "<|im_end|>", "<|endoftext|>", 131072)
    assert t["chat_template"] == CHAT_TEMPLATE


def test_the_folders_files_are_json_and_the_same_every_time(model):
    files = real_shapes_files(model)
    assert sorted(files) == ["chat_template.json", "config.json", "generation_config.json",
                             "preprocessor_config.json", "tokenizer_config.json"]
    assert json.loads(files["generation_config.json"])["eos_token_id"] == [151645, 151643]
    assert real_shapes_files(model) == files


@pytest.mark.parametrize("update, problem", [
    ({"name": "Qwen/Qwen3-32B"}, "model.name Qwen/Qwen3-32B: real-shapes makes Qwen/Qwen2.5-VL-7B-Instruct only"),
    ({"vision": None}, "model.vision: Qwen/Qwen2.5-VL-7B-Instruct is a vision-language model"),
    ({"head_dim": 64}, "model.head_dim 64: Qwen2.5-VL derives it as hidden_size / n_heads (3584 / 28)"),
    ({"n_kv_heads": 3}, "model.n_kv_heads 3 must divide model.n_heads 28"),
    ({"dtype_bytes": 4}, "model.dtype_bytes 4: Qwen/Qwen2.5-VL-7B-Instruct is served in bfloat16 (2)"),
])
def test_a_model_it_cannot_make_is_one_line(model, update, problem):
    why = real_shapes_problem(model.model_copy(update=update))
    assert why.startswith(problem) and "\n" not in why
    with pytest.raises(ValueError, match="^" + problem.replace("(", r"\(").replace(")", r"\)")):
        model_config(model.model_copy(update=update))


def test_the_spec_refuses_real_shapes_of_a_model_it_cannot_make_before_anything_starts():
    data = load_spec("gpu-qwen25vl").model_dump(mode="json")
    data["model"]["name"] = "Qwen/Qwen3-32B"
    with pytest.raises(SpecError) as e:
        parse_spec(data, "gpu-qwen25vl")
    assert str(e.value) == ("gpu-qwen25vl: field 'target.local.model_files' (real-shapes): model.name Qwen/Qwen3-32B: "
                            "real-shapes makes Qwen/Qwen2.5-VL-7B-Instruct only; serve another model from its own "
                            "folder with target.local.model_path")
