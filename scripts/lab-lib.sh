# lab-lib.sh - sourced by the link-limited lab scripts (run as root).
# Two network namespaces joined by a veth pair, each direction rate-limited
# with tc tbf. Addresses exist only inside the namespaces.
#   lab_up; lab_rate 1gbit; lab_srv CMD... (background); lab_cli CMD...; lab_down
# per-run names, so concurrent runs (CI jobs, other users) do not collide
LAB_NS_S=${LAB_NS_S:-ft-lab-srv-$$}
LAB_NS_C=${LAB_NS_C:-ft-lab-cli-$$}
LAB_VS=${LAB_VS:-fts$$}
LAB_VC=${LAB_VC:-ftc$$}
LAB_IP_S=10.201.0.1
LAB_IP_C=10.201.0.2

lab_down() {
    # Processes started inside a namespace outlive its deletion: stop them.
    local ns pids
    for ns in "$LAB_NS_S" "$LAB_NS_C"; do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -n "$pids" ] && kill $pids 2>/dev/null && sleep 0.2
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null
        ip netns del "$ns" 2>/dev/null || true
    done
}

lab_up() {
    [ "$(id -u)" = 0 ] || { echo "lab: must run as root" >&2; return 1; }
    lab_down
    ip netns add "$LAB_NS_S"
    ip netns add "$LAB_NS_C"
    ip link add "$LAB_VS" type veth peer name "$LAB_VC"
    ip link set "$LAB_VS" netns "$LAB_NS_S"
    ip link set "$LAB_VC" netns "$LAB_NS_C"
    ip -n "$LAB_NS_S" addr add "$LAB_IP_S/24" dev "$LAB_VS"
    ip -n "$LAB_NS_C" addr add "$LAB_IP_C/24" dev "$LAB_VC"
    for ns in "$LAB_NS_S" "$LAB_NS_C"; do ip -n "$ns" link set lo up; done
    ip -n "$LAB_NS_S" link set "$LAB_VS" up
    ip -n "$LAB_NS_C" link set "$LAB_VC" up
    # UCX only uses a device whose link is up: wait for carrier on both ends
    for _ in $(seq 50); do
        [ "$(ip netns exec "$LAB_NS_S" cat /sys/class/net/"$LAB_VS"/operstate)" = up ] &&
        [ "$(ip netns exec "$LAB_NS_C" cat /sys/class/net/"$LAB_VC"/operstate)" = up ] && return 0
        sleep 0.1
    done
    echo "lab: veth did not come up" >&2
    return 1
}

# tbf on both ends (each direction limited); "unlimited" removes it.
lab_rate() {
    local rate=$1 pair
    for pair in "$LAB_NS_S $LAB_VS" "$LAB_NS_C $LAB_VC"; do
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

# UCX over TCP on the veth only (shared memory would bypass the link).
lab_srv() { UCX_TLS=tcp UCX_NET_DEVICES="$LAB_VS" ip netns exec "$LAB_NS_S" "$@"; }
lab_cli() { UCX_TLS=tcp UCX_NET_DEVICES="$LAB_VC" ip netns exec "$LAB_NS_C" "$@"; }

# A fresh token for the lab's node (it listens on a non-loopback address,
# which a node refuses without one): 32 random bytes in hex, mode 0600.
lab_token() { (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$1"); }
