#!/usr/bin/env bash
# perplexity.sh - quality of the weight and KV-cache formats on a trained
# model, the way users judge quantization: `flextier perplexity` of each
# format on the same texts, relative to bf16 weights with a bf16 cache.
#
#   scripts/bench/perplexity.sh [--model DIR] [--flextier PATH] [--ctx N] [--threads N]
#                               [--step N] [--text NAME=FILE ...] [--out FILE]
# Defaults: the trained demo model (demo/kjv-llama), build/flextier, ctx 256,
# step 16 (each window fed 16 tokens per call, so that later tokens attend
# to the KV cache as stored: a whole-window call never reads it back).
# Texts (default): "held-out" = Tobit and Judith from the World English
# Bible's Deuterocanon (public domain; Debian's sword-text-web read with
# diatheke: `apt-get install diatheke sword-text-web`): biblical English the
# demo model never saw, since the KJV it was trained on (Debian's
# bible-kjv-text) has no Apocrypha; and "kjv-john" = the Gospel of John
# from that KJV (`bible`, package bible-kjv: training text, in-domain but
# not held out). Prints a markdown table (and writes it to --out):
# perplexity +- its standard error, and the change against bf16.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FT=$root/build/flextier
MODEL=$root/demo/kjv-llama
CTX=256
STEP=16
THREADS=0
OUT=""
TEXTS=()
while [ $# -gt 0 ]; do
    case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --flextier) FT=$2; shift 2 ;;
    --ctx) CTX=$2; shift 2 ;;
    --step) STEP=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --text) TEXTS+=("$2"); shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "perplexity.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$FT" ] || { echo "perplexity.sh: $FT is not built (make build)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ${#TEXTS[@]} -eq 0 ]; then
    if command -v diatheke >/dev/null && diatheke -b engWEB2015eb -f plain -k "Tobit 1:1" >/dev/null 2>&1; then
        # verses without their references or the module's trailer
        for book in Tobit Judith; do
            diatheke -b engWEB2015eb -f plain -k "$book" | sed -E -e '/^\(engWEB2015eb\)$/d' \
                -e 's/^[1-3]? ?[A-Za-z]+ [0-9]+:[0-9]+: //'
        done > "$tmp/heldout.txt"
        TEXTS+=("held-out=$tmp/heldout.txt")
    else
        echo "perplexity.sh: no held-out text (apt-get install diatheke sword-text-web)" >&2
    fi
    if command -v bible >/dev/null; then
        bible -f John1:1-John21:25 | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$tmp/john.txt"
        TEXTS+=("kjv-john=$tmp/john.txt")
    fi
fi
[ ${#TEXTS[@]} -gt 0 ] || { echo "perplexity.sh: no text (give --text NAME=FILE)" >&2; exit 2; }

# format label | flextier arguments
CONFIGS=(
    "bf16 weights, bf16 cache|--weights-dtype bf16 --kv-dtype bf16"
    "f32 weights, f32 cache|--weights-dtype f32 --kv-dtype f32"
    "q8 weights|--weights-dtype q8"
    "q4 weights|--weights-dtype q4"
    "f16 cache|--weights-dtype bf16 --kv-dtype f16"
    "q8 cache (offloaded)|--weights-dtype bf16 --policy c=0,100 --compress-cache q8"
    "q4 cache (offloaded)|--weights-dtype bf16 --policy c=0,100 --compress-cache q4"
    "q4 weights + q4 cache|--weights-dtype q4 --policy c=0,100 --compress-cache q4"
)
table=$tmp/table.md
{
    printf '| format |'
    for t in "${TEXTS[@]}"; do printf ' %s: perplexity | vs bf16 |' "${t%%=*}"; done
    printf '\n|---|'
    for _ in "${TEXTS[@]}"; do printf -- '---|---|'; done
    printf '\n'
} > "$table"
declare -A base
for c in "${CONFIGS[@]}"; do
    label=${c%%|*}
    args=${c#*|}
    row="| $label |"
    for t in "${TEXTS[@]}"; do
        name=${t%%=*} file=${t#*=}
        # shellcheck disable=SC2086
        out=$("$FT" perplexity --model "$MODEL" --text "$file" --ctx "$CTX" --step "$STEP" --threads "$THREADS" --json $args)
        read -r ppl se < <(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["perplexity"], d["stderr"])' "$out")
        [ -n "${base[$name]:-}" ] || base[$name]=$ppl
        rel=$(python3 -c 'import sys; p,b=map(float,sys.argv[1:]); print("%+.2f%%" % (100*(p/b-1)))' "$ppl" "${base[$name]}")
        row+=$(printf ' %.3f +- %.3f | %s |' "$ppl" "$se" "$rel")
        echo "perplexity.sh: $label, $name: $ppl ($rel)" >&2
    done
    echo "$row" >> "$table"
done
cat "$table"
[ -z "$OUT" ] || cp "$table" "$OUT"
