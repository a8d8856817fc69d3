"""LLM clients: Anthropic, OpenAI and OpenAI-compatible servers, and a shell command; token and dollar accounting."""

from cuco.llm.base import LLMClient, LLMError, LLMReply
from cuco.llm.registry import PROVIDERS, make_client

__all__ = ["LLMClient", "LLMError", "LLMReply", "PROVIDERS", "make_client"]
