"""A real model's shapes as the files of a Hugging Face model folder, made from code (pure): what vLLM needs to build
the model and serve it with random weights (`--load-format dummy`), without downloading the weights.

Qwen2.5-VL-7B-Instruct is the model made today. Its `config.json` takes the spec's `model` figures wherever the spec
names them (layers, widths, heads, the vision tower's structure) and the rest from the model's published
`config.json` (below); `preprocessor_config.json`, `generation_config.json`, `tokenizer_config.json` and the chat
template are the published ones. Transformers 5 reads the language model's figures from `text_config`
(Qwen2_5_VLConfig: top-level text fields are read only when it is absent), transformers 4 from the top level: the
config carries both. The tokenizer's vocabulary itself is made by tasks/local/qwen_vocab.py.
"""
from __future__ import annotations

import json

from epdbench.specs.node import ModelSpec

# What the spec does not name, from the published config.json of each model made (huggingface.co, model card
# revision of 2025-02; transformers' Qwen2_5_VLConfig defaults agree).
KNOWN = {
    "Qwen/Qwen2.5-VL-7B-Instruct": {
        "intermediate_size": 18944, "vocab_size": 152064, "rope_theta": 1000000.0, "mrope_section": [16, 24, 24],
        "max_position_embeddings": 128000, "sliding_window": 32768, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "vision_num_heads": 16, "tokens_per_second": 2,
    },
}
TOKEN_IDS = {"bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
             "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
             "video_token_id": 151656}
# The published config's: transformers 5 takes a local config.json without it for a Mistral one and warns that the
# tokenizer's split pattern is wrong.
TRANSFORMERS_VERSION = "4.41.2"
MODEL_MAX_LENGTH = 131072            # tokenizer_config.json's model_max_length
MIN_PIXELS = 3136                    # preprocessor_config.json: 56 × 56
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
# Qwen2-VL's chat template (Qwen2-VL and Qwen2.5-VL ship the same): a default system message, text parts as they
# are, each image part as one <|image_pad|> between vision start and end (the processor widens it to the image's
# tokens), each video part likewise.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def real_shapes_problem(model: ModelSpec) -> str | None:
    """Why the spec's model cannot be made as a real-shapes folder (one line naming the field), or None."""
    if model.name not in KNOWN:
        return (f"model.name {model.name}: real-shapes makes {', '.join(KNOWN)} only; serve another model from its "
                "own folder with target.local.model_path")
    if model.vision is None:
        return f"model.vision: {model.name} is a vision-language model; give its vision tower's figures"
    if model.n_heads * model.head_dim != model.hidden_size:
        return (f"model.head_dim {model.head_dim}: Qwen2.5-VL derives it as hidden_size / n_heads "
                f"({model.hidden_size} / {model.n_heads}); make them agree")
    if model.n_heads % model.n_kv_heads:
        return f"model.n_kv_heads {model.n_kv_heads} must divide model.n_heads {model.n_heads}"
    if model.dtype_bytes != 2:
        return f"model.dtype_bytes {model.dtype_bytes}: {model.name} is served in bfloat16 (2)"
    if model.vision.embed_dim != model.hidden_size:
        return (f"model.vision.embed_dim {model.vision.embed_dim}: the vision tower hands the language model tokens "
                f"of its hidden size ({model.hidden_size})")
    if model.vision.hidden_size % KNOWN[model.name]["vision_num_heads"]:
        return (f"model.vision.hidden_size {model.vision.hidden_size} must divide into the tower's "
                f"{KNOWN[model.name]['vision_num_heads']} heads")
    return None


def text_config(model: ModelSpec) -> dict:
    """The language model's figures (Qwen2_5_VLTextConfig)."""
    known = KNOWN[model.name]
    return {"hidden_size": model.hidden_size, "intermediate_size": known["intermediate_size"],
            "num_hidden_layers": model.n_layers, "num_attention_heads": model.n_heads,
            "num_key_value_heads": model.n_kv_heads, "hidden_act": "silu", "vocab_size": known["vocab_size"],
            "max_position_embeddings": known["max_position_embeddings"], "rms_norm_eps": known["rms_norm_eps"],
            "rope_theta": known["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": known["mrope_section"]},
            "use_sliding_window": False, "sliding_window": known["sliding_window"],
            "max_window_layers": model.n_layers, "attention_dropout": 0.0, "initializer_range": 0.02,
            "use_cache": True, "tie_word_embeddings": known["tie_word_embeddings"], "torch_dtype": "bfloat16",
            "bos_token_id": TOKEN_IDS["bos_token_id"], "eos_token_id": TOKEN_IDS["eos_token_id"]}


def vision_config(model: ModelSpec) -> dict:
    v, known = model.vision, KNOWN[model.name]
    return {"depth": v.depth, "hidden_size": v.hidden_size, "intermediate_size": v.intermediate_size,
            "num_heads": known["vision_num_heads"], "hidden_act": "silu", "in_channels": 3,
            "out_hidden_size": v.embed_dim, "patch_size": v.patch_size, "spatial_merge_size": v.spatial_merge_size,
            "temporal_patch_size": v.temporal_patch_size, "window_size": v.window_size,
            "fullatt_block_indexes": list(v.fullatt_block_indexes),
            "tokens_per_second": known["tokens_per_second"], "initializer_range": 0.02}


def model_config(model: ModelSpec) -> dict:
    """config.json: Qwen2_5_VLForConditionalGeneration; the text figures both nested and at the top level."""
    if why := real_shapes_problem(model):
        raise ValueError(why)
    text = text_config(model)
    return {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", **text,
            "text_config": {**text, "model_type": "qwen2_5_vl_text"}, "vision_config": vision_config(model),
            **TOKEN_IDS, "transformers_version": TRANSFORMERS_VERSION}


def preprocessor_config(model: ModelSpec) -> dict:
    v = model.vision
    return {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
            "min_pixels": MIN_PIXELS, "max_pixels": v.max_pixels,
            "size": {"shortest_edge": MIN_PIXELS, "longest_edge": v.max_pixels},
            "patch_size": v.patch_size, "temporal_patch_size": v.temporal_patch_size,
            "merge_size": v.spatial_merge_size, "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
            "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "do_convert_rgb": True}


def generation_config() -> dict:
    return {"bos_token_id": TOKEN_IDS["bos_token_id"], "pad_token_id": TOKEN_IDS["bos_token_id"],
            "eos_token_id": [TOKEN_IDS["eos_token_id"], TOKEN_IDS["bos_token_id"]], "do_sample": True,
            "repetition_penalty": 1.05, "temperature": 0.1, "top_p": 0.001, "top_k": 1}


def tokenizer_config() -> dict:
    return {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": MODEL_MAX_LENGTH, "bos_token": None,
            "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace",
            "add_prefix_space": False, "split_special_tokens": False, "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE}


def real_shapes_files(model: ModelSpec) -> dict[str, str]:
    """File name -> text of the folder, less tokenizer.json (tasks/local/qwen_vocab.py)."""
    dump = lambda d: json.dumps(d, indent=2) + "\n"      # noqa: E731
    return {"config.json": dump(model_config(model)), "preprocessor_config.json": dump(preprocessor_config(model)),
            "generation_config.json": dump(generation_config()), "tokenizer_config.json": dump(tokenizer_config()),
            "chat_template.json": dump({"chat_template": CHAT_TEMPLATE})}
