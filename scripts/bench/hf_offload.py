#!/usr/bin/env python3
"""Hugging Face accelerate's disk offload on the CPU: the peer of FlexTier's
lossless (bf16 / byte-plane) weight offloading in scripts/bench/memlimit.sh.

The model is loaded as users do it (docs of accelerate's big-model
inference): device_map="auto" with max_memory={"cpu": MAX_CPU}, the rest of
the weights offloaded to offload_folder as bf16 and read back layer by layer
(memory-mapped) at every forward pass. Then FlexTier's benchmark shape: B
random prompts of P tokens (seeded), one prefill forward pass, G-1 greedy
decode steps with the KV cache, EOS ignored.

  prefill tok/s = B*P / (the prefill forward pass)
  decode tok/s  = B*(G-1) / (the decode steps)

Prints one JSON line (the keys of `flextier bench run --json` it shares:
prefill_tok_s, decode_tok_s, peak_rss_bytes, plus the placement). Any error
is fatal (exit 1, the reason on stderr): the caller reports it.

  python3 scripts/bench/hf_offload.py --model DIR --max-cpu-mem 512MiB \\
      --offload-folder /tmp/off --threads 2 --prompt-len 16 --gen-len 33
"""
import argparse
import json
import resource
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-cpu-mem", required=True, help="accelerate max_memory for the CPU, e.g. 512MiB")
    ap.add_argument("--offload-folder", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--gen-len", type=int, default=33)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.gen_len < 2:
        sys.exit("hf_offload.py: --gen-len must be at least 2 (one prefill token, then decode steps)")
    try:
        import torch
        import accelerate
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        sys.exit(f"hf_offload.py: {e} (run it with the peers' venv: scripts/bench/peers-lib.sh)")
    torch.set_num_threads(a.threads)
    # The placement "auto" will make (accelerate's infer_auto_device_map, as
    # transformers calls it): with too small a CPU budget it puts the whole
    # model on "disk", which from_pretrained then fails to load with
    # "device disk is invalid"; say why instead.
    from accelerate import infer_auto_device_map, init_empty_weights
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(a.model)
    with init_empty_weights():
        empty = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    plan = infer_auto_device_map(empty, max_memory={"cpu": a.max_cpu_mem},
                                 no_split_module_classes=empty._no_split_modules, dtype=torch.bfloat16)
    if "cpu" not in plan.values():
        sys.exit(f"hf_offload.py: --max-cpu-mem {a.max_cpu_mem} is too small for accelerate to keep any module on "
                 f"the CPU (it plans {dict(plan)}; transformers {transformers.__version__} cannot load that): "
                 "raise it to at least the embedding plus one layer")
    del empty
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        a.model, device_map="auto", max_memory={"cpu": a.max_cpu_mem},
        offload_folder=a.offload_folder, torch_dtype=torch.bfloat16)
    model.eval()
    load_s = time.perf_counter() - t0
    placement = {}
    for dev in getattr(model, "hf_device_map", {}).values():
        placement[str(dev)] = placement.get(str(dev), 0) + 1
    if "disk" not in placement:
        print(f"hf_offload.py: note: nothing was offloaded to disk (placement {placement})", file=sys.stderr)
    g = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.prompt_len), generator=g)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True)
        prefill_s = time.perf_counter() - t0
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        for _ in range(a.gen_len - 1):
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
        decode_s = time.perf_counter() - t0
    print(json.dumps({
        "engine": "hf-accelerate", "model": a.model, "batch": a.batch, "prompt_len": a.prompt_len,
        "gen_len": a.gen_len, "threads": a.threads, "max_cpu_mem": a.max_cpu_mem, "load_s": round(load_s, 3),
        "prefill_tok_s": round(a.batch * a.prompt_len / prefill_s, 3),
        "decode_tok_s": round(a.batch * (a.gen_len - 1) / decode_s, 3),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "placement": placement,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "accelerate": accelerate.__version__},
    }))


if __name__ == "__main__":
    main()
