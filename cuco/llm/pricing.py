"""Dollars per call: a table of list prices (USD per million tokens), extended by run.toml [llm.pricing]."""

from __future__ import annotations

# (input, output) USD per million tokens. A model that is not here costs what [llm.pricing] says; with a
# budget set, an unpriced model is an error rather than free.
PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-1": (15.0, 75.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "gpt-5": (1.25, 10.0),
    "gpt-5-mini": (0.25, 2.0),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4o-mini": (0.15, 0.6),
}


def price_of(model: str, extra: dict | None = None) -> tuple[float, float] | None:
    table = {**PRICES, **{k: tuple(v) for k, v in (extra or {}).items()}}
    if model in table:
        return table[model]
    # dated snapshots ("claude-sonnet-4-5-20250929") cost what their family costs
    for name in sorted(table, key=len, reverse=True):
        if model.startswith(name):
            return table[name]
    return None


def cost_usd(model: str, input_tokens: int, output_tokens: int, extra: dict | None = None) -> float:
    p = price_of(model, extra)
    return 0.0 if p is None else (input_tokens * p[0] + output_tokens * p[1]) / 1e6
