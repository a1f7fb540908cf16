#!/usr/bin/env bash
# memlimit.sh - FlexTier against the peers a user would pick when the model
# does not fit in memory: each run in its own cgroup with a hard memory
# limit (page cache included), the page cache dropped before each run.
# Root only. See docs/bench-peers.md.
#
#   fit       the q4 model fits the limit: llama.cpp q4_0 (its defaults) vs FlexTier q4
#             (--weights-dtype q4; without that option, q4 frames on the host
#             tier, --policy w=0,100 --compress-weights q4)
#   stream    the limit is below the q4 model's size: llama.cpp q4_0 (-lm mmap
#             --repack 0: the kernel pages weights in and out) vs FlexTier streaming q4 weights
#             from disk (--policy w=0,0,100 --compress-weights q4 --disk-dir)
#   lossless  Hugging Face accelerate's bf16 disk offload (device_map="auto",
#             max_memory={"cpu": ...}, offload_folder) vs FlexTier's lossless
#             offload (bf16 byte-plane frames from disk: --compress-weights bp)
#
#   scripts/bench/memlimit.sh [options]
#     --flextier PATH   (build/flextier)      --layers N (22: the 1.12B model)
#     --scenarios "fit stream lossless"        --threads N (2)
#     --gen N (32 decode steps, batch 1)       --runs N (3, interleaved, medians)
#     --limit-fit SIZE       (default 0.7 x the bf16 checkpoint: 1.5 GB at 1.12B)
#     --limit-stream SIZE    (default 0.6 x the q4_0 GGUF: below the q4 model)
#     --limit-lossless SIZE  (default = --limit-fit)
#     --devmem-fit/--devmem-stream/--devmem-lossless SIZE
#                        FlexTier's --device-mem (default half the limit)
#     --hf-cpu-mem SIZE  accelerate's max_memory["cpu"] (default a third of the limit)
#     --model-args "ARGS" gen-model arguments instead of the Llama (e.g. a mixture
#                        of experts: "--arch mixtral ... --experts 32 --experts-per-tok 4")
#     --ft-args "ARGS"   extra FlexTier options (e.g. --expert-cache 64M --expert-evict lfu)
#     --out DIR          keep logs, results.tsv, meta.tsv, table.md
# SIZE: bytes or 512M / 1.5G (binary units). A run killed by the cgroup's OOM
# killer is reported as OOM, not dropped. Environment as llamacpp.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
PEERS_PROG=memlimit.sh
. "$here/peers-lib.sh"

FT=$root/build/flextier
LAYERS=22; SCENARIOS="fit stream lossless"; THREADS=2; GEN=32; RUNS=3; OUT=""
L_FIT=""; L_STREAM=""; L_LOSSLESS=""; D_FIT=""; D_STREAM=""; D_LOSSLESS=""; HF_CPU=""; MODEL_ARGS=""; FT_ARGS=""
PEERS_TIMEOUT=${PEERS_TIMEOUT:-3600}
usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --flextier) FT=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --limit-fit) L_FIT=$2; shift 2 ;;
    --limit-stream) L_STREAM=$2; shift 2 ;;
    --limit-lossless) L_LOSSLESS=$2; shift 2 ;;
    --devmem-fit) D_FIT=$2; shift 2 ;;
    --devmem-stream) D_STREAM=$2; shift 2 ;;
    --devmem-lossless) D_LOSSLESS=$2; shift 2 ;;
    --hf-cpu-mem) HF_CPU=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --model-args) MODEL_ARGS=$2; shift 2 ;;
    --ft-args) FT_ARGS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "memlimit.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$LAYERS" "$THREADS" "$GEN" "$RUNS"; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "memlimit.sh: '$v' is not a positive integer" >&2; exit 2; }
done
for s in $SCENARIOS; do
    case "$s" in fit|stream|lossless) ;; *) echo "memlimit.sh: unknown scenario $s" >&2; exit 2 ;; esac
done
# SIZE -> bytes (binary units, as flextier's --device-mem)
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
peers_cg_init

if [ -n "$OUT" ]; then
    mkdir -p "$OUT"; work=$(readlink -f "$OUT")
else
    work=$(mktemp -d /tmp/ft-memlimit.XXXXXX)
fi
cleanup() {
    peers_cg_cleanup
    if [ -z "$OUT" ]; then rm -rf "$work"; fi
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$work/logs" "$work/disk"
results=$work/results.tsv meta=$work/meta.tsv
printf 'tool\tfmt\tthreads\ttest\tbatch\trun\ttok_s\tpeak_rss_bytes\n' > "$results"
: > "$meta"

peers_build_llamacpp
peers_venv
LB=$(peers_llama_bin llama-bench)

model_args=(--arch llama --hidden 2048 --layers "$LAYERS" --heads 32 --kv-heads 8 --ffn 5632 --vocab 32000 --dtype bf16)
model=$PEERS_CACHE/models/llama-h2048-l$LAYERS-v32000-bf16
if [ -n "$MODEL_ARGS" ]; then
    read -r -a model_args <<< "$MODEL_ARGS"
    model=$PEERS_CACHE/models/gen-$(echo "$MODEL_ARGS" | md5sum | cut -c1-12)
fi
peers_gen_model "$FT" "$model" "${model_args[@]}"
q4=$(peers_gguf "$model" q4_0)
s_bf16=$(stat -c %s "$model/model.safetensors")
s_q4=$(stat -c %s "$q4")

L_FIT=$(bytes "${L_FIT:-$((s_bf16 * 7 / 10))}")
L_STREAM=$(bytes "${L_STREAM:-$((s_q4 * 6 / 10))}")
L_LOSSLESS=$(bytes "${L_LOSSLESS:-$L_FIT}")
D_FIT=$(bytes "${D_FIT:-$((L_FIT / 2))}")
D_STREAM=$(bytes "${D_STREAM:-$((L_STREAM / 2))}")
D_LOSSLESS=$(bytes "${D_LOSSLESS:-$((L_LOSSLESS / 2))}")
HF_CPU=$(bytes "${HF_CPU:-$((L_LOSSLESS / 3))}")
[ "$L_STREAM" -lt "$s_q4" ] || peers_log "warning: --limit-stream $(mib "$L_STREAM") is not below the q4_0 model ($(mib "$s_q4"))"

FT_WD=0
if peers_ft_has_wdtype "$FT"; then FT_WD=1; fi
[ "$FT_WD" = 1 ] || peers_log "NOTE: this flextier has no --weights-dtype: it computes in f32 (weights decoded to f32 per layer)"

# the flextier command of each scenario
ft_cmd() {   # SCENARIO -> FTC array
    local common=(bench run --model "$model" --batch 1 --prompt-len 1 --gen-len $((GEN + 1)) --threads "$THREADS" --json)
    case "$1" in
    fit)
        if [ "$FT_WD" = 1 ]; then FTC=("$FT" "${common[@]}" --weights-dtype q4)
        else FTC=("$FT" "${common[@]}" --policy w=0,100 --compress-weights q4 --device-mem "$D_FIT"); fi ;;
    stream)
        FTC=("$FT" "${common[@]}" --policy w=0,0,100 --compress-weights q4 --disk-dir "$work/disk/q4" --device-mem "$D_STREAM")
        if [ "$FT_WD" = 1 ]; then FTC+=(--weights-dtype q4); fi ;;
    lossless)
        FTC=("$FT" "${common[@]}" --policy w=0,0,100 --compress-weights bp --disk-dir "$work/disk/bp" --device-mem "$D_LOSSLESS")
        if [ "$FT_WD" = 1 ]; then FTC+=(--weights-dtype bf16); fi ;;
    esac
    if [ -n "$FT_ARGS" ]; then read -r -a fta <<< "$FT_ARGS"; FTC+=("${fta[@]}"); fi
}
limit_of() { case "$1" in fit) echo "$L_FIT" ;; stream) echo "$L_STREAM" ;; lossless) echo "$L_LOSSLESS" ;; esac; }

for s in $SCENARIOS; do
    printf 'limit_%s\t%s MiB\n' "$s" "$(( $(limit_of "$s") >> 20 ))" >> "$meta"
    ft_cmd "$s"
    case "$s" in
    fit) d="q4, $([ "$FT_WD" = 1 ] && echo 'computed as stored' || echo "host tier, --device-mem $(mib "$D_FIT")")" ;;
    stream) d="q4 from disk, --device-mem $(mib "$D_STREAM")" ;;
    lossless) d="bf16 byte-plane from disk, --device-mem $(mib "$D_LOSSLESS")" ;;
    esac
    printf 'desc_%s_flextier\t%s\n' "$s" "$d" >> "$meta"
    case "$s" in
    fit) printf 'desc_%s_llamacpp\tq4_0 GGUF (%s), default loading (mmap, q4_0 repacked)\n' "$s" "$(mib "$s_q4")" >> "$meta" ;;
    stream) printf 'desc_%s_llamacpp\tq4_0 GGUF (%s), -lm mmap --repack 0\n' "$s" "$(mib "$s_q4")" >> "$meta" ;;
    lossless) printf 'desc_%s_hf\tbf16, max_memory cpu %s, rest on disk\n' "$s" "$(mib "$HF_CPU")" >> "$meta" ;;
    esac
    # fill FlexTier's disk tier once, outside the limit (a measured run then
    # reuses the content-addressed frames, as a second start does)
    if [ "$s" != fit ]; then
        peers_log "$s: filling FlexTier's disk tier (unmeasured)"
        # (a failure here shows again, in the table, in the measured runs)
        "${FTC[@]}" > "$work/logs/$s-fill.out" 2> "$work/logs/$s-fill.err" \
            || peers_log "warning: flextier failed filling the disk tier: $(tail -1 "$work/logs/$s-fill.err")"
    fi
done
printf 'note\t%s\n' "Decode batch 1, $GEN tokens, $THREADS threads; peak memory = the cgroup's peak usage (RSS + page cache). $([ "$FT_WD" = 1 ] && echo 'FlexTier ran with --weights-dtype.' || echo 'This flextier has no --weights-dtype: it decodes weights to f32 per layer.')" >> "$meta"

# run_one SCENARIO TOOL RUN
run_one() {
    local s=$1 tool=$2 run=$3 cmd=() key=decode_tok_s fmt
    local log="$work/logs/$s-$tool-r$run.out" limit; limit=$(limit_of "$s")
    case "$tool" in
    llamacpp) cmd=("$LB" -m "$q4" -p 0 -n "$GEN" -t "$THREADS" -r 1 -o json); fmt=q4_0
        # below the model's size only file-backed pages can be dropped and
        # re-read: mmap, and no repacking of q4_0 into anonymous memory
        if [ "$s" = stream ]; then cmd+=(-lm mmap --repack 0); fi ;;
    flextier) ft_cmd "$s"; cmd=("${FTC[@]}"); fmt=$([ "$s" = lossless ] && echo bf16 || echo q4) ;;
    hf) rm -rf "$work/hf-offload"
        cmd=("$PEERS_PY" "$here/hf_offload.py" --model "$model" --max-cpu-mem "$(mib "$HF_CPU")iB"
             --offload-folder "$work/hf-offload" --threads "$THREADS" --prompt-len 1 --gen-len $((GEN + 1)))
        fmt=bf16 ;;
    esac
    echo "${cmd[*]}" > "$log.cmd"
    local rc=0 tps
    peers_cg_run "$limit" "$log" -- timeout "$PEERS_TIMEOUT" "${cmd[@]}" || rc=$?
    if [ "$PEERS_CG_OOM" -gt 0 ] || [ "$rc" = 137 ]; then
        tps=OOM
    elif [ "$rc" != 0 ]; then
        # an engine that refuses or fails under the limit is a result, shown
        # in the table with its own words; the run goes on
        tps=ERR
        local why; why=$(grep -v '^\s*$' "$log.err" | tail -1 | tr '\t|' '  ' | cut -c1-160)
        printf 'err_%s_%s\t%s\n' "$s" "$tool" "exit $rc: $why" >> "$meta"
        peers_log "run $run: $s $tool FAILED (exit $rc): $why (logs: $log.err)"
    elif [ "$tool" = llamacpp ]; then
        tps=$(python3 "$here/peers_report.py" llama-bench "$log")
    else
        tps=$(python3 "$here/peers_report.py" ft-json "$log" "$key")
    fi
    printf '%s\t%s\t%s\t%s\t1\t%s\t%s\t%s\n' "$tool" "$fmt" "$THREADS" "$s" "$run" "$tps" "$PEERS_CG_PEAK" >> "$results"
    peers_log "run $run: $s $tool: $tps tok/s, cgroup peak $((PEERS_CG_PEAK >> 20)) MiB (limit $(mib "$limit"))"
}

for run in $(seq "$RUNS"); do
    for s in $SCENARIOS; do
        peer=llamacpp
        if [ "$s" = lossless ]; then peer=hf; fi
        tools="$peer flextier"
        if [ $((run % 2)) -eq 0 ]; then tools="flextier $peer"; fi
        for tool in $tools; do run_one "$s" "$tool" "$run"; done
    done
done

{
    echo "## Memory-limited runs $(date -u +%Y-%m-%d)"
    echo
    echo "Model: flextier gen-model ${model_args[*]}: bf16 checkpoint $(mib "$s_bf16"), q4_0 GGUF $(mib "$s_q4"). cgroup v$PEERS_CG_VER."
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; $(peers_venv_versions); flextier $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?')."
    echo
    python3 "$here/peers_report.py" memtable "$results" "$meta"
} | tee "$work/table.md"
if [ -n "$OUT" ]; then peers_log "results in $work (table.md, results.tsv, logs/)"; fi
exit 0
