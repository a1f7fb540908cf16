#!/usr/bin/env python3
"""PyTorch + PEFT LoRA training on the CPU, the reference for
`flextier finetune`'s tok/s and peak memory (docs/training.md).

  PYTHONPATH=/tmp/peftlib /tmp/ft5/bin/python bench/train/peft_cpu.py MODEL DATA \
      [--steps 5] [--seq 128] [--batch 4] [--rank 8] [--threads 1] [--dtype f32|bf16|bf16-autocast]

Same recipe as flextier finetune's defaults: rank 8, alpha 16, all seven
projections, AdamW lr 1e-3 wd 0.01, clip 1.0, sequences of --seq tokens
(--dtype: f32; bf16: the model in bf16; bf16-autocast: an f32 model under
torch.autocast("cpu", torch.bfloat16), mixed precision as users run it)
packed from DATA (tokenized with the model's tokenizer). Prints one JSON
line: tokens/s over the steps after the first, peak RSS.
"""
import argparse
import json
import resource
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("data")
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--rank", type=int, default=8)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--dtype", default="f32")
a = ap.parse_args()
torch.set_num_threads(a.threads)
if a.dtype not in ("f32", "bf16", "bf16-autocast"):
    ap.error("--dtype: f32, bf16 or bf16-autocast")
dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
autocast = a.dtype == "bf16-autocast"
model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dt)
ids = AutoTokenizer.from_pretrained(a.model)(open(a.data).read())["input_ids"]
n = len(ids) // a.seq
seqs = torch.tensor(ids[: n * a.seq]).view(n, a.seq)
model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0, task_type="CAUSAL_LM",
                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                         "up_proj", "down_proj"]))
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
model.train()
t1 = None
for s in range(a.steps):
    if s == 1:
        t1 = time.perf_counter()
    b = seqs[(s * a.batch) % (n - a.batch):][: a.batch]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=b, labels=b).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad()
el = time.perf_counter() - t1
print(json.dumps({"tool": "pytorch+peft", "torch": torch.__version__, "threads": a.threads, "dtype": a.dtype,
                  "tok_s": (a.steps - 1) * a.batch * a.seq / el, "peak_rss_mib":
                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "loss": float(loss)}))
