#!/usr/bin/env bash
# moe-node.sh - a mixture of experts with its experts on a memory node under
# a cgroup memory limit (issue 23): `flextier serve` on loopback (outside the
# cgroup) holds what the policy puts on the remote tier; `flextier bench run`
# runs in a fresh cgroup whose hard limit (page cache included) is LIMIT,
# with --memory LIMIT. Root only (cgroups, drop_caches).
#
#   scripts/bench/moe-node.sh --model DIR [options]
#     --flextier PATH   (build/flextier)
#     --limits "200M 100M"   cgroup limits (binary units)
#     --policy SPEC     (w=3,0,0,97: attention, norms and routers resident,
#                        the experts on the node)
#     --ft-args "ARGS"  extra bench-run options (e.g. --expert-cache 24M)
#     --batch N (1) --prompt N (32) --gen N (32) --threads N (2) --runs N (1)
# Prints one row per limit: decode tok/s (median of the runs; each run's), the cgroup's
# peak (memory.max_usage_in_bytes / memory.peak), OOM kills, the expert
# cache's hit rate (its --json "experts"), and bytes read from the node per generated token (its
# --json remote read bytes over batch x gen; prefill included).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
export PEERS_PROG=moe-node.sh   # peers-lib.sh names its messages with it
. "$here/peers-lib.sh"

FT=$root/build/flextier MODEL='' LIMITS="200M 100M" POLICY="w=3,0,0,97" FTARGS='' BATCH=1 PROMPT=32 GEN=32 THREADS=2 RUNS=1
while [ $# -gt 0 ]; do
    case "$1" in
    --flextier) FT=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --limits) LIMITS=$2; shift 2 ;;
    --policy) POLICY=$2; shift 2 ;;
    --ft-args) FTARGS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "moe-node.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$MODEL" ] && [ -f "$MODEL/config.json" ] || { echo "moe-node.sh: --model DIR with a config.json" >&2; exit 2; }
[ -x "$FT" ] || { echo "moe-node.sh: no flextier at $FT" >&2; exit 2; }
for v in "$BATCH" "$PROMPT" "$GEN" "$THREADS" "$RUNS"; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "moe-node.sh: '$v' is not a positive integer" >&2; exit 2; }
done
bytes() { python3 -c 'import sys; s=sys.argv[1]; u={"K":1<<10,"M":1<<20,"G":1<<30}; print(int(float(s[:-1])*u[s[-1].upper()]) if s[-1].upper() in u else int(s))' "$1"; }

peers_cg_init
work=$(mktemp -d /tmp/ft-moe-node.XXXXXX)
node_pid=
cleanup() { [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null; wait 2>/dev/null; peers_cg_cleanup; rm -rf "$work"; }
trap cleanup EXIT
msize=$(du -sb "$MODEL/model.safetensors" | cut -f1)
"$FT" serve --listen 127.0.0.1:0 --capacity "$(( msize * 3 / 2 / 1048576 + 256 ))M" > "$work/serve.log" 2>&1 &
node_pid=$!
for _ in $(seq 100); do grep -q "listening on" "$work/serve.log" && break; sleep 0.1; done
node="ucx://$(sed -n 's/.*listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/serve.log" | head -1)"
[ "$node" != "ucx://" ] || peers_die "the memory node did not start: $(cat "$work/serve.log")"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# model $MODEL ($(( msize / 1048576 )) MiB), policy $POLICY, node $node, batch $BATCH, prompt $PROMPT, gen $GEN, threads $THREADS $FTARGS"
printf "| limit | decode tok/s (runs) | cgroup peak | OOM | expert hit rate | node bytes / token | load |\n|---|---|---|---|---|---|---|\n"
for lim in $LIMITS; do
    lb=$(bytes "$lim")
    tps=() peak=0 oom=0 hit=- bpt=- err=
    for r in $(seq "$RUNS"); do
        log="$work/run-$lim-$r"
        # shellcheck disable=SC2086
        if peers_cg_run "$lb" "$log" -- "$FT" bench run --model "$MODEL" --batch "$BATCH" --prompt-len "$PROMPT" \
               --gen-len "$GEN" --threads "$THREADS" --policy "$POLICY" --remote "$node" --memory "$lb" \
               --offload-stats --json $FTARGS; then
            j=$(tail -1 "$log")
            tps+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["decode_tok_s"])' "$j")")
            bpt=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("%.2f MiB" % (d["offload"]["weights"]["read_wire_bytes"]["remote"] / (d["batch"] * d["gen_len"]) / 1048576))' "$j")
            hit=$(python3 -c 'import json,sys; x=json.loads(sys.argv[1])["offload"].get("experts"); print("%.1f%%" % (100 * x["hit_rate"]) if x else "-")' "$j")
        else
            err=$(grep -m1 -i "error\|cannot\|refus" "$log.err" | cut -c1-120 || true)
        fi
        [ "$PEERS_CG_PEAK" -gt "$peak" ] && peak=$PEERS_CG_PEAK
        oom=$((oom + PEERS_CG_OOM))
    done
    med=$(printf "%s\n" "${tps[@]:-}" | sort -g | awk 'NF {a[n++]=$1} END {print n ? a[int((n-1)/2)] : "ERR"}')
    printf "| %s | %s (%s) | %.1f MiB | %d | %s | %s | %s |%s\n" "$lim" "$med" "${tps[*]:-}" "$(python3 -c "print($peak/1048576)")" "$oom" \
        "${hit:--}" "$bpt" "$(cut -d' ' -f1 /proc/loadavg)" "${err:+ $err}"
done
