#!/usr/bin/env python3
"""Helpers of scripts/bench/llamacpp.sh and memlimit.sh (docs/bench-peers.md).

  peers_report.py gguf-bytes FILE.gguf
      "<file tensor bytes> <bytes read per decoded token>": every tensor but
      token_embd (a token reads one row of it). Needs gguf-py on PYTHONPATH.
  peers_report.py ft-bytes MODEL_DIR FORMAT
      the same two numbers for FlexTier computing on FORMAT (f32 bf16 q8 q4)
      from config.json: matrices at 4, 2, 68/64 or 36/64 bytes per value
      (q8/q4: FlexGen groups of 64 with fp16 min and step; the embeddings
      and the LM head stay bf16, 2 bytes), 1-D tensors f32.
  peers_report.py llama-bench FILE.json           -> tok/s (avg_ts)
  peers_report.py batched FILE.jsonl BATCH        -> aggregate decode tok/s
  peers_report.py ft-json FILE.json KEY           -> a number from bench run --json
  peers_report.py table RESULTS.tsv META.tsv      -> the markdown table
  peers_report.py memtable RESULTS.tsv META.tsv   -> the scenario table (older memlimit.sh)
  peers_report.py limittable RESULTS.tsv META.tsv -> memlimit.sh's model-larger-than-memory
      table; RESULTS.tsv rows: limit batch row run tok_s peak_bytes oom read_bytes_per_token

RESULTS.tsv rows: tool fmt threads test batch run tok_s peak_rss_bytes
(tool: flextier or llamacpp or hf; test: decode prefill batched or a
memlimit scenario). META.tsv rows: key value.
Only the standard library (and gguf-py for gguf-bytes)."""
import json
import statistics
import sys

FT_BPP = {"f32": 4.0, "bf16": 2.0, "q8": 68 / 64, "q4": 36 / 64}
LLAMA_FMT = {"f32": "f32", "bf16": "bf16", "q8": "q8_0", "q4": "q4_0"}


def die(msg):
    print(f"peers_report.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def gguf_bytes(path):
    try:
        from gguf import GGUFReader
    except ImportError as e:
        die(f"gguf-py is not importable ({e}); put llama.cpp's gguf-py on PYTHONPATH")
    r = GGUFReader(path)
    total = per_tok = 0
    for t in r.tensors:
        n = int(t.n_bytes)
        total += n
        if t.name == "token_embd.weight":
            per_tok += n // int(t.shape[-1]) if len(t.shape) > 1 else n
        else:
            per_tok += n
    if not total:
        die(f"{path}: no tensors")
    print(total, per_tok)


def ft_bytes(model_dir, fmt):
    if fmt not in FT_BPP:
        die(f"unknown format {fmt} ({' '.join(FT_BPP)})")
    with open(f"{model_dir}/config.json") as f:
        c = json.load(f)
    arch = c.get("model_type")
    h, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    bpp = FT_BPP[fmt]
    extra_all = 0   # mixtures of experts: the experts a token does not use (held, not read)
    if arch in ("llama", "qwen3", "mixtral", "qwen3_moe"):
        nh, nkv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
        hd = c.get("head_dim") or h // nh
        ffn = c["intermediate_size"]
        layer_mat = h * nh * hd * 2 + h * nkv * hd * 2 + 3 * h * ffn
        layer_vec = 2 * h + (2 * hd if arch.startswith("qwen3") else 0)
        if arch in ("mixtral", "qwen3_moe"):   # every layer sparse (gen-model's shapes)
            E = c.get("num_local_experts") or c.get("num_experts")
            k = c["num_experts_per_tok"]
            mffn = c.get("moe_intermediate_size") or ffn
            layer_mat = h * nh * hd * 2 + h * nkv * hd * 2 + E * h + k * 3 * h * mffn
            extra_all = L * (E - k) * 3 * h * mffn
        tied = c.get("tie_word_embeddings", False)
        head = V * h
        glob_vec = h
    elif arch == "opt":
        ffn = c["ffn_dim"]
        layer_mat = 4 * h * h + 2 * h * ffn
        layer_vec = 4 * h + ffn + h + 4 * h
        tied = True
        head = V * h
        glob_vec = 2 * h
    else:
        die(f"{model_dir}: model_type {arch} not handled")
    # q8/q4 quantize the layers' matrices only: the embeddings and the LM
    # head stay bf16 (ft_tensor_format), and a decode step reads the head whole
    hb = 2.0 if fmt in ("q8", "q4") else bpp
    vecs = L * layer_vec + glob_vec
    per_tok = L * layer_mat * bpp + head * hb + vecs * 4 + h * hb   # + one embedding row
    total = per_tok - h * hb + (0 if tied else V * h * hb) + extra_all * bpp
    print(int(total), int(per_tok))


def llama_bench(path):
    with open(path) as f:
        data = json.load(f)
    if not data:
        die(f"{path}: no result")
    print(f"{float(data[-1]['avg_ts']):.3f}")


def batched(path, batch):
    batch = int(batch)
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            d = json.loads(line)
            if int(d["pl"]) == batch:
                print(f"{float(d['speed_tg']):.3f}")
                return
    die(f"{path}: no result for batch {batch}")


def ft_json(path, key):
    with open(path) as f:
        lines = [l for l in f if l.startswith("{")]
    if not lines:
        die(f"{path}: no JSON line")
    d = json.loads(lines[-1])
    v = d
    for k in key.split("."):
        if k not in v:
            die(f"{path}: no key {key}")
        v = v[k]
    print(v)


def load(results, meta):
    rows = []
    with open(results) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) != 8 or p[0] == "tool":
                continue
            rows.append(p)
    m = {}
    with open(meta) as f:
        for line in f:
            p = line.rstrip("\n").split("\t", 1)
            if len(p) == 2:
                m[p[0]] = p[1]
    return rows, m


def med(vals):
    vals = [float(v) for v in vals if v not in ("", "-", "nan")]
    return statistics.median(vals) if vals else None


def gb(x):
    return "-" if x is None else f"{x / 1e9:.2f} GB"


def mib(x):
    return "-" if x is None else f"{x / 2**20:.0f} MiB"


def num(x, nd=1):
    """nd decimals, or 3 significant digits for small values (0.374)."""
    if x is None:
        return "-"
    if abs(x) < 10 ** (2 - nd):
        return f"{x:.3g}"
    return f"{x:.{nd}f}"


def table(results, meta):
    rows, m = load(results, meta)
    groups = {}
    for tool, fmt, thr, test, b, run, tps, rss in rows:
        g = groups.setdefault((test, int(b), int(thr), fmt), {})
        g.setdefault(tool, {"tps": [], "rss": [], "runs": 0})
        g[tool]["tps"].append(tps)
        g[tool]["rss"].append(rss)
        g[tool]["runs"] += 1
    order = {"decode": 0, "batched": 1, "prefill": 2}
    fmts = ["f32", "bf16", "q8", "q4"]
    print("| test | batch | threads | format | FlexTier tok/s | llama.cpp tok/s | FlexTier / llama.cpp "
          "| FlexTier peak RSS | llama.cpp peak RSS | DRAM roofline tok/s (FlexTier / llama.cpp) "
          "| % of roofline (FlexTier / llama.cpp) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(groups, key=lambda k: (order.get(k[0], 9), k[1], k[2], fmts.index(k[3]) if k[3] in fmts else 9)):
        test, b, thr, fmt = key
        g = groups[key]
        ft = g.get("flextier", {})
        lc = g.get("llamacpp", {})
        ft_t, lc_t = med(ft.get("tps", [])), med(lc.get("tps", []))
        ft_r, lc_r = med(ft.get("rss", [])), med(lc.get("rss", []))
        ratio = f"**{ft_t / lc_t:.2f}x**" if ft_t and lc_t else "-"
        roof, pct = "-", "-"
        bw = m.get(f"membw_{thr}")
        if test in ("decode", "batched") and bw:
            bw = float(bw) * 1e9
            rf = m.get(f"bytes_per_token_flextier_{fmt}")
            rl = m.get(f"bytes_per_token_llamacpp_{fmt}")
            # a decode step reads the weights once for the whole batch
            rft = b * bw / float(rf) if rf else None
            rlc = b * bw / float(rl) if rl else None
            roof = f"{num(rft)} / {num(rlc)}"
            pft = f"{100 * ft_t / rft:.0f}%" if ft_t and rft else "-"
            plc = f"{100 * lc_t / rlc:.0f}%" if lc_t and rlc else "-"
            pct = f"{pft} / {plc}"
        ftcell = num(ft_t) if ft else m.get(f"flextier_missing_{fmt}", "-")
        print(f"| {test} | {b} | {thr} | {fmt} ({LLAMA_FMT.get(fmt, fmt)}) | {ftcell} | {num(lc_t)} | {ratio} "
              f"| {gb(ft_r)} | {gb(lc_r)} | {roof} | {pct} |")
    runs = sorted({int(r[5]) for r in rows})
    print()
    print(f"Medians of {len(runs)} interleaved run(s). " + m.get("note", ""))


def memtable(results, meta):
    rows, m = load(results, meta)
    groups = {}
    for tool, fmt, thr, test, b, run, tps, rss in rows:
        groups.setdefault((test, tool, fmt, int(thr)), []).append((tps, rss))
    print("| scenario | memory limit | engine | weights | threads | decode tok/s | peak memory (cgroup) | vs peer |")
    print("|---|---|---|---|---|---|---|---|")
    scen = {}
    for (test, tool, fmt, thr), v in groups.items():
        ok = [x for x in v if x[0] not in ("OOM", "ERR")]
        # every run killed by the cgroup, or failed (the reason is in META)
        tps = med([x[0] for x in ok]) if ok else ("OOM" if any(x[0] == "OOM" for x in v) else "ERR")
        scen.setdefault(test, []).append((tool, fmt, thr, tps, med([x[1] for x in v]), len(v) - len(ok)))
    names = {"flextier": "FlexTier", "llamacpp": "llama.cpp", "hf": "HF accelerate"}
    for test in sorted(scen):
        entries = scen[test]
        peer = next((e for e in entries if e[0] != "flextier"), None)
        for tool, fmt, thr, tps, rss, ooms in sorted(entries, key=lambda e: e[0] != "flextier"):
            vs = "-"
            if tool == "flextier" and peer and isinstance(tps, float) and isinstance(peer[3], float):
                vs = f"**{tps / peer[3]:.2f}x** {names.get(peer[0], peer[0])}"
            if tps == "OOM":
                cell = "OOM-killed"
            elif tps == "ERR":
                cell = "failed: " + m.get(f"err_{test}_{tool}", "?")
            else:
                cell = num(tps, 2) + (f" ({ooms} run(s) failed or OOM-killed)" if ooms else "")
            print(f"| {test} | {m.get('limit_' + test, '-')} | {names.get(tool, tool)} "
                  f"| {m.get('desc_' + test + '_' + tool, fmt)} | {thr} | {cell} | {mib(rss)} | {vs} |")
    runs = sorted({int(r[5]) for r in rows})
    print()
    print(f"Medians of {len(runs)} run(s), page cache dropped before each. " + m.get("note", ""))


LIMIT_ROWS = {
    "ft-disk": ("FlexTier", "local disk, lossless (auto)"),
    "ft-disk-q4": ("FlexTier", "local disk, q4"),
    "ft-node": ("FlexTier", "memory node, lossless (auto)"),
    "ft-node-q4": ("FlexTier", "memory node, q4"),
    "llama-bf16": ("llama.cpp", "bf16 GGUF, mmap"),
    "llama-q4_0": ("llama.cpp", "q4_0 GGUF, mmap"),
    "hf-bf16": ("HF accelerate", "bf16, disk offload"),
}
# FlexTier row -> the peer row it is compared with (same numerics)
LIMIT_PEER = {"ft-disk": "llama-bf16", "ft-node": "llama-bf16", "ft-disk-q4": "llama-q4_0",
              "ft-node-q4": "llama-q4_0"}


def limittable(results, meta):
    m = {}
    with open(meta) as f:
        for line in f:
            p = line.rstrip("\n").split("\t", 1)
            if len(p) == 2:
                m[p[0]] = p[1]
    groups = {}
    with open(results) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) != 8 or p[0] == "limit":
                continue
            lim, b, row, run, tps, peak, oom, bpt = p
            groups.setdefault((int(lim), int(b), row), []).append((tps, peak, oom, bpt))

    def cell(v):
        ok = [x for x in v if x[0] not in ("OOM", "ERR")]
        if ok:
            return med([x[0] for x in ok])
        return "OOM" if any(x[0] == "OOM" for x in v) else "ERR"

    print("| memory limit | batch | engine | weights | decode tok/s | peak (cgroup, highest) | OOM kills "
          "| bytes read / token | vs peer (same numerics) | vs accelerate |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    order = list(LIMIT_ROWS)
    for key in sorted(groups, key=lambda k: (-k[0], k[1], order.index(k[2]) if k[2] in order else 99)):
        lim, b, row = key
        v = groups[key]
        tps = cell(v)
        eng, desc = LIMIT_ROWS.get(row, (row, ""))
        if tps == "OOM":
            t = "OOM-killed"
        elif tps == "ERR":
            t = "failed: " + m.get(f"err_{lim >> 20}M_{b}_{row}", "?")
        else:
            t = f"{tps:.2f}" if tps < 1000 else f"{tps:.0f}"
        # the highest of the runs: what the limit is checked against
        pk = [float(x[1]) for x in v if x[1] not in ("", "-")]
        peak = max(pk) if pk else None
        ooms = sum(int(x[2]) for x in v if x[2].isdigit())
        bpt = med([x[3] for x in v if x[3] not in ("-", "")])
        vs, vh = "-", "-"
        if isinstance(tps, float):
            peer = LIMIT_PEER.get(row)
            if peer and (lim, b, peer) in groups:
                pt = cell(groups[(lim, b, peer)])
                vs = f"**{tps / pt:.2f}x** {LIMIT_ROWS[peer][1].split(',')[0]}" if isinstance(pt, float) else f"peer {pt}"
            if row.startswith("ft-") and (lim, b, "hf-bf16") in groups:
                ht = cell(groups[(lim, b, "hf-bf16")])
                vh = f"**{tps / ht:.2f}x**" if isinstance(ht, float) else f"accelerate {ht}"
        lims = f"{lim / 2**30:.2f} GiB" if lim >= 2**30 else f"{lim >> 20} MiB"
        print(f"| {lims} | {b} | {eng} | {desc} | {t} | {mib(peak)} | {ooms} | {gb(bpt)} | {vs} | {vh} |")


def main(argv):
    if len(argv) < 2:
        die("usage: see the module docstring")
    cmd, args = argv[1], argv[2:]
    cmds = {"gguf-bytes": (gguf_bytes, 1), "ft-bytes": (ft_bytes, 2), "llama-bench": (llama_bench, 1),
            "batched": (batched, 2), "ft-json": (ft_json, 2), "table": (table, 2), "memtable": (memtable, 2),
            "limittable": (limittable, 2)}
    if cmd not in cmds or len(args) != cmds[cmd][1]:
        die(f"bad command line: {' '.join(argv[1:])}")
    cmds[cmd][0](*args)


if __name__ == "__main__":
    main(sys.argv)
