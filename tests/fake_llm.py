"""A fake LLM provider for tests: a real HTTP server on 127.0.0.1 that speaks Anthropic's messages API and
OpenAI's chat-completions API, answering from a script of steps."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Step:
    text: str = ""  # the model's reply
    status: int = 200  # anything else: an error response with this HTTP status
    hang: bool = False  # never answer (until the server closes): provokes the client's timeout
    input_tokens: int = 1200
    output_tokens: int = 400


@dataclass
class FakeLLM:
    script: list[Step]
    repeat_last: bool = True
    by_model: dict[str, list[Step]] = field(default_factory=dict)  # per-model scripts, where given
    requests: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._release = threading.Event()
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with fake._lock:
                    fake.requests.append({"path": self.path, "body": body,
                                          "headers": {k.lower(): v for k, v in self.headers.items()}})
                    script = fake.by_model.get(body.get("model"), fake.script)
                    step = script.pop(0) if len(script) > 1 or not fake.repeat_last else script[0]
                if step.hang:
                    fake._release.wait()
                    return
                anthropic = self.path.endswith("/messages")
                if step.status != 200:
                    return self._send(step.status, _error(anthropic, step.status), {"retry-after": "0"})
                model = body.get("model", "fake-model")
                self._send(200, _anthropic(model, step) if anthropic else _openai(model, step))

            def _send(self, status, payload, headers=None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeLLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _anthropic(model: str, step: Step) -> dict:
    return {"id": f"msg_{time.time_ns():x}", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": step.text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": step.input_tokens, "output_tokens": step.output_tokens}}


def _openai(model: str, step: Step) -> dict:
    return {"id": f"chatcmpl-{time.time_ns():x}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": step.text},
                                         "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": step.input_tokens, "completion_tokens": step.output_tokens,
                      "total_tokens": step.input_tokens + step.output_tokens}}


def _error(anthropic: bool, status: int) -> dict:
    kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(status, "api_error")
    message = {401: "invalid x-api-key", 404: "model: no such model", 429: "Number of request tokens has exceeded "
               "your per-minute rate limit"}.get(status, "Internal server error")
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}
