#!/usr/bin/env bash
# Side-by-side decode throughput: flextier vs karpathy/llama2.c's run.c
# (fp32, OpenMP) on the same random Llama weights, same thread count.
# Usage: scripts/bench/compare_llama2c.sh PATH/TO/llama2.c/run.c [THREADS] [STEPS]
# run.c is not part of this repository: fetch it yourself. Nothing here is
# committed or downloaded. Needs python3 (standard library only).
set -euo pipefail
RUNC=${1:?path to llama2.c run.c}
T=${2:-2}
N=${3:-256}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FT=${FT_BIN:-$ROOT/build/flextier}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# stories15M's shape (dim 288, 6 layers, 6 heads, ffn 768, vocab 32000)
"$FT" gen-model --arch llama --out "$W/m" --hidden 288 --layers 6 --heads 6 --ffn 768 \
    --vocab 32000 --max-pos 1024 --dtype f32 >/dev/null
python3 "$ROOT/scripts/bench/export_llama2c.py" "$W/m" "$W/m.bin" "$W/tok.bin" --seq-len 1024 >/dev/null
cc -O3 -march=native -fopenmp -o "$W/run" "$RUNC" -lm
echo "llama2.c run.c, batch 1, $T threads, $N steps:"
for i in 1 2 3; do
  OMP_NUM_THREADS=$T "$W/run" "$W/m.bin" -z "$W/tok.bin" -t 0 -n "$N" 2>&1 >/dev/null | grep achieved
done
echo "flextier, $T threads, prompt 1, gen $N:"
for b in 1 1 1 32; do
  "$FT" bench run --model "$W/m" --batch $b --prompt-len 1 --gen-len "$N" --threads "$T" | grep -E "batch|decode "
done
