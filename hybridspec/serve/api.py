"""Request bodies of the OpenAI-compatible API and the chat template.

Chat template (the embedded tokenizer has none; tokenizer chat templates are not read): a system
message is prepended as plain text plus a newline, a user message becomes `<|user|>{content}\\n`, an
assistant message `<|assistant|>{content}\\n`, and the prompt ends with `<|assistant|>`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RequestError(ValueError):
    """A bad request: answered with `status` and an OpenAI error object naming `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


class StreamOptions(BaseModel):
    include_usage: bool = False


class RequestBody(BaseModel):
    """The fields completions and chat completions share."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0)  # OpenAI's default; 0 is greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # 0 or -1: off
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    policy: str | None = None  # extension: one of the engine's policy names

    @field_validator("n")
    @classmethod
    def _one(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n = 1 is supported (batch size one)")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop):
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return stops


class CompletionRequest(RequestBody):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]


class ChatRequest(RequestBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None


def chat_prompt(messages: list[ChatMessage]) -> str:
    """The simple template of the module docstring."""
    parts = []
    for m in messages:
        text = m.content if isinstance(m.content, str) else "".join(p.get("text", "") for p in m.content)
        parts.append({"user": f"<|user|>{text}\n", "assistant": f"<|assistant|>{text}\n"}.get(m.role, f"{text}\n"))
    return "".join(parts) + "<|assistant|>"
