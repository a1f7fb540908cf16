#!/usr/bin/env bash
# netlab.sh - a link-limited lab for the memory node (run as root).
#
# Makes two network namespaces joined by a veth pair, limits the link with
# tc (tbf) in both directions, runs `flextier serve` in one namespace and
# `flextier bench transfer` in the other, once per rate and codec, and
# tears everything down on exit (also on error or Ctrl-C).
#
#   scripts/netlab.sh [-b BUILD_DIR] [-r "1gbit 10gbit"] [-c "raw zstd bp q4"]
#                     [-s SIZE] [-n ITERS] [-d DEPTH] [-j] [--no-limit]
#
# Addresses live only inside the namespaces: 10.201.0.1/24 (server, ns
# ft-lab-srv) and 10.201.0.2/24 (client, ns ft-lab-cli). UCX is pinned to
# TCP over the veth (UCX_TLS=tcp, UCX_NET_DEVICES=<veth>), because shared
# memory would bypass the link. ucx_perftest (ucp_am_bw) runs over the same
# link in the same run for the side-by-side number.
set -euo pipefail

BUILD=build
RATES="1gbit 10gbit"
CODECS="raw zstd"
SIZE=64M
ITERS=8
DEPTH=4
JSON=""
LIMIT=1
while [ $# -gt 0 ]; do
    case "$1" in
    -b) BUILD=$2; shift 2 ;;
    -r) RATES=$2; shift 2 ;;
    -c) CODECS=$2; shift 2 ;;
    -s) SIZE=$2; shift 2 ;;
    -n) ITERS=$2; shift 2 ;;
    -d) DEPTH=$2; shift 2 ;;
    -j) JSON=--json; shift ;;
    --no-limit) LIMIT=0; RATES=unlimited; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "netlab.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

[ "$(id -u)" = 0 ] || { echo "netlab.sh: must run as root" >&2; exit 1; }
FT=$(readlink -f "$BUILD/flextier")
[ -x "$FT" ] || { echo "netlab.sh: $BUILD/flextier not built" >&2; exit 1; }
command -v ucx_perftest >/dev/null || echo "netlab.sh: ucx_perftest missing (ucx-utils): no side-by-side number" >&2

NS_S=ft-lab-srv
NS_C=ft-lab-cli
VS=ftlab-s
VC=ftlab-c
IP_S=10.201.0.1
IP_C=10.201.0.2
PORT=13337
PT_PORT=13338
SRV_PID=""
PT_PID=""

cleanup() {
    set +e
    [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null
    [ -n "$PT_PID" ] && kill "$PT_PID" 2>/dev/null && wait "$PT_PID" 2>/dev/null
    ip netns del $NS_S 2>/dev/null
    ip netns del $NS_C 2>/dev/null
}
trap cleanup EXIT INT TERM
cleanup
trap cleanup EXIT INT TERM

ip netns add $NS_S
ip netns add $NS_C
ip link add $VS type veth peer name $VC
ip link set $VS netns $NS_S
ip link set $VC netns $NS_C
ip -n $NS_S addr add $IP_S/24 dev $VS
ip -n $NS_C addr add $IP_C/24 dev $VC
for ns in $NS_S $NS_C; do ip -n $ns link set lo up; done
ip -n $NS_S link set $VS up
ip -n $NS_C link set $VC up

export UCX_TLS=tcp
export FLEXTIER_TIMEOUT_MS=120000

set_rate() {   # tbf on both ends: each direction is limited
    local rate=$1
    for pair in "$NS_S $VS" "$NS_C $VC"; do
        set -- $pair
        ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null || true
        if [ "$rate" != unlimited ]; then
            # burst ~ rate x 1 ms (at least 64 KB), queue ~ 20 ms
            local bits=${rate%gbit}
            local burst=$(( bits * 125000 )); [ $burst -lt 65536 ] && burst=65536
            ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst $burst latency 20ms
        fi
    done
}

start_server() {
    UCX_NET_DEVICES=$VS ip netns exec $NS_S "$FT" serve --listen $IP_S:$PORT --capacity 2G \
        > /tmp/ft-netlab-serve.log 2>&1 &
    SRV_PID=$!
    for _ in $(seq 50); do
        grep -q "listening on" /tmp/ft-netlab-serve.log 2>/dev/null && return 0
        sleep 0.1
    done
    echo "netlab.sh: server did not start:" >&2
    cat /tmp/ft-netlab-serve.log >&2
    exit 1
}

start_perftest_server() {
    command -v ucx_perftest >/dev/null || return 0
    UCX_NET_DEVICES=$VS ip netns exec $NS_S ucx_perftest -p $PT_PORT >/dev/null 2>&1 &
    PT_PID=$!
    sleep 0.3
}

start_server
echo "# netlab: server $IP_S:$PORT in $NS_S, client in $NS_C, UCX_TLS=$UCX_TLS, size $SIZE, depth $DEPTH, iters $ITERS"
for rate in $RATES; do
    [ "$LIMIT" = 1 ] && set_rate "$rate"
    for codec in $CODECS; do
        echo "## link $rate, codec $codec"
        start_perftest_server
        PT_ARGS=(--perftest-host $IP_S --perftest-port $PT_PORT)
        command -v ucx_perftest >/dev/null || PT_ARGS=(--no-perftest)
        UCX_NET_DEVICES=$VC ip netns exec $NS_C "$FT" bench transfer ucx://$IP_S:$PORT \
            --size "$SIZE" -c "$codec" --depth "$DEPTH" --iters "$ITERS" $JSON "${PT_ARGS[@]}" || \
            echo "netlab.sh: bench failed for $rate/$codec" >&2
        if [ -n "$PT_PID" ]; then
            kill "$PT_PID" 2>/dev/null || true
            wait "$PT_PID" 2>/dev/null || true
            PT_PID=""
        fi
    done
done
