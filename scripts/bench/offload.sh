#!/usr/bin/env bash
# offload.sh - FlexGen-style offloading table, one run per row, same
# model and machine (run as root for the lab rows):
#   (a) everything in memory            (b) weights on local SSD (file:)
#   (c) weights on a memory node over loopback
#   (d) (c) over the 1 Gbit/s lab link  (e) (d) with q4 weights
#   (f) (d) with byte-plane weights
#   (g) KV cache offloaded to the lab node, none vs q4 (weights on the
#       device; a longer prompt, so that the cache is what moves)
# Each row: decode tok/s, overlap efficiency, and the planner's prediction
# for that policy (flextier plan --policy), and their ratio.
#   scripts/bench/offload.sh [-b BUILD] [-m MODEL_DIR] [--batch N] [--gen N] [--rate 1gbit]
#                            [--cache-prompt N (row g, default 256)]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BUILD=build; MODEL=""; BATCH=8; PROMPT=32; GEN=8; RATE=1gbit; THREADS=1; GPROMPT=256
while [ $# -gt 0 ]; do
    case "$1" in
    -b) BUILD=$2; shift 2 ;;
    -m) MODEL=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --cache-prompt) GPROMPT=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "offload.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
FT=$(readlink -f "$BUILD/flextier")
work=$(mktemp -d /tmp/ft-bench-offload.XXXXXX)
SRV_PID=""
. "$here/../lab-lib.sh"
cleanup() {
    set +e
    [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null
    lab_down
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

if [ -z "$MODEL" ]; then
    # ~26 MB of bf16 weights per layer: ~0.2 s per layer over 1 Gbit/s
    MODEL=$work/model
    "$FT" gen-model --arch llama --out "$MODEL" --hidden 1024 --layers 8 --heads 16 --kv-heads 8 \
        --ffn 2816 --vocab 4096 --dtype bf16 >&2
fi
common=(bench run --model "$MODEL" --batch "$BATCH" --prompt-len "$PROMPT" --gen-len "$GEN" --threads "$THREADS")
DEV=$(( 512 * 1024 * 1024 ))

wait_listen() {   # log file
    for _ in $(seq 100); do grep -q "^flextier serve: listening on" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "bench-offload: server did not start" >&2; cat "$1" >&2; return 1
}
row() {   # name policy-text predict-args plan-prefix -- bench command...
    local name=$1 ptext=$2 pargs=$3 pre=$4; shift 5
    local out; out=$("$@" 2>&1) || { echo "| $name | $ptext | failed: $(echo "$out" | tail -1) | | | |"; return; }
    local dec eff pred
    dec=$(echo "$out" | awk '/^  decode/ {print $4}')
    eff=$(echo "$out" | sed -n 's/.*overlap efficiency \([0-9]*\)%.*/\1/p' | head -1)   # the decode phase's
    pred=""
    if [ -n "$pargs" ]; then
        pred=$(eval "$pre $FT plan --model $MODEL --device-mem $DEV --threads $THREADS --batch $BATCH --prompt-len $PROMPT --gen-len $GEN $pargs --json" 2>/dev/null |
               python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["decode_tps"])' 2>/dev/null || true)
    fi
    local ratio=""
    [ -n "$pred" ] && ratio=$(python3 -c "print('%.2f' % ($pred / $dec))")
    echo "| $name | $ptext | ${dec:-?} | ${eff:+$eff%} | $pred | $ratio |"
}

echo "model: $(python3 -c "import json;c=json.load(open('$MODEL/config.json'));print(c['model_type'], c['num_hidden_layers'],'layers, hidden', c['hidden_size'])"), batch $BATCH, prompt $PROMPT, gen $GEN, $THREADS compute thread(s); $(date -u +%F)"
echo
echo "| row | placement | decode tok/s | overlap efficiency (decode) | predicted tok/s | predicted / measured |"
echo "|---|---|---|---|---|---|"
row "(a) in memory" "w=100,0,0,0" "--policy w=100,0,0,0" "" -- "$FT" "${common[@]}"
mkdir -p "$work/disk"
row "(b) local SSD" "w=0,0,100,0" "--policy w=0,0,100,0 --disk-dir $work/disk" "" -- \
    "$FT" "${common[@]}" --policy w=0,0,100,0 --disk-dir "$work/disk" --device-mem $DEV
"$FT" serve --listen 127.0.0.1:0 --capacity 2G > "$work/lo.log" 2>&1 &
SRV_PID=$!
wait_listen "$work/lo.log"
LO=$(sed -n 's/.*listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/lo.log" | head -1)
row "(c) memory node, loopback" "w=0,0,0,100" "--policy w=0,0,0,100 --remote ucx://$LO" "" -- \
    "$FT" "${common[@]}" --policy w=0,0,0,100 --remote "ucx://$LO" --device-mem $DEV
kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=""
if [ "$(id -u)" = 0 ] && lab_up 2>/dev/null; then
    lab_rate "$RATE"
    lab_token "$work/token"          # a node on a non-loopback address needs one
    export FLEXTIER_TOKEN_FILE=$work/token
    lab_srv "$FT" serve --listen "$LAB_IP_S:13400" --capacity 2G --token-file "$work/token" \
        > "$work/lab.log" 2>&1 &
    SRV_PID=$!
    wait_listen "$work/lab.log"
    R="ucx://$LAB_IP_S:13400"
    for cw in none q4 bp; do
        case $cw in none) n="(d) memory node, $RATE lab link" ;; q4) n="(e) (d) + q4 weights" ;; bp) n="(f) (d) + byte-plane weights" ;; esac
        # the planner measures the link from the client namespace, as the run sees it
        row "$n" "w=0,0,0,100 cw=$cw" "--policy 'w=0,0,0,100 cw=$cw' --remote $R" lab_cli -- \
            lab_cli "$FT" "${common[@]}" --policy w=0,0,0,100 --remote "$R" --compress-weights $cw --device-mem $DEV
    done
    # The planner's own choice under the constraints of rows (d)-(f): a
    # device budget of two layer slots and ~2 resident layers, no host or
    # disk tier, this node.
    SLOTS=$(( 224 * 1024 * 1024 ))   # two streaming slots + about two resident layers
    choice=$(lab_cli "$FT" plan --model "$MODEL" --device-mem $SLOTS --host-mem 0 --remote "$R" \
             --batch "$BATCH" --fixed-batch --prompt-len "$PROMPT" --gen-len "$GEN" --threads "$THREADS" \
             --codecs none,bp,q4 --json 2>/dev/null)
    cpol=$(echo "$choice" | python3 -c 'import json,sys; print(json.load(sys.stdin)["policy"])' 2>/dev/null || true)
    # (g) the KV cache on the node, weights on the device: at prompt
    # $GPROMPT the cache of a layer is ~8 MiB of f32 rows per step
    for cc in none q4; do
        row "(g) KV cache on the node, cc=$cc, prompt $GPROMPT" "w=100,0 c=0,0,0,100 cc=$cc" \
            "--policy 'w=100,0 c=0,0,0,100 cc=$cc' --remote $R --prompt-len $GPROMPT" lab_cli -- \
            lab_cli "$FT" bench run --model "$MODEL" --batch "$BATCH" --prompt-len "$GPROMPT" --gen-len "$GEN" \
            --threads "$THREADS" --policy "w=100,0 c=0,0,0,100" --compress-cache $cc --remote "$R" --device-mem $DEV
    done
    if [ -n "$cpol" ]; then
        cw=$(echo "$cpol" | sed -n 's/.* cw=\([a-z0-9]*\).*/\1/p')
        wp=$(echo "$cpol" | sed -n 's/^w=\([0-9,]*\) .*/\1/p')
        row "planner's choice" "w=$wp cw=$cw" "--policy 'w=$wp cw=$cw' --remote $R" lab_cli -- \
            lab_cli "$FT" "${common[@]}" --policy "w=$wp" --remote "$R" --compress-weights "$cw" --device-mem $SLOTS
    fi
else
    echo "| (d)-(f) lab link | | needs root and network namespaces | | | |"
fi
