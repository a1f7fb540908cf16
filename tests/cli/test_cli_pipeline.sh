#!/usr/bin/env bash
# `flextier run --pipeline`: a 4-layer model split over 2 and 3 stages, as
# threads, as `flextier worker` processes (UCX over loopback TCP) and, when
# the CLI has MPI and mpirun exists, as the ranks of one mpirun (MPI and UCX
# transports): the text equals the single-process run's with one
# micro-batch, and runs with the same micro-batches agree with each other.
# Prints "N passed, N failed".
set -u
bin=$1
work=$(mktemp -d); pids=""
trap 'for p in $pids; do kill $p 2>/dev/null; done; rm -rf "$work"' EXIT
pass=0; fail=0
ok()  { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }
"$bin" gen-model --arch llama --out "$work/m" --layers 4 >/dev/null 2>&1 || { echo "gen-model failed"; echo "0 passed, 1 failed"; exit 1; }
printf 'Once upon a time\nThe quick brown fox\nIn the beginning\nA B C D E F\n' > "$work/p.txt"
run() { "$bin" run --model "$work/m" --prompt-file "$work/p.txt" --max-new-tokens 8 --temperature 0 --threads 1 "$@"; }
run > "$work/ref.txt" 2> "$work/ref.err" || bad "single process: $(tail -2 "$work/ref.err")"

run --pipeline local:2 --micro-batches 1 > "$work/l2.txt" 2> "$work/l2.err"
cmp -s "$work/ref.txt" "$work/l2.txt" && ok "2 stages (threads), 1 micro-batch: the engine's text" \
    || bad "local:2 differs: $(tail -2 "$work/l2.err")"
run --pipeline local:3 --micro-batches 1 --stage-layers 2,1,1 > "$work/l3.txt" 2> "$work/l3.err"
cmp -s "$work/ref.txt" "$work/l3.txt" && grep -q "layers 0-1 | 2-2 | 3-3" "$work/l3.err" \
    && ok "3 stages (2,1,1 layers), 1 micro-batch: the engine's text" || bad "local:3 differs: $(tail -2 "$work/l3.err")"
run --pipeline local:3 --micro-batches 2 > "$work/l3m.txt" 2> "$work/l3m.err" \
    && ok "3 stages, 2 micro-batches run" || bad "local:3 M=2: $(tail -2 "$work/l3m.err")"

# flextier worker processes on loopback (UCX's TCP: --trusted-network)
export UCX_TLS=tcp
start_worker() {
    "$bin" worker --models "$work" --listen 127.0.0.1:0 --trusted-network --once > "$work/w$1.log" 2>&1 &
    pids="$pids $!"
    for _ in $(seq 100); do grep -q "listening on" "$work/w$1.log" && break; sleep 0.05; done
    sed -n 's/.*listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/w$1.log" | head -1
}
w1=$(start_worker 1); w2=$(start_worker 2)
run --pipeline "$w1,$w2" --trusted-network --micro-batches 1 --stage-layers 2,1,1 > "$work/r3.txt" 2> "$work/r3.err"
cmp -s "$work/ref.txt" "$work/r3.txt" && ok "3 stages on worker processes: the engine's text" \
    || bad "workers differ: $(tail -3 "$work/r3.err"; tail -2 "$work/w1.log")"
sleep 0.3
grep -q "peak RSS" "$work/w1.log" && ok "a worker reports its peak RSS" || bad "worker log: $(tail -2 "$work/w1.log")"
w1=$(start_worker 3); w2=$(start_worker 4)
run --pipeline "$w1,$w2" --trusted-network --micro-batches 2 > "$work/r3m.txt" 2> "$work/r3m.err"
cmp -s "$work/l3m.txt" "$work/r3m.txt" && ok "2 micro-batches: worker processes agree with threads" \
    || bad "workers M=2 differ: $(tail -3 "$work/r3m.err")"
# refused: a worker that is not there; a policy that offloads the cache
run --pipeline 127.0.0.1:1 > /dev/null 2> "$work/e1.err" && bad "no worker: accepted" \
    || { grep -q "127.0.0.1:1" "$work/e1.err" && ok "no worker: a clear error" || bad "no worker: $(cat "$work/e1.err")"; }
run --pipeline local:2 --policy "w=100,0 c=0,100" > /dev/null 2> "$work/e2.err" && bad "offloaded cache: accepted" \
    || { grep -q "KV cache in memory" "$work/e2.err" && ok "a stage's cache stays in memory: refused clearly" \
         || bad "cache: $(cat "$work/e2.err")"; }
run --pipeline local:2 --policy "w=0,100 cw=bp" --micro-batches 1 > "$work/o2.txt" 2> "$work/o2.err"
cmp -s "$work/ref.txt" "$work/o2.txt" && ok "stages offloading their layers (host tier, byte-plane): the engine's text" \
    || bad "offloading stages differ: $(tail -2 "$work/o2.err")"

# mpirun: rank i is stage i, the last rank prints
if command -v mpirun >/dev/null && "$bin" run --help | grep -q "MPI: built in"; then
    mpi() { mpirun --allow-run-as-root --oversubscribe -n "$1" --mca btl self,tcp --mca pml ob1 \
            -x UCX_TLS -x FLEXTIER_LOG "$bin" run --model "$work/m" --prompt-file "$work/p.txt" --max-new-tokens 8 \
            --temperature 0 --threads 1 --pipeline mpi "${@:2}"; }
    mpi 2 --micro-batches 1 > "$work/mp2.txt" 2> "$work/mp2.err"
    cmp -s "$work/ref.txt" "$work/mp2.txt" && ok "mpirun -n 2 (MPI messages): the engine's text" \
        || bad "mpirun 2 differs: $(tail -3 "$work/mp2.err")"
    mpi 3 --micro-batches 2 > "$work/mp3.txt" 2> "$work/mp3.err"
    cmp -s "$work/l3m.txt" "$work/mp3.txt" && ok "mpirun -n 3, 2 micro-batches: agrees with threads" \
        || bad "mpirun 3 differs: $(tail -3 "$work/mp3.err")"
    mpi 3 --micro-batches 2 --pipe-transport ucx --trusted-network > "$work/mu3.txt" 2> "$work/mu3.err"
    cmp -s "$work/l3m.txt" "$work/mu3.txt" && ok "mpirun -n 3 with UCX links: agrees" \
        || bad "mpirun ucx differs: $(tail -3 "$work/mu3.err")"
else
    echo "skip mpirun (no mpirun, or a CLI without MPI)"
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
