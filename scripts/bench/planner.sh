#!/usr/bin/env bash
# planner.sh - can a user trust the planner? (issue 20, item 3) For every
# row of the README's offloading table and the memory-limited rows, one
# process plans (or, for a given policy, calibrates and predicts with
# `--predict`) and then generates: the predicted and the measured decode
# tok/s side by side, their ratio, the 1-minute load before and after the
# run. Then `flextier plan` three times in a row per model: with the
# calibration cache (as a user runs it) and with --recalibrate (three
# fresh calibrations), to show the predictions' spread.
#
# Rows (--sections):
#   offload   the README's offloading table: a random Llama (hidden 1024, 8
#             layers, 26 MB of bf16 per layer), batch 8, prompt 32: (a) in
#             memory, (b) weights on the disk tier, (c) on a memory node
#             over loopback, (c') byte-plane, (c'') q4; with root and network
#             namespaces the 1 Gbit/s lab rows (d) node, (e) q4, (f) bp, (g)
#             the KV cache on the lab node (f32 rows, q4)
#   memlimit  --policy auto --memory LIMIT (in a memory cgroup of LIMIT when
#             root, page cache dropped before each run), weights on the disk
#             tier or a memory node, lossless and q4, batch 1 and 16: the
#             1.12B Llama of the peer benchmark under 1.5 GiB and 768 MiB,
#             the 8-layer h2048 Llama (938 MiB) under 448 MiB, a small Llama
#             (h1024, 8 layers, vocab 32000, 262 MiB) under 160 MiB
#   stability three `plan` runs in a row (cached, then --recalibrate) per model
#
#   scripts/bench/planner.sh [--flextier PATH] [--sections "offload memlimit stability"]
#                            [--models "small h2048l8 llama1b"] [--batches "1 16"]
#                            [--rows "disk disk-q4 node node-q4"] [--limits "768M"] [--gen N] [--threads N]
#                            [--runs N] [--out DIR] [--calib-cache DIR]
# --runs N runs every generation row N times (default 1) and reports the
# medians, the measured range beside them (this VM's disk and cores swing
# 1.5-2x from minute to minute: a single run is one sample of that).
# The calibration cache is a private directory (--calib-cache; default
# under --out or a temporary one), measured fresh at the start of each
# section (--recalibrate on the first run of each shape): predictions then
# come from measurements taken under the same load as the runs. Output: a
# markdown table (README-ready) on stdout and in OUT/table.md.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
PEERS_PROG=planner.sh
. "$here/peers-lib.sh"

FT=$root/build/flextier
SECTIONS="offload memlimit stability"; MODELS="small h2048l8 llama1b"; BATCHES="1 16"
ROWS="disk disk-q4 node node-q4"; GEN=16; THREADS=2; OUT=""; CALIB=""; LIMITS_OPT=""; RUNS=1
usage() { sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --flextier) FT=$2; shift 2 ;;
    --sections) SECTIONS=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --batches) BATCHES=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    --limits) LIMITS_OPT=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --calib-cache) CALIB=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "planner.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$GEN" "$THREADS" "$RUNS" $BATCHES; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "planner.sh: '$v' is not a positive integer" >&2; exit 2; }
done
[ "$GEN" -ge 4 ] || { echo "planner.sh: --gen must be at least 4" >&2; exit 2; }
for s in $SECTIONS; do case "$s" in offload|memlimit|stability) ;; *) echo "planner.sh: unknown section $s" >&2; exit 2 ;; esac; done
for m in $MODELS; do case "$m" in small|h2048l8|llama1b) ;; *) echo "planner.sh: unknown model $m" >&2; exit 2 ;; esac; done
for r in $ROWS; do case "$r" in disk|disk-q4|node|node-q4) ;; *) echo "planner.sh: unknown row $r" >&2; exit 2 ;; esac; done
[ -x "$FT" ] || peers_die "no flextier binary at $FT (build it, or pass --flextier)"
FT=$(readlink -f "$FT")

if [ -n "$OUT" ]; then mkdir -p "$OUT"; work=$(readlink -f "$OUT"); else work=$(mktemp -d /var/tmp/ft-planner.XXXXXX); fi
mkdir -p "$work/logs" "$work/disk"
export FLEXTIER_CALIB_CACHE=${CALIB:-$work/calib}
ROOT=0; [ "$(id -u)" = 0 ] && ROOT=1
srv=""; labsrv=""
cleanup() {
    set +e
    [ -n "$srv" ] && kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
    [ -n "$labsrv" ] && kill "$labsrv" 2>/dev/null && wait "$labsrv" 2>/dev/null
    [ "$ROOT" = 1 ] && peers_cg_cleanup
    declare -F lab_down > /dev/null && lab_down 2>/dev/null
    [ -z "$OUT" ] && rm -rf "$work"
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM
[ "$ROOT" = 1 ] && peers_cg_init

load1() { cut -d' ' -f1 /proc/loadavg; }
table=$work/table.md
: > "$table"
emit() { echo "$*" | tee -a "$table"; }

start_node() {   # a memory node on loopback (another process, outside any cgroup)
    [ -n "$srv" ] && return 0
    "$FT" serve --listen 127.0.0.1:0 --capacity "${1:-4G}" > "$work/logs/serve.log" 2>&1 &
    srv=$!
    for _ in $(seq 100); do grep -q "listening on" "$work/logs/serve.log" && break; sleep 0.1; done
    NODE="ucx://$(sed -n 's/.*listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/logs/serve.log" | head -1)"
    [ "$NODE" != "ucx://" ] || peers_die "the memory node did not start: $(cat "$work/logs/serve.log")"
}

# One generation row: NAME POLICY-TEXT LIMIT(0: none) -- command... (a bench
# run --json), run $RUNS times (a --recalibrate in it on the first run
# only: the others plan from the calibration cache, as a user's next run
# does). Prints | name | policy | predicted | measured | ratio | load |:
# medians over the runs, the measured range beside them.
row() {
    local name=$1 ptext=$2 lim=$3; shift 4
    local log="$work/logs/$(echo "$name" | tr -c 'A-Za-z0-9_.-' '_')" rc=0 l0 l1 peak="" k pk=0 a
    local outs=()
    echo "$*" > "$log.cmd"
    l0=$(load1)
    for k in $(seq "$RUNS"); do
        local cmd=() o="$log.out"
        [ "$RUNS" -gt 1 ] && o="$log.$k.out"
        for a in "$@"; do [ "$k" -gt 1 ] && [ "$a" = --recalibrate ] && continue; cmd+=("$a"); done
        if [ "$lim" != 0 ] && [ "$ROOT" = 1 ]; then
            peers_cg_run "$lim" "$o" -- "${cmd[@]}" || rc=$?
            [ "$PEERS_CG_PEAK" -gt "$pk" ] && pk=$PEERS_CG_PEAK
            [ "${PEERS_CG_OOM:-0}" -gt 0 ] && rc=137
        else
            "${cmd[@]}" > "$o" 2> "$o.err" || rc=$?
        fi
        outs+=("$o")
        if [ "$rc" != 0 ]; then
            emit "| $name | $ptext | failed (exit $rc): $(grep -v '^\s*$' "$o.err" | tail -1 | tr '|' ' ' | cut -c1-120) | | | | | $l0-$(load1) |"
            return 0
        fi
    done
    [ "$lim" != 0 ] && [ "$ROOT" = 1 ] && peak=" (peak $((pk >> 20)) MiB)"
    l1=$(load1)
    python3 - "$name" "$ptext" "$l0" "$l1" "$peak" "${outs[@]}" <<'PY' | tee -a "$table"
import json, re, statistics, sys
runs = [[json.loads(l) for l in open(f) if l.startswith("{")][-1] for f in sys.argv[6:]]
med = lambda v: statistics.median(v) if v else 0.0
o = runs[-1].get("offload", {})
pol = o.get("policy", sys.argv[2])
pr = med([d.get("offload", {}).get("predicted_tok_s", 0.0) for d in runs])
me_v = [d.get("decode_tok_s", 0.0) for d in runs]
me = med(me_v)
prr = med([d.get("predicted_run_tok_s", 0.0) for d in runs])
sh = med([d.get("cpu_share_run", 0.0) for d in runs])
ratio = "%.2f" % (pr / me) if pr > 0 and me > 0 else "-"
rr = "%.2f" % (prr / me) if prr > 0 and me > 0 else "-"
rng = " (%.2f-%.2f)" % (min(me_v), max(me_v)) if len(me_v) > 1 else ""
print("| %s | `%s` | %.2f | %.2f%s | %s | %.2f (%.2f) | **%s** | %s-%s%s |" % (sys.argv[1],
      re.sub(r" (a=\S+|gbs=\d+|ngb=\d+)", "", pol), pr, me, rng, ratio, prr, sh, rr, sys.argv[3],
      sys.argv[4], sys.argv[5]))
PY
}

header() {
    emit ""
    local m="measured tok/s"
    [ "$RUNS" -gt 1 ] && m="measured tok/s (median of $RUNS runs; range)"
    emit "| row | policy | predicted when planned | $m | ratio | predicted at the run's CPU share (share) | ratio | 1-min load (before-after) |"
    emit "|---|---|---|---|---|---|---|---|"
}

emit "## Planner predictions against measured runs ($(date -u +%F), flextier $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?'))"
emit ""
emit "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; $THREADS threads unless said; decode of $GEN tokens per sequence."

# ------------------------------------------------------------- offload
if [[ " $SECTIONS " == *" offload "* ]]; then
    M=$work/m1024
    [ -f "$M/model.safetensors" ] || "$FT" gen-model --arch llama --out "$M" --hidden 1024 --layers 8 --heads 16 \
        --kv-heads 8 --ffn 2816 --vocab 4096 --dtype bf16 > /dev/null 2>&1
    DEV=512M
    common=(bench run --model "$M" --batch 8 --prompt-len 32 --gen-len "$GEN" --threads 1 --json --predict
            --device-mem "$DEV")
    emit ""
    emit "### The README's offloading table (random Llama h1024, 8 layers, bf16; batch 8, prompt 32, 1 compute thread, \`bench run --policy P --predict\`)"
    header
    # the first row calibrates afresh (under this section's load); the others reuse it
    row "(a) in memory" "w=100" 0 -- "$FT" "${common[@]}" --policy w=100,0,0,0 --recalibrate
    row "(b) weights on the disk tier" "w=0,0,100" 0 -- "$FT" "${common[@]}" --policy w=0,0,100,0 --disk-dir "$work/disk/off"
    start_node 4G
    row "(c) memory node, loopback" "w=0,0,0,100" 0 -- "$FT" "${common[@]}" --policy w=0,0,0,100 --remote "$NODE"
    row "(c) + byte-plane weights" "cw=bp" 0 -- "$FT" "${common[@]}" --policy w=0,0,0,100 --remote "$NODE" --compress-weights bp
    row "(c) + q4 weights" "cw=q4" 0 -- "$FT" "${common[@]}" --policy w=0,0,0,100 --remote "$NODE" --compress-weights q4
    row "(c) + KV cache on the node, prompt 256" "c=0,0,0,100" 0 -- "$FT" bench run --model "$M" --batch 8 \
        --prompt-len 256 --gen-len "$GEN" --threads 1 --json --predict --device-mem "$DEV" --policy "w=100,0 c=0,0,0,100" --remote "$NODE"
    if [ "$ROOT" = 1 ] && . "$root/scripts/lab-lib.sh" && lab_up 2> /dev/null; then
        lab_rate 1gbit
        lab_token "$work/token"
        export FLEXTIER_TOKEN_FILE=$work/token
        lab_srv "$FT" serve --listen "$LAB_IP_S:13400" --capacity 2G --token-file "$work/token" > "$work/logs/lab.log" 2>&1 &
        labsrv=$!
        for _ in $(seq 100); do grep -q "listening on" "$work/logs/lab.log" && break; sleep 0.1; done
        R="ucx://$LAB_IP_S:13400"
        for cw in none q4 bp; do
            case $cw in none) n="(d) memory node, 1 Gbit/s lab link" ;; q4) n="(e) (d) + q4 weights" ;; bp) n="(f) (d) + byte-plane weights" ;; esac
            row "$n" "cw=$cw" 0 -- lab_cli "$FT" "${common[@]}" --policy w=0,0,0,100 --remote "$R" --compress-weights $cw
        done
        for cc in none q4; do
            row "(g) KV cache on the lab node, cc=$cc, prompt 256" "c=0,0,0,100 cc=$cc" 0 -- lab_cli "$FT" bench run \
                --model "$M" --batch 8 --prompt-len 256 --gen-len "$GEN" --threads 1 --json --predict --device-mem "$DEV" \
                --policy "w=100,0 c=0,0,0,100" --compress-cache $cc --remote "$R"
        done
        # the lab node's token only: the loopback node of the next section has none
        unset FLEXTIER_TOKEN_FILE
    else
        emit "| (d)-(g) lab link | needs root and network namespaces | | | | | | |"
    fi
fi

# ------------------------------------------------------------ memlimit
model_dir() {   # NAME -> MODEL, LIMITS
    case "$1" in
    small) MODEL=$work/small; LIMITS="160M"
        [ -f "$MODEL/model.safetensors" ] || "$FT" gen-model --arch llama --out "$MODEL" --hidden 1024 --layers 8 \
            --heads 16 --kv-heads 4 --ffn 2816 --vocab 32000 --dtype bf16 > /dev/null 2>&1 ;;
    h2048l8) MODEL=$PEERS_CACHE/models/llama-h2048-l8-v32000-bf16; LIMITS="448M"
        peers_gen_model "$FT" "$MODEL" --arch llama --hidden 2048 --layers 8 --heads 32 --kv-heads 8 --ffn 5632 \
            --vocab 32000 --dtype bf16 ;;
    llama1b) MODEL=$PEERS_CACHE/models/llama-h2048-l22-v32000-bf16; LIMITS="1536M 768M"
        peers_gen_model "$FT" "$MODEL" --arch llama --hidden 2048 --layers 22 --heads 32 --kv-heads 8 --ffn 5632 \
            --vocab 32000 --dtype bf16 ;;
    esac
    if [ -n "$LIMITS_OPT" ]; then LIMITS=$LIMITS_OPT; fi
}
if [[ " $SECTIONS " == *" memlimit "* ]]; then
    [[ " $ROWS " == *" node"* ]] && start_node 4G
    emit ""
    emit "### Memory-limited rows (\`bench run --policy auto --memory LIMIT\`$([ "$ROOT" = 1 ] && echo ' in a memory cgroup of LIMIT, page cache dropped before each run'); prompt 1, $THREADS threads)"
    header
    for mn in $MODELS; do
        model_dir "$mn"
        for L in $LIMITS; do
            lim=$(python3 -c "import sys; s=sys.argv[1]; print(int(float(s[:-1]) * {'M': 1 << 20, 'G': 1 << 30}[s[-1]]))" "$L")
            first=1
            for r in $ROWS; do
                for b in $BATCHES; do
                    args=(bench run --model "$MODEL" --batch "$b" --prompt-len 1 --gen-len $((GEN + 1)) --threads "$THREADS"
                          --json --policy auto --memory "$lim")
                    case "$r" in
                    disk) args+=(--disk-dir "$work/disk/$mn-bp") ;;
                    disk-q4) args+=(--disk-dir "$work/disk/$mn-q4" --compress-weights q4) ;;
                    node) args+=(--remote "$NODE") ;;
                    node-q4) args+=(--remote "$NODE" --compress-weights q4) ;;
                    esac
                    # fresh calibration for the first row of each model and limit
                    [ "$first" = 1 ] && args+=(--recalibrate) && first=0
                    row "$(basename "$MODEL") $L $r b=$b" "auto" "$lim" -- "$FT" "${args[@]}"
                done
            done
        done
    done
fi

# ----------------------------------------------------------- stability
if [[ " $SECTIONS " == *" stability "* ]]; then
    emit ""
    emit "### Three plans in a row (\`flextier plan --json\`; decode tok/s predicted)"
    emit ""
    emit "Each plan: decode tok/s predicted at the load of the moment / on an idle machine (the CPU share a thread got)."
    emit ""
    emit "| model | plan arguments | cached: 3 plans | spread (now) | spread (idle) | --recalibrate: 3 plans | spread (now) | spread (idle) | load |"
    emit "|---|---|---|---|---|---|---|---|---|"
    cat > "$work/pj.py" <<'PY'
import json, sys
try:
    d = json.load(sys.stdin)
    print("%.2f/%.2f (%.2f)" % (d["decode_tps"], d.get("decode_tps_idle", 0), d.get("cpu_share", 0)))
except Exception:
    print("ERR")
PY
    cat > "$work/spread.py" <<'PY'
import sys
k = int(sys.argv[1])
v = [float(x.split(" ")[0].split("/")[k]) for x in sys.argv[2:] if x != "ERR"]
print("%.0f%%" % (100 * (max(v) - min(v)) / min(v)) if v and min(v) > 0 else "-")
PY
    plans=()
    [[ " $SECTIONS " == *" offload "* ]] || [ -f "$work/m1024/model.safetensors" ] || \
        "$FT" gen-model --arch llama --out "$work/m1024" --hidden 1024 --layers 8 --heads 16 --kv-heads 8 --ffn 2816 \
            --vocab 4096 --dtype bf16 > /dev/null 2>&1
    plans+=("$work/m1024|--device-mem 512M --threads 1 --batch 8 --prompt-len 32 --gen-len $GEN --policy w=0,0,100,0 --disk-dir $work/disk/st")
    for mn in $MODELS; do
        model_dir "$mn"
        for L in $LIMITS; do
            plans+=("$MODEL|--memory $L --threads $THREADS --batch 1 --prompt-len 1 --gen-len $((GEN + 1)) --disk-dir $work/disk/st-$mn")
        done
    done
    for p in "${plans[@]}"; do
        m=${p%%|*}; a=${p#*|}
        l0=$(load1)
        vals=(); rvals=()
        # shellcheck disable=SC2086
        for k in 1 2 3; do vals+=("$("$FT" plan --model "$m" $a --json 2>/dev/null | python3 "$work/pj.py")"); done
        # shellcheck disable=SC2086
        for k in 1 2 3; do rvals+=("$("$FT" plan --model "$m" $a --json --recalibrate 2>/dev/null | python3 "$work/pj.py")"); done
        emit "| $(basename "$m") | \`${a//$work/WORK}\` | ${vals[0]}, ${vals[1]}, ${vals[2]} | $(python3 "$work/spread.py" 0 "${vals[@]}") | $(python3 "$work/spread.py" 1 "${vals[@]}") | ${rvals[0]}, ${rvals[1]}, ${rvals[2]} | $(python3 "$work/spread.py" 0 "${rvals[@]}") | $(python3 "$work/spread.py" 1 "${rvals[@]}") | $l0-$(load1) |"
    done
fi
emit ""
emit "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg). Logs: $work/logs."
exit 0
