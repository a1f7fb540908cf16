#!/usr/bin/env bash
# agent.sh - the codec agent on the two-namespace lab (run as root).
#
# Memory node in one namespace, behind a rate-limited veth (default
# 1 Gbit/s); the client and `flextier agent` in the other ("the host
# side"), the client pinned to core 0 and the agent to core 1 with
# taskset. In the same run, per codec: `bench transfer` through the agent
# (agent://) and in-process (ucx://): tensor GB/s and the client process's
# CPU seconds per GB of tensors; then the offloading row (weights on the
# lab node, q4) with `bench run`, decode tok/s both ways.
#   scripts/bench/agent.sh [-b BUILD] [-r 1gbit] [-c "q4 bp"] [-s 64M] [-n 6] [-d 4] [--no-run]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BUILD=build; RATE=1gbit; CODECS="q4 bp"; SIZE=64M; ITERS=6; DEPTH=4; RUNROW=1
while [ $# -gt 0 ]; do
    case "$1" in
    -b) BUILD=$2; shift 2 ;;
    -r) RATE=$2; shift 2 ;;
    -c) CODECS=$2; shift 2 ;;
    -s) SIZE=$2; shift 2 ;;
    -n) ITERS=$2; shift 2 ;;
    -d) DEPTH=$2; shift 2 ;;
    --no-run) RUNROW=0; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "agent.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "agent.sh: must run as root" >&2; exit 1; }
FT=$(readlink -f "$BUILD/flextier")
work=$(mktemp -d /tmp/ft-bench-agent.XXXXXX)
SRV_PID=""; AG_PID=""
. "$here/../lab-lib.sh"
cleanup() {
    set +e
    [ -n "$AG_PID" ] && kill "$AG_PID" 2>/dev/null && wait "$AG_PID" 2>/dev/null
    [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null
    lab_down
    rm -rf "$work"
}
trap cleanup EXIT INT TERM
wait_listen() {   # log file
    for _ in $(seq 100); do grep -q "listening on" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "bench-agent: $1 did not start" >&2; cat "$1" >&2; return 1
}
lab_up
lab_rate "$RATE"
export FLEXTIER_TIMEOUT_MS=120000
# off loopback, the node and the agent require a token (protected mode):
# one lab token for both, clients and the agent find it in the environment
lab_token "$work/token"
export FLEXTIER_TOKEN_FILE="$work/token"
lab_srv "$FT" serve --listen "$LAB_IP_S:13500" --capacity 3G --token-file "$work/token" > "$work/srv.log" 2>&1 &
SRV_PID=$!
wait_listen "$work/srv.log"
NODE="ucx://$LAB_IP_S:13500"
lab_cli taskset -c 1 "$FT" agent --listen "$LAB_IP_C:13501" --node "$NODE" --token-file "$work/token" > "$work/agent.log" 2>&1 &
AG_PID=$!
wait_listen "$work/agent.log"
AGENT="agent://$LAB_IP_C:13501"   # own address: local traffic, not over the veth
cli() { lab_cli taskset -c 0 "$FT" "$@"; }
get() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
ratio() { python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$1" "$2"; }

echo "# bench-agent: $RATE lab link, node in $LAB_NS_S, client (core 0) and agent (core 1) in $LAB_NS_C; $(date -u +%F)"
echo
echo "| codec | path | write GB/s | read GB/s | client CPU s/GB write | client CPU s/GB read |"
echo "|---|---|---|---|---|---|"
for c in $CODECS; do
    a=$(cli bench transfer "$AGENT" --size "$SIZE" -c "$c" --depth "$DEPTH" --iters "$ITERS" --json --no-perftest)
    i=$(cli bench transfer "$NODE" --size "$SIZE" -c "$c" --depth "$DEPTH" --iters "$ITERS" --json --no-perftest)
    for kind in agent in-process; do
        j=$a; [ $kind = in-process ] && j=$i
        printf "| %s | %s | %.3f | %.3f | %.3f | %.3f |\n" "$c" "$kind" "$(get "$j" write_logical_gbs)" \
            "$(get "$j" read_logical_gbs)" "$(get "$j" write_cpu_s_per_gb)" "$(get "$j" read_cpu_s_per_gb)"
    done
    printf "| %s | agent / in-process | %s | %s | %s | %s |\n" "$c" \
        "$(ratio "$(get "$a" write_logical_gbs)" "$(get "$i" write_logical_gbs)")" \
        "$(ratio "$(get "$a" read_logical_gbs)" "$(get "$i" read_logical_gbs)")" \
        "$(ratio "$(get "$a" write_cpu_s_per_gb)" "$(get "$i" write_cpu_s_per_gb)")" \
        "$(ratio "$(get "$a" read_cpu_s_per_gb)" "$(get "$i" read_cpu_s_per_gb)")"
done

if [ "$RUNROW" = 1 ]; then
    # the offloading row (e) of offload.sh: weights on the lab node, q4
    "$FT" gen-model --arch llama --out "$work/model" --hidden 1024 --layers 8 --heads 16 --kv-heads 8 \
        --ffn 2816 --vocab 4096 --dtype bf16 >&2
    common=(bench run --model "$work/model" --batch 8 --prompt-len 32 --gen-len 8 --threads 1
            --policy w=0,0,0,100 --compress-weights q4 --device-mem 512M)
    echo
    echo "| offloading row (e), weights on the lab node, q4 | decode tok/s |"
    echo "|---|---|"
    for uri in "$NODE" "$AGENT"; do
        out=$(cli "${common[@]}" --remote "$uri" 2>&1) || { echo "| $uri | failed: $(echo "$out" | tail -1) |"; continue; }
        echo "| $uri | $(echo "$out" | awk '/^  decode/ {print $4}') |"
    done
fi
