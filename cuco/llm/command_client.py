"""A shell command as the LLM: the prompt on stdin, the reply on stdout (`llm -m ...`, `ollama run ...`)."""

from __future__ import annotations

import asyncio
import shlex
import time

from cuco.llm.base import LLMError, LLMReply
from cuco.llm.config import LLMConfig


class CommandClient:
    provider = "command"

    def __init__(self, cfg: LLMConfig) -> None:
        if not cfg.command.strip():
            raise LLMError("config", "provider command needs [llm] command, e.g. \"llm -m gpt-4o-mini\"")
        self.argv = shlex.split(cfg.command)
        self.model = cfg.model or self.argv[0]
        self.timeout_s = cfg.timeout_s

    async def complete(self, system: str, user: str, temperature: float, max_tokens: int) -> LLMReply:
        prompt = f"{system}\n\n{user}"
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(*self.argv, stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            raise LLMError("command", f"cannot start {self.argv[0]!r}: {exc.strerror}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(prompt.encode()), self.timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise LLMError("timeout", f"{self.argv[0]!r} gave no reply within {self.timeout_s:.0f} s") from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no stderr"]
            raise LLMError("command", f"{self.argv[0]!r} exited with {proc.returncode}: {tail[0][:200]}")
        text = out.decode(errors="replace")
        # No usage report from a command: count roughly 4 characters a token, as most tokenizers do on code.
        return LLMReply(text, self.model, len(prompt) // 4, len(text) // 4, time.monotonic() - t0)
