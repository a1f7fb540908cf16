"""flextier.Session: generation from Python over the C session API, checked
against `flextier run` on the same model (the trained demo model and a
random one from `flextier gen-model`)."""
import os
import subprocess
import threading

import pytest

import flextier

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO = os.path.join(ROOT, "demo", "kjv-llama")
FT_BIN = os.environ.get("FT_BIN", os.path.join(ROOT, "build", "flextier"))


def cli_run(model, prompt, n, *extra):
    out = subprocess.run([FT_BIN, "run", "--model", model, "--prompt", prompt, "--max-new-tokens", str(n),
                          "--temperature", "0", "--threads", "1", *extra],
                         check=True, capture_output=True, text=True).stdout
    assert out.startswith(prompt)
    return out[len(prompt):].rstrip("\n")


needs_cli = pytest.mark.skipif(not os.access(FT_BIN, os.X_OK), reason="the flextier CLI is not built")


@needs_cli
def test_greedy_text_equals_the_cli():
    prompt = "And God said unto Moses,"
    want = cli_run(DEMO, prompt, 24)
    with flextier.Session(DEMO, threads=1) as s:
        got = s.generate(prompt, 24, temperature=0)
        assert got == want
        assert s.stats["decode_tokens"] == 23 and s.stats["prefill_tokens"] > 0
        info = s.info()
        assert info["model_type"] == "llama" and info["weights_format"] == "bf16" and info["has_tokenizer"]


@needs_cli
def test_formats_and_policies_equal_the_cli(tmp_path):
    prompt = "In the beginning"
    for extra, kw in ((["--weights-dtype", "q4"], dict(weights="q4")),
                      (["--kv-dtype", "f32"], dict(kv_dtype="f32")),
                      (["--policy", "w=0,0,100", "--disk-dir", str(tmp_path / "cli")],
                       dict(policy="w=0,0,100", disk_dir=str(tmp_path / "py")))):
        want = cli_run(DEMO, prompt, 16, *extra)
        with flextier.Session(DEMO, threads=1, **kw) as s:
            assert s.generate(prompt, 16, temperature=0) == want, extra


def test_batch_stream_and_stop():
    prompts = ["And the LORD said", "Blessed are"]
    with flextier.Session(DEMO, threads=1) as s:
        batch = s.generate(prompts, 12, temperature=0)
        assert len(batch) == 2
        # one at a time gives the same text (batched == sequential)
        assert [s.generate(p, 12, temperature=0) for p in prompts] == batch
        pieces = list(s.stream(prompts[0], 12, temperature=0))
        assert "".join(pieces) == batch[0] and len(pieces) > 1
        seen = []
        s.generate(prompts[0], 12, temperature=0, on_text=lambda i, t: seen.append((i, t)))
        assert "".join(t for _, t in seen) == batch[0] and all(i == 0 for i, _ in seen)
        # stop strings cut the text; a callback returning True stops
        word = batch[0].split()[1] if len(batch[0].split()) > 1 else batch[0]
        cut = s.generate(prompts[0], 12, temperature=0, stop=word)
        assert word not in cut and batch[0].startswith(cut)
        early = s.generate(prompts[0], 12, temperature=0, on_text=lambda i, t: True)
        assert len(early) <= len(batch[0])
        # sampling with a seed reproduces
        a = s.generate(prompts[0], 12, temperature=0.8, top_k=40, seed=7)
        assert a == s.generate(prompts[0], 12, temperature=0.8, top_k=40, seed=7)


def test_ids_and_errors(tmp_path):
    with flextier.Session(DEMO, threads=1) as s:
        ids = s.generate_ids([[1, 2, 3], [4, 5]], 5, temperature=0, ignore_eos=True)
        assert [len(x) for x in ids] == [5, 5]
        with pytest.raises(flextier.InvalidArgumentError):
            s.generate_ids([[]], 3)
        with pytest.raises(flextier.NoSpaceError):   # past max_position_embeddings
            s.generate("x", 5000)

        def boom(i, t):
            raise RuntimeError("from the callback")
        with pytest.raises(RuntimeError, match="from the callback"):
            s.generate("And", 8, on_text=boom)
        # another thread inside the session: busy
        started, release = threading.Event(), threading.Event()

        def slow(i, t):
            started.set()
            release.wait(5)
        th = threading.Thread(target=lambda: s.generate("And", 4, on_text=slow))
        th.start()
        started.wait(5)
        with pytest.raises(flextier.BusyError):
            s.generate("And", 2)
        release.set()
        th.join()
    with pytest.raises(flextier.NotFoundError):
        flextier.Session(str(tmp_path / "nope"))
    with pytest.raises(flextier.InvalidArgumentError):
        flextier.Session(DEMO, weights="q3")
    with pytest.raises(flextier.InvalidArgumentError):
        flextier.Session(DEMO, disk_dir="/tmp/x")   # a tier without a policy
    with pytest.raises(flextier.InvalidArgumentError):
        flextier.Session(DEMO, policy="w=60,60")


def test_device_cuda_without_a_backend_says_why():
    # The Python extension is built without the CUDA backend (docs/cuda.md):
    # device="cuda" is refused with the same words as the CLI, and opening
    # it loads no CUDA library into the interpreter.
    with pytest.raises(flextier.UnsupportedError, match="this build has no CUDA backend|no NVIDIA GPU or driver found"):
        flextier.Session(DEMO, device="cuda")
    with open("/proc/self/maps") as f:
        maps = f.read()
    assert "libcudart" not in maps and "libcublas" not in maps


@needs_cli
def test_memory_budget_auto_is_lossless_and_refuses_too_little(tmp_path):
    # issue 20: memory= bounds the whole process; auto plans within it and
    # stays lossless (f32 cache rows, as --kv-dtype f32 in memory)
    prompt = "And God said unto Moses,"
    want = cli_run(DEMO, prompt, 12, "--kv-dtype", "f32")
    with flextier.Session(DEMO, threads=1, policy="auto", memory="1G", kv_dtype="f32",
                          disk_dir=str(tmp_path / "d")) as s:
        pol = s.info()["policy"]
        assert "cw=q" not in pol and "cc=q" not in pol, pol
        assert s.generate(prompt, 12, temperature=0) == want
    with pytest.raises(flextier.Error, match="cannot hold"):
        flextier.Session(DEMO, threads=1, policy="auto", memory="8M")
