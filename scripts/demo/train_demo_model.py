#!/usr/bin/env python3
"""Train the demo model: a small Llama on the King James Bible.

`make demo` streams text from the model this script writes into
demo/kjv-llama/ (committed; CI never runs this script). The corpus is the
King James Version as Debian ships it in the package bible-kjv-text (read
through the `bible` program of the package bible-kjv). The text of the KJV
is in the public domain (its copyright expired; Debian's copyright file for
bible-kjv-text says so), so the corpus and a model trained on it can be
redistributed.

Pipeline, all deterministic (fixed seeds, one CPU thread, deterministic
torch algorithms):
  1. `bible -f Gen1:1-Rev22:21`: one verse per line; the references are
     dropped and the verses of a chapter joined into one paragraph.
  2. A byte-level BPE tokenizer (GPT-2 style: ByteLevel pre-tokenizer and
     decoder, no normalizer) of VOCAB tokens is trained with HF tokenizers;
     id 0 is <|endoftext|>, which separates the books.
  3. A Llama (transformers' LlamaForCausalLM, f32 on the CPU) is trained on
     random windows of SEQ tokens of the token stream with AdamW and a
     cosine schedule for STEPS steps, then saved as bf16 safetensors with
     save_pretrained, beside tokenizer.json, tokenizer_config.json and
     generation_config.json.

Reproduce (one thread; the committed model took 61 minutes wall-clock on a
shared 2-vCPU Sapphire Rapids VM that gave it 50-80% of a core; final loss
3.6):
  apt-get install bible-kjv            # pulls bible-kjv-text
  python3 -m venv /tmp/kjvvenv
  /tmp/kjvvenv/bin/pip install torch==2.5.1 transformers==4.46.3 \
      tokenizers==0.20.3 safetensors==0.4.5 numpy==2.4.6
  /tmp/kjvvenv/bin/python scripts/demo/train_demo_model.py [--out demo/kjv-llama]
(The PyPI torch wheel pulls the CUDA runtime packages but trains on the
CPU.)
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

PINNED = {"torch": "2.5.1", "transformers": "4.46.3", "tokenizers": "0.20.3"}
VOCAB = 4096
SEQ = 256
BATCH = 16
STEPS = 700
LR = 2e-3
WARMUP = 40
SEED = 1611
MODEL = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
             intermediate_size=704, vocab_size=VOCAB, max_position_embeddings=1024,
             rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
             bos_token_id=0, eos_token_id=0, hidden_act="silu")


def corpus():
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         text=True).stdout
    books, cur_book, cur_ch, para = [], None, None, []
    ref = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
    for line in out.splitlines():
        m = ref.match(line)
        if not m:
            raise SystemExit("unexpected line from bible: %r" % line)
        book, ch, text = m.group(1), m.group(2), m.group(4).strip()
        if book != cur_book:
            if para:
                books[-1].append(" ".join(para))
            books.append([])
            cur_book, cur_ch, para = book, ch, []
        elif ch != cur_ch:
            books[-1].append(" ".join(para))
            cur_ch, para = ch, []
        para.append(text)
    books[-1].append(" ".join(para))
    return ["\n\n".join(chs) for chs in books]


def train_tokenizer(books):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(books, trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "demo", "kjv-llama"))
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    import tokenizers
    import transformers
    got = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
           "tokenizers": tokenizers.__version__}
    if got != PINNED:
        print("warning: pinned versions are %s, found %s (results may differ)" % (PINNED, got))
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(SEED)

    books = corpus()
    tok = train_tokenizer(books)
    eot = tok.token_to_id("<|endoftext|>")
    ids = []
    for b in books:
        ids.extend(tok.encode(b).ids)
        ids.append(eot)
    data = torch.tensor(ids, dtype=torch.long)
    print("corpus: %d books, %d bytes, %d tokens" % (len(books), sum(len(b.encode()) for b in books), len(ids)))

    model = LlamaForCausalLM(LlamaConfig(**MODEL))
    nparam = sum(p.numel() for p in model.parameters())
    print("model: %.2fM parameters" % (nparam / 1e6))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    t0 = time.time()
    for step in range(args.steps):
        lr = LR * min(1.0, (step + 1) / WARMUP) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(data) - SEQ - 1, BATCH)
        x = torch.stack([data[s:s + SEQ] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print("step %5d  loss %.3f  lr %.2e  %.0f s" % (step, loss.item(), lr, time.time() - t0), flush=True)

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    model.eval()
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
                   "eos_token": "<|endoftext|>", "add_bos_token": False,
                   "model_max_length": MODEL["max_position_embeddings"]}, f, indent=1)
    with open(os.path.join(out, "TRAINING.json"), "w") as f:
        json.dump({"script": "scripts/demo/train_demo_model.py", "versions": got, "seed": SEED,
                   "steps": args.steps, "batch": BATCH, "seq": SEQ, "lr": LR, "parameters": nparam,
                   "tokens": len(ids), "final_loss": loss.item(), "seconds": time.time() - t0,
                   "corpus": "King James Bible, Debian bible-kjv-text (public domain)"}, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    sys.exit(main())
