#!/usr/bin/env bash
# netlab.sh - a link-limited lab for the memory node (run as root).
#
# Makes two network namespaces joined by a veth pair, limits the link with
# tc (tbf) in both directions, runs `flextier serve` in one namespace and
# `flextier bench transfer` in the other, once per rate and codec, and
# tears everything down on exit (also on error or Ctrl-C).
#
#   scripts/netlab.sh [-b BUILD_DIR] [-r "1gbit 10gbit"] [-c "raw zstd bp q4"]
#                     [-t "tcp ucx"] [-s SIZE] [-n ITERS] [-d DEPTH] [-j] [--no-limit]
#
# Addresses live only inside the namespaces: 10.201.0.1/24 (server, ns
# ft-lab-srv-PID) and 10.201.0.2/24 (client, ns ft-lab-cli-PID). The node
# has a fresh token. Data paths (-t): tcp = FlexTier's own TCP path (the
# default for a node on another host without RDMA); ucx = UCX over TCP,
# which the node allows only with --trusted-network. UCX is pinned to TCP
# over the veth (UCX_TLS=tcp, UCX_NET_DEVICES=<veth>). ucx_perftest
# (ucp_am_bw) runs over the same link in the same run for the side-by-side
# number.
set -euo pipefail

BUILD=build
RATES="1gbit 10gbit"
CODECS="raw zstd"
TRANSPORTS="tcp"
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
    -t) TRANSPORTS=$2; shift 2 ;;
    -s) SIZE=$2; shift 2 ;;
    -n) ITERS=$2; shift 2 ;;
    -d) DEPTH=$2; shift 2 ;;
    -j) JSON=--json; shift ;;
    --no-limit) LIMIT=0; RATES=unlimited; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "netlab.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

[ "$(id -u)" = 0 ] || { echo "netlab.sh: must run as root" >&2; exit 1; }
FT=$(readlink -f "$BUILD/flextier")
[ -x "$FT" ] || { echo "netlab.sh: $BUILD/flextier not built" >&2; exit 1; }
command -v ucx_perftest >/dev/null || echo "netlab.sh: ucx_perftest missing (ucx-utils): no side-by-side number" >&2

. "$(dirname "$0")/lab-lib.sh"
NS_S=$LAB_NS_S NS_C=$LAB_NS_C VS=$LAB_VS VC=$LAB_VC IP_S=$LAB_IP_S IP_C=$LAB_IP_C
PORT=13337
PT_PORT=13338
SRV_PID=""
PT_PID=""
FAILED=0
LOG=$(mktemp /tmp/ft-netlab-serve.XXXXXX)
TOKEN=$(mktemp /tmp/ft-netlab-token.XXXXXX)

cleanup() {
    set +e
    [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null
    stop_perftest_server
    lab_down
    rm -f "$LOG" "$TOKEN"
}
trap cleanup EXIT INT TERM
lab_up || exit 1

export UCX_TLS=tcp
export FLEXTIER_TIMEOUT_MS=120000
lab_token "$TOKEN"
export FLEXTIER_TOKEN_FILE=$TOKEN

set_rate() { lab_rate "$1"; }

start_server() {   # extra serve options...
    UCX_NET_DEVICES=$VS ip netns exec $NS_S "$FT" serve --listen $IP_S:$PORT --capacity 2G \
        --token-file "$TOKEN" "$@" > $LOG 2>&1 &
    SRV_PID=$!
    for _ in $(seq 50); do
        grep -q "^flextier serve: listening on" $LOG 2>/dev/null && return 0
        kill -0 "$SRV_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "netlab.sh: server did not start:" >&2
    cat $LOG >&2
    exit 1
}

# A ucx_perftest server serves one test and exits; bench transfer runs one
# before and one after its own phases: keep restarting it.
start_perftest_server() {
    command -v ucx_perftest >/dev/null || return 0
    ip netns exec $NS_S env UCX_NET_DEVICES=$VS UCX_TLS=$UCX_TLS \
        sh -c "while :; do ucx_perftest -p $PT_PORT >/dev/null 2>&1; sleep 0.1; done" &
    PT_PID=$!
    sleep 0.3
}

stop_perftest_server() {   # the keeper first, so that it does not start another
    [ -n "$PT_PID" ] || return 0
    local kids
    kids=$(pgrep -P "$PT_PID" 2>/dev/null || true)
    kill "$PT_PID" 2>/dev/null || true
    wait "$PT_PID" 2>/dev/null || true
    # (a child may exit between pgrep and kill: under set -e, a failed
    # kill as the function's last status ended the whole lab silently)
    [ -z "$kids" ] || kill $kids 2>/dev/null || true
    PT_PID=""
}

echo "# netlab: server $IP_S:$PORT in $NS_S, client in $NS_C, UCX_TLS=$UCX_TLS, size $SIZE, depth $DEPTH, iters $ITERS"
for tr in $TRANSPORTS; do
    case $tr in
    tcp) start_server; export FLEXTIER_TRANSPORT=tcp ;;
    ucx) start_server --trusted-network; export FLEXTIER_TRANSPORT=ucx ;;
    *) echo "netlab.sh: unknown transport $tr (tcp, ucx)" >&2; exit 2 ;;
    esac
    for rate in $RATES; do
        [ "$LIMIT" = 1 ] && set_rate "$rate"
        for codec in $CODECS; do
            echo "## data path $tr, link $rate, codec $codec"
            start_perftest_server
            PT_ARGS=(--perftest-host $IP_S --perftest-port $PT_PORT)
            command -v ucx_perftest >/dev/null || PT_ARGS=(--no-perftest)
            UCX_NET_DEVICES=$VC ip netns exec $NS_C "$FT" bench transfer ucx://$IP_S:$PORT \
                --size "$SIZE" -c "$codec" --depth "$DEPTH" --iters "$ITERS" $JSON "${PT_ARGS[@]}" || \
                { echo "netlab.sh: bench failed for $tr/$rate/$codec" >&2; FAILED=1; }
            stop_perftest_server
        done
    done
    kill "$SRV_PID" 2>/dev/null || true
    wait "$SRV_PID" 2>/dev/null || true
    SRV_PID=""
done
exit $FAILED
