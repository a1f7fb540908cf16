"""flextier server with the real `openai` Python client (PyPI): chat and
completions, streaming and not, stop lists, n, errors as the client raises
them (bad request, wrong API key), models; skipped without the package or
the CLI."""
import os
import re
import subprocess
import tempfile
import time

import pytest

openai = pytest.importorskip("openai")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO = os.path.join(ROOT, "demo", "kjv-llama")
FT_BIN = os.environ.get("FT_BIN", os.path.join(ROOT, "build", "flextier"))
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
KEY = "test-key-123"

pytestmark = pytest.mark.skipif(not os.access(FT_BIN, os.X_OK), reason="the flextier CLI is not built")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("srv")
    (d / "chatml.jinja").write_text(CHATML)
    (d / "key").write_text(KEY + "\n")
    log = open(d / "log", "w+")
    p = subprocess.Popen([FT_BIN, "server", "--model", DEMO, "--listen", "127.0.0.1:0", "--chat-template",
                          str(d / "chatml.jinja"), "--api-key-file", str(d / "key"), "--slots", "4"],
                         stdout=log, stderr=log)
    port = None
    for _ in range(600):
        m = re.search(r"127\.0\.0\.1:(\d+)", open(d / "log").read())
        if m:
            port = int(m.group(1))
            break
        time.sleep(0.05)
    assert port, open(d / "log").read()
    yield f"http://127.0.0.1:{port}/v1"
    p.terminate()
    assert p.wait(30) == 0


def client(url, key=KEY):
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0)


def test_models(server):
    assert [m.id for m in client(server).models.list()] == ["kjv-llama"]


def test_completions(server):
    c = client(server)
    r = c.completions.create(model="kjv-llama", prompt="In the beginning", max_tokens=16, temperature=0)
    text = r.choices[0].text
    assert text and r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 16
    s = c.completions.create(model="kjv-llama", prompt="In the beginning", max_tokens=16, temperature=0,
                             stream=True)
    assert "".join(ch.choices[0].text for ch in s) == text
    mid = text[4:9]
    r = c.completions.create(model="kjv-llama", prompt="In the beginning", max_tokens=16, temperature=0,
                             stop=[mid, "@@"])
    assert r.choices[0].text == text[:text.index(mid)] and r.choices[0].finish_reason == "stop"


def test_chat(server):
    c = client(server)
    msgs = [{"role": "system", "content": "Thou art a scribe."}, {"role": "user", "content": "Who made heaven?"}]
    r = c.chat.completions.create(model="kjv-llama", messages=msgs, max_tokens=12, temperature=0)
    reply = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant" and reply
    s = c.chat.completions.create(model="kjv-llama", messages=msgs, max_tokens=12, temperature=0, stream=True,
                                  stream_options={"include_usage": True})
    chunks = list(s)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == reply
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    r2 = c.chat.completions.create(model="kjv-llama", messages=msgs, max_tokens=12, temperature=0, n=2)
    assert [ch.message.content for ch in r2.choices] == [reply, reply]


def test_errors(server):
    with pytest.raises(openai.AuthenticationError):
        client(server, "wrong").models.list()
    with pytest.raises(openai.BadRequestError) as e:
        client(server).completions.create(model="kjv-llama", prompt="x", max_tokens=100000)
    assert "max_tokens" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client(server).chat.completions.create(model="kjv-llama", messages=[{"role": "user", "content": "x"}],
                                               logprobs=True)
