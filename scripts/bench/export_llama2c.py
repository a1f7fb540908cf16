#!/usr/bin/env python3
"""Export a FlexTier/Hugging Face Llama checkpoint directory (config.json +
model.safetensors, f32 or bf16) to karpathy/llama2.c's legacy .bin format
(the one run.c reads), plus a placeholder tokenizer.bin with one entry per
vocabulary id. Standard library only (no numpy/torch), for the benchmark
comparison in scripts/bench/compare_llama2c.sh.

Usage: export_llama2c.py MODEL_DIR OUT.bin TOKENIZER_OUT.bin [--seq-len N]
"""
import json
import os
import struct
import sys


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    hdr.pop("__metadata__", None)
    return hdr, data


def tensor_f32(hdr, data, name):
    t = hdr[name]
    b, e = t["data_offsets"]
    raw = data[b:e]
    if t["dtype"] == "F32":
        return bytes(raw)
    if t["dtype"] == "BF16":
        out = bytearray(len(raw) * 2)
        out[2::4] = raw[0::2]
        out[3::4] = raw[1::2]
        return bytes(out)
    raise SystemExit("unsupported dtype %s for %s" % (t["dtype"], name))


def permute_reverse(w, n_heads, rows, cols):
    """HF's rotate_half layout -> Meta's interleaved RoPE layout (rows)."""
    hd = rows // n_heads
    rb = cols * 4
    out = bytearray(len(w))
    for h in range(n_heads):
        for i in range(hd // 2):
            for j in range(2):
                src = h * hd + j * (hd // 2) + i
                dst = h * hd + 2 * i + j
                out[dst * rb:(dst + 1) * rb] = w[src * rb:(src + 1) * rb]
    return bytes(out)


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    mdir, out, tok_out = sys.argv[1:4]
    seq_len = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--seq-len" else None
    cfg = json.load(open(os.path.join(mdir, "config.json")))
    if cfg.get("model_type") != "llama":
        raise SystemExit("only llama checkpoints can be exported to llama2.c")
    hdr, data = read_safetensors(os.path.join(mdir, "model.safetensors"))
    dim, hidden, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    vocab = cfg["vocab_size"]
    hs = dim // nh
    seq_len = seq_len or cfg.get("max_position_embeddings", 2048)
    shared = cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in hdr
    g = lambda n: tensor_f32(hdr, data, n)
    lay = lambda i, n: g("model.layers.%d.%s" % (i, n))
    with open(out, "wb") as f:
        f.write(struct.pack("<7i", dim, hidden, L, nh, nkv, vocab if shared else -vocab, seq_len))
        f.write(g("model.embed_tokens.weight"))
        for i in range(L): f.write(lay(i, "input_layernorm.weight"))
        for i in range(L): f.write(permute_reverse(lay(i, "self_attn.q_proj.weight"), nh, dim, dim))
        for i in range(L): f.write(permute_reverse(lay(i, "self_attn.k_proj.weight"), nkv, nkv * hs, dim))
        for i in range(L): f.write(lay(i, "self_attn.v_proj.weight"))
        for i in range(L): f.write(lay(i, "self_attn.o_proj.weight"))
        for i in range(L): f.write(lay(i, "post_attention_layernorm.weight"))
        for i in range(L): f.write(lay(i, "mlp.gate_proj.weight"))
        for i in range(L): f.write(lay(i, "mlp.down_proj.weight"))
        for i in range(L): f.write(lay(i, "mlp.up_proj.weight"))
        f.write(g("model.norm.weight"))
        f.write(bytes(seq_len * hs // 2 * 4 * 2))      # legacy freq_cis_real/imag, unused
        if not shared:
            f.write(g("lm_head.weight"))
    with open(tok_out, "wb") as f:
        f.write(struct.pack("<i", 8))
        for i in range(vocab):
            s = ("<%d>" % i).encode()
            f.write(struct.pack("<fi", 0.0, len(s)) + s)
    print("wrote", out, "and", tok_out)


if __name__ == "__main__":
    main()
