#!/usr/bin/env python3
"""Hugging Face transformers (PyTorch) on a model directory: prefill and
decode tokens/s, the reference row of scripts/gpu-check.sh next to
`flextier bench run --device cuda` on the same directory and GPU.

Same shape as `flextier bench run`: B random prompts of P tokens (seeded),
G greedy new tokens each, EOS ignored (min_new_tokens = G).
  prefill tok/s = B*P / (one forward pass over the prompts)
  decode tok/s  = B*(G-1) / (generate() time - that forward pass)
The weights are loaded as bf16 on the GPU; attention is transformers'
default (sdpa). Timings are CUDA-synchronized wall clock, after a warm-up.

Degrades gracefully: without torch, transformers or a GPU it writes
{"error": ...} to --json, prints why, and exits 0 (the GPU check still
reports FlexTier's own numbers).

  python3 scripts/bench/hf_generate.py --model DIR --batch 1,64 \
      --prompt-len 128 --gen-len 128 --json out.json
"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    result = {"engine": "transformers", "model": a.model, "prompt_len": a.prompt_len,
              "gen_len": a.gen_len, "rows": []}

    def finish(err=None):
        if err:
            result["error"] = err
            print(f"hf_generate: {err}", flush=True)
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
        return 0

    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return finish(f"torch/transformers not available ({type(e).__name__}: {e})")
    result["torch"] = torch.__version__
    result["transformers"] = transformers.__version__
    if not torch.cuda.is_available():
        return finish("torch sees no CUDA device")
    dev = torch.device("cuda")
    result["gpu"] = torch.cuda.get_device_name(0)
    t0 = time.time()
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16)
        except TypeError:   # transformers < 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.bfloat16)
        model = model.to(dev).eval()
    except Exception as e:  # noqa: BLE001
        return finish(f"loading {a.model} failed ({type(e).__name__}: {e})")
    result["load_s"] = round(time.time() - t0, 3)
    result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    vocab = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(a.seed)

    def sync():
        torch.cuda.synchronize()

    for b in [int(x) for x in a.batch.split(",") if x]:
        ids = torch.randint(0, vocab, (b, a.prompt_len), generator=g).to(dev)
        mask = torch.ones_like(ids)
        gen_kw = dict(max_new_tokens=a.gen_len, min_new_tokens=a.gen_len, do_sample=False,
                      attention_mask=mask, pad_token_id=0)
        try:
            with torch.inference_mode():
                model.generate(ids, **dict(gen_kw, max_new_tokens=4, min_new_tokens=4))   # warm-up
                sync()
                t = time.time()
                model(input_ids=ids, attention_mask=mask)
                sync()
                prefill_s = time.time() - t
                t = time.time()
                out = model.generate(ids, **gen_kw)
                sync()
                gen_s = time.time() - t
        except Exception as e:  # noqa: BLE001 (e.g. out of memory at a large batch)
            result["rows"].append({"batch": b, "error": f"{type(e).__name__}: {e}"})
            print(f"hf_generate: batch {b}: {type(e).__name__}: {e}", flush=True)
            continue
        new = out.shape[1] - a.prompt_len
        decode_s = max(gen_s - prefill_s, 1e-9)
        row = {"batch": b, "new_tokens": int(new), "prefill_s": round(prefill_s, 4),
               "generate_s": round(gen_s, 4),
               "prefill_tok_s": round(b * a.prompt_len / prefill_s, 1),
               "decode_tok_s": round(b * max(new - 1, 0) / decode_s, 2),
               "throughput_tok_s": round(b * new / gen_s, 2)}
        result["rows"].append(row)
        print(f"transformers batch {b}: prefill {row['prefill_tok_s']} tok/s, decode {row['decode_tok_s']} tok/s "
              f"({new} new tokens in {gen_s:.3f} s)", flush=True)
    result["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
    return finish()


if __name__ == "__main__":
    sys.exit(main())
