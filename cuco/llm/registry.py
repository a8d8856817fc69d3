"""Providers by name: built-in ones register exactly as a plug-in would."""

from __future__ import annotations

from collections.abc import Callable

from cuco.llm.base import LLMClient, LLMError
from cuco.llm.command_client import CommandClient
from cuco.llm.config import LLMConfig
from cuco.llm.http_clients import AnthropicClient, OpenAIClient

PROVIDERS: dict[str, Callable[[LLMConfig], LLMClient]] = {}


def register(name: str, factory: Callable[[LLMConfig], LLMClient]) -> None:
    PROVIDERS[name] = factory


register("anthropic", AnthropicClient)
register("openai", OpenAIClient)
register("openai_compatible", lambda cfg: OpenAIClient(cfg, compatible=True))
register("command", CommandClient)


def make_client(cfg: LLMConfig) -> LLMClient:
    if cfg.provider not in PROVIDERS:
        raise LLMError("config", f"unknown provider {cfg.provider!r} (known: {', '.join(PROVIDERS)})")
    return PROVIDERS[cfg.provider](cfg)
