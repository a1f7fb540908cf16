#!/usr/bin/env python3
"""flextier chat driven through a pseudo-terminal: a reply streams, the
second turn reuses the first turn's KV cache (--stats), Ctrl-C stops a
long reply and keeps the session (the next turn still answers, reusing the
cache), Ctrl-C at the prompt does not leave, /clear forgets the
conversation, /exit leaves with status 0; greedy replies equal the server's
chat completion for the same conversation.

    test_chat_pty.py FLEXTIER_BIN MODEL_DIR
"""
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
failures, passed = [], 0


def check(cond, what):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)
        print("FAIL:", what, flush=True)


class Pty:
    def __init__(self, argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(argv[0], argv)
        self.buf = b""

    def read_until(self, pattern, timeout=60):
        rx = re.compile(pattern)
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = rx.search(self.buf)
            if m:
                out, self.buf = self.buf[:m.end()], self.buf[m.end():]
                return out
            r, _, _ = select.select([self.fd], [], [], 0.1)
            if r:
                try:
                    d = os.read(self.fd, 65536)
                except OSError:
                    break
                if not d:
                    break
                self.buf += d
        raise TimeoutError(f"waiting for {pattern!r}, got {self.buf[-500:]!r}")

    def send(self, s):
        os.write(self.fd, s.encode() if isinstance(s, str) else s)

    def wait(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                r, _, _ = select.select([self.fd], [], [], 0.1)
                if r:
                    os.read(self.fd, 65536)
            except OSError:
                pass
        os.kill(self.pid, signal.SIGKILL)
        return None


def server_reply(tmpl, messages, max_tokens):
    log = tempfile.NamedTemporaryFile(delete=False)
    p = subprocess.Popen([BIN, "server", "--model", MODEL, "--listen", "127.0.0.1:0", "--chat-template", tmpl],
                         stdout=log, stderr=log)
    try:
        port = None
        for _ in range(600):
            m = re.search(r"127\.0\.0\.1:(\d+)", open(log.name).read())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.05)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(
            dict(messages=messages, max_tokens=max_tokens, temperature=0)).encode(),
            {"Content-Type": "application/json"})
        return json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"]
    finally:
        p.terminate()
        p.wait(30)
        os.unlink(log.name)


def main():
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(CHATML)
    tmpl = f.name
    try:
        c = Pty([BIN, "chat", "--model", MODEL, "--chat-template", tmpl, "--temperature", "0", "--stats",
                 "--max-new-tokens", "16"])
        c.read_until(rb"> ")
        c.send("Who made heaven?\r")
        out = c.read_until(rb"\]\r?\n> ")
        text = out.decode(errors="replace").replace("\r", "")
        text = text.split("Who made heaven?\n")[-1]   # after the echo (a line editor may draw it twice)
        m = re.search(r"^(.*)\n\[prompt (\d+) tokens: (\d+) reused", text, re.S)
        check(m is not None, f"first turn: a reply and stats ({text!r})")
        reply1 = m.group(1) if m else ""
        check(len(reply1.strip()) > 0, "the reply is not empty")
        want = server_reply(tmpl, [{"role": "user", "content": "Who made heaven?"}], 16)
        check(reply1 == want, f"greedy reply equals the server's: {reply1!r} vs {want!r}")
        c.send("And then?\r")
        out = c.read_until(rb"\]\r?\n> ").decode(errors="replace").replace("\r", "")
        m2 = re.search(r"\[prompt (\d+) tokens: (\d+) reused", out)
        check(m2 is not None and int(m2.group(2)) >= int(m.group(2)) if m else False,
              f"the second turn reuses the first turn's cache ({out!r})")
        c.send("/clear\r")
        c.read_until(rb"conversation cleared\]\r?\n> ")
        c.send("/exit\r")
        check(c.wait() == 0, "/exit leaves with status 0")
        # Ctrl-C stops a long reply (no token limit: until the context ends); the session stays
        c = Pty([BIN, "chat", "--model", MODEL, "--chat-template", tmpl, "--temperature", "0", "--stats",
                 "--ctx", "1024"])
        c.read_until(rb"> ")
        c.send("Tell me all the generations of Adam\r")
        c.read_until(rb"Adam\r?\n")
        # the reply is streaming (a line editor may echo the line twice: wait for more than that)
        c.read_until(rb"(?s).{120}")
        c.send(b"\x03")
        out = c.read_until(rb"\]\r?\n> ", timeout=30).decode(errors="replace")
        m3 = re.search(r"(\d+) generated", out)
        check("[stopped]" in out and m3 and int(m3.group(1)) < 500, f"Ctrl-C stops the reply ({out[-300:]!r})")
        c.send(b"\x03")   # at the prompt: a new line, not an exit
        time.sleep(0.2)
        c.send("Who made heaven?\r")
        out = c.read_until(rb"\]\r?\n> ").decode(errors="replace").replace("\r", "")
        check("reused" in out, f"the session answers after Ctrl-C ({out!r})")
        c.send("/exit\r")
        rc = c.wait()
        check(rc == 0, f"/exit leaves with status 0 ({rc})")
        # Ctrl-D leaves too
        c = Pty([BIN, "chat", "--model", MODEL, "--chat-template", tmpl])
        c.read_until(rb"> ")
        time.sleep(0.5)   # the line editor may flush input typed before it set the terminal up
        c.send(b"\x04")
        rc = c.wait()
        check(rc == 0, f"Ctrl-D leaves with status 0 ({rc})")
        # no template: a clear refusal
        p = subprocess.run([BIN, "chat", "--model", MODEL], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                           timeout=60)
        check(p.returncode == 2 and "--chat-template" in p.stderr, f"no chat template: refused ({p.stderr!r})")
    finally:
        os.unlink(tmpl)
    print(f"{passed} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
