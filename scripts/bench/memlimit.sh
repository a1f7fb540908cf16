#!/usr/bin/env bash
# memlimit.sh - the model-larger-than-memory table (issue 20): FlexTier
# with --memory equal to a cgroup's hard memory limit (page cache
# included) against the peers a user would pick, side by side in one run,
# the page cache dropped before each run. Root only. See docs/bench-peers.md.
#
# For each memory limit (default: 1.5 GiB and 768 MiB for the 1.12B Llama
# of the peer benchmark, 2.1 GiB of bf16) and decode batch (1 and 16):
#   ft-disk       FlexTier --policy auto --memory LIMIT, weights on local disk
#                 (--disk-dir), lossless (auto keeps the numerics)
#   ft-disk-q4    the same with --compress-weights q4 (q4 frames)
#   ft-node       FlexTier --policy auto --memory LIMIT, a memory node
#                 (`flextier serve` on loopback, outside the cgroup), lossless
#   ft-node-q4    the same with --compress-weights q4
#   llama-bf16    llama.cpp, the bf16 GGUF, mmap (its default)
#   llama-q4_0    llama.cpp, the q4_0 GGUF, mmap
#   hf-bf16       Hugging Face accelerate's disk offload (device_map="auto",
#                 max_memory={"cpu": LIMIT/3}, offload_folder), bf16
# Columns: decode tok/s, the cgroup's peak (memory.max_usage_in_bytes or
# memory.peak), OOM kills, and bytes read per generated token: FlexTier's
# tier reads (disk + memory node, its --json), the peers' block-device reads
# (/usr/bin/time %I: getrusage's ru_inblock x 512), over the whole run.
#
#   scripts/bench/memlimit.sh [options]
#     --flextier PATH    (build/flextier)    --layers N (22: the 1.12B model)
#     --limits "1.5G 768M"                   --batches "1 16"
#     --rows "ft-disk ft-disk-q4 ft-node ft-node-q4 llama-bf16 llama-q4_0 hf-bf16"
#     --threads N (2)    --gen N (16 generated tokens per sequence)
#     --runs N (1; interleaved, medians)     --out DIR (keep logs, results.tsv, table.md)
#     --model-args "ARGS" gen-model arguments instead of the Llama (e.g. a mixture
#                        of experts: "--arch mixtral ... --experts 32 --experts-per-tok 4")
#     --ft-args "ARGS"   extra FlexTier options (e.g. --expert-cache 64M --expert-evict lfu)
# SIZE: bytes or 512M / 1.5G (binary units). A run killed by the cgroup's
# OOM killer is reported as OOM, a refusal or failure as ERR with its reason.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
PEERS_PROG=memlimit.sh
. "$here/peers-lib.sh"

FT=$root/build/flextier
LAYERS=22; THREADS=2; GEN=16; RUNS=1; OUT=""
LIMITS="1.5G 768M"; BATCHES="1 16"
ROWS="ft-disk ft-disk-q4 ft-node ft-node-q4 llama-bf16 llama-q4_0 hf-bf16"
PEERS_TIMEOUT=${PEERS_TIMEOUT:-1800}
MODEL_ARGS=""; FT_ARGS=""
usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --flextier) FT=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --limits) LIMITS=$2; shift 2 ;;
    --batches) BATCHES=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --model-args) MODEL_ARGS=$2; shift 2 ;;
    --ft-args) FT_ARGS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "memlimit.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$LAYERS" "$THREADS" "$GEN" "$RUNS" $BATCHES; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "memlimit.sh: '$v' is not a positive integer" >&2; exit 2; }
done
[ "$GEN" -ge 2 ] || { echo "memlimit.sh: --gen must be at least 2" >&2; exit 2; }
for r in $ROWS; do
    case "$r" in ft-disk|ft-disk-q4|ft-node|ft-node-q4|llama-bf16|llama-q4_0|hf-bf16) ;;
    *) echo "memlimit.sh: unknown row $r" >&2; exit 2 ;; esac
done
# SIZE -> bytes (binary units, as flextier's --memory)
bytes() {
    python3 - "$1" <<'PY' || { echo "memlimit.sh: bad size '$1'" >&2; exit 2; }
import re, sys
m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kKmMgGtT]?)i?[bB]?", sys.argv[1])
if not m:
    sys.exit(1)
print(int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper())))
PY
}
mib() { echo "$(( $1 >> 20 ))M"; }

[ -x "$FT" ] || peers_die "no flextier binary at $FT (build it: make build, or pass --flextier)"
FT=$(readlink -f "$FT")
peers_need timeout "apt-get install coreutils" flock "apt-get install util-linux"
[ -x /usr/bin/time ] || peers_die "/usr/bin/time not found (apt-get install time)"
peers_cg_init

if [ -n "$OUT" ]; then
    mkdir -p "$OUT"; work=$(readlink -f "$OUT")
else
    work=$(mktemp -d /var/tmp/ft-memlimit.XXXXXX)
fi
srv=""
cleanup() {
    [ -n "$srv" ] && kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
    peers_cg_cleanup
    if [ -z "$OUT" ]; then rm -rf "$work"; fi
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# the disk tier on local disk, never a tmpfs (/tmp may be one: memory)
mkdir -p "$work/logs" "$work/disk"
results=$work/results.tsv meta=$work/meta.tsv
printf 'limit\tbatch\trow\trun\ttok_s\tpeak_bytes\toom\tread_bytes_per_token\n' > "$results"
: > "$meta"

need_llama=0; need_hf=0; need_node=0
for r in $ROWS; do
    case "$r" in llama-*) need_llama=1 ;; hf-*) need_hf=1 ;; ft-node*) need_node=1 ;; esac
done
if [ "$need_llama" = 1 ]; then peers_build_llamacpp; fi
if [ "$need_hf" = 1 ] || [ "$need_llama" = 1 ]; then peers_venv; fi

model_args=(--arch llama --hidden 2048 --layers "$LAYERS" --heads 32 --kv-heads 8 --ffn 5632 --vocab 32000 --dtype bf16)
model=$PEERS_CACHE/models/llama-h2048-l$LAYERS-v32000-bf16
if [ -n "$MODEL_ARGS" ]; then
    read -r -a model_args <<< "$MODEL_ARGS"
    model=$PEERS_CACHE/models/gen-$(echo "$MODEL_ARGS" | md5sum | cut -c1-12)
fi
peers_gen_model "$FT" "$model" "${model_args[@]}"
# the model directory copied too (FlexTier and accelerate read it)
pm="$work/private/model"
if [ ! -f "$pm/model.safetensors" ] || [ "$(stat -c %s "$pm/model.safetensors")" != "$(stat -c %s "$model/model.safetensors")" ]; then
    rm -rf "$pm" "$pm.tmp"; mkdir -p "$pm.tmp"
    cp "$model"/*.json "$model/model.safetensors" "$pm.tmp/" && mv "$pm.tmp" "$pm"
fi
gmodel=$model
model=$pm
s_bf16=$(stat -c %s "$model/model.safetensors")
gg_bf16=""; gg_q4=""
# private copies (another inode) of the GGUFs: the cache's files may be
# read by other benchmarks at the same time, and page cache charged to
# their cgroups is not charged (nor limited) in ours
private() {   # FILE -> a copy in $work/private (made once)
    local dst="$work/private/$(basename "$1")"
    mkdir -p "$work/private"
    if [ ! -f "$dst" ] || [ "$(stat -c %s "$dst")" != "$(stat -c %s "$1")" ]; then cp "$1" "$dst.tmp" && mv "$dst.tmp" "$dst"; fi
    echo "$dst"
}
if [ "$need_llama" = 1 ]; then
    gg_bf16=$(private "$(peers_gguf "$gmodel" bf16)"); gg_q4=$(private "$(peers_gguf "$gmodel" q4_0)")
fi

if [ "$need_node" = 1 ]; then
    # the memory node: another process (another machine's memory in a
    # deployment), outside the measured cgroup
    "$FT" serve --listen 127.0.0.1:0 --capacity "$(( s_bf16 * 3 / 2 / 1048576 + 256 ))M" > "$work/logs/serve.log" 2>&1 &
    srv=$!
    for _ in $(seq 100); do grep -q "listening on" "$work/logs/serve.log" && break; sleep 0.1; done
    node="ucx://$(sed -n 's/.*listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/logs/serve.log" | head -1)"
    [ "$node" != "ucx://" ] || peers_die "the memory node did not start: $(cat "$work/logs/serve.log")"
fi

# the command of a row -> CMD array
row_cmd() {   # ROW LIMIT_BYTES BATCH
    local r=$1 lim=$2 b=$3
    local ft=("$FT" bench run --model "$model" --batch "$b" --prompt-len 1 --gen-len $((GEN + 1)) --threads "$THREADS"
              --json --policy auto --memory "$lim")
    if [ -n "$FT_ARGS" ]; then local extra; read -r -a extra <<< "$FT_ARGS"; ft+=("${extra[@]}"); fi
    case "$r" in
    ft-disk) CMD=("${ft[@]}" --disk-dir "$work/disk/bp") ;;
    ft-disk-q4) CMD=("${ft[@]}" --disk-dir "$work/disk/q4" --compress-weights q4) ;;
    ft-node) CMD=("${ft[@]}" --remote "$node") ;;
    ft-node-q4) CMD=("${ft[@]}" --remote "$node" --compress-weights q4) ;;
    llama-bf16|llama-q4_0)
        local g; g=$([ "$r" = llama-bf16 ] && echo "$gg_bf16" || echo "$gg_q4")
        if [ "$b" = 1 ]; then
            CMD=("$(peers_llama_bin llama-bench)" -m "$g" -p 0 -n "$GEN" -t "$THREADS" -r 1 -o json)
        else
            CMD=("$(peers_llama_bin llama-batched-bench)" -m "$g" -c $(( b * (GEN + 2) + 64 )) -npp 1 -ntg "$GEN"
                 -npl "$b" -t "$THREADS" --output-format jsonl)
        fi ;;
    hf-bf16)
        CMD=("$PEERS_PY" "$here/hf_offload.py" --model "$model" --max-cpu-mem "$(( lim / 3 >> 20 ))MiB"
             --offload-folder "$work/hf-offload" --threads "$THREADS" --batch "$b" --prompt-len 1
             --gen-len $((GEN + 1))) ;;
    esac
}

# FlexTier's tiers filled once per row and limit, outside the cgroup (a
# measured run reuses the content-addressed frames, as a second start does;
# the plan is the same: the calibration is cached)
for L in $LIMITS; do
    lim=$(bytes "$L")
    for r in $ROWS; do
        case "$r" in ft-*) ;; *) continue ;; esac
        row_cmd "$r" "$lim" 1
        peers_log "$r under $(mib "$lim"): filling FlexTier's tiers (unmeasured)"
        "${CMD[@]}" > "$work/logs/fill-$r-$L.out" 2> "$work/logs/fill-$r-$L.err" \
            || peers_log "warning: filling failed: $(tail -1 "$work/logs/fill-$r-$L.err")"
    done
done

run_one() {   # LIMIT_BYTES BATCH ROW RUN
    local lim=$1 b=$2 r=$3 run=$4 rc=0 tps bpt
    local log="$work/logs/$r-$(mib "$lim")-b$b-r$run"
    rm -rf "$work/hf-offload"
    row_cmd "$r" "$lim" "$b"
    echo "${CMD[*]}" > "$log.cmd"
    peers_cg_run "$lim" "$log.out" -- /usr/bin/time -f "%M %I" -o "$log.time" timeout "$PEERS_TIMEOUT" "${CMD[@]}" || rc=$?
    local inblk; inblk=$(awk 'END {print $2}' "$log.time" 2>/dev/null || echo "")
    if [ "$PEERS_CG_OOM" -gt 0 ] || [ "$rc" = 137 ]; then
        tps=OOM; bpt=-
    elif [ "$rc" != 0 ]; then
        tps=ERR; bpt=-
        local why; why=$(grep -v '^\s*$' "$log.out.err" | grep -v '^Command exited' | tail -1 | tr '\t|' '  ' | cut -c1-200)
        printf 'err_%s_%s_%s\t%s\n' "$(mib "$lim")" "$b" "$r" "exit $rc: $why" >> "$meta"
        peers_log "$r $(mib "$lim") batch $b FAILED (exit $rc): $why"
    else
        case "$r" in
        ft-*)
            tps=$(python3 "$here/peers_report.py" ft-json "$log.out" decode_tok_s)
            bpt=$(python3 - "$log.out" "$b" "$GEN" <<'PY'
import json, sys
d = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
w = d.get("offload", {}).get("weights", {}).get("read_wire_bytes", {})
print(int((w.get("disk", 0) + w.get("remote", 0)) / (int(sys.argv[2]) * int(sys.argv[3]))))
PY
) ;;
        llama-*)
            if [ "$b" = 1 ]; then tps=$(python3 "$here/peers_report.py" llama-bench "$log.out")
            else tps=$(python3 "$here/peers_report.py" batched "$log.out" "$b"); fi
            bpt=$(( ${inblk:-0} * 512 / (b * GEN) )) ;;
        hf-*)
            tps=$(python3 "$here/peers_report.py" ft-json "$log.out" decode_tok_s)
            bpt=$(( ${inblk:-0} * 512 / (b * GEN) )) ;;
        esac
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$lim" "$b" "$r" "$run" "$tps" "$PEERS_CG_PEAK" "$PEERS_CG_OOM" "$bpt" >> "$results"
    peers_log "run $run: $r under $(mib "$lim"), batch $b: $tps tok/s, cgroup peak $((PEERS_CG_PEAK >> 20)) MiB, $bpt B read/token (load $(cut -d' ' -f1 /proc/loadavg))"
}

for run in $(seq "$RUNS"); do
    for L in $LIMITS; do
        lim=$(bytes "$L")
        for b in $BATCHES; do
            order=$ROWS
            if [ $((run % 2)) -eq 0 ]; then order=$(echo "$ROWS" | tr ' ' '\n' | tac | tr '\n' ' '); fi
            for r in $order; do run_one "$lim" "$b" "$r" "$run"; done
        done
    done
done

{
    echo "## Model larger than memory $(date -u +%Y-%m-%d)"
    echo
    echo "Model: flextier gen-model ${model_args[*]}: bf16 checkpoint $(mib "$s_bf16")iB. cgroup v$PEERS_CG_VER, hard limit = FlexTier's --memory."
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, $THREADS threads; load average at the end $(cut -d' ' -f1-3 /proc/loadavg); flextier $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?')."
    echo
    python3 "$here/peers_report.py" limittable "$results" "$meta"
    echo
    echo "Decode tok/s over $GEN generated tokens per sequence (prompt 1 token); page cache dropped before each run."
    echo "Bytes read per generated token: FlexTier's disk and memory-node reads (--json); the peers' block-device reads (ru_inblock), whole run."
} | tee "$work/table.md"
if [ -n "$OUT" ]; then peers_log "results in $work (table.md, results.tsv, logs/)"; fi
exit 0
