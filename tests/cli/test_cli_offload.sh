#!/usr/bin/env bash
# `flextier run` with offloading: logits through a memory node and the disk
# tier are byte-identical to the in-memory run (lossless codecs); q4 runs;
# bad policies are refused. Prints "N passed, N failed".
set -u
bin=$1
work=$(mktemp -d); srv=""; agent=""
trap '[ -n "$agent" ] && kill $agent 2>/dev/null; [ -n "$srv" ] && kill $srv 2>/dev/null; rm -rf "$work"' EXIT
pass=0; fail=0
ok()  { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }
"$bin" gen-model --arch llama --out "$work/m" --layers 4 >/dev/null 2>&1 || { echo "gen-model failed"; echo "0 passed, 1 failed"; exit 1; }
"$bin" serve --listen 127.0.0.1:0 --capacity 128M > "$work/srv.log" 2>&1 &
srv=$!
for _ in $(seq 100); do grep -q "listening on" "$work/srv.log" && break; sleep 0.1; done
uri="ucx://$(sed -n 's/.*listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/srv.log" | head -1)"
# --kv-dtype f32: the in-memory cache as exact as an offloaded (f32-row) one
run() { "$bin" run --model "$work/m" --prompt "Once upon a time" --max-new-tokens 8 --temperature 0 --threads 1 --kv-dtype f32 "$@"; }
run --dump-logits "$work/ref.bin" > "$work/ref.txt" 2>/dev/null || bad "in-memory run"
run --dump-logits "$work/r.bin" --policy w=0,0,0,100 --remote "$uri" --compress-weights bp --offload-stats \
    > "$work/r.txt" 2> "$work/r.err"
cmp -s "$work/ref.bin" "$work/r.bin" && cmp -s "$work/ref.txt" "$work/r.txt" && ok "remote bp: identical logits and text" \
    || bad "remote bp differs: $(tail -2 "$work/r.err")"
grep -q "remote read .* (1\.[3-9][0-9]x)" "$work/r.err" && ok "remote bytes reported with ratio" || bad "stats: $(cat "$work/r.err")"
run --dump-logits "$work/d.bin" --policy "w=50,0,50,0" --disk-dir "$work/disk" > "$work/d.txt" 2>/dev/null
cmp -s "$work/ref.bin" "$work/d.bin" && ok "device+disk: identical logits" || bad "device+disk differs"
run --policy "w=50,0,50,0" --disk-dir "$work/disk" --offload-stats > /dev/null 2> "$work/d2.err"
grep -q "uploaded 0.0 MiB" "$work/d2.err" && ok "second start reuses the disk tier" || bad "reuse: $(cat "$work/d2.err")"
run --policy w=0,0,0,100 --remote "$uri" --compress-weights q4 > "$work/q.txt" 2>/dev/null && ok "remote q4 runs" || bad "remote q4"
run --policy auto --remote "$uri" --device-mem 64M > /dev/null 2> "$work/a.err" && grep -q "planned" "$work/a.err" \
    && ok "policy auto" || bad "policy auto: $(tail -2 "$work/a.err")"
# --predict: a given policy's prediction in the same process, also at the
# run's CPU share (the values depend on the machine: only their presence)
FLEXTIER_CALIB_CACHE=0 "$bin" bench run --model "$work/m" --batch 2 --prompt-len 4 --gen-len 6 --threads 1 --json \
    --policy w=0,0,100,0 --disk-dir "$work/disk" --predict > "$work/p.json" 2> "$work/p.err" \
    && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["offload"]["predicted_tok_s"] > 0' "$work/p.json" \
    && grep -q "(cost model: [0-9.]* tok/s predicted)" "$work/p.err" \
    && ok "--predict: the given policy's prediction beside the measurement" || bad "--predict: $(tail -2 "$work/p.err")"
run --dump-logits "$work/k.bin" --policy "w=100,0 c=0,0,100,0" --disk-dir "$work/disk" --offload-stats \
    > "$work/k.txt" 2> "$work/k.err"
cmp -s "$work/ref.bin" "$work/k.bin" && cmp -s "$work/ref.txt" "$work/k.txt" \
    && ok "KV cache on disk: identical logits and text" || bad "KV cache on disk differs: $(tail -3 "$work/k.err")"
grep -q "KV cache disk .*wrote" "$work/k.err" && ok "KV cache traffic reported per tier" || bad "KV stats: $(cat "$work/k.err")"
run --policy "w=0,100 c=0,100" --compress-weights q4 --compress-cache q4 --offload-stats > /dev/null 2> "$work/kq.err" \
    && grep -q "KV cache host .*([5-9]\.[0-9]*x)" "$work/kq.err" && ok "q4 KV cache: over 5x fewer bytes written" \
    || bad "q4 KV cache: $(tail -4 "$work/kq.err")"
"$bin" bench run --model "$work/m" --batch 2 --prompt-len 4 --gen-len 4 --threads 1 --json \
    --policy "w=0,100 c=0,50,50" --disk-dir "$work/disk" --compress-cache q8 > "$work/kj.json" 2>/dev/null
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); o=d['offload']; \
w = o['kv_cache']['written_stored_bytes']; assert w['host'] > 0 and w['disk'] > 0 and 0 < o['overlap_efficiency'] <= 1.0001 and 0 < o['decode_overlap_efficiency'] <= 1.0001" "$work/kj.json" \
    && ok "bench run --json carries the offload metrics" || bad "json: $(cat "$work/kj.json")"
run --dump-logits "$work/kr.bin" --policy "w=0,0,0,100 c=0,0,0,100" --remote "$uri" --compress-weights bp \
    --offload-stats > "$work/kr.txt" 2> "$work/kr.err"
cmp -s "$work/ref.bin" "$work/kr.bin" && grep -q "KV cache remote .*wrote" "$work/kr.err" \
    && ok "weights and KV cache on a memory node: identical logits" || bad "remote KV: $(tail -3 "$work/kr.err")"
# mixtures of experts (issue 23): every expert a slot of its own, on the
# memory node and on disk: identical logits and text
data="$(cd "$(dirname "$0")/../data/models" && pwd)"
for moe in mixtral-tiny qwen3moe-tiny; do
    mrun() { "$bin" run --model "$data/$moe" --prompt "The quick brown fox" --max-new-tokens 6 --temperature 0 \
                 --threads 1 --kv-dtype f32 "$@"; }
    mrun --dump-logits "$work/$moe-ref.bin" > "$work/$moe-ref.txt" 2>/dev/null || bad "$moe in memory"
    mrun --dump-logits "$work/$moe-r.bin" --policy w=0,0,0,100 --remote "$uri" --compress-weights bp \
        --offload-stats > "$work/$moe-r.txt" 2> "$work/$moe-r.err"
    mrun --dump-logits "$work/$moe-d.bin" --policy w=0,50,50 --disk-dir "$work/disk" --expert-evict lfu \
        --expert-prefetch --expert-cache 1M > "$work/$moe-d.txt" 2>/dev/null
    grep -q "offload: experts all layers: needed [1-9]" "$work/$moe-r.err" && grep -q "offload: experts layer   0:" \
        "$work/$moe-r.err" && ok "$moe: --offload-stats reports the experts per layer" \
        || bad "$moe expert stats: $(grep experts "$work/$moe-r.err" | head -3)"
    cmp -s "$work/$moe-ref.bin" "$work/$moe-r.bin" && cmp -s "$work/$moe-ref.txt" "$work/$moe-r.txt" \
        && cmp -s "$work/$moe-ref.bin" "$work/$moe-d.bin" \
        && ok "$moe: experts on a memory node and on disk: identical logits and text" \
        || bad "$moe offloaded differs: $(tail -2 "$work/$moe-r.err")"
done
# the same runs through a codec agent (agent://): identical output, the
# agent encoding and decoding for the client
"$bin" agent --listen 127.0.0.1:0 --node "$uri" --threads 1 > "$work/agent.log" 2>&1 &
agent=$!
for _ in $(seq 100); do grep -q "listening on" "$work/agent.log" && break; sleep 0.1; done
auri="agent://$(sed -n 's/.*listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/agent.log" | head -1)"
run --dump-logits "$work/ag.bin" --policy "w=0,0,0,100 c=0,0,0,100" --remote "$auri" --compress-weights bp \
    --offload-stats > "$work/ag.txt" 2> "$work/ag.err"
cmp -s "$work/ref.bin" "$work/ag.bin" && cmp -s "$work/ref.txt" "$work/ag.txt" \
    && ok "weights and KV cache through the agent: identical logits and text" || bad "agent run: $(tail -3 "$work/ag.err")"
run --dump-logits "$work/q1.bin" --policy w=0,0,0,100 --remote "$uri" --compress-weights q4 > /dev/null 2>&1
run --dump-logits "$work/q2.bin" --policy w=0,0,0,100 --remote "$auri" --compress-weights q4 > /dev/null 2>&1
cmp -s "$work/q1.bin" "$work/q2.bin" && ok "q4 weights: agent and in-process decoding give identical logits" \
    || bad "q4 through the agent differs"
head -c 4096 /dev/urandom > "$work/t.bin"
"$bin" put "$auri" cli/t "$work/t.bin" --dtype bf16 --shape 32,64 -c bp > /dev/null 2>&1 && \
    "$bin" get "$uri" cli/t "$work/t2.bin" > /dev/null 2>&1 && cmp -s "$work/t.bin" "$work/t2.bin" && \
    "$bin" get "$auri" cli/t "$work/t3.bin" > /dev/null 2>&1 && cmp -s "$work/t.bin" "$work/t3.bin" \
    && ok "put/get through the agent" || bad "put/get through the agent"
kill $agent 2>/dev/null; wait $agent 2>/dev/null; agent=""
run --compress-cache q4 > /dev/null 2>&1; [ $? -eq 1 ] && ok "--compress-cache without --policy refused" || bad "cc without policy"
run --policy w=0,0,0,100 > /dev/null 2> "$work/e1.err"; rc=$?
[ $rc -eq 1 ] && grep -q "no --remote" "$work/e1.err" && ok "remote tier without node refused" || bad "no-node rc=$rc $(cat "$work/e1.err")"
run --policy w=60,60 > /dev/null 2>&1; [ $? -eq 1 ] && ok "bad percentages refused" || bad "bad percentages"
run --policy frob=1 > /dev/null 2>&1; [ $? -eq 2 ] && ok "unknown policy item is a usage error" || bad "unknown item"
run --policy w=0,100 --expert-evict mru > /dev/null 2>&1; [ $? -ne 0 ] && ok "--expert-evict mru refused" || bad "expert-evict"
run --remote "$uri" > /dev/null 2>&1; [ $? -eq 1 ] && ok "--remote without --policy refused" || bad "remote without policy"
run --policy w=0,0,100 --disk-dir "$work/disk" --device-mem 1K > /dev/null 2> "$work/b.err"; rc=$?
[ $rc -eq 1 ] && grep -q "budget" "$work/b.err" && ok "device budget enforced" || bad "budget rc=$rc"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
