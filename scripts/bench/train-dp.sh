#!/usr/bin/env bash
# train-dp.sh - data-parallel fine-tuning over the lab's link (run as root):
# two `flextier finetune --data-parallel tcp` ranks in two network
# namespaces joined by a rate-limited veth (scripts/lab-lib.sh), each
# pinned to its own core, against one process on one core with the same
# global batch (docs/training.md, "Over TCP").
#
#   scripts/bench/train-dp.sh [-b BUILD] [-m MODEL] [-r RATE] [-n ROUNDS] [-s STEPS]
#                             [--seq N] [--accum N] [--rank R] [--data FILE]
#
# Defaults: demo/kjv-llama (f32 weights), LoRA rank 8 on all projections,
# steps of 4 micro-batches of 1 x 128 tokens, 8 steps, 1gbit, 5 rounds
# (one process and the two ranks alternate). Reported per row: training
# tok/s after the first step (median, range over the rounds), and the
# speed-up of the medians; every round checks that the two ranks' adapter
# is byte-identical to the one process's. Prints the CPU model and the
# 1-minute load beside the numbers.
set -euo pipefail

BUILD=build
MODEL=demo/kjv-llama
RATE=1gbit
ROUNDS=5
STEPS=8
SEQ=128
ACCUM=4
LRANK=8
DATA=""
while [ $# -gt 0 ]; do
    case "$1" in
    -b) BUILD=$2; shift 2 ;;
    -m) MODEL=$2; shift 2 ;;
    -r) RATE=$2; shift 2 ;;
    -n) ROUNDS=$2; shift 2 ;;
    -s) STEPS=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;;
    --accum) ACCUM=$2; shift 2 ;;
    --rank) LRANK=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "train-dp.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

[ "$(id -u)" = 0 ] || { echo "train-dp.sh: must run as root (network namespaces)" >&2; exit 1; }
FT=$(readlink -f "$BUILD/flextier")
[ -x "$FT" ] || { echo "train-dp.sh: $BUILD/flextier not built" >&2; exit 1; }
[ "$(nproc)" -ge 2 ] || { echo "train-dp.sh: needs 2 cores (one per rank)" >&2; exit 1; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/scripts/lab-lib.sh"

WORK=$(mktemp -d /tmp/ft-train-dp.XXXXXX)
cleanup() { set +e; lab_down; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
lab_up
lab_rate "$RATE"
lab_token "$WORK/token"

# training text: the given file, else the repository's documentation
if [ -z "$DATA" ]; then
    DATA=$WORK/data.txt
    cat "$ROOT"/docs/*.md > "$DATA"
fi
PORT=7101
ARGS=(--model "$(readlink -f "$MODEL")" --data "$(readlink -f "$DATA")" --steps "$STEPS" --seq-len "$SEQ" --batch 1
      --grad-accum "$ACCUM" --rank "$LRANK" --eval-frac 0 --weights-dtype f32 --threads 1)
PEERS=$LAB_IP_S:$PORT,$LAB_IP_C:$PORT

tps() { sed -n 's/.*: \([0-9.]*\) tok\/s after the first step.*/\1/p' "$1"; }

one=() two=() cone=() ctwo=() twin=()
cpu() { awk '{s += $1 + $2} END {printf "%.2f", s}' "$@"; }
for r in $(seq "$ROUNDS"); do
    # one process, one core
    /usr/bin/time -o "$WORK/one.time" -f "%U %S" taskset -c 0 "$FT" finetune "${ARGS[@]}" --out "$WORK/one" > "$WORK/one.out" 2>&1 ||
        { cat "$WORK/one.out"; exit 1; }
    one+=("$(tps "$WORK/one.out")")
    # the same, with a twin on the other core: the other jobs on the machine
    # then compete with ours on both cores, as with two ranks
    taskset -c 0 "$FT" finetune "${ARGS[@]}" --out "$WORK/tw0" > "$WORK/tw0.out" 2>&1 &
    t0=$!
    taskset -c 1 "$FT" finetune "${ARGS[@]}" --out "$WORK/tw1" > "$WORK/tw1.out" 2>&1 &
    t1=$!
    wait $t0 && wait $t1 || { cat "$WORK/tw0.out" "$WORK/tw1.out"; exit 1; }
    twin+=("$(tps "$WORK/tw0.out") $(tps "$WORK/tw1.out")")
    # two ranks, one per namespace and core, over the link
    ip netns exec "$LAB_NS_S" /usr/bin/time -o "$WORK/r0.time" -f "%U %S" taskset -c 0 "$FT" finetune "${ARGS[@]}" --out "$WORK/two" --data-parallel tcp \
        --dp-rank 0 --dp-peers "$PEERS" --dp-token-file "$WORK/token" > "$WORK/r0.out" 2>&1 &
    p0=$!
    ip netns exec "$LAB_NS_C" /usr/bin/time -o "$WORK/r1.time" -f "%U %S" taskset -c 1 "$FT" finetune "${ARGS[@]}" --out "$WORK/two1" --data-parallel tcp \
        --dp-rank 1 --dp-peers "$PEERS" --dp-token-file "$WORK/token" > "$WORK/r1.out" 2>&1 &
    p1=$!
    ok=1
    wait $p0 || ok=0
    wait $p1 || ok=0
    [ $ok = 1 ] || { cat "$WORK/r0.out" "$WORK/r1.out"; exit 1; }
    two+=("$(tps "$WORK/r0.out")")
    cone+=("$(cpu "$WORK/one.time")")
    ctwo+=("$(cpu "$WORK/r0.time" "$WORK/r1.time")")
    cmp -s "$WORK/one/adapter_model.safetensors" "$WORK/two/adapter_model.safetensors" ||
        { echo "train-dp.sh: round $r: the two ranks' adapter differs from one process's" >&2; exit 1; }
    echo "round $r: one process ${one[-1]} tok/s (CPU ${cone[-1]} s), with a twin ${twin[-1]}," \
         "two ranks ${two[-1]} tok/s (CPU ${ctwo[-1]} s)" \
         "(load $(cut -d' ' -f1 /proc/loadavg))"
done

med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {m = NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "%.0f (%.0f-%.0f)", m, a[1], a[NR]}'; }
medv() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
NP=$(sed -n 's/.*targets [^,]*, \([0-9]*\) trainable parameters.*/\1/p' "$WORK/one.out")
echo
echo "model $MODEL, LoRA rank $LRANK (all projections, $NP parameters: gradient $((NP * 4)) bytes);"
echo "steps of $ACCUM x 1 x $SEQ tokens, $STEPS steps; link $RATE (tc tbf both ways); $ROUNDS rounds"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
medc() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {printf "%.1f", NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
echo "| run | tok/s after the first step (median; range) | CPU s, whole run, all processes (median) |"
echo "|---|---|---|"
echo "| 1 process, 1 core | $(med "${one[@]}") | $(medc "${cone[@]}") |"
echo "| 1 process, 1 core, a twin on the other core | $(med $(printf '%s\n' "${twin[@]}" | tr ' ' '\n')) | |"
echo "| 2 ranks over $RATE (namespaces), 1 core each | $(med "${two[@]}") | $(medc "${ctwo[@]}") |"
awk -v a="$(medv "${two[@]}")" -v b="$(medv "${one[@]}")" -v c="$(medv $(printf '%s\n' "${twin[@]}" | tr ' ' '\n'))" \
    'BEGIN {printf "speed-up (medians): %.2fx one process alone, %.2fx one process with a twin\n", a / b, a / c}'
echo "adapters: byte-identical in every round"
# the exchange alone (what a step sends between the two ranks), over the same link
EX=$(readlink -f "$BUILD/bench/bench_dp_exchange" 2>/dev/null || true)
if [ -x "$EX" ]; then
    ip netns exec "$LAB_NS_C" "$EX" 1 "$PEERS" $((NP * 4)) 50 "$WORK/token" &
    ip netns exec "$LAB_NS_S" "$EX" 0 "$PEERS" $((NP * 4)) 50 "$WORK/token"
    wait
fi
