"""The model folder the local target's engines load when it is made at run time (target.local.model_files): the tiny
Qwen2 of tasks/local/tiny_model.py, or a real model's shapes (specs/real_shapes.py, with Qwen's real vocabulary from
tasks/local/qwen_vocab.py), served with random weights. Files already there with the same text are left alone."""
from __future__ import annotations

from pathlib import Path

from epdbench.specs.models import ExperimentSpec
from epdbench.specs.real_shapes import real_shapes_files, real_shapes_problem
from epdbench.tasks.local.qwen_vocab import VocabError, qwen_tokenizer_json
from epdbench.tasks.local.tiny_model import TinyModelError, write_tiny_model

FOLDERS = {"tiny": "tiny-model", "real-shapes": "real-shapes-model"}     # in the results folder


class ModelFilesError(ValueError):
    """The model folder cannot be made; the message is one line naming the field and the fix."""


def write_folder(files: dict[str, str], folder: Path) -> Path:
    """Every file of `files` (name -> text) in `folder`, each replaced whole and only when its text differs."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = folder / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
    return folder


def write_real_shapes_model(spec: ExperimentSpec, folder: Path) -> Path:
    """config.json, preprocessor_config.json, generation_config.json, tokenizer_config.json, chat_template.json and
    tokenizer.json of the spec's model."""
    if why := real_shapes_problem(spec.model):
        raise ModelFilesError(f"target.local.model_files real-shapes: {why}")
    try:
        tokenizer = qwen_tokenizer_json()
    except VocabError as e:
        raise ModelFilesError(f"target.local.model_files real-shapes: {e}") from None
    return write_folder({**real_shapes_files(spec.model), "tokenizer.json": tokenizer}, folder)


def made_model_folder(spec: ExperimentSpec, run_dir: Path) -> Path | None:
    """The folder made in `run_dir` for target.local.model_files (or tiny_model), or None when nothing is made."""
    kind = spec.target.local.made_model
    if kind is None:
        return None
    folder = run_dir / FOLDERS[kind]
    if kind == "tiny":
        try:
            return write_tiny_model(spec.model, spec.engine.max_model_len, folder)
        except TinyModelError as e:
            raise ModelFilesError(str(e)) from None
    return write_real_shapes_model(spec, folder)
