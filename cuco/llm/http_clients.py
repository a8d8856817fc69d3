"""Anthropic and OpenAI(-compatible) clients through the official SDKs, async.

The SDKs retry rate limits (honouring retry-after), 5xx and dropped connections with exponential
backoff; failures that remain become one-line LLMErrors, and a bad key or an unknown model says so.
"""

from __future__ import annotations

import os
import time

from cuco.extras import require
from cuco.llm.base import LLMError, LLMReply
from cuco.llm.config import LLMConfig


def _key(cfg: LLMConfig, default_env: str, required: bool = True) -> str:
    env = cfg.api_key_env or default_env
    key = os.environ.get(env, "")
    if not key and required:
        raise LLMError("auth", f"no API key: set the environment variable {env} (or [llm] api_key_env)")
    return key or "not-needed"


def _error(sdk, exc: Exception, provider: str, model: str) -> LLMError:
    """The SDK's exception as one line; both SDKs name their exception classes alike. Most specific first."""
    table = [("AuthenticationError", "auth", f"{provider} rejected the API key (HTTP 401)"),
             ("NotFoundError", "model", f"{provider} does not know model {model!r} (HTTP 404)"),
             ("RateLimitError", "rate", f"{provider} rate limit persisted after the retries (HTTP 429)"),
             ("APITimeoutError", "timeout", f"{provider} did not answer within the request timeout"),
             ("APIConnectionError", "connection", f"cannot reach {provider}: {exc}")]
    for cls, kind, message in table:
        if isinstance(exc, getattr(sdk, cls)):
            return LLMError(kind, message)
    if isinstance(exc, sdk.APIStatusError):
        return LLMError("server", f"{provider} answered HTTP {exc.status_code} after the retries")
    return LLMError("server", f"{provider}: {type(exc).__name__}: {exc}")


class AnthropicClient:
    provider = "anthropic"

    def __init__(self, cfg: LLMConfig) -> None:
        anthropic = require("anthropic")

        self.sdk, self.model, self.send_temperature = anthropic, cfg.model, cfg.send_temperature
        self.client = anthropic.AsyncAnthropic(api_key=_key(cfg, "ANTHROPIC_API_KEY"), base_url=cfg.base_url or None,
                                               max_retries=cfg.max_retries, timeout=cfg.timeout_s)

    async def complete(self, system: str, user: str, temperature: float, max_tokens: int) -> LLMReply:
        t0 = time.monotonic()
        try:
            # The SDK no longer names temperature; the Messages API still takes it in the body.
            extra = {"temperature": temperature} if self.send_temperature else None
            msg = await self.client.messages.create(model=self.model, system=system, max_tokens=max_tokens,
                                                    messages=[{"role": "user", "content": user}], extra_body=extra)
        except self.sdk.APIError as exc:
            raise _error(self.sdk, exc, self.provider, self.model) from None
        text = "".join(getattr(b, "text", "") for b in msg.content)
        return LLMReply(text, msg.model or self.model, msg.usage.input_tokens, msg.usage.output_tokens,
                        time.monotonic() - t0)


class OpenAIClient:
    """OpenAI, or any server speaking its chat-completions API (vLLM, SGLang, Ollama, llama.cpp) via base_url."""

    provider = "openai"

    def __init__(self, cfg: LLMConfig, compatible: bool = False) -> None:
        openai = require("openai")

        if compatible and not cfg.base_url:
            raise LLMError("config", "provider openai_compatible needs [llm] base_url (e.g. http://host:8000/v1)")
        self.sdk, self.model, self.send_temperature = openai, cfg.model, cfg.send_temperature
        self.provider = "openai_compatible" if compatible else "openai"
        self.client = openai.AsyncOpenAI(api_key=_key(cfg, "OPENAI_API_KEY", required=not compatible),
                                         base_url=cfg.base_url or None, max_retries=cfg.max_retries,
                                         timeout=cfg.timeout_s)

    async def complete(self, system: str, user: str, temperature: float, max_tokens: int) -> LLMReply:
        t0 = time.monotonic()
        try:
            sampling = {"temperature": temperature} if self.send_temperature else {}
            resp = await self.client.chat.completions.create(
                model=self.model, max_tokens=max_tokens, **sampling,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
        except self.sdk.APIError as exc:
            raise _error(self.sdk, exc, self.provider, self.model) from None
        if not resp.choices:
            raise LLMError("bad_reply", f"{self.provider} returned no choices")
        usage = resp.usage
        return LLMReply(resp.choices[0].message.content or "", resp.model or self.model,
                        usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0,
                        time.monotonic() - t0)
