#!/usr/bin/env bash
# The installed library as an outside program sees it: `cmake --install`
# into a temporary prefix, then small programs built against the installed
# headers only:
#   - with pkg-config: codec_only.c against flextier-codec alone (shared
#     and static), full.c against flextier (shared and static), which opens
#     a session on a model the installed `flextier gen-model` wrote;
#   - with find_package(flextier): the same four through the CMake package
#     (tests/install/consumer);
# each run. The codec-only programs must not pull in UCX, BLAS, json-c or
# the other FlexTier libraries (ldd, nm); every function declared FT_API
# in the installed headers must be exported by the shared libraries, and
# they export nothing but ft_* symbols.
# The CUDA backend: no installed program or library loads a CUDA library
# or libstdc++ by itself; with PLUGIN=1 (a CUDA build) the plugin is
# installed in lib/flextier/ and the installed program and a program
# linking the installed libflextier.so open that one.
#   test_install.sh BUILD_DIR C_COMPILER [CMAKE [PLUGIN]]
set -euo pipefail
build=$1
cc=$2
cmake=${3:-cmake}
plugin=${4:-0}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work=$(mktemp -d /tmp/ft_install.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix="$work/prefix"
"$cmake" --install "$build" --prefix "$prefix" > "$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
pc=$(find "$prefix" -name flextier.pc -print -quit)
[ -n "$pc" ] || fail "no flextier.pc installed"
pcdir=$(dirname "$pc")
libdir=$(dirname "$pcdir")
for f in include/flextier/flextier.h include/flextier/core.h bin/flextier; do
    [ -e "$prefix/$f" ] || fail "$f not installed"
done
for l in flextier flextier-store flextier-codec; do
    [ -e "$libdir/lib$l.a" ] || fail "lib$l.a not installed"
    [ -e "$libdir/lib$l.so" ] || fail "lib$l.so not installed"
    [ -e "$pcdir/$l.pc" ] || fail "$l.pc not installed"
done
"$prefix/bin/flextier" version > /dev/null || fail "installed flextier does not run"
# a tiny model directory for the full programs' sessions
model="$work/model"
"$prefix/bin/flextier" gen-model --arch llama --out "$model" --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
    --ffn 96 --vocab 300 --seed 3 > /dev/null || fail "installed flextier gen-model"
export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
[ "$(pkg-config --modversion flextier)" = "$(pkg-config --modversion flextier-codec)" ] || fail "pc versions"

# What a codec-only program must not load or contain.
forbidden_libs='libucp|libucs|libuct|libopenblas|libblas|libjson-c|libcrypto|libpcre2|libutf8proc|libcudart|libcublas|libflextier\.so|libflextier-store'
check_codec_only() {   # $1: program
    # (output captured first: with pipefail, grep closing the pipe early
    # would fail the producer with SIGPIPE)
    local deps syms
    deps=$(ldd "$1")
    syms=$(nm "$1")
    if grep -E "$forbidden_libs" <<< "$deps"; then fail "$(basename "$1") loads the libraries above"; fi
    if grep -E ' [TtUu] (ucp_|ucs_|uct_|cblas_|openblas|json_object|ft_store_|ft_model_|ft_ctx_)' <<< "$syms"; then
        fail "$(basename "$1") contains or needs code beyond the codec"
    fi
}
rpath_of() {   # -Wl,-rpath for every -L of a pkg-config answer
    local d
    for d in $(pkg-config --static --libs-only-L "$@" | sed 's/-L//g'); do printf ' -Wl,-rpath,%s' "$d"; done
}
static_libs() {   # our libraries as archives, the rest as pkg-config says
    pkg-config --static --libs "$@" | sed -E 's/-l(flextier(-store|-codec)?)( |$)/-l:lib\1.a\3/g'
}

cd "$work"
# --- pkg-config
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror "$here/codec_only.c" $(pkg-config --cflags --libs flextier-codec) \
    -Wl,-rpath,"$libdir" -o pc_codec_shared || fail "codec_only (pkg-config, shared) does not build"
./pc_codec_shared > /dev/null || fail "pc_codec_shared"
grep -q 'libflextier-codec\.so' <<< "$(ldd pc_codec_shared)" || fail "pc_codec_shared does not load libflextier-codec.so"
check_codec_only pc_codec_shared
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror "$here/codec_only.c" $(pkg-config --cflags flextier-codec) \
    $(static_libs flextier-codec) -o pc_codec_static || fail "codec_only (pkg-config, static) does not build"
./pc_codec_static > /dev/null || fail "pc_codec_static"
if grep -q libflextier <<< "$(ldd pc_codec_static)"; then fail "pc_codec_static loads a FlexTier shared library"; fi
check_codec_only pc_codec_static
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror "$here/full.c" $(pkg-config --cflags --libs flextier) \
    -Wl,-rpath,"$libdir" -o pc_full_shared || fail "full (pkg-config, shared) does not build"
./pc_full_shared "$model" > full.out || { cat full.out; fail "pc_full_shared"; }
grep -q "^session: " full.out || fail "pc_full_shared"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror "$here/full.c" $(pkg-config --cflags flextier) \
    $(static_libs flextier) $(rpath_of flextier) -o pc_full_static || fail "full (pkg-config, static) does not build"
./pc_full_static "$model" > /dev/null || fail "pc_full_static"

# --- the CUDA backend: a plugin, loaded only when asked
for p in "$prefix/bin/flextier" "$libdir/libflextier.so" pc_full_shared pc_full_static; do
    if grep -E 'libcudart|libcublas|libstdc\+\+' <<< "$(ldd "$p")"; then fail "$(basename "$p") loads CUDA or libstdc++"; fi
done
if [ "$plugin" = 1 ]; then
    [ -e "$libdir/flextier/libflextier-cuda.so" ] || fail "lib/flextier/libflextier-cuda.so not installed"
    # found relative to the installed program (bin/../lib/flextier) ...
    LD_DEBUG=files env -u FLEXTIER_CUDA_PLUGIN "$prefix/bin/flextier" run --model "$model" --prompt hi \
        --max-new-tokens 2 --device cuda > /dev/null 2> cuda_run.err || true
    grep -qF "file=$libdir/flextier/libflextier-cuda.so" cuda_run.err || { grep -E 'file=|flextier:' cuda_run.err; fail "installed flextier did not open the installed plugin"; }
    grep -q 'CUDA device: \(no NVIDIA GPU or driver found\|no usable CUDA device\)' cuda_run.err \
        || grep -q 'weights resident' cuda_run.err || { tail -3 cuda_run.err; fail "installed flextier --device cuda"; }
    # ... and relative to the installed libflextier.so (lib/flextier)
    LD_DEBUG=files env -u FLEXTIER_CUDA_PLUGIN ./pc_full_shared "$model" cuda > cuda_full.out 2> cuda_full.err \
        || { cat cuda_full.out; fail "pc_full_shared cuda"; }
    grep -qF "file=$libdir/flextier/libflextier-cuda.so" cuda_full.err || fail "pc_full_shared did not open the installed plugin"
    grep -q '^cuda: ' cuda_full.out || fail "pc_full_shared cuda"
else
    [ ! -e "$libdir/flextier/libflextier-cuda.so" ] || fail "a CUDA plugin was installed by a build without one"
fi

# --- find_package(flextier)
"$cmake" -S "$here/consumer" -B cm -DCMAKE_PREFIX_PATH="$prefix" -DFT_SRC="$here" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release > cm.log 2>&1 || { cat cm.log; fail "find_package consumer: configure"; }
"$cmake" --build cm > cmb.log 2>&1 || { cat cmb.log; fail "find_package consumer: build"; }
for p in codec_shared codec_static full_shared full_static; do
    "./cm/$p" "$model" > /dev/null || fail "find_package consumer: $p"
done
check_codec_only cm/codec_shared
check_codec_only cm/codec_static

# --- the exported symbols
nm -D --defined-only "$libdir"/libflextier*.so | awk 'NF == 3 && $2 ~ /[TWiV]/ { print $3 }' | sort -u > exported
# the declarations as the compiler sees them (comments and #if gone), with
# FT_API kept as a marker
echo '#include "flextier/flextier.h"' | "$cc" -E -P -DFT_API=FT_API_MARK -I"$prefix/include" -x c - \
    | tr '\n' ' ' | grep -oE 'FT_API_MARK [^;{(]*\(' \
    | sed -E 's/\($//; s/.*[^A-Za-z0-9_]([A-Za-z_][A-Za-z0-9_]*)$/\1/' | sort -u > declared
[ "$(wc -l < declared)" -gt 100 ] || fail "found only $(wc -l < declared) FT_API declarations"
# every function the public headers declare is marked FT_API (else the
# shared libraries hide it, and a program fails to link only when it calls it)
unmarked=$(echo '#include "flextier/flextier.h"' | "$cc" -E -P -DFT_API=FT_API_MARK -I"$prefix/include" -x c - \
    | tr '\n' ' ' | tr ';{}' '\n\n\n' | grep -E '^\s*[A-Za-z_][A-Za-z0-9_ *]*\bft_[a-z0-9_]+\s*\(' \
    | grep -v 'FT_API_MARK\|^\s*static\|typedef' || true)
[ -z "$unmarked" ] || fail "public functions without FT_API: $unmarked"
missing=$(comm -23 declared exported)
[ -z "$missing" ] || fail "declared FT_API but not exported: $missing"
stray=$(grep -v '^ft_' exported || true)
[ -z "$stray" ] || fail "exported symbols outside ft_*: $stray"
echo "install ok: $(wc -l < declared) public functions, $(wc -l < exported) exported" \
     "($(comm -13 declared exported | wc -l) internal entry points for the libraries above)"
