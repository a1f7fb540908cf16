#!/usr/bin/env python3
"""How much rounding activations to bf16 (FLEXTIER_BF16_ACTIVATIONS=1) costs
in accuracy, measured against Hugging Face transformers on a bf16 model.

    bf16_act_accuracy.py FLEXTIER_BIN MODEL_DIR [TEXT_FILE]

Runs `flextier run --dump-logits` on the prompt (every position's logits)
with bf16 weights as stored and a f32 KV cache, with exact f32 activations
(the default) and with bf16 activations, and transformers on the same ids
in float32 (the reference: the bf16 weights widened exactly) and in
bfloat16 (what a user of transformers gets with torch_dtype=bfloat16).
Prints, for each, the relative RMS of the logits against transformers
f32, the share of positions whose top-1 token agrees with it, and the
mean negative log-likelihood of the text. Needs torch and transformers
(the peers venv of scripts/bench/llamacpp.sh has both)."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and "
        "void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face "
        "of the waters. And God said, Let there be light: and there was light. And God saw the light, "
        "that it was good: and God divided the light from the darkness. And God called the light Day, "
        "and the darkness he called Night. And the evening and the morning were the first day. The LORD "
        "is my shepherd; I shall not want. He maketh me to lie down in green pastures: he leadeth me "
        "beside the still waters. He restoreth my soul: he leadeth me in the paths of righteousness for "
        "his name's sake. Yea, though I walk through the valley of the shadow of death, I will fear no "
        "evil: for thou art with me; thy rod and thy staff they comfort me.")


def flextier_logits(binary, model, text, vocab, bf16_act):
    env = dict(os.environ, FLEXTIER_BF16_ACTIVATIONS="1" if bf16_act else "0")
    with tempfile.TemporaryDirectory() as d:
        pf, lf = os.path.join(d, "p.txt"), os.path.join(d, "l.bin")
        with open(pf, "w") as f:
            f.write(text.replace("\n", " ") + "\n")
        subprocess.run([binary, "run", "--model", model, "--prompt-file", pf, "--max-new-tokens", "1",
                        "--temperature", "0", "--weights-dtype", "bf16", "--kv-dtype", "f32",
                        "--dump-logits", lf, "--threads", "2"],
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return np.fromfile(lf, dtype=np.float32).reshape(-1, vocab)


def stats(name, got, ref, ids):
    n = min(len(got), len(ref))
    got, ref = got[:n].astype(np.float64), ref[:n].astype(np.float64)
    rel = np.sqrt(((got - ref) ** 2).sum() / (ref ** 2).sum())
    top1 = (got.argmax(1) == ref.argmax(1)).mean()
    lse = np.log(np.exp(got - got.max(1, keepdims=True)).sum(1)) + got.max(1)
    nll = np.mean(lse[:-1] - got[np.arange(n - 1), ids[1:n]])
    print(f"| {name} | {rel:.2e} | {100 * top1:.1f}% | {nll:.5f} |")


def main():
    binary, model = sys.argv[1], sys.argv[2]
    text = open(sys.argv[3]).read() if len(sys.argv) > 3 else TEXT
    tok = AutoTokenizer.from_pretrained(model)
    ids = tok(text.replace("\n", " "), return_tensors="pt").input_ids
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(ids).logits[0].float().numpy()
        hb = hf.to(torch.bfloat16)(ids).logits[0].float().numpy()
    vocab = ref.shape[1]
    ids_np = ids[0].numpy()
    print(f"{model}: {ids.shape[1]} tokens; reference: transformers {transformers.__version__} float32 "
          f"(torch {torch.__version__})")
    print("| computation | logits relative RMS vs transformers f32 | top-1 agreement | mean NLL |")
    print("|---|---|---|---|")
    stats("transformers float32 (reference)", ref, ref, ids_np)
    stats("FlexTier bf16 weights, f32 activations (default)", flextier_logits(binary, model, text, vocab, 0),
          ref, ids_np)
    stats("FlexTier bf16 weights, bf16 activations (opt-in)", flextier_logits(binary, model, text, vocab, 1),
          ref, ids_np)
    stats("transformers bfloat16", hb, ref, ids_np)


if __name__ == "__main__":
    main()
