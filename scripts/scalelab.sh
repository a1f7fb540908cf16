#!/usr/bin/env bash
# scalelab.sh - the scale-out lab (run as root): network namespaces with
# their own rate-limited links, for multi-rail clients, replicated memory
# nodes and pipelines across hosts (docs/pipeline.md, "The lab").
#
# Hosts (one namespace each) and their links; every link is a veth pair to
# a bridge in a switch namespace, limited in both directions (tc tbf):
#
#   c    the client: rail0 10.212.1.1 (br0), rail1 10.212.2.1 (br1),
#        pnet 10.212.3.1 (br2)
#   m1   memory node on rail 0: 10.212.1.11      (link m1)
#   m2   memory node on rail 1: 10.212.2.12      (link m2)
#   m3   memory node on rail 0: 10.212.1.13      (link m3)
#   p1   pipeline host: 10.212.3.11              (link p1)
#   p2   pipeline host: 10.212.3.12              (link p2)
#
# The client's NICs are links c-r0, c-r1, c-p. A rail is one NIC: the
# client reaches m1 and m3 through rail0, m2 through rail1 (the routing
# table picks it); the nodes of one rail share its bandwidth.
#
# Sourced:  . scripts/scalelab.sh; sl_up; sl_rate all 1gbit; sl_exec c CMD..;
#           sl_cut m2; sl_restore m2; sl_down
# Command:  scripts/scalelab.sh up [RATE] | down | info   (SL_ID names the lab)
#
# Names carry SL_ID (default: the PID), so concurrent labs do not collide.
# Processes started in a namespace are stopped by sl_down.

SL_ID=${SL_ID:-$$}
SL_HOSTS="c m1 m2 m3 p1 p2"
SL_LINKS="c-r0 c-r1 c-p m1 m2 m3 p1 p2"

sl_ns() { echo "ftsl$SL_ID-$1"; }
sl_exec() { local h=$1; shift; ip netns exec "$(sl_ns "$h")" "$@"; }

# IP of a host (on its first network; c: rail0).
sl_ip() {
    case $1 in
    c|c-r0) echo 10.212.1.1 ;; c-r1) echo 10.212.2.1 ;; c-p) echo 10.212.3.1 ;;
    m1) echo 10.212.1.11 ;; m2) echo 10.212.2.12 ;; m3) echo 10.212.1.13 ;;
    p1) echo 10.212.3.11 ;; p2) echo 10.212.3.12 ;;
    *) echo "scalelab: no host $1" >&2; return 1 ;;
    esac
}
# The interface a host's traffic leaves by (UCX_NET_DEVICES).
sl_dev() {
    case $1 in
    c|c-r0) echo rail0 ;; c-r1) echo rail1 ;; c-p) echo pnet ;;
    *) echo eth0 ;;
    esac
}

sl_down() {
    local h pids
    for h in $SL_HOSTS sw; do
        pids=$(ip netns pids "$(sl_ns $h)" 2>/dev/null || true)
        [ -n "$pids" ] && kill $pids 2>/dev/null && sleep 0.2
        pids=$(ip netns pids "$(sl_ns $h)" 2>/dev/null || true)
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null
        ip netns del "$(sl_ns $h)" 2>/dev/null || true
    done
    return 0
}

# veth from host namespace $1 (interface $2, address $3/24) to bridge $4 in
# the switch namespace (port named $5).
_sl_link() {
    ip link add "$2" netns "$(sl_ns $1)" type veth peer name "$5" netns "$(sl_ns sw)" || return 1
    ip -n "$(sl_ns $1)" addr add "$3/24" dev "$2"
    ip -n "$(sl_ns $1)" link set "$2" up
    ip -n "$(sl_ns sw)" link set "$5" master "$4"
    ip -n "$(sl_ns sw)" link set "$5" up
}

sl_up() {
    [ "$(id -u)" = 0 ] || { echo "scalelab: must run as root" >&2; return 1; }
    command -v tc >/dev/null || { echo "scalelab: tc (iproute2) missing" >&2; return 1; }
    sl_down
    local h
    for h in $SL_HOSTS sw; do
        ip netns add "$(sl_ns $h)" || return 1
        ip -n "$(sl_ns $h)" link set lo up
    done
    for b in br0 br1 br2; do
        ip -n "$(sl_ns sw)" link add "$b" type bridge || return 1
        ip -n "$(sl_ns sw)" link set "$b" up
    done
    _sl_link c rail0 10.212.1.1 br0 c-r0 &&
    _sl_link c rail1 10.212.2.1 br1 c-r1 &&
    _sl_link c pnet 10.212.3.1 br2 c-p &&
    _sl_link m1 eth0 10.212.1.11 br0 m1 &&
    _sl_link m2 eth0 10.212.2.12 br1 m2 &&
    _sl_link m3 eth0 10.212.1.13 br0 m3 &&
    _sl_link p1 eth0 10.212.3.11 br2 p1 &&
    _sl_link p2 eth0 10.212.3.12 br2 p2 || { echo "scalelab: links failed" >&2; return 1; }
    # UCX uses a device only once its link is up: wait for carrier
    local i ok
    for i in $(seq 100); do
        ok=1
        for h in "c rail0" "c rail1" "c pnet" "m1 eth0" "m2 eth0" "m3 eth0" "p1 eth0" "p2 eth0"; do
            set -- $h
            [ "$(sl_exec "$1" cat /sys/class/net/"$2"/operstate 2>/dev/null)" = up ] || ok=0
        done
        [ $ok = 1 ] && break
        sleep 0.1
    done
    [ $ok = 1 ] || { echo "scalelab: links did not come up" >&2; return 1; }
    # the bridges forward at once (no STP), but give them a ping to learn
    sl_exec c ping -c1 -W2 10.212.1.11 >/dev/null 2>&1 || true
    sl_exec c ping -c1 -W2 10.212.2.12 >/dev/null 2>&1 || true
    sl_exec c ping -c1 -W2 10.212.1.13 >/dev/null 2>&1 || true
    sl_exec p1 ping -c1 -W2 10.212.3.12 >/dev/null 2>&1 || true
    sl_exec c ping -c1 -W2 10.212.3.11 >/dev/null 2>&1 || true
    return 0
}

# tbf on both ends of a link (the host's NIC and its switch port): each
# direction limited to RATE. LINK: a name of SL_LINKS or "all";
# RATE "unlimited" removes the limit.
sl_rate() {
    local link=$1 rate=$2 l
    if [ "$link" = all ]; then
        for l in $SL_LINKS; do sl_rate "$l" "$rate" || return 1; done
        return 0
    fi
    local host dev
    case $link in
    c-r0) host=c dev=rail0 ;; c-r1) host=c dev=rail1 ;; c-p) host=c dev=pnet ;;
    *) host=$link dev=eth0 ;;
    esac
    local pair
    for pair in "$host $dev" "sw $link"; do
        set -- $pair
        ip -n "$(sl_ns $1)" link set "$2" txqueuelen 1000 2>/dev/null
        tc -n "$(sl_ns $1)" qdisc del dev "$2" root 2>/dev/null || true
        if [ "$rate" != unlimited ]; then
            # burst ~ rate x 1 ms (at least 64 KB), queue ~ 20 ms
            local bits=${rate%gbit} burst
            case $rate in *gbit) burst=$(( bits * 125000 )) ;; *) burst=65536 ;; esac
            [ "$burst" -lt 65536 ] && burst=65536
            tc -n "$(sl_ns $1)" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 20ms || return 1
        fi
    done
}

# Cut a host's link (its switch port goes down: packets vanish, no reset
# reaches anyone, as when a cable is pulled) and restore it.
sl_cut() { ip -n "$(sl_ns sw)" link set "$1" down; }
sl_restore() { ip -n "$(sl_ns sw)" link set "$1" up; }

# A fresh token file (32 random bytes in hex, mode 0600).
sl_token() { (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$1"); }

# Start `flextier serve` on host $1 port $2 in the background (more
# options follow); waits until it listens; echoes its PID. Log: $SL_LOG_DIR.
sl_serve() {
    local h=$1 port=$2 ft=${FT:-flextier}; shift 2
    local log=${SL_LOG_DIR:-/tmp}/ftsl$SL_ID-serve-$h.log
    # ip netns exec execs the command: $! is the node itself (kill -9 hits
    # it, not a subshell around it). The log emptied first: the child opens
    # it after this shell goes on, and a node of the same host's earlier
    # "listening on" read as this one's start (a client then met a refused
    # connection, seen once under make test's load)
    : > "$log"
    ip netns exec "$(sl_ns "$h")" "$ft" serve --listen "$(sl_ip "$h"):$port" "$@" > "$log" 2>&1 &
    local pid=$! i
    for i in $(seq 100); do
        grep -q "listening on" "$log" 2>/dev/null && { echo "$pid"; return 0; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    echo "scalelab: serve on $h did not start:" >&2
    cat "$log" >&2
    return 1
}

sl_info() {
    echo "scale-out lab $SL_ID: namespaces $(for h in $SL_HOSTS; do printf '%s ' "$(sl_ns $h)"; done)"
    for h in $SL_HOSTS; do printf '  %-3s %s\n' "$h" "$(sl_exec "$h" ip -4 -o addr show 2>/dev/null | awk '$2 != "lo" {print $2, $4}' | tr '\n' ' ')"; done
    for l in $SL_LINKS; do
        local host dev
        case $l in c-r0) host=c dev=rail0 ;; c-r1) host=c dev=rail1 ;; c-p) host=c dev=pnet ;; *) host=$l dev=eth0 ;; esac
        printf '  link %-5s %s\n' "$l" "$(tc -n "$(sl_ns $host)" qdisc show dev "$dev" | head -1)"
    done
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case "${1:-}" in
    up) sl_up && sl_rate all "${2:-1gbit}" && sl_info ;;
    down) sl_down ;;
    info) sl_info ;;
    *) sed -n '2,30p' "$0"; exit 2 ;;
    esac
fi
