"""scripts/bench/peers_report.py, the parsing and table code of the peer
benchmarks (docs/bench-peers.md), on hand-made tool outputs: medians,
ratios, the roofline column, OOM and failed runs, bytes per token."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench" / "peers_report.py"


def run(*args):
    r = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def test_llama_bench_and_batched(tmp_path):
    lb = tmp_path / "lb.json"
    lb.write_text(json.dumps([{"n_prompt": 0, "n_gen": 64, "avg_ts": 41.25}]))
    assert run("llama-bench", lb)[1].strip() == "41.250"
    bb = tmp_path / "bb.jsonl"
    bb.write_text("some log line\n" + "\n".join(json.dumps({"pl": b, "speed_tg": 10.0 * b}) for b in (1, 8)) + "\n")
    assert run("batched", bb, 8)[1].strip() == "80.000"
    rc, _, err = run("batched", bb, 32)
    assert rc == 1 and "no result for batch 32" in err


def test_ft_json(tmp_path):
    f = tmp_path / "ft.json"
    f.write_text("loading\n" + json.dumps({"decode_tok_s": 12.5, "offload": {"overlap": 0.9}}) + "\n")
    assert run("ft-json", f, "decode_tok_s")[1].strip() == "12.5"
    assert run("ft-json", f, "offload.overlap")[1].strip() == "0.9"
    assert run("ft-json", f, "missing")[0] == 1


def test_ft_bytes_llama(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
           "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    # per layer: q,o 64x64, k,v 32x64, gate/up/down 96x64; lm_head 100x64; one embedding row
    mats = 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 96 * 64) + 100 * 64
    vecs = 2 * 2 * 64 + 64
    total, per_tok = map(int, run("ft-bytes", tmp_path, "bf16")[1].split())
    assert per_tok == mats * 2 + vecs * 4 + 64 * 2
    assert total == per_tok - 64 * 2 + 100 * 64 * 2
    # q4: the layers' matrices at 36/64 bytes, the LM head and the embedding row bf16
    layers = mats - 100 * 64
    total4, per_tok4 = map(int, run("ft-bytes", tmp_path, "q4")[1].split())
    assert per_tok4 == int(layers * 36 / 64 + 100 * 64 * 2 + vecs * 4 + 64 * 2)
    assert total4 == int(layers * 36 / 64 + 100 * 64 * 2 + vecs * 4 + 100 * 64 * 2)


def write_tsv(path, rows):
    path.write_text("\n".join("\t".join(map(str, r)) for r in rows) + "\n")


def test_table_medians_ratio_roofline(tmp_path):
    res, meta = tmp_path / "r.tsv", tmp_path / "m.tsv"
    hdr = ["tool", "fmt", "threads", "test", "batch", "run", "tok_s", "peak_rss_bytes"]
    rows = [hdr]
    for run_i, (ft, lc) in enumerate([(10, 20), (30, 25), (20, 30)], 1):
        rows.append(["flextier", "bf16", 2, "decode", 1, run_i, ft, 2e9])
        rows.append(["llamacpp", "bf16", 2, "decode", 1, run_i, lc, 3e9])
    write_tsv(res, rows)
    write_tsv(meta, [["membw_2", "10.0"], ["bytes_per_token_flextier_bf16", 1e9],
                     ["bytes_per_token_llamacpp_bf16", 1e9]])
    rc, out, err = run("table", res, meta)
    assert rc == 0, err
    line = next(l for l in out.splitlines() if l.startswith("| decode"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    # medians 20 and 25, ratio 0.80, roofline 10 GB/s / 1 GB = 10 tok/s: 200% / 250%
    assert cells[4:7] == ["20.0", "25.0", "**0.80x**"]
    assert cells[7:9] == ["2.00 GB", "3.00 GB"]
    assert cells[9] == "10.0 / 10.0" and cells[10] == "200% / 250%"
    assert "Medians of 3 interleaved run(s)" in out


def test_memtable_oom_and_failures(tmp_path):
    res, meta = tmp_path / "r.tsv", tmp_path / "m.tsv"
    write_tsv(res, [["tool", "fmt", "threads", "test", "batch", "run", "tok_s", "peak_rss_bytes"],
                    ["llamacpp", "q4_0", 2, "stream", 1, 1, 4.0, 100 << 20],
                    ["flextier", "q4", 2, "stream", 1, 1, "OOM", 110 << 20],
                    ["hf", "bf16", 2, "lossless", 1, 1, 1.5, 1 << 30],
                    ["flextier", "bf16", 2, "lossless", 1, 1, "ERR", 5 << 20],
                    ["llamacpp", "q4_0", 2, "fit", 1, 1, 2.0, 300 << 20],
                    ["flextier", "q4", 2, "fit", 1, 1, 3.0, 900 << 20],
                    ["flextier", "q4", 2, "fit", 1, 2, "OOM", 900 << 20]])
    write_tsv(meta, [["limit_stream", "110 MiB"], ["err_lossless_flextier", "exit 1: no space left"]])
    rc, out, err = run("memtable", res, meta)
    assert rc == 0, err
    lines = {tuple(c.strip() for c in l.strip("|").split("|")[:3]): l for l in out.splitlines() if l.startswith("| ")}
    assert "OOM-killed" in lines[("stream", "110 MiB", "FlexTier")]
    assert "failed: exit 1: no space left" in lines[("lossless", "-", "FlexTier")]
    fit = lines[("fit", "-", "FlexTier")]
    assert "3.00 (1 run(s) failed or OOM-killed)" in fit and "**1.50x** llama.cpp" in fit


def test_limittable_ratios_oom_and_failures(tmp_path):
    res, meta = tmp_path / "r.tsv", tmp_path / "m.tsv"
    g = 1536 << 20
    write_tsv(res, [["limit", "batch", "row", "run", "tok_s", "peak_bytes", "oom", "read_bytes_per_token"],
                    [g, 1, "ft-disk", 1, 0.8, 1400 << 20, 0, 800000000],
                    [g, 1, "ft-disk", 2, 1.0, 1300 << 20, 0, 800000000],
                    [g, 1, "llama-bf16", 1, 0.3, 1536 << 20, 0, 2000000000],
                    [g, 1, "hf-bf16", 1, 0.6, 1000 << 20, 0, 3000000000],
                    [768 << 20, 1, "ft-disk-q4", 1, 3.0, 700 << 20, 0, 300000000],
                    [768 << 20, 1, "llama-q4_0", 1, "OOM", 768 << 20, 1, "-"],
                    [768 << 20, 16, "ft-node", 1, "ERR", 20 << 20, 0, "-"]])
    write_tsv(meta, [["err_768M_16_ft-node", "exit 1: no space left"]])
    rc, out, err = run("limittable", res, meta)
    assert rc == 0, err
    lines = {tuple(c.strip() for c in l.strip("|").split("|")[:4]): l for l in out.splitlines() if l.startswith("| ")}
    d = lines[("1.50 GiB", "1", "FlexTier", "local disk, lossless (auto)")]
    assert "| 0.90 |" in d and "**3.00x** bf16 GGUF" in d and "**1.50x**" in d and "1400 MiB" in d  # the highest of the runs
    assert "OOM-killed" in lines[("768 MiB", "1", "llama.cpp", "q4_0 GGUF, mmap")]
    assert "peer OOM" in lines[("768 MiB", "1", "FlexTier", "local disk, q4")]
    assert "failed: exit 1: no space left" in lines[("768 MiB", "16", "FlexTier", "memory node, lossless (auto)")]
