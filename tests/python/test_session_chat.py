"""flextier.Session for chat and interactive use (issue 22): chat() with the
model's template (or a given one), tokenize/detokenize, stop as a list, and
generation that stops when the caller stops iterating, sets a cancel event
or presses Ctrl-C (the session is free again at once)."""
import os
import signal
import threading
import time

import pytest

import flextier

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO = os.path.join(ROOT, "demo", "kjv-llama")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def s():
    with flextier.Session(DEMO, threads=1) as sess:
        yield sess


def test_tokenize_detokenize(s):
    ids = s.tokenize("In the beginning God created")
    assert ids and all(isinstance(i, int) for i in ids)
    assert s.detokenize(ids) == "In the beginning God created"
    assert s.tokenize("In the beginning", add_special=False) == s.tokenize("In the beginning")[-len(
        s.tokenize("In the beginning", add_special=False)):]
    with pytest.raises(flextier.InvalidArgumentError):
        s.detokenize([-1])


def test_chat_without_a_template_is_refused(s):
    with pytest.raises(flextier.NotFoundError, match="chat template"):
        s.chat([{"role": "user", "content": "hi"}])


def test_chat_with_a_template(s):
    msgs = [{"role": "system", "content": "Thou art a scribe."}, {"role": "user", "content": "Who made heaven?"}]
    text = s.apply_chat_template(msgs, chat_template=CHATML)
    assert text == ("<|im_start|>system\nThou art a scribe.<|im_end|>\n<|im_start|>user\nWho made heaven?"
                    "<|im_end|>\n<|im_start|>assistant\n")
    reply = s.chat(msgs, 16, chat_template=CHATML, temperature=0)
    # the rendered text generated without the tokenizer's special tokens
    assert reply == s.generate(text, 16, temperature=0, add_special=False)
    assert "".join(s.chat(msgs, 16, chat_template=CHATML, temperature=0, stream=True)) == reply


def test_stop_list(s):
    full = s.generate("And God said", 40, temperature=0)
    mid = full[len(full) // 2:len(full) // 2 + 5]
    cut = full[:full.index(mid)]
    assert s.generate("And God said", 40, temperature=0, stop=["@@never@@", mid]) == cut
    assert s.generate("And God said", 40, temperature=0, stop=mid) == cut
    assert "".join(s.stream("And God said", 40, temperature=0, stop=[mid, "@@"])) == cut
    with pytest.raises(TypeError):
        s.generate("x", 2, stop=[1])


def test_abandoned_stream_stops_at_once(s):
    it = s.stream("In the beginning", 900, temperature=0, ignore_eos=True)
    next(it)
    t0 = time.time()
    it.close()   # the caller stops iterating
    assert time.time() - t0 < 2.0
    # the session is free: no BusyError
    assert s.generate("And God said", 4, temperature=0)
    for piece in s.stream("In the beginning", 900, temperature=0, ignore_eos=True):
        break
    del piece
    assert s.generate("And God said", 4, temperature=0)


def test_cancel_event(s):
    ev = threading.Event()
    got = []

    def on_text(_seq, t):
        got.append(t)
        if len(got) == 3:
            ev.set()

    t0 = time.time()
    s.generate("In the beginning", 900, temperature=0, ignore_eos=True, on_text=on_text, cancel=ev)
    assert time.time() - t0 < 5 and s.stats["decode_tokens"] < 50


def test_ctrl_c_stops_generation(s):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    # Ctrl-C arrives while tokens are generated: sent when the 5th piece
    # of text comes out (a timer of 0.3 s raced the 0.5 s the demo takes
    # for 900 tokens on a quiet machine, and lost under load)
    seen = []

    def on_text(seq, text):
        seen.append(text)
        if len(seen) == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return False

    # Python's own Ctrl-C handler, whatever this process inherited: a
    # shell that starts a job in the background (`make test &`) ignores
    # SIGINT for it, Python then keeps it ignored, and the signal was lost
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.time()
    try:
        with pytest.raises(KeyboardInterrupt):
            s.generate("In the beginning", 900, temperature=0, ignore_eos=True, on_text=on_text)
    finally:
        signal.signal(signal.SIGINT, old)
    assert time.time() - t0 < 5
    assert 5 <= len(seen) < 50
    assert s.generate("And God said", 4, temperature=0)   # usable again
