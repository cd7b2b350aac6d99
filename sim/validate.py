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
REQUEST_MODEL_ERROR = "Bad Request"   # vLLM 0.32's type for a body its request model refuses (the HTTP reason)


def request_model_error(kind: str, name: str, msg: str, value) -> BadRequest:
    """A body the request model refuses before vLLM's handler runs (so before its request-body log line), as vLLM
    0.32's validation handler answers it: 400 `Bad Request`, param `body.<field>`, pydantic's error in the message."""
    shown = f"<dict of {value} items>" if kind == "missing" else repr(value)
    return BadRequest(400, REQUEST_MODEL_ERROR,
                      f"1 validation error:\n  {{'type': '{kind}', 'loc': 'body.{name}', 'msg': '{msg}', "
                      f"'input': {shown}}}", f"body.{name}")


def malformed_json(offset: int) -> BadRequest:
    """A body that is not JSON: the request model's json_invalid error at the character where parsing stopped."""
    return BadRequest(400, REQUEST_MODEL_ERROR,
                      f"1 validation error:\n  {{'type': 'json_invalid', 'loc': 'body.{offset}', 'msg': 'JSON decode "
                      f"error', 'input': '<dict of 0 items>', 'ctx': {{'error': 'Expecting value'}}}}",
                      f"body.{offset}")


def _int_field(body: dict, name: str) -> BadRequest | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return request_model_error("int_parsing" if isinstance(value, str) else "int_type", name,
                                   "Input should be a valid integer", value)
    return None


def check_schema(body, chat: bool) -> BadRequest | None:
    """What vLLM's request model refuses before its handler runs (no request-body line is logged for it): a body
    that is no object, fields of the wrong type, missing messages, a missing or empty completions prompt."""
    if not isinstance(body, dict):
        return BadRequest(400, "BadRequestError", "1 validation error:\n  Input should be a valid dictionary or "
                                                  "object to extract fields from")
    for name in (("max_tokens", "max_completion_tokens", "n") if chat else ("max_tokens", "n")):
        problem = _int_field(body, name)
        if problem:
            return problem
    if chat and "messages" not in body:
        return request_model_error("missing", "messages", "Field required", len(body))
    if chat and not isinstance(body["messages"], list):
        return request_model_error("list_type", "messages", "Input should be a valid list", body["messages"])
    if not chat and body.get("prompt") in (None, "", []):
        return BadRequest.validation("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    return None


def check_served(body: dict, served_model: str) -> BadRequest | None:
    """What vLLM's handler refuses after logging the request's body: an unknown model, n, negative temperature."""
    model = body.get("model")
    if model and model != served_model:
        return BadRequest(404, "NotFoundError", f"The model `{model}` does not exist. Valid aliases: {served_model}.",
                          "model")
    n = body.get("n")
    if n is not None and n < 1:
        return BadRequest(400, "BadRequestError", f"n must be at least 1, got {n}.")
    if n is not None and n > 1:
        return BadRequest(400, "BadRequestError", f"n must be 1 on the simulator, got {n} (vLLM returns n "
                                                  "choices; the simulator generates one)", "n")
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature < 0:
        return BadRequest.validation(f"temperature must be non-negative, got {float(temperature)}.", "temperature",
                                     float(temperature))
    return None


def check_body(body, served_model: str, chat: bool) -> BadRequest | None:
    """The first reason vLLM would refuse this (chat) completions body before generating, or None."""
    return check_schema(body, chat) or check_served(body, served_model)


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
