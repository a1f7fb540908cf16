#!/usr/bin/env bash
# scripts/bench/scaleout.sh - the scale-out benchmarks in the lab (root;
# scripts/scalelab.sh, every link 1 Gbit/s):
#   rails     raw bf16 weights on memory nodes, decode tok/s: one node on
#             one rail; two nodes on one rail; two nodes on two rails
#             (striped). Link-bound: two rails should give ~2x.
#   failover  two replicas over m1 (rail 0) and m2 (rail 1): a layer's
#             fetch time normally, the fetch during which m2 is killed
#             (kill -9) or its link cut, and with m2 gone.
#   pipeline  generation throughput and peak RSS: one process with one
#             compute thread, then 2 stages (p1 worker, p2 driver) and 3
#             stages (c, p1 workers, p2 driver), one compute thread each,
#             activations over UCX on the 1 Gbit/s pipeline network.
#   transports the pipeline's activations as MPI messages (Open MPI, btl
#             tcp) or UCX tag messages (TCP), 2 ranks of one mpirun on
#             this host (loopback: the transports' own cost, no link)
#   scripts/bench/scaleout.sh [-b BUILD] [-p "rails failover pipeline transports"] [--reps N]
#                             [--batch B] [--gen G] [--micro M]
# Prints a markdown table per part (medians of --reps runs; the raw runs
# above them). The machine is shared: figures are provisional.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BUILD=build; PARTS="rails failover pipeline transports"; REPS=3; PBATCH=64; PGEN=32; PPROMPT=16; MICRO=""
while [ $# -gt 0 ]; do
    case "$1" in
    -b) BUILD=$2; shift 2 ;;
    -p) PARTS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --batch) PBATCH=$2; shift 2 ;;
    --gen) PGEN=$2; shift 2 ;;
    --micro) MICRO=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "scaleout.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "scaleout.sh: must run as root (network namespaces)" >&2; exit 1; }
FT=$(readlink -f "$BUILD/flextier")
export FT SL_ID=b$$
. "$here/../scalelab.sh"
work=$(mktemp -d /tmp/ft-bench-scaleout.XXXXXX)
export SL_LOG_DIR=$work
trap 'sl_down >/dev/null 2>&1; rm -rf "$work"' EXIT INT TERM
sl_up
sl_rate all 1gbit
sl_token "$work/tok"
export FLEXTIER_TOKEN_FILE=$work/tok
M1=10.212.1.11 M2=10.212.2.12 M3=10.212.1.13

# ~26 MB of bf16 weights per layer (0.2 s over 1 Gbit/s), 8 layers
MODEL=$work/model
"$FT" gen-model --arch llama --out "$MODEL" --hidden 1024 --layers 8 --heads 16 --kv-heads 8 --ffn 2816 \
    --vocab 4096 --dtype bf16 > /dev/null
jget() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
median() { python3 -c "import statistics,sys; v=[float(x) for x in sys.argv[1:] if x]; print('%.3f' % statistics.median(v) if v else 'n/a')" "$@"; }

serve_all() {   # port: m1 m2 m3 with 1 GiB each
    S1=$(sl_serve m1 "$1" --capacity 1G --token-file "$work/tok")
    S2=$(sl_serve m2 "$1" --capacity 1G --token-file "$work/tok")
    S3=$(sl_serve m3 "$1" --capacity 1G --token-file "$work/tok")
}
stop_all() { kill $S1 $S2 $S3 2>/dev/null || true; sleep 0.3; }

if [[ " $PARTS " == *" rails "* ]]; then
    serve_all 7201
    echo "## rails: raw bf16 weights on memory nodes, batch 8, prompt 32, 8 new tokens, 1 compute thread"
    declare -A R
    for row in "one rail, one node|ucx://$M1:7201" "one rail, two nodes (m1, m3)|ucx://$M1:7201,ucx://$M3:7201" \
               "two rails, two nodes (m1, m2)|ucx://$M1:7201,ucx://$M2:7201"; do
        name=${row%%|*}; rem=${row#*|}
        b=(bench run --model "$MODEL" --batch 8 --prompt-len 32 --gen-len 8 --threads 1 --policy w=0,0,0,100
           --remote "$rem" --json)
        sl_exec c "$FT" "${b[@]}" > /dev/null 2>&1 || true   # uploads
        vals=()
        for r in $(seq "$REPS"); do
            sl_exec c "$FT" "${b[@]}" > "$work/r.json" 2> "$work/r.err" || { echo "run failed: $(tail -2 "$work/r.err")"; continue; }
            v=$(jget "$work/r.json" 'd["decode_tok_s"]'); vals+=("$v")
            echo "  $name run $r: decode $v tok/s"
        done
        R[$name]=$(median "${vals[@]}")
    done
    one=${R["one rail, one node"]}
    echo "| placement | decode tok/s | vs one rail |"
    echo "|---|---|---|"
    for name in "one rail, one node" "one rail, two nodes (m1, m3)" "two rails, two nodes (m1, m2)"; do
        echo "| $name | ${R[$name]} | $(python3 -c "print('%.2fx' % (float('${R[$name]}') / float('$one')))" 2>/dev/null) |"
    done
    stop_all
fi

if [[ " $PARTS " == *" failover "* ]]; then
    S1=$(sl_serve m1 7301 --capacity 1G --token-file "$work/tok")
    S2=$(sl_serve m2 7301 --capacity 1G --token-file "$work/tok")
    echo "## failover: two replicas on m1 (rail 0) and m2 (rail 1), batch 8, 16 new tokens"
    b=(bench run --model "$MODEL" --batch 8 --prompt-len 32 --gen-len 16 --threads 1 --policy w=0,0,0,100
       --remote "ucx://$M1:7301,ucx://$M2:7301" --replicas 2 --json)
    sl_exec c "$FT" "${b[@]}" > /dev/null 2>&1 || true   # uploads
    normal=(); killed=(); cut=(); degraded=()
    for r in $(seq "$REPS"); do
        # kill -9 m2 during the decode phase: the fetches before it (both
        # nodes), the one it died in, the ones after (m2 gone)
        sl_exec c "$FT" "${b[@]}" > "$work/k.json" 2>"$work/k.err" &
        cli=$!
        sleep 5; kill -9 "$S2" 2>/dev/null || true
        if wait $cli; then
            killed+=("$(jget "$work/k.json" '"%.4f" % d["offload"]["weights"]["failover_fetch_s"]')")
            normal+=("$(jget "$work/k.json" '(lambda w: "%.4f" % ((w["io_busy_s"] - w["degraded_fetch_s"] - w["failover_fetch_s"]) / (w["layer_fetches"] - w["degraded_fetches"] - 1)))(d["offload"]["weights"])')")
            degraded+=("$(jget "$work/k.json" '(lambda w: "%.4f" % (w["degraded_fetch_s"] / max(1, w["degraded_fetches"])))(d["offload"]["weights"])')")
        else
            echo "  kill run failed: $(tail -2 "$work/k.err")"
        fi
        S2=$(sl_serve m2 7301 --capacity 1G --token-file "$work/tok")
        sl_exec c "$FT" "${b[@]}" > /dev/null 2>&1 || true   # refills m2
        # the link cut instead (nothing returns; given up after --failover-timeout)
        sl_exec c "$FT" "${b[@]}" --failover-timeout 200 > "$work/c.json" 2>"$work/c.err" &
        cli=$!
        sleep 5; sl_cut m2; sleep 3; sl_restore m2
        wait $cli && cut+=("$(jget "$work/c.json" '"%.4f" % d["offload"]["weights"]["failover_fetch_s"]')")
        echo "  round $r: layer fetch ${normal[-1]:-?} s; the fetch m2 died in ${killed[-1]:-?} s; with m2 gone ${degraded[-1]:-?} s; link cut (200 ms timeout) ${cut[-1]:-?} s"
    done
    n=$(median "${normal[@]}"); k=$(median "${killed[@]}"); g=$(median "${degraded[@]}"); c=$(median "${cut[@]}")
    echo "| | seconds | extra over a normal fetch, in normal fetches |"
    echo "|---|---|---|"
    echo "| a layer's fetch, both nodes | $n | |"
    echo "| the fetch during which m2 is killed (kill -9) | $k | $(python3 -c "print('%.2f' % ((float('$k') - float('$n')) / float('$n')))" 2>/dev/null) |"
    echo "| the fetch during which m2's link is cut (--failover-timeout 200) | $c | $(python3 -c "print('%.2f' % ((float('$c') - float('$n')) / float('$n')))" 2>/dev/null) |"
    echo "| a layer's fetch with m2 gone (one rail) | $g | |"
    kill $S1 $S2 2>/dev/null || true
fi

if [[ " $PARTS " == *" pipeline "* ]]; then
    echo "## pipeline: batch $PBATCH, prompt $PPROMPT, $PGEN new tokens, one compute thread per process"
    # Wall-clock throughput needs a free core per stage; on a shared machine
    # the CPU-time figures say what dedicated cores would give: the run's
    # CPU time in one process over the busiest stage's CPU time (each
    # stage's process CPU during the run: the driver's from its JSON, the
    # workers' from their logs).
    export UCX_TLS=tcp
    pb=(bench run --model "$MODEL" --batch "$PBATCH" --prompt-len "$PPROMPT" --gen-len "$PGEN" --threads 1 --json)
    worker() {   # host address port (c: its pipeline NIC, 10.212.3.1)
        rm -f "$work/w-$1.log"
        sl_exec "$1" env FLEXTIER_LOG=info "$FT" worker --models "$(dirname "$MODEL")" --listen "$2:$3" --token-file "$work/tok" --trusted-network \
            --once > "$work/w-$1.log" 2>&1 &
        for _ in $(seq 200); do grep -q "listening on" "$work/w-$1.log" 2>/dev/null && break; sleep 0.05; done
    }
    wrss() { sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' "$work/w-$1.log" | tail -1; }
    wcpu() { sed -n 's/.*run ended (CPU \([0-9.]*\) s.*/\1/p' "$work/w-$1.log" | tail -1; }
    dcpu() { jget "$1" '"%.3f" % (d["prefill_cpu_s"] + d["decode_cpu_s"])'; }
    s1=(); s2=(); s3=(); r1=(); r2=(); r3=(); q2=(); q3=()
    for r in $(seq "$REPS"); do
        c1=""
        sl_exec p2 "$FT" "${pb[@]}" > "$work/p1.json" 2>/dev/null && {
            s1+=("$(jget "$work/p1.json" 'd["throughput_tok_s"]')"); r1+=("$(jget "$work/p1.json" 'd["peak_rss_bytes"] / 1048576')")
            c1=$(dcpu "$work/p1.json"); }
        worker p1 10.212.3.11 7400
        sl_exec p2 "$FT" "${pb[@]}" --pipeline 10.212.3.11:7400 --worker-token-file "$work/tok" --trusted-network \
            ${MICRO:+--micro-batches $MICRO} > "$work/p2.json" 2>"$work/p2.err" && {
            sleep 0.5
            s2+=("$(jget "$work/p2.json" 'd["throughput_tok_s"]')")
            r2+=("$(python3 -c "print(max(float('$(jget "$work/p2.json" 'd["peak_rss_bytes"] / 1048576')'), float('$(wrss p1)' or 0)))")")
            q2+=("$(python3 -c "print('%.2f' % (float('$c1') / max(float('$(dcpu "$work/p2.json")'), float('$(wcpu p1)' or 0))))" 2>/dev/null)"); } \
            || echo "  2 stages failed: $(tail -2 "$work/p2.err")"
        worker c 10.212.3.1 7401; worker p1 10.212.3.11 7400
        sl_exec p2 "$FT" "${pb[@]}" --pipeline 10.212.3.1:7401,10.212.3.11:7400 --worker-token-file "$work/tok" \
            --trusted-network ${MICRO:+--micro-batches $MICRO} > "$work/p3.json" 2>"$work/p3.err" && {
            sleep 0.5
            s3+=("$(jget "$work/p3.json" 'd["throughput_tok_s"]')")
            r3+=("$(python3 -c "print(max(float('$(jget "$work/p3.json" 'd["peak_rss_bytes"] / 1048576')'), float('$(wrss c)' or 0), float('$(wrss p1)' or 0)))")")
            q3+=("$(python3 -c "print('%.2f' % (float('$c1') / max(float('$(dcpu "$work/p3.json")'), float('$(wcpu c)' or 0), float('$(wcpu p1)' or 0))))" 2>/dev/null)"); } \
            || echo "  3 stages failed: $(tail -2 "$work/p3.err")"
        echo "  round $r: 1 process ${s1[-1]:-?} tok/s (${r1[-1]:-?} MiB, CPU $c1 s); 2 stages ${s2[-1]:-?} tok/s (largest stage ${r2[-1]:-?} MiB; CPU-bound ${q2[-1]:-?}x; worker CPU $(wcpu p1) s); 3 stages ${s3[-1]:-?} tok/s (${r3[-1]:-?} MiB; CPU-bound ${q3[-1]:-?}x)"
    done
    a=$(median "${s1[@]}"); b2=$(median "${s2[@]}"); c3=$(median "${s3[@]}")
    ra=$(median "${r1[@]}"); rb=$(median "${r2[@]}"); rc=$(median "${r3[@]}")
    qb=$(median "${q2[@]}"); qc=$(median "${q3[@]}")
    echo "load average during the runs: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
    echo "| processes | generated tok/s (wall) | vs one process | CPU-bound ratio (one core per stage) | largest peak RSS of a stage, MiB | vs one process |"
    echo "|---|---|---|---|---|---|"
    echo "| 1 (single process) | $a | 1.00x | 1.00x | $ra | 1.00x |"
    echo "| 2 stages (p1, p2) | $b2 | $(python3 -c "print('%.2fx' % (float('$b2')/float('$a')))" 2>/dev/null) | ${qb}x | $rb | $(python3 -c "print('%.2fx' % (float('$rb')/float('$ra')))" 2>/dev/null) |"
    echo "| 3 stages (c, p1, p2) | $c3 | $(python3 -c "print('%.2fx' % (float('$c3')/float('$a')))" 2>/dev/null) | ${qc}x | $rc | $(python3 -c "print('%.2fx' % (float('$rc')/float('$ra')))" 2>/dev/null) |"
fi

if [[ " $PARTS " == *" transports "* ]]; then
    if ! command -v mpirun >/dev/null || ! "$FT" run --help | grep -q "MPI: built in"; then
        echo "## transports: skipped (no mpirun, or a CLI without MPI)"
    else
        echo "## transports: 2 stages as ranks of one mpirun on this host, batch $PBATCH, prompt $PPROMPT, $PGEN new tokens"
        mpi=(mpirun --allow-run-as-root --oversubscribe -n 2 --mca btl self,tcp --mca pml ob1 -x UCX_TLS=tcp)
        tb=(bench run --model "$MODEL" --batch "$PBATCH" --prompt-len "$PPROMPT" --gen-len "$PGEN" --threads 1 --json
            --pipeline mpi --trusted-network ${MICRO:+--micro-batches $MICRO})
        declare -A T
        for t in mpi ucx; do
            vals=()
            for r in $(seq "$REPS"); do
                "${mpi[@]}" "$FT" "${tb[@]}" --pipe-transport "$t" > "$work/t.json" 2> "$work/t.err" \
                    || { echo "  $t run failed: $(tail -2 "$work/t.err")"; continue; }
                v=$(jget "$work/t.json" 'd["throughput_tok_s"]'); vals+=("$v")
                echo "  $t run $r: $v generated tok/s"
            done
            T[$t]=$(median "${vals[@]}")
        done
        echo "| activations over | generated tok/s | vs MPI |"
        echo "|---|---|---|"
        for t in mpi ucx; do
            echo "| $t | ${T[$t]} | $(python3 -c "print('%.2fx' % (float('${T[$t]}') / float('${T[mpi]}')))" 2>/dev/null) |"
        done
    fi
fi
