#!/usr/bin/env bash
# The fine-tuning demo (`make finetune-demo`): the demo model
# demo/kjv-llama learnt its English from the King James Bible (1611);
# `flextier finetune` trains a LoRA adapter on two books of the World
# English Bible (public domain, modern English: "you" for "thee", "Yahweh"
# for "the LORD", curly quotes), 1 and 2 Maccabees, and `flextier
# perplexity --lora` measures, before and after, how well the model
# predicts two other WEB books it never saw in any form: Tobit and Judith
# (the KJV it was trained on has no Apocrypha, and the adapter never saw
# them). The Gospel of John from the KJV (the base model's own training
# text) shows what the adapter costs on the old English. Text source:
# Debian's diatheke + sword-text-web and bible-kjv (scripts/install-deps.sh).
#   scripts/finetune-demo.sh [--quick] [BUILD_DIR]
#     --quick   a handful of steps on a few windows (the ctest `finetune_demo`)
#   MODEL=DIR  another Hugging Face model directory (its tokenizer must cover the text)
#   OUT=DIR    keep the adapter there (default: a temporary directory)
#   STEPS=N LR=X RANK=R THREADS=N override the recipe below
# Exit status: 0 when the held-out perplexity went down, 1 when it did not
# (or on an error), 77 when the text source is not installed (ctest: skipped).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
quick=0
build=""
for a in "$@"; do
    case "$a" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "finetune-demo: unknown option $a (see --help)" >&2; exit 2 ;;
    *) [ -z "$build" ] || { echo "finetune-demo: one BUILD_DIR only" >&2; exit 2; }; build=$a ;;
    esac
done
build=${build:-$root/build}
bin="$build/flextier"
model=${MODEL:-$root/demo/kjv-llama}
[ -x "$bin" ] || { echo "finetune-demo: $bin is not built (make build)" >&2; exit 1; }
[ -f "$model/config.json" ] || { echo "finetune-demo: $model/config.json not found (MODEL=DIR names a model directory)" >&2; exit 1; }

# The recipe: LoRA rank 8 (alpha 16) on all seven projections, sequences
# of 256 tokens (the context the perplexity is measured at), 4 per step,
# peak lr 3e-3 with warmup and cosine decay; the base weights stay frozen
# in bf16 (as stored). --quick: 6 steps of 2 sequences, perplexity on the
# first 12 windows of each text only.
steps=${STEPS:-48} lr=${LR:-0.003} rank=${RANK:-8}
thr=()
[ -z "${THREADS:-}" ] || thr=(--threads "$THREADS")
seq=256 batch=4 windows=0
if [ "$quick" = 1 ]; then
    steps=${STEPS:-6} batch=2 windows=12
fi

# --- the texts
web=engWEB2015eb
if ! command -v diatheke >/dev/null || ! diatheke -b "$web" -f plain -k "Tobit 1:1" 2>/dev/null | grep -q "^Tobit 1:1: "; then
    echo "finetune-demo: SKIPPED: the World English Bible is not installed (Debian packages diatheke and"
    echo "  sword-text-web: scripts/install-deps.sh installs them)"
    exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
# a book's verses as plain text, without their references and the module's trailer
web_book() {
    diatheke -b "$web" -f plain -k "$1" | sed -E -e "/^\\($web\\)\$/d" -e 's/^[^:]* [0-9]+:[0-9]+: //'
}
for b in "1 Maccabees" "2 Maccabees"; do web_book "$b"; done > "$work/train.txt"
for b in Tobit Judith; do web_book "$b"; done > "$work/heldout.txt"
for f in train heldout; do
    [ "$(wc -w < "$work/$f.txt")" -gt 10000 ] || { echo "finetune-demo: the $web module gave too little text for $f" >&2; exit 1; }
done
texts=("held-out: WEB Tobit + Judith (never trained on)|$work/heldout.txt")
if command -v bible >/dev/null; then
    bible -f John1:1-John21:25 | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$work/john.txt"
    texts+=("KJV Gospel of John (the base model's training text)|$work/john.txt")
else
    echo "finetune-demo: note: no KJV column (Debian package bible-kjv: scripts/install-deps.sh)"
fi

# perplexity MODEL-ARGS... on each text: "ppl stderr tokens" lines
ppl_args=(--model "$model" --ctx "$seq" --json "${thr[@]}")
[ "$windows" = 0 ] || ppl_args+=(--max-windows "$windows")
measure() {
    local t out
    for t in "${texts[@]}"; do
        out=$("$bin" perplexity "${ppl_args[@]}" --text "${t#*|}" "$@") \
            || { echo "finetune-demo: flextier perplexity failed on ${t%%|*}" >&2; return 1; }
        python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["perplexity"], d["stderr"], d["tokens_scored"])' "$out"
    done
}
now() { date +%s.%N; }
secs() { python3 -c 'import sys; print("%.0f" % (float(sys.argv[2]) - float(sys.argv[1])))' "$1" "$2"; }

echo "== model: $model ($(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print("%s, %d layers, hidden %d" % (c["model_type"], c["num_hidden_layers"], c["hidden_size"]))' "$model/config.json"))"
echo "== fine-tuning text: World English Bible, 1 + 2 Maccabees ($(wc -w < "$work/train.txt") words)"
echo "== held-out text:    World English Bible, Tobit + Judith ($(wc -w < "$work/heldout.txt") words)"
t0=$(now)
echo "== perplexity before (base model, context $seq$( [ "$windows" = 0 ] || echo ", first $windows windows"))"
measure > "$work/before.txt"
t1=$(now)
adapter=${OUT:-$work/adapter}
echo "== flextier finetune: LoRA rank $rank on all projections, $steps steps x $batch sequences of $seq tokens, lr $lr"
"$bin" finetune --model "$model" --data "$work/train.txt" --out "$adapter" --steps "$steps" --lr "$lr" \
    --rank "$rank" --alpha $((2 * rank)) --seq-len "$seq" --batch "$batch" --eval-frac 0 --seed 0 \
    "${thr[@]}" | tee "$work/finetune.log" | grep -E "^(finetune|lora|step [0-9]*0/|trained|adapter)" || true
grep -q "^adapter written" "$work/finetune.log" || { echo "finetune-demo: flextier finetune failed" >&2; exit 1; }
t2=$(now)
echo "== perplexity after (the base model with the adapter: --lora)"
measure --lora "$adapter" > "$work/after.txt"
t3=$(now)

echo
echo "| text | tokens scored | perplexity before | after fine-tuning | change |"
echo "|---|---|---|---|---|"
i=0
verdict=1
while read -r pb sb n && read -r pa sa _ <&3; do
    label=${texts[$i]%%|*}
    python3 -c 'import sys; l,n,pb,sb,pa,sa=sys.argv[1:]; pb,sb,pa,sa=map(float,(pb,sb,pa,sa)); print("| %s | %s | %.2f +- %.2f | %.2f +- %.2f | %+.1f%% |" % (l,n,pb,sb,pa,sa,100*(pa/pb-1)))' \
        "$label" "$n" "$pb" "$sb" "$pa" "$sa"
    if [ "$i" = 0 ]; then
        python3 -c 'import sys; sys.exit(0 if float(sys.argv[2]) < float(sys.argv[1]) else 1)' "$pb" "$pa" && verdict=0
        held=$(python3 -c 'import sys; b,a=map(float,sys.argv[1:]); print("%.2f -> %.2f (%+.1f%%)" % (b,a,100*(a/b-1)))' "$pb" "$pa")
    fi
    i=$((i + 1))
done < "$work/before.txt" 3< "$work/after.txt"
echo
echo "== time: perplexity before $(secs "$t0" "$t1") s, fine-tuning $(secs "$t1" "$t2") s, perplexity after $(secs "$t2" "$t3") s"
grep "^trained" "$work/finetune.log" | sed 's/^/   /'
if [ "$quick" = 0 ]; then
    prompt="Tobias said to his father,"
    sampling=(--max-new-tokens 40 --temperature 0.7 --top-k 40 --seed 7)
    echo "== the same prompt and seed, without and with the adapter"
    echo "-- base:"
    "$bin" run --model "$model" --prompt "$prompt" "${sampling[@]}" "${thr[@]}"
    echo "-- with the adapter:"
    "$bin" run --model "$model" --prompt "$prompt" "${sampling[@]}" "${thr[@]}" --lora "$adapter"
fi
[ -z "${OUT:-}" ] || echo "== adapter kept in $OUT (flextier run --model $model --lora $OUT ...)"
if [ "$verdict" = 0 ]; then
    echo "== the held-out perplexity went down: $held"
else
    echo "== FAILED: the held-out perplexity did not go down: $held"
fi
exit "$verdict"
