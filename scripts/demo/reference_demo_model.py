#!/usr/bin/env python3
"""Record transformers' output on the demo model, for the C tests.

Loads demo/kjv-llama (bf16 weights) into transformers in f32 (the engine's
arithmetic: bf16 converted to f32 exactly) and writes
demo/kjv-llama/reference.json: a text prompt, its ids by the tokenizer.json
through `tokenizers`, the logits of the last prompt position, and 24 greedy
tokens with their decoded text. tests/engine/test_engine_fixtures.c checks
flextier against it (logits within 1e-4, identical tokens and text).

  /tmp/kjvvenv/bin/python scripts/demo/reference_demo_model.py [DIR]
(the venv of train_demo_model.py: torch 2.5.1, transformers 4.46.3)
"""
import json
import os
import sys

import torch
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM

PROMPT = "And God said unto Moses,"
STEPS = 24


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "demo",
                                                             "kjv-llama")
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    model = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    ids = tok.encode(PROMPT).ids
    with torch.no_grad():
        last = model(torch.tensor([ids])).logits[0, -1].float()
        seq = list(ids)
        for _ in range(STEPS):
            nxt = model(torch.tensor([seq])).logits[0, -1]
            seq.append(int(torch.argmax(nxt)))
    greedy = seq[len(ids):]
    out = {"generator": "scripts/demo/reference_demo_model.py", "prompt": PROMPT, "ids": ids,
           "last_logits": [round(float(x), 6) for x in last], "greedy": greedy,
           "greedy_text": tok.decode(greedy)}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(out, f)
    print(PROMPT + out["greedy_text"])


if __name__ == "__main__":
    sys.exit(main())
