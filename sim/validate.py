"""Bad requests answered as vLLM answers them (pure): the status, error type, message and parameter of vLLM
0.33's OpenAI server for the mistakes a client makes, in its error body shape
{"error": {"message", "type", "param", "code"}}; and how many tokens a request that passes may generate.

Sources (vllm 0.33.0): entrypoints/serve/engine/serving.py (_check_model: 404 NotFoundError, param "model";
_base_request_id: the X-Request-Id header before the body's request_id), sampling_params.py (max_tokens and
n "must be at least 1"), v1/engine/input_processor.py ("The decoder prompt cannot be empty"),
entrypoints/serve/exception_handling/handlers/validation.py (a body that fails the request model: 400
BadRequestError), renderers/params.py (TokenizeParams: more output tokens asked than max_model_len, a prompt
longer than max_model_len), entrypoints/serve/utils/api_utils.py (get_max_tokens: the tokens a request may
generate), openai/completion/protocol.py (completions' max_tokens defaults to 16; chat's to none at all),
exception_handling/error_response.py and exceptions.py (a VLLMValidationError that names its parameter ends
its message with "(parameter=..., value=...)"). vLLM serves n > 1; the simulator does not, and says so with a
400 instead of silently returning one choice.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BadRequest:
    status: int
    type: str
    message: str
    param: str | None = None

    @staticmethod
    def validation(message: str, param: str | None = None, value=None) -> BadRequest:
        """vLLM's VLLMValidationError as its server answers it: 400 BadRequestError, the message ending with the
        parameter and value it names (exceptions.py __str__)."""
        extras = ([f"parameter={param}"] if param is not None else []) + ([f"value={value}"] if value is not None
                                                                           else [])
        return BadRequest(400, "BadRequestError", f"{message} ({', '.join(extras)})" if extras else message, param)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


COMPLETIONS_MAX_TOKENS = 16    # openai/completion/protocol.py: `max_tokens: int | None = 16`


def _int_field(body: dict, name: str) -> BadRequest | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return BadRequest(400, "BadRequestError", f"1 validation error:\n  {name}: Input should be a valid integer",
                          name)
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
        if n < 1:
            return BadRequest(400, "BadRequestError", f"n must be at least 1, got {n}.")
        if n > 1:
            return BadRequest(400, "BadRequestError", f"n must be 1 on the simulator, got {n} (vLLM returns n "
                                                      "choices; the simulator generates one)", "n")
    if chat and not isinstance(body.get("messages"), list):
        return BadRequest(400, "BadRequestError", "1 validation error:\n  messages: Field required", "messages")
    if not chat and "prompt" not in body:
        return BadRequest(400, "BadRequestError", "1 validation error:\n  prompt: Field required", "prompt")
    return None


def requested_tokens(body: dict, chat: bool) -> tuple[int | None, str]:
    """The output tokens a (chat) completions body asks for, and the field that asks: chat's
    max_completion_tokens before its max_tokens, neither meaning none; completions' max_tokens, 16 when absent and
    none when null. A body check_body passed."""
    if chat:
        if body.get("max_completion_tokens") is not None:
            return body["max_completion_tokens"], "max_completion_tokens"
        return body.get("max_tokens"), "max_tokens"
    return body.get("max_tokens", COMPLETIONS_MAX_TOKENS), "max_tokens"


def output_budget(body: dict, chat: bool, prompt_tokens: int, max_model_len: int) -> int | BadRequest:
    """The max_tokens vLLM 0.33 generates for a request whose prompt has `prompt_tokens` tokens, or its refusal, in
    vLLM's order: more output tokens asked than the whole context (TokenizeParams); a prompt longer than the context
    (the tokenizer stops at max_model_len + 1 tokens: "at least"); then what is asked, cut to what the context has
    left — a request asking for more is served and stops early, never refused (get_max_tokens) — and none asked
    means all that is left; the sampling parameters refuse fewer than 1 (a prompt filling the whole context too)."""
    requested, param = requested_tokens(body, chat)
    if requested is not None and requested > max_model_len:
        return BadRequest.validation(f"{param}={requested} cannot be greater than max_model_len={max_model_len}. "
                                     "Please request fewer output tokens.", param, requested)
    if prompt_tokens > max_model_len:
        count = min(prompt_tokens, max_model_len + 1)
        qualifier = "at least " if count == max_model_len + 1 else ""
        return BadRequest.validation(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{qualifier}{count} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt.", "input_tokens", count)
    left = max_model_len - prompt_tokens
    max_tokens = left if requested is None else min(left, requested)
    if max_tokens < 1:
        return BadRequest.validation(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    return max_tokens


def empty_prompt() -> BadRequest:
    return BadRequest(400, "BadRequestError", "The decoder prompt cannot be empty")


def request_id_of(header: str | None, body: dict) -> str | None:
    """vLLM's precedence: the X-Request-Id header, else the body's request_id."""
    return header if header is not None else body.get("request_id")
