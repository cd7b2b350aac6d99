"""Bad requests answered as vLLM answers them (pure): the status, error type, message and parameter of vLLM
0.33's OpenAI server for the mistakes a client makes, in its error body shape
{"error": {"message", "type", "param", "code"}}.

Sources (vllm 0.33.0): entrypoints/serve/engine/serving.py (_check_model: 404 NotFoundError, param "model";
_base_request_id: the X-Request-Id header before the body's request_id), sampling_params.py (max_tokens and
n "must be at least 1", param named), v1/engine/input_processor.py ("The decoder prompt cannot be empty"),
entrypoints/serve/exception_handling/handlers/validation.py (a body that fails the request model: 400
BadRequestError). vLLM serves n > 1; the simulator does not, and says so with a 400 instead of silently
returning one choice.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BadRequest:
    status: int
    type: str
    message: str
    param: str | None = None

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


def _int_field(body: dict, name: str) -> BadRequest | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return BadRequest(400, "BadRequestError", f"1 validation error:\n  {name}: Input should be a valid integer",
                          name)
    if value < 1:
        return BadRequest(400, "BadRequestError", f"{name} must be at least 1, got {value}.", name)
    return None


def check_body(body, served_model: str, chat: bool) -> BadRequest | None:
    """The first reason vLLM would refuse this (chat) completions body before generating, or None."""
    if not isinstance(body, dict):
        return BadRequest(400, "BadRequestError", "1 validation error:\n  Input should be a valid dictionary or "
                                                  "object to extract fields from")
    model = body.get("model")
    if model and model != served_model:
        return BadRequest(404, "NotFoundError", f"The model `{model}` does not exist. Valid aliases: {served_model}.",
                          "model")
    for name in (("max_tokens", "max_completion_tokens") if chat else ("max_tokens",)):
        problem = _int_field(body, name)
        if problem:
            return problem
    n = body.get("n")
    if n is not None:
        problem = _int_field(body, "n")
        if problem:
            return problem
        if n > 1:
            return BadRequest(400, "BadRequestError", f"n must be 1 on the simulator, got {n} (vLLM returns n "
                                                      "choices; the simulator generates one)", "n")
    if chat and not isinstance(body.get("messages"), list):
        return BadRequest(400, "BadRequestError", "1 validation error:\n  messages: Field required", "messages")
    if not chat and "prompt" not in body:
        return BadRequest(400, "BadRequestError", "1 validation error:\n  prompt: Field required", "prompt")
    return None


def empty_prompt() -> BadRequest:
    return BadRequest(400, "BadRequestError", "The decoder prompt cannot be empty")


def request_id_of(header: str | None, body: dict) -> str | None:
    """vLLM's precedence: the X-Request-Id header, else the body's request_id."""
    return header if header is not None else body.get("request_id")
