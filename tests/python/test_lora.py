"""LoRA from Python (docs/python.md, docs/training.md): flextier.finetune over
the library's train API equals `flextier finetune` byte for byte (text and
chat data) and reports progress; Session(lora=...) applies adapters with
scales as `flextier run --lora DIR:SCALE` and transformers + peft do
(tests/data/lora/multi)."""
import json
import os
import subprocess

import pytest

import flextier

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "tests", "data", "models", "llama-tiny")
MULTI = os.path.join(ROOT, "tests", "data", "lora", "multi")
CHAT = os.path.join(ROOT, "tests", "data", "lora", "chat")
FT_BIN = os.environ.get("FT_BIN", os.path.join(ROOT, "build", "flextier"))
needs_cli = pytest.mark.skipif(not os.access(FT_BIN, os.X_OK), reason="the flextier CLI is not built")

ARGS = dict(steps=4, seq_len=16, batch=2, grad_accum=2, warmup=1, lr=1e-2, seed=3, threads=1)
CLI_ARGS = ["--steps", "4", "--seq-len", "16", "--batch", "2", "--grad-accum", "2", "--warmup", "1", "--lr", "1e-2",
            "--seed", "3", "--threads", "1"]


def text_data(tmp_path):
    p = tmp_path / "data.txt"
    p.write_text("".join(f"The quick brown fox jumps over the lazy dog. Hello world {i}, hello again.\n"
                         for i in range(40)))
    return str(p)


@needs_cli
@pytest.mark.parametrize("kind", ["text", "chat", "dropout"])
def test_finetune_equals_cli(tmp_path, kind):
    if kind == "text":
        data, extra, kw = text_data(tmp_path), [], {}
    elif kind == "dropout":
        data, extra, kw = text_data(tmp_path), ["--dropout", "0.3"], {"dropout": 0.3}
    else:
        tpl = os.path.join(CHAT, "template.jinja")
        data, extra, kw = os.path.join(CHAT, "chat.jsonl"), ["--chat-template", tpl], {"chat_template": tpl}
    subprocess.run([FT_BIN, "finetune", "--model", TINY, "--data", data, "--out", str(tmp_path / "cli"), *CLI_ARGS,
                    *extra], check=True, capture_output=True)
    seen = []
    r = flextier.finetune(TINY, data, str(tmp_path / "py"), on_progress=seen.append, **ARGS, **kw)
    a = (tmp_path / "cli" / "adapter_model.safetensors").read_bytes()
    b = (tmp_path / "py" / "adapter_model.safetensors").read_bytes()
    assert a == b
    assert [p["step"] for p in seen] == [1, 2, 3, 4] and all(p["steps"] == 4 for p in seen)
    assert [p["loss"] for p in seen] == r["losses"] and r["steps"] == 4
    assert all(p["tok_s"] > 0 and p["grad_norm"] > 0 for p in seen)
    assert r["eval_after"] is not None and r["eval_after"][0] < r["eval_before"][0]
    cfg = json.loads((tmp_path / "py" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 8
    assert cfg["lora_dropout"] == (0.3 if kind == "dropout" else 0.0)
    if kind == "chat":
        assert 0 < r["labels"] < r["tokens"]


def test_finetune_stops_on_request_and_refuses(tmp_path):
    data = text_data(tmp_path)
    r = flextier.finetune(TINY, data, str(tmp_path / "a"), on_progress=lambda p: p["step"] == 2, **ARGS)
    assert r["steps"] == 2 and len(r["losses"]) == 2
    assert (tmp_path / "a" / "adapter_model.safetensors").exists()
    with pytest.raises(flextier.InvalidArgumentError):
        flextier.finetune(TINY, data, str(tmp_path / "b"), steps=2, warmup=5)
    with pytest.raises(flextier.NotFoundError):
        flextier.finetune(TINY, str(tmp_path / "missing.txt"), str(tmp_path / "b"), steps=2)
    with pytest.raises(flextier.Error, match="chat template"):
        flextier.finetune(TINY, os.path.join(CHAT, "chat.jsonl"), str(tmp_path / "b"), steps=2)


def test_session_lora_matches_peft():
    ref = json.load(open(os.path.join(MULTI, "multi.json")))["cases"]["llama-ab"]
    lora = [(os.path.join(MULTI, a["dir"]), a["scale"]) for a in ref["adapters"]]
    with flextier.Session(TINY, kv_dtype="f32", threads=1, lora=lora) as s:
        out = s.generate_ids([ref["prompt"]], len(ref["greedy"]), temperature=0, ignore_eos=True)
        assert out[0] == ref["greedy"]
    with flextier.Session(TINY, kv_dtype="f32", threads=1) as s:
        out = s.generate_ids([ref["prompt"]], len(ref["greedy"]), temperature=0, ignore_eos=True)
        assert out[0] != ref["greedy"]
    # one adapter as a plain directory
    one = json.load(open(os.path.join(MULTI, "multi.json")))["cases"]["llama-a"]
    with flextier.Session(TINY, kv_dtype="f32", threads=1, lora=os.path.join(MULTI, "llama-a")) as s:
        out = s.generate_ids([one["prompt"]], len(one["greedy"]), temperature=0, ignore_eos=True)
        assert out[0] == one["greedy"]
    with pytest.raises(flextier.InvalidArgumentError):
        flextier.Session(TINY, lora=[(MULTI, 1.0, 2)])
    with pytest.raises(flextier.Error, match="adapter_config.json"):
        flextier.Session(TINY, lora=MULTI)
