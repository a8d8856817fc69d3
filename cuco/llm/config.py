"""The [llm] table of run.toml. API keys are never in it: only the name of the variable that holds one."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LLMConfig:
    provider: str = "anthropic"
    """anthropic, openai, openai_compatible (vLLM, SGLang, Ollama, llama.cpp: set base_url) or command."""
    model: str = "claude-sonnet-4-5"
    """The model name the provider knows."""
    models: list[str] = field(default_factory=list)
    """Several models of the provider to choose among by a UCB bandit on improvement per dollar (overrides model)."""
    base_url: str = ""
    """API base URL (openai_compatible; optional for the others)."""
    api_key_env: str = ""
    """Environment variable holding the key (default: ANTHROPIC_API_KEY / OPENAI_API_KEY)."""
    command: str = ""
    """command provider: a shell command that reads the prompt on stdin and writes the reply on stdout."""
    max_tokens: int = 8192
    """Longest reply asked for."""
    timeout_s: float = 300.0
    """Per request."""
    max_retries: int = 4
    """Retries with backoff on rate limits, 5xx and dropped connections."""
    budget_usd: float = 0.0
    """Hard budget for the run: no new proposal once reached (0: no limit)."""
    patch_retries: int = 2
    """How often a reply whose change cannot be applied is sent back with the error."""
    max_consecutive_failures: int = 5
    """Proposals in a row without a usable reply before the search stops asking."""
    temperature_explore: float = 1.0
    """Sampling temperature while exploring."""
    temperature_exploit: float = 0.4
    """Sampling temperature while exploiting."""
    send_temperature: bool = True
    """Send a temperature at all (some newer models reject sampling parameters: set false)."""
    meta_interval: int = 10
    """Every this many finished evaluations, the LLM distils what worked and what failed (0: never)."""
    knowledge: bool = True
    """Keep the recommendations in a knowledge file per workload (CUCO_HOME/knowledge) for later runs."""
    pricing: dict[str, list[float]] = field(default_factory=dict)
    """Extra prices: model = [dollars per million input tokens, per million output tokens]."""
