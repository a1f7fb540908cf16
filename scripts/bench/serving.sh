#!/usr/bin/env bash
# serving.sh - flextier server beside llama.cpp's llama-server on the same
# generated Llama (same weights, bf16 for both), same threads, same machine,
# one interleaved run: N concurrent streaming clients (N = 1, 8, 32 by
# default), aggregate generated tok/s and time to first token p50/p99; and
# the TTFT of a second turn whose first turn's prompt (a history of H
# tokens plus a question) is its prefix, with and without the prefix cache
# (flextier --no-prefix-cache; llama-server cache_prompt false). Not a test:
# timings on a shared machine are noisy (the table carries the load).
#
#   scripts/bench/serving.sh [options]
#     --flextier PATH      the flextier binary (default build/flextier)
#     --layers N           layers of the generated model (default 22: 1.1B
#                          parameters, hidden 2048, vocab 32000, bf16)
#     --clients "1 8 32"   concurrent clients; each server gets that many slots
#     --prompt N (64) --gen N (32)   tokens per request (EOS ignored)
#     --requests N         requests per client count (default 2 x clients, at least 4)
#     --time S (300)       per measurement, at most
#     --history N (1000)   the second-turn test's shared history (it and 40 tokens
#                          more must fit the model's max_position_embeddings)
#     --tests "load turn2" which measurements (default both)
#     --threads N (2)      compute threads of both servers
#     --runs N (1)         interleaved repetitions (medians)
#     --out DIR            keep logs and table.md there (default: a temp dir)
# Environment: PEERS_CACHE, LLAMA_CPP_PY_VERSION, PEERS_JOBS (peers-lib.sh).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
PEERS_PROG=serving.sh
. "$here/peers-lib.sh"

FT=$root/build/flextier
LAYERS=22; CLIENTS="1 8 32"; PROMPT=64; GEN=32; REQUESTS=""; TIME=300; HISTORY=1000; THREADS=2; RUNS=1; OUT=""
TESTS="load turn2"
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --flextier) FT=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --requests) REQUESTS=$2; shift 2 ;;
    --time) TIME=$2; shift 2 ;;
    --history) HISTORY=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --tests) TESTS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "serving.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$LAYERS" "$PROMPT" "$GEN" "$TIME" "$HISTORY" "$THREADS" "$RUNS" $CLIENTS ${REQUESTS:-1}; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "serving.sh: '$v' is not a positive integer" >&2; exit 2; }
done
[ -x "$FT" ] || peers_die "$FT is not built (cmake --build build)"
peers_need python3 "apt-get install python3" curl "apt-get install curl"
peers_build_llama_server
LS=$(peers_llama_bin llama-server)
model_args=(--arch llama --hidden 2048 --layers "$LAYERS" --heads 32 --kv-heads 8 --ffn 5632 --vocab 32000 --dtype bf16)
model=$PEERS_CACHE/models/llama-h2048-l$LAYERS-v32000-bf16
peers_gen_model "$FT" "$model" "${model_args[@]}"
gguf=$(peers_gguf "$model" bf16)

tmp_out=""
if [ -z "$OUT" ]; then OUT=$(mktemp -d); tmp_out=$OUT; fi
mkdir -p "$OUT"
touch "$OUT/results.jsonl"   # appended to: a rerun with --tests adds its rows
maxc=1; for n in $CLIENTS; do [ "$n" -gt "$maxc" ] && maxc=$n; done
ctx=$((PROMPT + GEN + 16))
hctx=$((HISTORY + 40))   # history + two 16-token questions + 8 generated
[ "$hctx" -gt "$ctx" ] || hctx=$ctx

srv_pid=""
stop_server() {
    if [ -n "$srv_pid" ]; then kill "$srv_pid" 2>/dev/null || true; wait "$srv_pid" 2>/dev/null || true; srv_pid=""; fi
}
trap 'stop_server; [ -z "$tmp_out" ] || rm -rf "$tmp_out"' EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start TOOL SLOTS CTX [no-cache]: a server in the background; sets port
start() {
    local tool=$1 slots=$2 sctx=$3 nocache=${4:-}
    port=$(free_port)
    if [ "$tool" = flextier ]; then
        "$FT" server --model "$model" --listen "127.0.0.1:$port" --slots "$slots" --ctx "$sctx" \
            --threads "$THREADS" --queue 1024 --max-connections 256 ${nocache:+--no-prefix-cache} \
            >"$OUT/server-$tool.log" 2>&1 &
    else
        "$LS" -m "$gguf" --host 127.0.0.1 --port "$port" -np "$slots" -c $((slots * sctx)) -t "$THREADS" \
            -tb "$THREADS" --no-webui >"$OUT/server-$tool.log" 2>&1 &
    fi
    srv_pid=$!
    for _ in $(seq 1200); do
        if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then return 0; fi
        kill -0 "$srv_pid" 2>/dev/null || peers_die "$tool server exited; see $OUT/server-$tool.log"
        sleep 0.25
    done
    peers_die "$tool server did not become ready; see $OUT/server-$tool.log"
}

load1() { uptime | sed 's/.*load average: \([0-9.]*\).*/\1/'; }

for run in $(seq "$RUNS"); do
    for n in $CLIENTS; do
        [[ " $TESTS " == *" load "* ]] || continue
        req=${REQUESTS:-$((2 * n > 4 ? 2 * n : 4))}
        for tool in flextier llama-server; do
            start "$tool" "$n" "$ctx"
            python3 "$here/serving_load.py" --url "http://127.0.0.1:$port" --clients 1 --requests 1 \
                --prompt-len 8 --gen-len 4 >/dev/null   # warm up
            l=$(load1)
            r=$(python3 "$here/serving_load.py" --url "http://127.0.0.1:$port" --clients "$n" --requests "$req" \
                --prompt-len "$PROMPT" --gen-len "$GEN" --time "$TIME" --seed "$run")
            echo "{\"test\":\"load\",\"tool\":\"$tool\",\"run\":$run,\"load1\":$l,\"r\":$r}" | tee -a "$OUT/results.jsonl"
            stop_server
        done
    done
    for tool in flextier llama-server; do
        [[ " $TESTS " == *" turn2 "* ]] || continue
        for cache in on off; do
            nocache=""; [ "$cache" = off ] && nocache=1
            # flextier: --no-prefix-cache; llama-server: cache_prompt false per request
            start "$tool" 1 "$hctx" $([ "$tool" = flextier ] && echo "$nocache")
            l=$(load1)
            r=$(python3 "$here/serving_load.py" --url "http://127.0.0.1:$port" --second-turn --history "$HISTORY" \
                --gen-len 8 --repeats 3 --seed "$run" $([ "$tool" = llama-server ] && [ -n "$nocache" ] && echo --no-cache-prompt))
            echo "{\"test\":\"turn2\",\"tool\":\"$tool\",\"cache\":\"$cache\",\"run\":$run,\"load1\":$l,\"r\":$r}" \
                | tee -a "$OUT/results.jsonl"
            stop_server
        done
    done
done

python3 - "$OUT/results.jsonl" "$LAYERS" "$PROMPT" "$GEN" "$THREADS" "$HISTORY" <<'EOF' | tee "$OUT/table.md"
import json, statistics, sys, platform
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
layers, prompt, gen, threads, hist = sys.argv[2:7]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
print(f"Serving: generated Llama, hidden 2048, {layers} layers, vocab 32000, bf16 (GGUF bf16 for llama-server), "
      f"{threads} threads, {cpu}; streaming /v1/completions, prompt {prompt} tokens, {gen} generated (EOS ignored).\n")
print("| clients | flextier tok/s | llama-server tok/s | flextier / llama-server | TTFT p50 ms (flextier / llama-server) "
      "| TTFT p99 ms (flextier / llama-server) | load (1 min) |")
print("|---|---|---|---|---|---|---|")
by = {}
for r in rows:
    if r["test"] == "load":
        by.setdefault(r["r"]["clients"], {}).setdefault(r["tool"], []).append(r)
def med(rs, k):
    return statistics.median(x["r"][k] for x in rs)
for n in sorted(by):
    f, l = by[n].get("flextier", []), by[n].get("llama-server", [])
    if not f or not l:
        continue
    loads = "/".join(f"{x['load1']:.1f}" for x in f + l)
    print(f"| {n} | {med(f, 'tok_s'):.1f} | {med(l, 'tok_s'):.1f} | **{med(f, 'tok_s') / med(l, 'tok_s'):.2f}x** | "
          f"{med(f, 'ttft_p50_ms'):.0f} / {med(l, 'ttft_p50_ms'):.0f} | {med(f, 'ttft_p99_ms'):.0f} / "
          f"{med(l, 'ttft_p99_ms'):.0f} | {loads} |")
hists = sorted({r["r"]["history"] for r in rows if r["test"] == "turn2"})
hist = "/".join(str(h) for h in hists) or hist
print(f"\nSecond turn, {hist}-token shared history (+16-token question; the second prompt's prefix is the first "
      "prompt), TTFT median of 3 conversations:\n")
print("| server | prefix cache | turn 1 TTFT ms | turn 2 TTFT ms | load (1 min) |")
print("|---|---|---|---|---|")
t2 = {}
for r in rows:
    if r["test"] == "turn2":
        t2.setdefault((r["tool"], r["cache"]), []).append(r)
for (tool, cache), rs in sorted(t2.items()):
    print(f"| {tool} | {cache} | {med(rs, 'turn1_ttft_ms'):.0f} | {med(rs, 'turn2_ttft_ms'):.0f} | "
          f"{'/'.join(str(x['load1']) for x in rs)} |")
for tool in ("flextier", "llama-server"):
    on, off = t2.get((tool, "on")), t2.get((tool, "off"))
    if on and off:
        print(f"\n{tool}: second-turn TTFT {med(off, 'turn2_ttft_ms') / med(on, 'turn2_ttft_ms'):.1f}x faster with "
              "the prefix cache.")
EOF
