#!/usr/bin/env bash
# The main job on a built-in default: demo/kjv-llama, a small Llama trained
# on the King James Bible (scripts/demo/train_demo_model.py; committed), is
# streamed layer by layer from a memory node (`flextier serve` on a free
# loopback port), its weights byte-plane compressed on the wire and its KV
# cache offloaded to host memory (written back and prefetched layer by
# layer), while the CPU writes its text; then the same prompt runs all in
# memory for comparison.
#   scripts/demo.sh [BUILD_DIR]       MODEL=DIR to use your own checkpoint,
#                                     PROMPT=TEXT to change the prompt
set -euo pipefail
build=${1:-build}
bin="$build/flextier"
model=${MODEL:-demo/kjv-llama}
work=$(mktemp -d)
srv=""
cleanup() { [ -n "$srv" ] && kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT INT TERM

if [ ! -f "$model/config.json" ]; then
    echo "demo: $model/config.json not found (MODEL=DIR names a Hugging Face model directory)"; exit 1
fi
# Sizes from the model: the memory node holds every layer (byte-plane frames
# are never larger than the checkpoint), and the device budget two layers'
# slots (the frame and its decoded tensor, twice) plus the cache's staging.
read -r ckpt layers < <(python3 - "$model" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(d, "*.safetensors")))
cfg = json.load(open(os.path.join(d, "config.json")))
print(size, max(1, int(cfg.get("num_hidden_layers", 1))))
PY
) || { echo "demo: cannot read $model's checkpoint size"; exit 1; }
[ "${ckpt:-0}" -gt 0 ] || { echo "demo: no *.safetensors in $model"; exit 1; }
capacity=$(( (ckpt + ckpt / 4) / 1048576 + 64 ))M
devmem=$(( 4 * (ckpt / layers) / 1048576 + 64 ))M
echo "== starting a memory node on loopback (capacity $capacity for a ${ckpt}-byte checkpoint)"
"$bin" serve --listen 127.0.0.1:0 --capacity "$capacity" > "$work/serve.log" 2>&1 &
srv=$!
for _ in $(seq 100); do grep -q "listening on" "$work/serve.log" && break; sleep 0.1; done
addr=$(sed -n 's/.*listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/serve.log" | head -1)
[ -n "$addr" ] || { echo "demo: the memory node did not start:"; cat "$work/serve.log"; exit 1; }
echo "   ucx://$addr"
prompt=${PROMPT:-"And God said unto Moses,"}
# sampling with a fixed seed: the streamed and the in-memory run draw the same tokens
sampling=(--temperature 0.7 --top-k 40 --repetition-penalty 1.1 --seed 7)
echo "== generating with every layer's weights streamed from ucx://$addr (byte-plane, lossless; --device-mem $devmem)"
echo "   and the KV cache offloaded to host memory (f32 rows, lossless)"
"$bin" run --model "$model" --prompt "$prompt" --max-new-tokens 80 "${sampling[@]}" \
    --policy "w=0,0,0,100 c=0,100,0,0" --remote "ucx://$addr" --compress-weights bp --device-mem "$devmem" \
    --offload-stats --dump-logits "$work/remote.logits" | tee "$work/remote.txt"
echo "== the same prompt with all weights in memory (and an f32 KV cache, as the offloaded one: f32 rows)"
"$bin" run --model "$model" --prompt "$prompt" --max-new-tokens 80 "${sampling[@]}" --kv-dtype f32 \
    --dump-logits "$work/local.logits" | tee "$work/local.txt"
if cmp -s "$work/remote.txt" "$work/local.txt" && cmp -s "$work/remote.logits" "$work/local.logits"; then
    echo "== identical text and prompt logits: streaming compressed weights and the cache changed nothing"
else
    echo "== MISMATCH between the streamed and the in-memory run"; exit 1
fi
echo "== memory node statistics"
"$bin" stat "ucx://$addr"
echo "(any Hugging Face OPT, Llama, Mistral or Qwen2 directory works: MODEL=dir make demo)"
