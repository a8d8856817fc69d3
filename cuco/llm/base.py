"""What every LLM client returns and raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class LLMReply:
    text: str
    model: str
    input_tokens: int
    output_tokens: int
    seconds: float


class LLMError(Exception):
    """A failed call, in one line. kind: auth, model, rate, server, timeout, connection, command, bad_reply."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(f"{kind}: {message}")


class LLMClient(Protocol):
    provider: str
    model: str

    async def complete(self, system: str, user: str, temperature: float, max_tokens: int) -> LLMReply: ...
