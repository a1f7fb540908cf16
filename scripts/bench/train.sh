#!/usr/bin/env bash
# train.sh - the training table (issue 24): `flextier finetune` beside
# PyTorch + PEFT on the CPU in the same run, on the same model and data:
# LoRA of rank 16 (alpha 32) on all seven projections, the same batch and
# context, a few optimizer steps each; training tok/s (after the first
# step) and peak RSS (/usr/bin/time %M) per row. See docs/training.md.
#
# Rows (--rows):
#   ft-bf16        flextier, base weights bf16 in memory (recompute backward)
#   ft-bf16-act    the same with saved activations (--activations mem, lossless)
#   ft-bf16-saved  saved activations kept raw in memory (--activations mem
#                  --activations-codec raw): no recompute, no encoding
#   ft-bf16-bfx    ft-bf16 with FLEXTIER_BF16_ACTIVATIONS=1: products of >= 25 rows round
#                  their activations to bf16 (vdpbf16ps on AVX512_BF16; what autocast does)
#   ft-bf16-saved-bfx  ft-bf16-saved with FLEXTIER_BF16_ACTIVATIONS=1: the products of
#                  >= 16 rows on the bf16 GEMMs (vdpbf16ps on AVX512_BF16; x and dy in bf16)
#   ft-q8          base weights q8 in memory
#   ft-q4          base weights q4 in memory
#   ft-q4-disk     q4 streamed from the disk tier (--policy w=0,0,100 --disk-dir)
#   ft-q4-disk-lim the same inside a memory cgroup of --limit (page cache included;
#                  root), with --memory equal to it: the cgroup's peak is reported
#   pt-f32         PyTorch + PEFT, the model in f32 (bench/train/peft_cpu.py)
#   pt-bf16-amp    PyTorch + PEFT, f32 model under torch.autocast(bfloat16)
#
#   scripts/bench/train.sh [options]
#     --flextier PATH   (build/flextier)      --model DIR (default: the peer benchmark's
#                                              1.12B Llama, generated once in $PEERS_CACHE)
#     --layers N (22)   --steps N (3)         --seq N (128)   --batch N (1)
#     --rank R (16)     --threads N (2)       --runs N (1; interleaved, medians)
#     --rows "ft-bf16 ft-q4 ft-q4-disk pt-f32 pt-bf16-amp"
#     --limit SIZE (1G: below the 1.12B model's 2.1 GiB of bf16; bytes or 512M/1.5G)
#     --python PY       a Python with torch, transformers and peft (PEFT_PYTHON, else python3)
#     --out DIR         keep the logs, results.tsv and table.md
# The data: 20000 words drawn (seed 2) from the repository's README.md.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
PEERS_PROG=train.sh
. "$here/peers-lib.sh"
FT=$root/build/flextier
MODEL=""; LAYERS=22; STEPS=3; SEQ=128; BATCH=1; RANK=16; THREADS=2; RUNS=1; OUT=""
ROWS="ft-bf16 ft-q4 ft-q4-disk pt-f32 pt-bf16-amp"
PY=${PEFT_PYTHON:-python3}
usage() { sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; }
LIMIT=1G
while [ $# -gt 0 ]; do
    case "$1" in
    --flextier) FT=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --rank) RANK=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "train.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$LAYERS" "$STEPS" "$SEQ" "$BATCH" "$RANK" "$THREADS" "$RUNS"; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "train.sh: '$v' is not a positive integer" >&2; exit 2; }
done
[ "$STEPS" -ge 2 ] || { echo "train.sh: --steps must be at least 2 (tok/s is measured after the first)" >&2; exit 2; }
for r in $ROWS; do
    case "$r" in ft-bf16|ft-bf16-act|ft-bf16-saved|ft-bf16-saved-bfx|ft-bf16-bfx|ft-q8|ft-q4|ft-q4-disk|ft-q4-disk-lim|pt-f32|pt-bf16-amp) ;;
    *) echo "train.sh: unknown row $r" >&2; exit 2 ;; esac
done
peers_need /usr/bin/time "apt-get install time" "$FT" "build flextier (cmake --build build)"
case " $ROWS " in *" pt-"*)
    "$PY" -c "import torch, transformers, peft" 2>/dev/null \
        || peers_die "$PY lacks torch, transformers or peft (pip install torch transformers peft; or --python)" ;;
esac
if [ -z "$MODEL" ]; then
    MODEL=$PEERS_CACHE/models/llama-h2048-l$LAYERS-v32000-bf16
    peers_gen_model "$FT" "$MODEL" --arch llama --hidden 2048 --layers "$LAYERS" --heads 32 --kv-heads 8 \
        --ffn 5632 --vocab 32000 --dtype bf16
fi
[ -f "$MODEL/config.json" ] || peers_die "$MODEL has no config.json"
LIMIT_B=$(python3 - "$LIMIT" <<'PY' || { echo "train.sh: bad --limit '$LIMIT'" >&2; exit 2; }
import re, sys
m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kKmMgGtT]?)i?[bB]?", sys.argv[1])
if not m:
    sys.exit(1)
print(int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper())))
PY
)
case " $ROWS " in *" ft-q4-disk-lim "*)
    [ "$(id -u)" = 0 ] || peers_die "ft-q4-disk-lim needs root (memory cgroups)"
    peers_cg_init ;;
esac
work=$(mktemp -d "${TMPDIR:-/var/tmp}/ft-train.XXXXXX")
trap 'rm -rf "$work"; declare -F peers_cg_cleanup >/dev/null && [ -n "${PEERS_CG_VER:-}" ] && peers_cg_cleanup' EXIT
python3 - "$root/README.md" > "$work/data.txt" <<'PY'
import random, sys
random.seed(2)
w = open(sys.argv[1]).read().split()
print(" ".join(random.choice(w) for _ in range(20000)))
PY
cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
peers_log "model $MODEL; $STEPS steps of $BATCH x $SEQ tokens, rank $RANK, $THREADS threads; CPU $cpu; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'row\trun\ttok_s\tpeak_rss_kb\tload1\tcgroup_peak\n' > "$work/results.tsv"
common=(--model "$MODEL" --data "$work/data.txt" --steps "$STEPS" --seq-len "$SEQ" --batch "$BATCH"
        --rank "$RANK" --alpha $((2 * RANK)) --eval-frac 0 --threads "$THREADS" --out "$work/adapter")
one() {   # one row once: appends to results.tsv
    local row=$1 run=$2 log="$work/$1.$2.log" rc=0 cgp=0
    local load; load=$(cut -d' ' -f1 /proc/loadavg)
    case "$row" in
    ft-bf16) /usr/bin/time -f 'RSS %M' "$FT" finetune "${common[@]}" --weights-dtype bf16 > "$log" 2>&1 || rc=$? ;;
    ft-bf16-act) /usr/bin/time -f 'RSS %M' "$FT" finetune "${common[@]}" --weights-dtype bf16 --activations mem \
        > "$log" 2>&1 || rc=$? ;;
    ft-bf16-saved) /usr/bin/time -f 'RSS %M' "$FT" finetune "${common[@]}" --weights-dtype bf16 --activations mem \
        --activations-codec raw > "$log" 2>&1 || rc=$? ;;
    ft-bf16-saved-bfx) FLEXTIER_BF16_ACTIVATIONS=1 /usr/bin/time -f 'RSS %M' "$FT" finetune "${common[@]}" \
        --weights-dtype bf16 --activations mem --activations-codec raw > "$log" 2>&1 || rc=$? ;;
    ft-bf16-bfx) FLEXTIER_BF16_ACTIVATIONS=1 /usr/bin/time -f 'RSS %M' "$FT" finetune "${common[@]}" \
        --weights-dtype bf16 > "$log" 2>&1 || rc=$? ;;
    ft-q8) /usr/bin/time -f 'RSS %M' "$FT" finetune "${common[@]}" --weights-dtype q8 > "$log" 2>&1 || rc=$? ;;
    ft-q4) /usr/bin/time -f 'RSS %M' "$FT" finetune "${common[@]}" --weights-dtype q4 > "$log" 2>&1 || rc=$? ;;
    ft-q4-disk) /usr/bin/time -f 'RSS %M' "$FT" finetune "${common[@]}" --weights-dtype q4 --policy w=0,0,100 \
        --disk-dir "$work/disk" > "$log" 2>&1 || rc=$? ;;
    ft-q4-disk-lim)
        peers_cg_run "$LIMIT_B" "$log.out" -- /usr/bin/time -f 'RSS %M' "$FT" finetune "${common[@]}" \
            --weights-dtype q4 --policy w=0,0,100 --disk-dir "$work/disk" --memory "$LIMIT_B" || rc=$?
        cat "$log.out" "$log.out.err" > "$log"
        cgp=$PEERS_CG_PEAK
        [ "$PEERS_CG_OOM" = 0 ] || { peers_log "$row: $PEERS_CG_OOM OOM kills"; rc=137; } ;;
    pt-f32|pt-bf16-amp)
        local dt=f32; [ "$row" = pt-bf16-amp ] && dt=bf16-autocast
        /usr/bin/time -f 'RSS %M' "$PY" "$root/bench/train/peft_cpu.py" "$MODEL" "$work/data.txt" --steps "$STEPS" \
            --seq "$SEQ" --batch "$BATCH" --rank "$RANK" --threads "$THREADS" --dtype "$dt" > "$log" 2>&1 || rc=$? ;;
    esac
    local tps rss
    if [ "$rc" != 0 ]; then
        peers_log "$row run $run failed (exit $rc): $(tail -2 "$log" | tr '\n' ' ')"
        tps=ERR
    elif [ "${row#pt-}" != "$row" ]; then
        tps=$(python3 -c 'import json,sys; print("%.2f" % [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]["tok_s"])' "$log")
    else
        tps=$(sed -n 's/.*: \([0-9.]*\) tok\/s after the first step.*/\1/p' "$log")
    fi
    rss=$(sed -n 's/^RSS \([0-9]*\)$/\1/p' "$log" | tail -1)
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$row" "$run" "${tps:-ERR}" "${rss:-0}" "$load" "$cgp" >> "$work/results.tsv"
    peers_log "$row run $run: ${tps:-ERR} tok/s, peak RSS $(( ${rss:-0} / 1024 )) MiB (load $load)"
}
for run in $(seq 1 "$RUNS"); do
    for row in $ROWS; do one "$row" "$run"; done
done
python3 - "$work/results.tsv" "$cpu" "$STEPS" "$BATCH" "$SEQ" "$RANK" "$THREADS" "$LIMIT_B" > "$work/table.md" <<'PY'
import statistics, sys
rows, cpu, steps, batch, seq, rank, threads, limit = sys.argv[1:]
res, cg = {}, {}
for line in open(rows).read().splitlines()[1:]:
    r, run, tps, rss, load, cgp = line.split("\t")
    res.setdefault(r, []).append((tps, int(rss), float(load)))
    if int(cgp):
        cg.setdefault(r, []).append(int(cgp))
def med(r):
    ok = [float(t) for t, _, _ in res[r] if t != "ERR"]
    return statistics.median(ok) if ok else None
ref = med("pt-f32") if "pt-f32" in res else None
refm = statistics.median([m for _, m, _ in res["pt-f32"]]) if ref else None
print(f"{cpu}, {threads} threads; LoRA rank {rank} on all projections; batch {batch} x {seq} tokens; "
      f"{steps} steps per run, tok/s after the first; medians of {len(next(iter(res.values())))} run(s)\n")
print("| run | tok/s | peak RSS | tok/s vs PyTorch f32 | memory vs PyTorch f32 | 1-min load |")
print("|---|---|---|---|---|---|")
for r in res:
    t = med(r)
    m = statistics.median([x for _, x, _ in res[r]])
    ld = "/".join("%.1f" % l for _, _, l in res[r])
    ts = "ERR" if t is None else ("%.2f" % t)
    rt = "%.2fx" % (t / ref) if t and ref else "-"
    rm = "%.2fx" % (m / refm) if refm else "-"
    print(f"| {r} | {ts} | {m / 1024:.0f} MiB | {rt} | {rm} | {ld} |")
for r in cg:
    print(f"\n{r}: cgroup limit {int(limit) / 1048576:.0f} MiB, peak {statistics.median(cg[r]) / 1048576:.0f} MiB "
          "(page cache included), no OOM kill")
PY
cat "$work/table.md"
if [ -n "$OUT" ]; then mkdir -p "$OUT"; cp "$work"/*.log "$work/results.tsv" "$work/table.md" "$OUT"/; fi
