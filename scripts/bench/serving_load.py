#!/usr/bin/env python3
"""Load generator for scripts/bench/serving.sh (standard library only): N
concurrent clients, each sending streaming /v1/completions requests one
after another (a prompt of P random token ids, G generated tokens with EOS
ignored) until R requests are done in all or T seconds pass. Prints one
JSON line: aggregate generated tok/s (tokens of finished requests over the
wall time), time to first token p50/p99, requests done.

    serving_load.py --url http://127.0.0.1:PORT --clients N --prompt-len P --gen-len G
                    [--requests R] [--time T] [--seed S]
    serving_load.py --url ... --second-turn --history H   # TTFT of a second turn

--second-turn: one client; turn 1 sends a history of H token ids plus a
16-token question and reads the reply; turn 2 sends history + question + a
new 16-token question (turn 1's prompt as a shared prefix). Prints the TTFT of
turn 2 (median of --repeats conversations, each with a fresh history).
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def stream_completion(url, prompt, gen, extra=None):
    """(ttft seconds, total seconds, generated token ids or text pieces count)."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = dict(prompt=prompt, max_tokens=gen, temperature=0, stream=True, ignore_eos=True)
    body.update(extra or {})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft = None
    text = []
    buf = b""
    done = False
    while not done:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(4096)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            ev = ev.strip()
            if not ev.startswith(b"data: "):
                continue
            payload = ev[6:]
            if payload == b"[DONE]":
                done = True
                break
            o = json.loads(payload)
            ch = o.get("choices") or []
            if ch and ch[0].get("text"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(ch[0]["text"])
    c.close()
    return ttft, time.perf_counter() - t0, "".join(text)


def pct(v, p):
    v = sorted(v)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def load(a):
    rng = random.Random(a.seed)
    lock = threading.Lock()
    state = {"left": a.requests, "tokens": 0, "done": 0, "ttft": [], "errors": 0}
    deadline = time.perf_counter() + a.time

    def client(i):
        r = random.Random(a.seed * 1000 + i)
        while time.perf_counter() < deadline:
            with lock:
                if state["left"] <= 0:
                    return
                state["left"] -= 1
            prompt = [r.randrange(100, a.vocab) for _ in range(a.prompt_len)]
            try:
                ttft, _, _ = stream_completion(a.url, prompt, a.gen_len)
            except Exception as e:  # counted, reported
                print(f"client {i}: {e}", file=sys.stderr)
                with lock:
                    state["errors"] += 1
                continue
            with lock:
                state["tokens"] += a.gen_len
                state["done"] += 1
                if ttft is not None:
                    state["ttft"].append(ttft)

    del rng
    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    print(json.dumps(dict(clients=a.clients, requests=state["done"], errors=state["errors"], wall_s=round(wall, 2),
                          tok_s=round(state["tokens"] / wall, 2),
                          ttft_p50_ms=round(pct(state["ttft"], 50) * 1e3, 1),
                          ttft_p99_ms=round(pct(state["ttft"], 99) * 1e3, 1))))


def second_turn(a):
    r = random.Random(a.seed)
    extra = {"cache_prompt": False} if a.no_cache_prompt else None
    ttft2, ttft1 = [], []
    for k in range(a.repeats):
        hist = [r.randrange(100, a.vocab) for _ in range(a.history)]
        q1 = [r.randrange(100, a.vocab) for _ in range(16)]
        t1, _, _ = stream_completion(a.url, hist + q1, a.gen_len, extra)
        # the second turn: turn 1's prompt (history + question) and a new
        # question; the shared prefix is the whole first prompt (the reply's
        # ids are not portable between servers, so it is left out)
        q2 = [r.randrange(100, a.vocab) for _ in range(16)]
        t2, _, _ = stream_completion(a.url, hist + q1 + q2, a.gen_len, extra)
        ttft1.append(t1)
        ttft2.append(t2)
    print(json.dumps(dict(history=a.history, repeats=a.repeats,
                          turn1_ttft_ms=round(statistics.median(ttft1) * 1e3, 1),
                          turn2_ttft_ms=round(statistics.median(ttft2) * 1e3, 1))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--time", type=float, default=120)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--second-turn", action="store_true")
    ap.add_argument("--history", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-cache-prompt", action="store_true", help="llama-server: cache_prompt false")
    a = ap.parse_args()
    second_turn(a) if a.second_turn else load(a)


if __name__ == "__main__":
    main()
