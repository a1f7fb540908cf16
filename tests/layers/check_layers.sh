#!/usr/bin/env bash
# The one-way arrows of docs/architecture.md, checked on the objects: an
# object of a layer may use symbols defined by its own layer or the layers
# below it, never one defined by a layer above. The layer of an object is
# the src/<layer>/ directory of its source, or of the CMakeLists.txt of
# its target (FT_CUDA=FAKE's emulation, tests/cuda/fake, counts as cuda).
#   check_layers.sh OBJECT...
set -euo pipefail
order="core codec net store agent model engine offload pipe cuda train session server"
rank() {   # layer name -> position in $order, or nothing
    local i=0 l
    for l in $order; do [ "$l" = "$1" ] && { echo $i; return; }; i=$((i + 1)); done
}
layer_of() {
    case "$1" in
    */tests/cuda/fake/*) echo cuda ;;
    # a target defined in src/<layer>/CMakeLists.txt (the CUDA plugin's)
    */src/*/CMakeFiles/*) echo "$1" | sed -nE 's#.*/src/([a-z]+)/CMakeFiles/.*#\1#p' ;;
    *) echo "$1" | sed -nE 's#.*/src/([a-z]+)/[^/]+$#\1#p' ;;
    esac
}
work=$(mktemp -d /tmp/ft_layers.XXXXXX)
trap 'rm -rf "$work"' EXIT
: > "$work/defs"
: > "$work/uses"
n=0
for o in "$@"; do
    l=$(layer_of "$o")
    r=$(rank "$l")
    [ -n "$r" ] || { echo "check_layers: no layer for $o" >&2; exit 1; }
    nm --defined-only "$o" | awk -v r="$r" -v l="$l" 'NF == 3 && $2 ~ /[TDBRVWC]/ { print $3, r, l }' >> "$work/defs"
    nm --undefined-only "$o" | awk -v r="$r" -v f="$o" '{ print $NF, r, f }' >> "$work/uses"
    n=$((n + 1))
done
# a use of a symbol defined by a layer above the user's
bad=$(awk 'NR == FNR { def[$1] = $2; lay[$1] = $3; next }
           ($1 in def) && def[$1] > $2 { print "  " $3 " uses " $1 " (" lay[$1] ")" }' "$work/defs" "$work/uses")
if [ -n "$bad" ]; then
    echo "layer arrows pointing up:"
    echo "$bad" | sed -E 's#[^ ]*/(src|tests)/#\1/#' | sort -u
    exit 1
fi
echo "layers ok: $n objects, no upward use ($order)"
