"""`flextier gen-model` writes a tokenizer.json that Hugging Face
`tokenizers` loads, with exactly --vocab tokens, and that round-trips text.
(FlexTier's own loader is checked in tests/cli/test_gen_model.c.)

Needs the CLI: $FT_BIN, else build/flextier of this checkout (scripts/
test-python.sh passes it; `make test` builds it first)."""
import json
import os
import pathlib
import subprocess

import pytest

tokenizers = pytest.importorskip("tokenizers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
FT_BIN = os.environ.get("FT_BIN") or str(ROOT / "build" / "flextier")

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces  ",
    "tabs\tand\nnewlines\n\n",
    "digits 0123456789 and symbols !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "caf\u00e9 na\u00efve \u0120 \u65e5\u672c\u8a9e \U0001F600 \u03a9",
]


@pytest.fixture(scope="module")
def ft_bin():
    if not os.access(FT_BIN, os.X_OK):
        pytest.skip(f"no flextier binary at {FT_BIN} (build it, or set FT_BIN)")
    return FT_BIN


@pytest.mark.parametrize("arch,vocab", [("llama", 260), ("llama", 32000), ("opt", 260), ("opt", 5000)])
def test_hf_tokenizers_loads_gen_model(tmp_path, ft_bin, arch, vocab):
    out = tmp_path / "m"
    subprocess.run([ft_bin, "gen-model", "--arch", arch, "--out", str(out), "--hidden", "64",
                    "--layers", "1", "--heads", "2", "--ffn", "64", "--vocab", str(vocab)],
                   check=True, stdout=subprocess.DEVNULL)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == vocab
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == vocab
    ids = set(tok.get_vocab(with_added_tokens=True).values())
    assert ids == set(range(vocab))          # no holes, no duplicates
    bos = 1 if arch == "llama" else 2
    for text in TEXTS:
        enc = tok.encode(text)
        assert enc.ids[0] == bos
        assert all(0 <= i < vocab for i in enc.ids)
        assert tok.decode(enc.ids, skip_special_tokens=True) == text
    if vocab >= 4096:   # merges in use: fewer tokens than bytes
        text = TEXTS[1]
        assert len(tok.encode(text).ids) - 1 < len(text) * 2 / 3
