#!/usr/bin/env bash
# llamacpp.sh - FlexTier beside llama.cpp on the same generated Llama, same
# threads, same weight format, in one interleaved run; medians and ratios.
# See docs/bench-peers.md for what each column means.
#
#   scripts/bench/llamacpp.sh [options]
#     --flextier PATH     the flextier binary (default build/flextier)
#     --layers N          layers of the model (default 22: 1.12B parameters,
#                         hidden 2048, GQA 32/8, ffn 5632, vocab 32000, bf16)
#     --formats "f32 bf16 q8 q4"   FlexTier's names; llama.cpp's f32 bf16 q8_0 q4_0
#     --threads "1 2"     thread counts, each run by both tools
#     --tests "decode prefill batched"
#                         decode: batch 1, --gen tokens (llama-bench -p 0 -n G)
#                         prefill: one --prompt-token prompt (llama-bench -p P -n 0)
#                         batched: aggregate decode tok/s of B sequences, prompt 16,
#                         32 tokens each (llama-batched-bench -npp 16 -ntg 32 -npl B)
#     --batches "1 2 4 8 16 32"   for the batched test
#     --gen N (64)  --prompt N (512)  --runs N (3, interleaved, medians)
#     --model-args "ARGS" gen-model arguments instead of the Llama above, e.g. a
#                         mixture of experts: "--arch mixtral --hidden 1024 --layers 6
#                         --heads 16 --kv-heads 4 --ffn 512 --experts 32
#                         --experts-per-tok 4 --vocab 32000 --dtype bf16" (issue 23;
#                         llama.cpp's converter takes mixtral with this tokenizer)
#     --out DIR           keep logs, results.tsv, meta.tsv and table.md there
#                         (default: a temporary directory, removed at exit)
# Environment: PEERS_CACHE (~/.cache/flextier/peers: llama.cpp build, venv,
# models), LLAMA_CPP_PY_VERSION (0.3.36), PEERS_JOBS, PEERS_QUANT_ARGS
# (extra llama-quantize arguments, e.g. --pure), PEERS_LLAMA_ARGS (extra
# llama-bench / llama-batched-bench arguments, e.g. "--poll 0"), PEERS_TIMEOUT
# (s per command, default 3600). No root needed; memlimit.sh does the cgroup runs.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
PEERS_PROG=llamacpp.sh
. "$here/peers-lib.sh"

FT=$root/build/flextier
LAYERS=22; FORMATS="f32 bf16 q8 q4"; THREADS="1 2"; TESTS="decode prefill batched"
BATCHES="1 2 4 8 16 32"; GEN=64; PROMPT=512; RUNS=3; OUT=""; MODEL_ARGS=""
BPP=16; BTG=32
PEERS_TIMEOUT=${PEERS_TIMEOUT:-3600}
PEERS_LLAMA_ARGS=${PEERS_LLAMA_ARGS:-}
usage() { sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --flextier) FT=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --formats) FORMATS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --tests) TESTS=$2; shift 2 ;;
    --batches) BATCHES=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --model-args) MODEL_ARGS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "llamacpp.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$LAYERS" "$GEN" "$PROMPT" "$RUNS" $THREADS $BATCHES; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "llamacpp.sh: '$v' is not a positive integer" >&2; exit 2; }
done
for f in $FORMATS; do
    case "$f" in f32|bf16|q8|q4) ;; *) echo "llamacpp.sh: unknown format $f (f32 bf16 q8 q4)" >&2; exit 2 ;; esac
done
for t in $TESTS; do
    case "$t" in decode|prefill|batched) ;; *) echo "llamacpp.sh: unknown test $t" >&2; exit 2 ;; esac
done

[ -x "$FT" ] || peers_die "no flextier binary at $FT (build it: make build, or pass --flextier)"
FT=$(readlink -f "$FT")
peers_need /usr/bin/time "apt-get install time" timeout "apt-get install coreutils" flock "apt-get install util-linux"

if [ -n "$OUT" ]; then
    mkdir -p "$OUT"; work=$(readlink -f "$OUT")
else
    work=$(mktemp -d /tmp/ft-llamacpp.XXXXXX)
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/logs"
results=$work/results.tsv meta=$work/meta.tsv
printf 'tool\tfmt\tthreads\ttest\tbatch\trun\ttok_s\tpeak_rss_bytes\n' > "$results"
: > "$meta"

peers_build_llamacpp
peers_venv
LB=$(peers_llama_bin llama-bench)
LBB=$(peers_llama_bin llama-batched-bench)
SRC=$(peers_llama_dir)/src

model_args=(--arch llama --hidden 2048 --layers "$LAYERS" --heads 32 --kv-heads 8 --ffn 5632 --vocab 32000 --dtype bf16)
model=$PEERS_CACHE/models/llama-h2048-l$LAYERS-v32000-bf16
if [ -n "$MODEL_ARGS" ]; then
    read -r -a model_args <<< "$MODEL_ARGS"
    model=$PEERS_CACHE/models/gen-$(echo "$MODEL_ARGS" | md5sum | cut -c1-12)
fi
peers_gen_model "$FT" "$model" "${model_args[@]}"

declare -A gguf
for f in $FORMATS; do gguf[$f]=$(peers_gguf "$model" "${PEERS_LLAMA_FMT[$f]}"); done

# FlexTier computes on the stored format only with --weights-dtype (issue 12)
ft_formats="" FT_WD=0
if peers_ft_has_wdtype "$FT"; then
    FT_WD=1
    ft_formats=$FORMATS
    printf 'note\tFlexTier ran with --weights-dtype FORMAT.\n' >> "$meta"
else
    for f in $FORMATS; do
        if [ "$f" = f32 ]; then ft_formats=f32; else printf 'flextier_missing_%s\tn/a (no --weights-dtype)\n' "$f" >> "$meta"; fi
    done
    peers_log "NOTE: this flextier has no --weights-dtype: FlexTier runs f32 only (it converts weights to f32 at load)"
    printf 'note\tThis flextier has no --weights-dtype: FlexTier ran f32 only (weights converted to f32 at load); its other rows are empty.\n' >> "$meta"
fi

# the roofline's two terms: streaming-read bandwidth per thread count, and
# the bytes each engine reads per decoded token
# (measured before and after the runs; the roofline takes the higher: on a
# shared machine the bandwidth a run gets varies)
membw=$(peers_membw)
measure_bw() {   # start|end
    local t bw
    for t in $THREADS; do
        bw=$("$membw" "$t" 1024 5) || peers_die "membw failed"
        printf 'membw_%s_%s\t%s\n' "$1" "$t" "$bw" >> "$meta"
        peers_log "streaming read, $t thread(s), $1: $bw GB/s"
    done
}
measure_bw start
for f in $FORMATS; do
    read -r _ bpt < <(PYTHONPATH="$SRC/gguf-py" "$PEERS_PY" "$here/peers_report.py" gguf-bytes "${gguf[$f]}")
    printf 'bytes_per_token_llamacpp_%s\t%s\n' "$f" "$bpt" >> "$meta"
    read -r _ bpt < <(python3 "$here/peers_report.py" ft-bytes "$model" "$f")
    printf 'bytes_per_token_flextier_%s\t%s\n' "$f" "$bpt" >> "$meta"
done

# run_one TOOL FMT THREADS TEST BATCH RUN: one measurement, one row
run_one() {
    local tool=$1 fmt=$2 t=$3 test=$4 b=$5 run=$6
    local tag="$tool-$fmt-t$t-$test-b$b-r$run" cmd=() tps
    local log="$work/logs/$tag.out" tf="$work/logs/$tag.time"
    if [ "$tool" = llamacpp ]; then
        case "$test" in
        decode) cmd=("$LB" -m "${gguf[$fmt]}" -p 0 -n "$GEN" -t "$t" -r 1 -o json) ;;
        prefill) cmd=("$LB" -m "${gguf[$fmt]}" -p "$PROMPT" -n 0 -t "$t" -r 1 -o json) ;;
        batched) cmd=("$LBB" -m "${gguf[$fmt]}" -c $((b * (BPP + BTG))) -npp "$BPP" -ntg "$BTG" -npl "$b" \
                      -t "$t" --output-format jsonl) ;;
        esac
        # shellcheck disable=SC2206
        cmd+=($PEERS_LLAMA_ARGS)
    else
        local wd=()
        if [ "$FT_WD" = 1 ]; then wd=(--weights-dtype "$fmt"); fi
        case "$test" in
        decode) cmd=("$FT" bench run --model "$model" --batch 1 --prompt-len 1 --gen-len $((GEN + 1))) ;;
        prefill) cmd=("$FT" bench run --model "$model" --batch 1 --prompt-len "$PROMPT" --gen-len 1) ;;
        batched) cmd=("$FT" bench run --model "$model" --batch "$b" --prompt-len "$BPP" --gen-len $((BTG + 1))) ;;
        esac
        cmd+=(--threads "$t" --json "${wd[@]}")
    fi
    echo "${cmd[*]}" > "$log.cmd"
    if ! timeout "$PEERS_TIMEOUT" /usr/bin/time -f '%M' -o "$tf" "${cmd[@]}" > "$log" 2> "$log.err"; then
        tail -5 "$log.err" >&2
        peers_die "$tool $fmt $test (batch $b, $t threads) failed: ${cmd[*]} (logs: $log.err)"
    fi
    case "$tool/$test" in
    llamacpp/batched) tps=$(python3 "$here/peers_report.py" batched "$log" "$b") ;;
    llamacpp/*) tps=$(python3 "$here/peers_report.py" llama-bench "$log") ;;
    flextier/prefill) tps=$(python3 "$here/peers_report.py" ft-json "$log" prefill_tok_s) ;;
    flextier/*) tps=$(python3 "$here/peers_report.py" ft-json "$log" decode_tok_s) ;;
    esac
    local rss; rss=$(( $(tail -1 "$tf") * 1024 ))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$tool" "$fmt" "$t" "$test" "$b" "$run" "$tps" "$rss" >> "$results"
    peers_log "run $run: $tool $fmt $test b$b t$t: $tps tok/s, peak RSS $((rss >> 20)) MiB"
}

# Interleaved: every run measures every cell once, both tools back to back,
# who goes first alternating from run to run.
for run in $(seq "$RUNS"); do
    for f in $FORMATS; do
        for t in $THREADS; do
            for test in $TESTS; do
                bl=1
                if [ "$test" = batched ]; then bl=$BATCHES; fi
                for b in $bl; do
                    tools="llamacpp flextier"
                    if [ $((run % 2)) -eq 0 ]; then tools="flextier llamacpp"; fi
                    for tool in $tools; do
                        if [ "$tool" = flextier ] && [[ " $ft_formats " != *" $f "* ]]; then continue; fi
                        run_one "$tool" "$f" "$t" "$test" "$b" "$run"
                    done
                done
            done
        done
    done
done

measure_bw end
for t in $THREADS; do
    printf 'membw_%s\t%s\n' "$t" "$(awk -F'\t' -v a="membw_start_$t" -v b="membw_end_$t" \
        '$1 == a || $1 == b { if ($2 > m) m = $2 } END { print m }' "$meta")" >> "$meta"
done

{
    echo "## FlexTier vs llama.cpp $(date -u +%Y-%m-%d)"
    echo
    echo "Model: flextier gen-model ${model_args[*]} ($(python3 "$here/peers_report.py" ft-bytes "$model" bf16 | awk '{printf "%.2f GB bf16", $1/1e9}'))."
    echo "llama.cpp: llama-cpp-python $LLAMA_CPP_PY_VERSION sdist (vendor/llama.cpp), GGML_NATIVE; GGUF by convert_hf_to_gguf.py (f32, bf16) and llama-quantize ${PEERS_QUANT_ARGS:-} (q8_0, q4_0)."
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; flextier $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '?')."
    echo "Streaming read (membw, before / after the runs; the roofline uses the higher): $(for t in $THREADS; do printf '%s thread(s) %s / %s GB/s; ' "$t" "$(grep "^membw_start_$t" "$meta" | cut -f2)" "$(grep "^membw_end_$t" "$meta" | cut -f2)"; done)"
    if [ -n "$PEERS_LLAMA_ARGS" ]; then echo "Extra llama.cpp arguments: $PEERS_LLAMA_ARGS"; fi
    echo
    python3 "$here/peers_report.py" table "$results" "$meta"
} | tee "$work/table.md"
if [ -n "$OUT" ]; then peers_log "results in $work (table.md, results.tsv, logs/)"; fi
exit 0
