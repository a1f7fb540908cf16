#!/usr/bin/env python3
"""flextier server end to end, with the Python standard library only (the
`openai` client test is tests/python/test_server_openai.py): the demo model
(demo/kjv-llama) served on a loopback port; completions and chat, streaming
and not, stop lists, n, greedy text identical to `flextier run`, concurrent
requests identical to the same requests alone, the prefix cache (reused
tokens reported, text unchanged, from an idle slot and copied from a busy
one), a client that disconnects mid-stream, the queue's 429, the API key,
the non-loopback refusal, hostile bodies (bad JSON, oversized, wrong types,
deep nesting), an idle connection timed out, /health, /v1/models, /metrics.

    test_server.py FLEXTIER_BIN MODEL_DIR
"""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

BIN, MODEL = sys.argv[1], sys.argv[2]
failures = []
passed = 0

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def check(cond, what):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)
        print("FAIL:", what, flush=True)


class Server:
    def __init__(self, *args, model=None):
        self.log = tempfile.NamedTemporaryFile(prefix="ft_srv_", suffix=".log", delete=False)
        self.p = subprocess.Popen([BIN, "server", "--model", model or MODEL, "--listen", "127.0.0.1:0", *args],
                                  stdout=self.log, stderr=self.log)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline and self.p.poll() is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(self.log.name).read())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.05)
        if not self.port:
            raise RuntimeError("server did not start: " + open(self.log.name).read())

    def stop(self):
        """SIGTERM; the server must exit 0 (a sanitizer report or a leak would not)."""
        self.p.terminate()
        try:
            rc = self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        log = open(self.log.name, errors="replace").read()
        check(rc == 0 and "Sanitizer" not in log and "runtime error" not in log,
              f"the server exits cleanly on SIGTERM (exit {rc}): {log[-3000:]}")
        os.unlink(self.log.name)
        return rc

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, data, headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, raw

    def post(self, path, body, headers=None):
        status, raw = self.request("POST", path, body, headers)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    def stream(self, path, body):
        """The SSE events' JSON objects, and whether [DONE] ended them."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("POST", path, json.dumps(dict(body, stream=True)).encode(), {"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200, (r.status, r.read())
        assert r.getheader("Content-Type").startswith("text/event-stream")
        events, done = [], False
        for block in r.read().decode().split("\n\n"):
            if not block:
                continue
            assert block.startswith("data: "), block
            payload = block[6:]
            if payload == "[DONE]":
                done = True
                continue
            assert not done, "event after [DONE]"
            events.append(json.loads(payload))
        c.close()
        return events, done

    def metrics(self):
        _, raw = self.request("GET", "/metrics")
        out = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def run_cli(prompt, n):
    out = subprocess.run([BIN, "run", "--model", MODEL, "--prompt", prompt, "--max-new-tokens", str(n),
                          "--temperature", "0"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(prompt), out
    return out[len(prompt):].rstrip("\n")


def completion(srv, prompt, maxt, **kw):
    status, r = srv.post("/v1/completions", dict(prompt=prompt, max_tokens=maxt, temperature=0, **kw))
    assert status == 200, (status, r)
    return r


PROMPTS = ["In the beginning", "And God said", "Blessed are the", "The LORD is my shepherd",
           "And it came to pass", "Thou shalt not"]


def test_basics(srv):
    status, raw = srv.request("GET", "/health")
    check(status == 200 and json.loads(raw)["status"] == "ok", "/health")
    status, raw = srv.request("GET", "/v1/models")
    m = json.loads(raw)
    check(status == 200 and m["object"] == "list" and m["data"][0]["id"] == "kjv-llama", "/v1/models")
    status, raw = srv.request("GET", "/v1/models/kjv-llama")
    check(status == 200 and json.loads(raw)["id"] == "kjv-llama", "/v1/models/ID")
    status, raw = srv.request("GET", "/v1/models/other")
    check(status == 404 and json.loads(raw)["error"]["type"] == "not_found_error", "/v1/models/unknown: 404")


def test_greedy_matches_run(srv):
    for p in PROMPTS[:3]:
        want = run_cli(p, 24)
        r = completion(srv, p, 24)
        got = r["choices"][0]["text"]
        check(got == want, f"greedy server text equals flextier run for {p!r}: {got!r} vs {want!r}")
        check(r["object"] == "text_completion" and r["choices"][0]["finish_reason"] == "length",
              "completion object / finish_reason length")
        u = r["usage"]
        check(u["completion_tokens"] == 24 and u["total_tokens"] == u["prompt_tokens"] + 24, "usage counts")


def test_stream(srv):
    want = completion(srv, "In the beginning", 20)["choices"][0]["text"]
    ev, done = srv.stream("/v1/completions", dict(prompt="In the beginning", max_tokens=20, temperature=0,
                                                   stream_options={"include_usage": True}))
    text = "".join(e["choices"][0]["text"] for e in ev if e["choices"])
    check(done, "stream ends with [DONE]")
    check(text == want, f"streamed text equals the non-streamed: {text!r} vs {want!r}")
    fins = [e["choices"][0]["finish_reason"] for e in ev if e["choices"] and e["choices"][0]["finish_reason"]]
    check(fins == ["length"], f"one finish_reason in the stream: {fins}")
    check(ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 20, "usage chunk last")
    check(len({e["id"] for e in ev}) == 1 and all(e["object"] == "text_completion" for e in ev), "chunk ids")


def test_stop(srv):
    full = completion(srv, "And God said", 40)["choices"][0]["text"]
    # a stop string from the middle of the greedy text, and one that never occurs
    mid = full[len(full) // 2:len(full) // 2 + 5]
    cut = full[:full.index(mid)]
    r = completion(srv, "And God said", 40, stop=["@@never@@", mid])
    check(r["choices"][0]["text"] == cut and r["choices"][0]["finish_reason"] == "stop",
          f"stop list cuts the text: {r['choices'][0]['text']!r} vs {cut!r}")
    r = completion(srv, "And God said", 40, stop=mid)
    check(r["choices"][0]["text"] == cut, "stop as a string")
    ev, _ = srv.stream("/v1/completions", dict(prompt="And God said", max_tokens=40, temperature=0, stop=[mid]))
    text = "".join(e["choices"][0]["text"] for e in ev)
    check(text == cut, f"stop in a stream: {text!r} vs {cut!r}")
    check(ev[-1]["choices"][0]["finish_reason"] == "stop", "stream finish_reason stop")


def test_n(srv):
    want = completion(srv, "Blessed are the", 12)["choices"][0]["text"]
    r = completion(srv, "Blessed are the", 12, n=3)
    texts = [c["text"] for c in r["choices"]]
    check([c["index"] for c in r["choices"]] == [0, 1, 2] and texts == [want] * 3, "n=3 greedy choices")
    status, r = srv.post("/v1/completions", dict(prompt="Blessed are the", max_tokens=12, n=2, temperature=1.0,
                                                 seed=7))
    check(status == 200 and len(r["choices"]) == 2 and r["usage"]["completion_tokens"] >= 2, "n=2 sampled")
    status, r2 = srv.post("/v1/completions", dict(prompt="Blessed are the", max_tokens=12, n=2, temperature=1.0,
                                                  seed=7))
    check([c["text"] for c in r["choices"]] == [c["text"] for c in r2["choices"]], "same seed, same samples")


def test_concurrent(srv):
    alone = [completion(srv, p, 16)["choices"][0]["text"] for p in PROMPTS]
    got = [None] * len(PROMPTS)

    def one(i):
        got[i] = completion(srv, PROMPTS[i], 16)["choices"][0]["text"]

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(got == alone, f"concurrent requests give the text each gives alone: {got} vs {alone}")
    m = srv.metrics()
    check(m["flextier_step_rows_total"] > m["flextier_steps_total"], "steps batched several rows")


def test_prefix_cache(srv):
    history = " ".join(["And the LORD spake unto Moses, saying, Speak unto the children of Israel."] * 6)
    r1 = completion(srv, history + " And Moses", 10)
    r2 = completion(srv, history + " And Moses", 10)
    plen = r2["usage"]["prompt_tokens"]
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    check(cached == plen - 1, f"the same prompt again: {cached} of {plen} tokens from the cache")
    check(r1["choices"][0]["text"] == r2["choices"][0]["text"], "same text with the cache")
    r3 = completion(srv, history + " And Aaron said", 10)
    c3 = r3["usage"]["prompt_tokens_details"]["cached_tokens"]
    check(c3 >= plen - 4, f"a shared prefix is reused: {c3} cached of {r3['usage']['prompt_tokens']}")
    want = run_cli(history + " And Aaron said", 10)
    check(r3["choices"][0]["text"] == want, f"text after a reused prefix equals flextier run: "
          f"{r3['choices'][0]['text']!r} vs {want!r}")
    # copied from a busy slot: a long streaming request holds the prefix (its
    # first token out: its prompt is in its slot), another joins meanwhile
    other = " ".join(["Blessed are the poor in spirit: for theirs is the kingdom of heaven."] * 5)
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.settimeout(60)
    body = json.dumps(dict(prompt=other + " Blessed", max_tokens=300, ignore_eos=True, stream=True,
                           temperature=0)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode() +
              b"\r\n\r\n" + body)
    got = b""
    while b"data: " not in got:
        d = s.recv(4096)
        if not d:
            break
        got += d
    r4 = completion(srv, other + " Blessed are they that mourn", 8)
    c4 = r4["usage"]["prompt_tokens_details"]["cached_tokens"]
    s.close()
    check(c4 >= 16, f"a prefix held by a busy slot is copied: {c4} cached")
    want = run_cli(other + " Blessed are they that mourn", 8)
    check(r4["choices"][0]["text"] == want, "text after a copied prefix equals flextier run")


def test_disconnect(srv):
    before = srv.metrics().get("flextier_requests_finished_total{reason=\"cancelled\"}", 0)
    s = socket.create_connection(("127.0.0.1", srv.port))
    body = json.dumps(dict(prompt="In the beginning", max_tokens=400, ignore_eos=True, stream=True)).encode()
    s.settimeout(30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while b"data: " not in got:
        d = s.recv(4096)
        if not d:
            break
        got += d
    check(b"data: " in got, f"the stream began: {got[:200]!r}")
    s.close()
    deadline = time.time() + 10
    m = srv.metrics()
    while time.time() < deadline and (m.get("flextier_requests_finished_total{reason=\"cancelled\"}", 0) == before
                                      or m["flextier_active_requests"] > 0):
        time.sleep(0.05)
        m = srv.metrics()
    check(m.get("flextier_requests_finished_total{reason=\"cancelled\"}", 0) == before + 1,
          "a client that disconnects mid-stream cancels its request")
    check(m["flextier_active_requests"] == 0, "its slot is free again")
    check(completion(srv, "And God said", 4)["choices"][0]["text"] != "", "the server serves on")
    # the same for a non-streaming request
    s = socket.create_connection(("127.0.0.1", srv.port))
    body = json.dumps(dict(prompt="In the beginning", max_tokens=400, ignore_eos=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode() +
              b"\r\n\r\n" + body)
    time.sleep(0.3)
    s.close()
    deadline = time.time() + 10
    while time.time() < deadline and srv.metrics()["flextier_active_requests"] > 0:
        time.sleep(0.05)
    check(srv.metrics()["flextier_active_requests"] == 0, "a non-streaming request is cancelled when its client goes")


def test_hostile(srv):
    cases = [
        (b"{bad", 400, "bad JSON"),
        (b'{"prompt": "x"', 400, "truncated JSON"),
        (b'{"prompt": "x"} trailing', 400, "text after the value"),
        (b"[1, 2]", 400, "not an object"),
        (b"", 400, "empty body"),
        (b'{"prompt": 5}', 400, "prompt of the wrong type"),
        (b'{"prompt": [1, -2]}', 400, "negative token id"),
        (b'{"prompt": [99999999]}', 400, "token id past the vocabulary"),
        (b'{"prompt": "x", "max_tokens": 0}', 400, "max_tokens 0"),
        (b'{"prompt": "x", "max_tokens": 1e30}', 400, "max_tokens huge"),
        (b'{"prompt": "x", "max_tokens": 1000}', 400, "prompt + max_tokens past the context"),
        (b'{"prompt": "x", "temperature": -1}', 400, "negative temperature"),
        (b'{"prompt": "x", "temperature": "hot"}', 400, "temperature string"),
        (b'{"prompt": "x", "top_p": 2}', 400, "top_p > 1"),
        (b'{"prompt": "x", "n": 100}', 400, "n too large"),
        (b'{"prompt": "x", "stop": [1]}', 400, "stop of the wrong type"),
        (b'{"prompt": "x", "stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}', 400,
         "too many stop strings"),
        (b'{"prompt": "x", "logprobs": true}', 400, "logprobs (not implemented)"),
        (b'{"prompt": "x", "stream": "yes"}', 400, "stream not a boolean"),
        (b'{"prompt": "x", "presence_penalty": 1}', 400, "presence_penalty (not implemented)"),
        (b'{"prompt": "' + b"word " * 1200 + b'"}', 400, "prompt longer than the context"),
        (b"[" * 10000 + b"]" * 10000, 400, "deep nesting"),
        (b'{"prompt": "x\\u0000y", "max_tokens": 2}', 200, "NUL in the prompt"),
        (b'{"prompt": "\xff\xfe\xc3", "max_tokens": 2}', 200, "invalid UTF-8 in the prompt"),
    ]
    for body, want, what in cases:
        status, raw = srv.request("POST", "/v1/completions", body)
        ok = status == want
        if ok and want >= 400:
            e = json.loads(raw).get("error", {})
            ok = isinstance(e.get("message"), str) and e.get("type") == "invalid_request_error"
        check(ok, f"{what}: HTTP {status} (want {want}) {raw[:200]!r}")
    # an oversized body announced by Content-Length: answered before it is sent
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.settimeout(10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
    resp = s.recv(65536)
    s.close()
    check(resp.startswith(b"HTTP/1.1 413") and b"payload_too_large" in resp, f"oversized body: 413 ({resp[:60]!r})")
    # an oversized chunked body (no Content-Length)
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"a" * 65536
    try:
        for _ in range(20):
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        s.sendall(b"0\r\n\r\n")
        s.settimeout(10)
        resp = s.recv(4096)
    except OSError:
        resp = b"HTTP/1.1 413"   # the server may close while the body is still coming
    s.close()
    check(resp.startswith(b"HTTP/1.1 413"), f"oversized chunked body: 413 ({resp[:40]!r})")
    status, raw = srv.request("GET", "/v1/nothing")
    check(status == 404, "unknown path: 404")
    status, raw = srv.request("GET", "/v1/completions")
    check(status == 405, "GET on a POST endpoint: 405")
    status, r = srv.post("/v1/chat/completions", dict(messages=[{"role": "user", "content": "hi"}]))
    check(status == 400 and "chat template" in r["error"]["message"] and "--chat-template" in r["error"]["message"],
          "chat without a template: a clear 400")
    check(completion(srv, "And God said", 3)["choices"][0]["text"] != "", "the server serves on after all that")


def test_timeout():
    srv = Server("--timeout", "1")
    try:
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")   # never finished
        s.settimeout(10)
        t0 = time.time()
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        check(time.time() - t0 < 8 and data in (b"",) or data.startswith(b"HTTP/1.1 4"),
              "an idle half-sent request is closed after the timeout")
        s.close()
        check(completion(srv, "And God said", 3)["choices"][0]["text"] != "", "served after a timed-out client")
    finally:
        srv.stop()


def test_queue_full():
    srv = Server("--slots", "1", "--queue", "0")
    try:
        res = {}

        def long_one():
            res["r"] = completion(srv, "In the beginning", 300, ignore_eos=True)

        t = threading.Thread(target=long_one)
        t.start()
        deadline = time.time() + 20
        while time.time() < deadline and srv.metrics()["flextier_active_requests"] < 1:
            time.sleep(0.02)
        status, r = srv.post("/v1/completions", dict(prompt="x", max_tokens=2))
        check(status == 429 and r["error"]["type"] == "rate_limit_error", f"queue full: 429 ({status})")
        t.join()
        check(res["r"]["usage"]["completion_tokens"] == 300, "the running request is unaffected")
        status, r = srv.post("/v1/completions", dict(prompt="x", max_tokens=2))
        check(status == 200, "accepted again once the slot is free")
    finally:
        srv.stop()


def test_api_key():
    with tempfile.NamedTemporaryFile("w", delete=False) as f:
        f.write("s3cret-key\n")
    srv = Server("--api-key-file", f.name)
    try:
        body = dict(prompt="x", max_tokens=2)
        status, r = srv.post("/v1/completions", body)
        check(status == 401 and r["error"]["code"] == "invalid_api_key", "no key: 401")
        status, r = srv.post("/v1/completions", body, {"Authorization": "Bearer wrong"})
        check(status == 401, "wrong key: 401")
        status, r = srv.post("/v1/completions", body, {"Authorization": "Bearer s3cret-key"})
        check(status == 200, "right key: 200")
        status, _ = srv.request("GET", "/v1/models", headers={"Authorization": "Bearer s3cret-keyX"})
        check(status == 401, "a longer key: 401")
        status, _ = srv.request("GET", "/health", headers={})
        check(status == 200, "/health needs no key")
        status, _ = srv.request("GET", "/metrics", headers={})
        check(status == 401, "/metrics needs the key")
    finally:
        srv.stop()
        os.unlink(f.name)
    p = subprocess.run([BIN, "server", "--model", MODEL, "--listen", "0.0.0.0:0"], capture_output=True, text=True,
                       timeout=60)
    check(p.returncode != 0 and "--insecure" in p.stderr, f"non-loopback without a key refused: {p.stderr!r}")


def test_offloaded():
    """Weights streamed from a disk tier (every offloading option of run
    applies): greedy text as flextier run with the same policy, and each
    step fetches each layer once, whatever the number of requests in it."""
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        srv = Server("--policy", "w=0,0,100", "--disk-dir", d1, "--slots", "4")
        try:
            out = subprocess.run([BIN, "run", "--model", MODEL, "--prompt", "And God said", "--max-new-tokens", "12",
                                  "--temperature", "0", "--policy", "w=0,0,100", "--disk-dir", d2],
                                 capture_output=True, text=True, check=True).stdout
            want = out[len("And God said"):].rstrip("\n")
            got = [None] * 4

            def one(i):
                got[i] = completion(srv, "And God said", 12)["choices"][0]["text"]

            ts = [threading.Thread(target=one, args=(i,)) for i in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            check(got == [want] * 4, f"offloaded server = offloaded run: {got} vs {want!r}")
            deadline = time.time() + 10
            m = srv.metrics()
            while time.time() < deadline and m["flextier_active_requests"] > 0:
                time.sleep(0.05)
                m = srv.metrics()
            time.sleep(0.2)
            m = srv.metrics()
            steps, fetched = m["flextier_steps_total"], m["flextier_weight_layers_fetched_total"]
            check(steps >= 12 and 6 * steps <= fetched <= 6 * steps + 6,
                  f"one fetch of each layer per step: {fetched} fetches for {steps} steps of 6 layers")
            check(m['flextier_moved_bytes_total{what="weights",dir="read",tier="disk"}'] > 0, "bytes read from disk")
        finally:
            srv.stop()


def write_adapter(d, seed, rank=4, alpha=8):
    """A PEFT LoRA adapter for the demo model with random A and B (standard
    library only: safetensors is a JSON header and raw little-endian f32)."""
    import random
    import struct
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    h, f = cfg["hidden_size"], cfg["intermediate_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    rnd = random.Random(seed)
    tensors = []
    for layer in range(cfg["num_hidden_layers"]):
        for mod, out, inp in (("self_attn.q_proj", q, h), ("mlp.down_proj", h, f)):
            base = f"base_model.model.model.layers.{layer}.{mod}"
            tensors.append((base + ".lora_A.weight", [rank, inp], [rnd.uniform(-1, 1) / inp ** 0.5
                                                                  for _ in range(rank * inp)]))
            tensors.append((base + ".lora_B.weight", [out, rank], [rnd.gauss(0, 0.3) for _ in range(out * rank)]))
    header, off, blobs = {}, 0, []
    for name, shape, vals in tensors:
        b = struct.pack(f"<{len(vals)}f", *vals)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "adapter_model.safetensors"), "wb") as fh:
        fh.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
    with open(os.path.join(d, "adapter_config.json"), "w") as fh:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": ["q_proj", "down_proj"],
                   "bias": "none", "lora_dropout": 0.0}, fh)


def test_lora():
    """server --lora A:SCALE --lora B (several adapters, applied in the
    engine's forward under continuous batching): concurrent requests give
    the greedy text of `flextier run` with the same adapters, which differs
    from the base model's."""
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "a"), os.path.join(d, "b")
        write_adapter(a, 1)
        write_adapter(b, 2, rank=2, alpha=2)
        ads = ["--lora", a + ":0.5", "--lora", b]
        srv = Server("--slots", "4", *ads)
        try:
            want, base = [], []
            for p in PROMPTS[:4]:
                out = subprocess.run([BIN, "run", "--model", MODEL, "--prompt", p, "--max-new-tokens", "12",
                                      "--temperature", "0", *ads], capture_output=True, text=True, check=True).stdout
                want.append(out[len(p):].rstrip("\n"))
                base.append(run_cli(p, 12))
            check(want != base, f"the adapters change the text: {want} vs {base}")
            got = [None] * 4

            def one(i):
                got[i] = completion(srv, PROMPTS[i], 12)["choices"][0]["text"]

            ts = [threading.Thread(target=one, args=(i,)) for i in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            check(got == want, f"server --lora = run --lora: {got} vs {want}")
        finally:
            srv.stop()
    r = subprocess.run([BIN, "server", "--model", MODEL, "--listen", "127.0.0.1:0", "--lora", MODEL],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "adapter_config.json" in r.stderr, f"server --lora without an adapter: {r.stderr}")


def test_model_template():
    """A model directory whose tokenizer_config.json has a chat_template: the
    server uses it without --chat-template (the same replies as with the file)."""
    msgs = [{"role": "user", "content": "Who made heaven?"}]
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(CHATML)
    srv = Server("--chat-template", f.name)
    try:
        want = srv.post("/v1/chat/completions", dict(messages=msgs, max_tokens=12, temperature=0))[1]
    finally:
        srv.stop()
        os.unlink(f.name)
    with tempfile.TemporaryDirectory() as d:
        for name in os.listdir(MODEL):
            if name != "tokenizer_config.json":
                os.symlink(os.path.join(os.path.abspath(MODEL), name), os.path.join(d, name))
        cfg = json.load(open(os.path.join(MODEL, "tokenizer_config.json")))
        cfg["chat_template"] = CHATML
        with open(os.path.join(d, "tokenizer_config.json"), "w") as out:
            json.dump(cfg, out)
        srv = Server(model=d)
        try:
            status, r = srv.post("/v1/chat/completions", dict(messages=msgs, max_tokens=12, temperature=0))
            check(status == 200 and r["choices"][0]["message"]["content"] ==
                  want["choices"][0]["message"]["content"], f"the model's own chat template: {status} {r}")
        finally:
            srv.stop()


def test_prefix_store():
    """One slot: a prefix pushed out of it goes to the store and comes back."""
    history = " ".join(["And the LORD spake unto Moses, saying, Speak unto the children of Israel."] * 6)
    with tempfile.TemporaryDirectory() as d:
        for uri in ("mem:", "file:" + d):
            srv = Server("--slots", "1", "--ctx", "512", "--prefix-store", uri)
            try:
                completion(srv, history + " And Moses", 8)
                completion(srv, "Blessed are the poor in spirit: for theirs is the kingdom of heaven. " * 3, 4)
                r = completion(srv, history + " And Aaron said", 10)
                c = r["usage"]["prompt_tokens_details"]["cached_tokens"]
                m = srv.metrics()
                check(c >= 64 and m["flextier_prefix_store_restored_tokens_total"] == c,
                      f"{uri}: a prefix comes back from the store ({c} cached, "
                      f"{m['flextier_prefix_store_restored_tokens_total']} restored)")
                check(m["flextier_prefix_store_spilled_tokens_total"] >= c, f"{uri}: spilled")
                want = run_cli(history + " And Aaron said", 10)
                check(r["choices"][0]["text"] == want, f"{uri}: text after a restored prefix equals flextier run: "
                      f"{r['choices'][0]['text']!r} vs {want!r}")
            finally:
                srv.stop()
            if uri.startswith("file:"):
                check(os.listdir(d) == [] or all(not f.startswith("ftpfx") for f in os.listdir(d)),
                      f"the server removes its prefixes from the store at exit: {os.listdir(d)}")
    p = subprocess.run([BIN, "server", "--model", MODEL, "--listen", "127.0.0.1:0", "--prefix-store", "mem:",
                        "--policy", "w=100,0 c=0,100"], capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "prefix-store" in p.stderr, f"--prefix-store with an offloaded cache: refused "
          f"({p.stderr[-200:]!r})")


def test_chat():
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(CHATML)
    srv = Server("--chat-template", f.name)
    try:
        msgs = [{"role": "system", "content": "Thou art a scribe."}, {"role": "user", "content": "Who made heaven?"}]
        status, r = srv.post("/v1/chat/completions", dict(messages=msgs, max_tokens=12, temperature=0))
        check(status == 200 and r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] ==
              "assistant", f"chat completion: {status} {r}")
        reply = r["choices"][0]["message"]["content"]
        ev, done = srv.stream("/v1/chat/completions", dict(messages=msgs, max_tokens=12, temperature=0))
        check(done and ev[0]["choices"][0]["delta"].get("role") == "assistant", "chat stream starts with the role")
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev)
        check(text == reply, f"chat stream equals the non-streamed reply: {text!r} vs {reply!r}")
        check(all(e["object"] == "chat.completion.chunk" for e in ev), "chat chunk objects")
        # the second turn reuses the first's cache
        msgs2 = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
        status, r2 = srv.post("/v1/chat/completions", dict(messages=msgs2, max_tokens=8, temperature=0))
        c = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
        check(status == 200 and c >= r["usage"]["prompt_tokens"] - 1,
              f"second turn: {c} of {r2['usage']['prompt_tokens']} prompt tokens cached")
        # text parts, and a message the template cannot take
        parts = [{"role": "user", "content": [{"type": "text", "text": "Who made "}, {"type": "text",
                                                                                     "text": "heaven?"}]}]
        status, r3 = srv.post("/v1/chat/completions", dict(messages=msgs[:1] + parts, max_tokens=12, temperature=0))
        check(status == 200 and r3["choices"][0]["message"]["content"] == reply, "content as text parts")
        status, r = srv.post("/v1/chat/completions", dict(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]))
        check(status == 400, "an image part: 400")
        status, r = srv.post("/v1/chat/completions", dict(messages="hi"))
        check(status == 400 and r["error"]["param"] == "messages", "messages not a list: 400")
        status, r = srv.post("/v1/chat/completions", dict(messages=[{"content": "no role"}]))
        check(status == 400, "a message without a role: 400")
    finally:
        srv.stop()
        os.unlink(f.name)


def main():
    srv = Server("--slots", "4", "--ctx", "512")
    try:
        for t in (test_basics, test_greedy_matches_run, test_stream, test_stop, test_n, test_concurrent,
                  test_prefix_cache, test_disconnect, test_hostile):
            t0 = time.time()
            t(srv)
            print(f"{t.__name__}: {time.time() - t0:.1f} s", flush=True)
        m = srv.metrics()
        for name in ("flextier_requests_total", "flextier_generated_tokens_total", "flextier_queue_length",
                     "flextier_generation_tokens_per_second", 'flextier_memory_bytes{what="kv_cache",tier="device"}',
                     "flextier_prompt_tokens_cached_total"):
            check(name in m, f"/metrics has {name}")
        check(m["flextier_requests_finished_total{reason=\"error\"}"] == 0, "no request ended in an error")
    finally:
        srv.stop()
    for t in (test_chat, test_lora, test_offloaded, test_model_template, test_prefix_store, test_queue_full, test_api_key, test_timeout):
        t0 = time.time()
        t()
        print(f"{t.__name__}: {time.time() - t0:.1f} s", flush=True)
    print(f"{passed} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
