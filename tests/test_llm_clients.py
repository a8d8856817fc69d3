"""Each LLM client against a fake provider on 127.0.0.1 that speaks the real HTTP API."""

from __future__ import annotations

import asyncio
import sys

import pytest
from fake_llm import FakeLLM, Step

from cuco.llm import LLMError, make_client
from cuco.llm.config import LLMConfig
from cuco.llm.pricing import cost_usd, price_of

KEY = "sk-test-not-a-real-key"


def _client(provider: str, url: str, monkeypatch, **kw):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    base = url if provider == "anthropic" else url + "/v1"
    cfg = LLMConfig(provider=provider, model="fake-model", base_url=base, **{"max_retries": 2, "timeout_s": 10, **kw})
    return make_client(cfg)


def _ask(client):
    return asyncio.run(client.complete("system text", "user text", 0.7, 256))


@pytest.mark.parametrize("provider", ["anthropic", "openai", "openai_compatible"])
def test_reply_usage_and_request_shape(provider, monkeypatch):
    with FakeLLM([Step("the answer", input_tokens=11, output_tokens=7)]) as fake:
        reply = _ask(_client(provider, fake.url, monkeypatch))
    assert reply.text == "the answer" and reply.input_tokens == 11 and reply.output_tokens == 7
    req = fake.requests[0]
    body = req["body"]
    assert body["model"] == "fake-model" and body["temperature"] == 0.7 and body["max_tokens"] == 256
    if provider == "anthropic":
        assert req["path"] == "/v1/messages" and body["system"] == "system text"
        assert body["messages"] == [{"role": "user", "content": "user text"}]
        h = req["headers"]
        assert KEY in (h.get("x-api-key"), h.get("authorization", "").removeprefix("Bearer "))
    else:
        assert req["path"] == "/v1/chat/completions"
        assert body["messages"][0] == {"role": "system", "content": "system text"}
        assert req["headers"].get("authorization") == f"Bearer {KEY}"


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_rate_limit_then_success(provider, monkeypatch):
    with FakeLLM([Step(status=429), Step("ok after retry")]) as fake:
        reply = _ask(_client(provider, fake.url, monkeypatch))
    assert reply.text == "ok after retry" and len(fake.requests) == 2


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_server_error_every_time(provider, monkeypatch):
    with FakeLLM([Step(status=500)]) as fake:
        with pytest.raises(LLMError) as err:
            _ask(_client(provider, fake.url, monkeypatch, max_retries=1))
    assert err.value.kind == "server" and "500" in str(err.value)
    assert len(fake.requests) == 2  # one try and one retry


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_timeout(provider, monkeypatch):
    with FakeLLM([Step(hang=True)]) as fake:
        with pytest.raises(LLMError) as err:
            _ask(_client(provider, fake.url, monkeypatch, max_retries=0, timeout_s=0.5))
    assert err.value.kind == "timeout"


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
@pytest.mark.parametrize("status,kind,words", [(401, "auth", "API key"), (404, "model", "fake-model")])
def test_bad_key_and_unknown_model(provider, status, kind, words, monkeypatch):
    with FakeLLM([Step(status=status)]) as fake:
        with pytest.raises(LLMError) as err:
            _ask(_client(provider, fake.url, monkeypatch))
    assert err.value.kind == kind and words in str(err.value) and len(str(err.value).splitlines()) == 1
    assert KEY not in str(err.value)


def test_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(LLMError, match="ANTHROPIC_API_KEY"):
        make_client(LLMConfig(provider="anthropic"))


def test_command_backend_with_a_real_command(tmp_path):
    script = tmp_path / "model.py"
    script.write_text("import sys\nprompt = sys.stdin.read()\nprint('echo:', len(prompt.split()), 'words')\n")
    client = make_client(LLMConfig(provider="command", model="local", command=f"{sys.executable} {script}"))
    reply = asyncio.run(client.complete("one two", "three", 0.5, 100))
    assert reply.text.strip() == "echo: 3 words" and reply.input_tokens > 0


def test_command_backend_failure_is_one_line(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import sys\nsys.stderr.write('model not loaded\\n')\nsys.exit(3)\n")
    client = make_client(LLMConfig(provider="command", command=f"{sys.executable} {script}"))
    with pytest.raises(LLMError, match="exited with 3: model not loaded"):
        asyncio.run(client.complete("s", "u", 0.5, 100))
    with pytest.raises(LLMError, match="cannot start"):
        asyncio.run(make_client(LLMConfig(provider="command", command="/no/such/model")).complete("s", "u", 0.5, 9))


def test_pricing_table_and_extension():
    assert price_of("claude-sonnet-4-5-20250929") == price_of("claude-sonnet-4-5")
    assert price_of("my-local-model") is None
    assert cost_usd("my-local-model", 10**6, 10**6, {"my-local-model": [1.0, 2.0]}) == 3.0
