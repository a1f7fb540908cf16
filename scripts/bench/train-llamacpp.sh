#!/usr/bin/env bash
# train-llamacpp.sh - `flextier finetune` beside llama.cpp's fine-tuning
# example (examples/training/finetune.cpp, `llama-finetune`) on the same
# model, context, sequences per step, text and threads, in one interleaved
# run: training tok/s (after the first step) and peak RSS, medians.
#
# What llama.cpp's example can run (docs/training.md, "Beside llama.cpp"):
# full fine-tuning only, of every F32 tensor but the token embeddings, with
# AdamW or SGD, one sequence of --ctx tokens per optimizer step; no LoRA.
# FlexTier trains LoRA adapters only. So the runs compared are the closest
# each supports, labelled as such: FlexTier LoRA (rank --rank on all seven
# projections, base frozen in f32 and in bf16) against llama.cpp full
# fine-tuning of the f32 GGUF; same tokens per step (1 x --ctx), same text.
#
#   scripts/bench/train-llamacpp.sh [options]
#     --flextier PATH   the flextier binary (default build/flextier)
#     --models "demo l2"  demo: demo/kjv-llama (6 layers, hidden 256);
#                       l2: the peer benchmark's 1.12B Llama cut to 2 layers
#                       (hidden 2048, GQA 32/8, ffn 5632, vocab 32000: its layers'
#                       shapes); 1b: the 1.12B itself (22 layers; llama.cpp's
#                       full fine-tuning needs ~16 bytes per parameter: run
#                       only when MemAvailable allows, else said and skipped)
#     --ctx N (256)     tokens per sequence = per step (llama.cpp: -c N -b N -ub N)
#     --steps N (8)     optimizer steps per run
#     --threads "2"     thread counts, each run by both tools
#     --rank R (16)     FlexTier's LoRA rank (alpha 2R)
#     --ft-dtypes "f32 bf16"   FlexTier's frozen base formats
#     --runs N (3)      interleaved rounds (who goes first alternates); medians
#     --data FILE       the training text (default: the World English Bible's
#                       1 + 2 Maccabees via diatheke, else the KJV via `bible`)
#     --out DIR         keep logs, results.tsv and table.md (default: temporary)
# Environment: PEERS_CACHE, LLAMA_CPP_PY_VERSION, PEERS_JOBS (peers-lib.sh).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
PEERS_PROG=train-llamacpp.sh
. "$here/peers-lib.sh"

FT=$root/build/flextier
MODELS="demo l2"; CTX=256; STEPS=8; THREADS="2"; RANK=16; FT_DTYPES="f32 bf16"; RUNS=3; DATA=""; OUT=""
PEERS_TIMEOUT=${PEERS_TIMEOUT:-3600}
usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --flextier) FT=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --ctx) CTX=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rank) RANK=$2; shift 2 ;;
    --ft-dtypes) FT_DTYPES=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "train-llamacpp.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$CTX" "$STEPS" "$RANK" "$RUNS" $THREADS; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "train-llamacpp.sh: '$v' is not a positive integer" >&2; exit 2; }
done
[ $((CTX % 2)) -eq 0 ] || { echo "train-llamacpp.sh: --ctx must be even (llama.cpp's windows stride by ctx/2)" >&2; exit 2; }
[ "$STEPS" -ge 3 ] || { echo "train-llamacpp.sh: --steps must be >= 3 (tok/s is taken after the first step)" >&2; exit 2; }
for m in $MODELS; do
    case "$m" in demo|l2|1b) ;; *) echo "train-llamacpp.sh: unknown model $m (demo l2 1b)" >&2; exit 2 ;; esac
done
for d in $FT_DTYPES; do
    case "$d" in f32|bf16|q8|q4) ;; *) echo "train-llamacpp.sh: unknown FlexTier dtype $d (f32 bf16 q8 q4)" >&2; exit 2 ;; esac
done
[ -x "$FT" ] || peers_die "no flextier binary at $FT (build it: make build, or pass --flextier)"
FT=$(readlink -f "$FT")
peers_need /usr/bin/time "apt-get install time" timeout "apt-get install coreutils" flock "apt-get install util-linux"

if [ -n "$OUT" ]; then
    mkdir -p "$OUT"; work=$(readlink -f "$OUT")
else
    work=$(mktemp -d /tmp/ft-train-llamacpp.XXXXXX)
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/logs"

# --- llama.cpp: the peers' build plus the llama-finetune target (own stamp)
peers_build_llamacpp
LLD=$(peers_llama_dir)
LFT=$(peers_llama_bin llama-finetune)
if [ ! -f "$LLD/build/.flextier-finetune-built" ] || [ ! -x "$LFT" ]; then
    (
        flock 9
        [ -f "$LLD/build/.flextier-finetune-built" ] && [ -x "$LFT" ] && exit 0
        peers_log "building llama-finetune in $LLD/build (once)"
        cmake --build "$LLD/build" -j "$PEERS_JOBS" --target llama-finetune >"$LLD/build-finetune.log" 2>&1 \
            || peers_die "building llama-finetune failed; see $LLD/build-finetune.log"
        touch "$LLD/build/.flextier-finetune-built"
    ) 9>"$LLD/.build.lock"
fi
[ -x "$LFT" ] || peers_die "$LFT is missing after the build"
peers_venv

# --- the training text
if [ -z "$DATA" ]; then
    DATA=$work/text.txt
    if command -v diatheke >/dev/null && diatheke -b engWEB2015eb -f plain -k "Tobit 1:1" 2>/dev/null | grep -q "^Tobit 1:1: "; then
        for b in "1 Maccabees" "2 Maccabees"; do
            diatheke -b engWEB2015eb -f plain -k "$b" | sed -E -e '/^\(engWEB2015eb\)$/d' -e 's/^[^:]* [0-9]+:[0-9]+: //'
        done > "$DATA"
        DATA_NAME="World English Bible, 1 + 2 Maccabees"
    elif command -v bible >/dev/null; then
        bible -f Genesis1:1-Exodus40:38 | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$DATA"
        DATA_NAME="King James Bible, Genesis + Exodus"
    else
        peers_die "no text: pass --data FILE (or install Debian's diatheke + sword-text-web, or bible-kjv: scripts/install-deps.sh)"
    fi
else
    [ -s "$DATA" ] || peers_die "--data $DATA is missing or empty"
    DATA_NAME=$(basename "$DATA")
fi

# model_dir NAME: the Hugging Face directory; model_gguf NAME: its f32 GGUF
declare -A MDIR GGUF
gen_args() { echo "--arch llama --hidden 2048 --layers $1 --heads 32 --kv-heads 8 --ffn 5632 --vocab 32000 --dtype bf16"; }
for m in $MODELS; do
    case "$m" in
    demo)
        # the converter does not know the demo tokenizer's pre-tokenizer by
        # its hash: it is byte-level BPE with GPT-2's split regex
        # (tokenizer.json: ByteLevel, use_regex), llama.cpp's "gpt-2"
        src=$root/demo/kjv-llama
        key=kjv-llama-$(sha256sum "$src/model.safetensors" "$src/tokenizer.json" | sha256sum | cut -c1-12)
        d=$PEERS_CACHE/models/$key
        mkdir -p "$d"
        for f in config.json generation_config.json tokenizer.json tokenizer_config.json model.safetensors; do
            [ -e "$d/$f" ] || cp "$src/$f" "$d/$f"
        done
        if [ ! -f "$d/ggml-f32.gguf" ]; then
            python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["pre_tokenizer"]; sys.exit(0 if p.get("type")=="ByteLevel" and p.get("use_regex", True) else 1)' \
                "$d/tokenizer.json" || peers_die "the demo tokenizer is no longer GPT-2 byte-level BPE: revisit the conversion"
            peers_log "converting $src to GGUF f32 (pre-tokenizer gpt-2)"
            PYTHONPATH="$LLD/src/gguf-py:$LLD/src" "$PEERS_PY" - "$LLD/src/convert_hf_to_gguf.py" "$d" --outtype f32 \
                --outfile "$d/ggml-f32.gguf.tmp" >"$d/convert-f32.log" 2>&1 <<'PY' \
                || { rm -f "$d/ggml-f32.gguf.tmp"; peers_die "convert_hf_to_gguf.py failed; see $d/convert-f32.log"; }
import runpy, sys
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
PY
            mv "$d/ggml-f32.gguf.tmp" "$d/ggml-f32.gguf"
        fi
        MDIR[$m]=$d; GGUF[$m]=$d/ggml-f32.gguf ;;
    l2|1b)
        L=2; [ "$m" = 1b ] && L=22
        # llamacpp.sh's directory when it holds a tokenizer (older gen-model
        # versions wrote none: the converter needs one), else our own
        d=$PEERS_CACHE/models/llama-h2048-l$L-v32000-bf16
        [ ! -d "$d" ] || [ -f "$d/tokenizer.json" ] || d=$PEERS_CACHE/models/train-llama-h2048-l$L-v32000-bf16
        # shellcheck disable=SC2046
        peers_gen_model "$FT" "$d" $(gen_args "$L")
        [ -f "$d/tokenizer.json" ] || peers_die "$d has no tokenizer.json"
        MDIR[$m]=$d; GGUF[$m]=$(peers_gguf "$d" f32) || exit 1 ;;
    esac
done

# cut_text MODEL: the first tokens of the text, enough for STEPS + 1 of
# llama.cpp's windows (ctx tokens at a stride of ctx / 2), counted with the
# model's own tokenizer (the GGUF holds the same vocabulary and merges)
cut_text() {
    local m=$1 out=$work/text-$1.txt
    "$PEERS_PY" - "${MDIR[$m]}/tokenizer.json" "$DATA" "$out" $(( (STEPS + 1) * CTX / 2 + CTX + 16 )) <<'PY' >&2
import sys
from tokenizers import Tokenizer
tok, src, dst, need = Tokenizer.from_file(sys.argv[1]), open(sys.argv[2], encoding="utf-8").read(), sys.argv[3], int(sys.argv[4])
text = src
while len(tok.encode(text, add_special_tokens=False).ids) < need:
    text += "\n" + src          # a short text repeats
enc = tok.encode(text, add_special_tokens=False)
end = enc.offsets[need - 1][1]
open(dst, "w", encoding="utf-8").write(text[:end])
print("train-llamacpp.sh: %s: %d tokens of text" % (dst, need))
PY
    echo "$out"
}

# trainable parameters of llama.cpp's run: its llama_set_param filter (F32,
# not token_embd / rope_freqs)
llama_trainable() {
    PYTHONPATH="$LLD/src/gguf-py" "$PEERS_PY" - "$1" <<'PY'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
n = sum(int(t.n_elements) for t in r.tensors
        if t.tensor_type == gguf.GGMLQuantizationType.F32 and t.name not in ("token_embd.weight", "rope_freqs.weight"))
print(n)
PY
}

results=$work/results.tsv
printf 'model\ttool\tthreads\trun\ttok_s\tpeak_rss_bytes\ttrainable\tload1\ttok_per_cpu_s\n' > "$results"

# llama.cpp's tok/s after the first step: each optimizer step logs
# "M.SS.mmm.uuu I epoch E lr=X" as it starts (common_opt_lr_pars, called
# from ggml_opt_eval); steps 2..K-1 span the stamps of step 2 and step K
llama_tok_s() {
    python3 - "$1" "$CTX" <<'PY'
import re, sys
stamps = [int(m[0]) * 60 + int(m[1]) + int(m[2]) / 1e3 + int(m[3]) / 1e6
          for m in re.findall(r"(\d+)\.(\d\d)\.(\d\d\d)\.(\d\d\d) I epoch \S+ lr=", open(sys.argv[1], errors="replace").read())]
if len(stamps) < 3:
    sys.exit("fewer than 3 optimizer steps in %s" % sys.argv[1])
print("%.1f %d" % ((len(stamps) - 2) * int(sys.argv[2]) / (stamps[-1] - stamps[1]), len(stamps)))
PY
}

run_one() {
    local m=$1 tool=$2 t=$3 run=$4 tag cmd=() tps trainable load1 nsteps
    tag="$m-$tool-t$t-r$run"
    local log="$work/logs/$tag.out" tf="$work/logs/$tag.time"
    case "$tool" in
    llamacpp)
        cmd=("$LFT" -m "${GGUF[$m]}" -f "${TEXT[$m]}" -c "$CTX" -b "$CTX" -ub "$CTX" -t "$t" -epochs 1
             -val-split 0 -o "$work/llamacpp-out.gguf") ;;
    flextier-*)
        cmd=("$FT" finetune --model "${MDIR[$m]}" --data "${TEXT[$m]}" --out "$work/ft-adapter" --steps "$STEPS"
             --seq-len "$CTX" --batch 1 --grad-accum 1 --rank "$RANK" --alpha $((2 * RANK)) --targets all
             --eval-frac 0 --weights-dtype "${tool#flextier-}" --threads "$t") ;;
    esac
    echo "${cmd[*]}" > "$log.cmd"
    load1=$(cut -d' ' -f1 /proc/loadavg)
    if ! timeout "$PEERS_TIMEOUT" /usr/bin/time -f '%M %U %S' -o "$tf" "${cmd[@]}" > "$log" 2> "$log.err"; then
        tail -5 "$log.err" >&2
        peers_die "$tool on $m ($t threads) failed: ${cmd[*]} (logs: $log.err)"
    fi
    if [ "$tool" = llamacpp ]; then
        read -r tps nsteps < <(llama_tok_s "$log.err") || peers_die "no step timings in $log.err"
        trainable=${LTRAIN[$m]}
    else
        tps=$(sed -n 's/^trained .*: \([0-9.]*\) tok\/s after the first step.*/\1/p' "$log")
        trainable=$(sed -n 's/.* \([0-9]*\) trainable parameters.*/\1/p' "$log")
        [ -n "$tps" ] || peers_die "no tok/s in $log"
        nsteps=$STEPS
    fi
    local kb user sys rss cpus
    read -r kb user sys < <(tail -1 "$tf")
    rss=$(( kb * 1024 ))
    # the whole process (load, tokenization, every step): tokens trained per CPU-second
    cpus=$(python3 -c 'import sys; print("%.1f" % (int(sys.argv[1]) * int(sys.argv[2]) / (float(sys.argv[3]) + float(sys.argv[4]))))' \
        "$nsteps" "$CTX" "$user" "$sys")
    rm -rf "$work/ft-adapter" "$work/llamacpp-out.gguf"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$tool" "$t" "$run" "$tps" "$rss" "$trainable" "$load1" "$cpus" >> "$results"
    peers_log "run $run: $m $tool t$t: $tps tok/s, $cpus tok/CPU-s, peak RSS $((rss >> 20)) MiB (load $load1)"
}

declare -A TEXT LTRAIN SKIPLL
for m in $MODELS; do
    TEXT[$m]=$(cut_text "$m") || peers_die "cutting the text for $m failed"
    LTRAIN[$m]=$(llama_trainable "${GGUF[$m]}") || peers_die "reading ${GGUF[$m]} failed"
    # llama.cpp holds the f32 weights, their gradients and AdamW's two
    # moments: ~16 bytes per trainable parameter plus the f32 model
    need=$(( LTRAIN[$m] * 12 + $(stat -c %s "${GGUF[$m]}") ))
    avail=$(( $(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024 ))
    if [ "$need" -gt $(( avail - (2 << 30) )) ]; then
        SKIPLL[$m]="needs ~$((need >> 30)) GiB for weights, gradients and AdamW moments; $((avail >> 30)) GiB available, of which 2 GiB are left to the rest of the machine"
        peers_log "llama.cpp on $m skipped: ${SKIPLL[$m]}"
    fi
done

for run in $(seq "$RUNS"); do
    for m in $MODELS; do
        for t in $THREADS; do
            tools="llamacpp"
            for d in $FT_DTYPES; do tools+=" flextier-$d"; done
            if [ $((run % 2)) -eq 0 ]; then tools=$(echo "$tools" | tr ' ' '\n' | tac | tr '\n' ' '); fi
            for tool in $tools; do
                if [ "$tool" = llamacpp ] && [ -n "${SKIPLL[$m]:-}" ]; then continue; fi
                run_one "$m" "$tool" "$t" "$run"
            done
        done
    done
done

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
grep -qw avx512_bf16 /proc/cpuinfo && cpu="$cpu, AVX-512 with BF16"
{
    echo "Fine-tuning: FlexTier LoRA beside llama.cpp's full fine-tuning (its example supports no LoRA)."
    echo "Text: $DATA_NAME; $STEPS steps of 1 sequence x $CTX tokens; tok/s after the first step, medians of $RUNS interleaved runs."
    echo "CPU: $cpu ($(nproc) cores); llama.cpp: llama-cpp-python $LLAMA_CPP_PY_VERSION's vendored source, llama-finetune (AdamW, lr 1e-5 default)."
    echo
    python3 - "$results" "$RANK" "$(printf '%s;' "${!SKIPLL[@]}")" <<'PY'
import collections, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
rank = sys.argv[2]
cells = collections.OrderedDict()
for m, tool, t, run, tps, rss, trainable, load, cpus in rows:
    c = cells.setdefault((m, tool, t), {"tps": [], "rss": [], "load": [], "cpus": [], "trainable": trainable})
    c["tps"].append(float(tps)); c["rss"].append(int(rss)); c["load"].append(float(load)); c["cpus"].append(float(cpus))
def num(x):
    return "%.1f" % x if x < 100 else "%.0f" % x
names = {"demo": "demo/kjv-llama (5.5M)", "l2": "1.12B Llama's layers, 2 of 22 (hidden 2048)", "1b": "1.12B Llama (22 layers)"}
print("| model | run | what is trained | threads | tok/s median (range) | vs llama.cpp | tok per CPU-s, whole run | peak RSS | 1-min load |")
print("|---|---|---|---|---|---|---|---|---|")
for (m, tool, t), c in cells.items():
    med = statistics.median(c["tps"])
    base = cells.get((m, "llamacpp", t))
    ratio = "%.2fx" % (med / statistics.median(base["tps"])) if base and tool != "llamacpp" else ""
    if tool == "llamacpp":
        what = "full fine-tuning, f32: %s params (all F32 tensors but token_embd)" % format(int(c["trainable"]), ",")
        label = "llama.cpp llama-finetune"
    else:
        what = "LoRA r%s all 7 projections: %s params; base frozen in %s" % (rank, format(int(c["trainable"]), ","), tool.split("-")[1])
        label = "flextier finetune"
    print("| %s | %s | %s | %s | %s (%s-%s) | %s | %s | %.0f MiB | %.1f-%.1f |" % (
        names[m], label, what, t, num(med), num(min(c["tps"])), num(max(c["tps"])), ratio,
        num(statistics.median(c["cpus"])), statistics.median(c["rss"]) / 2**20, min(c["load"]), max(c["load"])))
PY
    for m in "${!SKIPLL[@]}"; do echo; echo "llama.cpp on $m not run: ${SKIPLL[$m]}."; done
} > "$work/table.md"
cat "$work/table.md"
