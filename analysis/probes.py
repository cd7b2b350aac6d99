"""The protocol differential's probes (pure): the good and bad requests sent, in the same order, to a real vLLM
engine and to the simulator (analysis.differential compares their answers)."""
from __future__ import annotations

from dataclasses import dataclass

PROBE_ID_PREFIX = "diff-"
GOOD_MAX_TOKENS = 4
# Two KV blocks of the largest block size in play (vLLM's CPU build: 128 tokens), so a repeated prompt hits the cache.
LONG_PROMPT_WORDS = 300

@dataclass(frozen=True)
class Probe:
    """One request: `body` a dict sent as JSON, a str sent as it is (malformed JSON), or None (GET)."""
    name: str
    method: str
    path: str
    body: dict | str | None = None

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True


def long_prompt() -> str:
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    return " ".join(words[i % len(words)] + str(i % 7) for i in range(LONG_PROMPT_WORDS))


def probes(model: str, max_model_len: int) -> list[Probe]:
    """The good and bad requests sent to both servers, in order (the prefix-cache pair back to back)."""
    def completion(name: str, **over) -> Probe:
        body = {"model": model, "prompt": "the quick brown fox jumps", "max_tokens": GOOD_MAX_TOKENS,
                "ignore_eos": True, "request_id": PROBE_ID_PREFIX + name, **over}
        return Probe(name, "POST", "/v1/completions", {k: v for k, v in body.items() if v is not DROP})

    def chat(name: str, **over) -> Probe:
        body = {"model": model, "messages": [{"role": "user", "content": "the quick brown fox jumps"}],
                "max_tokens": GOOD_MAX_TOKENS, "ignore_eos": True, "request_id": PROBE_ID_PREFIX + name, **over}
        return Probe(name, "POST", "/v1/chat/completions", {k: v for k, v in body.items() if v is not DROP})

    usage = {"include_usage": True}
    return [
        Probe("health", "GET", "/health"),
        Probe("models", "GET", "/v1/models"),
        Probe("tokenize-prompt", "POST", "/tokenize", {"model": model, "prompt": "the quick brown fox"}),
        Probe("tokenize-messages", "POST", "/tokenize",
              {"model": model, "messages": [{"role": "user", "content": "the quick brown fox"}]}),
        completion("completion"),
        completion("completion-stream", stream=True),
        completion("completion-stream-usage", stream=True, stream_options=usage),
        completion("completion-max-tokens-1", max_tokens=1),
        completion("completion-default-max-tokens", max_tokens=DROP),
        chat("chat"),
        chat("chat-stream", stream=True),
        chat("chat-stream-usage", stream=True, stream_options=usage),
        chat("chat-max-completion-tokens", max_tokens=DROP, max_completion_tokens=2),
        completion("prefix-first", prompt=long_prompt(), max_tokens=1),
        completion("prefix-repeat", prompt=long_prompt(), max_tokens=1),
        completion("prefix-repeat-stream-usage", prompt=long_prompt(), max_tokens=1, stream=True,
                   stream_options=usage),
        completion("bad-unknown-model", model="no-such-model"),
        completion("bad-max-tokens-0", max_tokens=0),
        completion("bad-max-tokens-over-context", max_tokens=max_model_len + 1),
        completion("bad-prompt-over-context", prompt="alpha " * (2 * max_model_len)),
        completion("bad-max-tokens-string", max_tokens="four"),
        completion("bad-negative-temperature", temperature=-1.0),
        completion("bad-empty-prompt", prompt=""),
        completion("bad-missing-prompt", prompt=DROP),
        completion("n-2", n=2),
        Probe("bad-malformed-json", "POST", "/v1/completions", '{"model": "' + model + '", "prompt": '),
        chat("bad-missing-messages", messages=DROP),
        chat("bad-messages-string", messages="hello"),
        chat("bad-unknown-model-chat", model="no-such-model"),
        chat("bad-stream-unknown-model", model="no-such-model", stream=True),
    ]


class _Drop:
    """A field left out of a probe's body."""


DROP = _Drop()


# --- one answer, reduced -----------------------------------------------------------------------------------------
