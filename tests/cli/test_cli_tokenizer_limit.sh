#!/bin/sh
# `flextier run` with a tokenizer whose split pattern backtracks without end
# on the prompt (issue 21): a clear error naming the cause, before the
# prompt is echoed, never "internal error".
bin=$1
work=$(mktemp -d /tmp/ft_toklimit_XXXXXX)
trap 'rm -rf "$work"' EXIT
pass=0; fail=0
ok() { echo "ok   $1"; pass=$((pass+1)); }
bad() { echo "FAIL $1"; fail=$((fail+1)); }
"$bin" gen-model --arch llama --out "$work/m" --layers 1 >/dev/null 2>&1 || { echo "gen-model failed"; echo "0 passed, 1 failed"; exit 1; }
python3 - "$work/m/tokenizer.json" <<'PY' || { echo "cannot edit tokenizer.json"; exit 1; }
import json, sys
p = sys.argv[1]
d = json.load(open(p))
d["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated"}
json.dump(d, open(p, "w"))
PY
prompt=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab
"$bin" run --model "$work/m" --prompt "$prompt" --max-new-tokens 2 --threads 1 > "$work/out" 2> "$work/err"
rc=$?
[ "$rc" != 0 ] && ok "refused (exit $rc)" || bad "exit 0"
grep -q "backtracks" "$work/err" && ok "the error names the cause" || bad "error: $(tail -2 "$work/err")"
grep -q "internal error" "$work/err" && bad "says internal error" || ok "not an internal error"
grep -q "$prompt" "$work/out" && bad "the prompt was echoed" || ok "the prompt was not echoed"
# the same model on text the pattern handles still runs
"$bin" run --model "$work/m" --prompt "ab" --max-new-tokens 2 --threads 1 > "$work/out2" 2> "$work/err2" \
    && ok "other text runs" || bad "other text: $(tail -2 "$work/err2")"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
