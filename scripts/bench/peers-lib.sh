# peers-lib.sh - shared by scripts/bench/llamacpp.sh and memlimit.sh (sourced,
# not run): the peers' build and Python environment, cached outside the
# repository and reused, and the model conversions. See docs/bench-peers.md.
#
# Cache layout ($PEERS_CACHE, default ~/.cache/flextier/peers):
#   llama.cpp-<ver>/src     the llama-cpp-python sdist's vendor/llama.cpp
#   llama.cpp-<ver>/build   its cmake build (llama-bench, llama-batched-bench,
#                           llama-quantize, llama-perplexity); a stamp file marks a
#                           finished build, so a rerun builds nothing
#   venv/                   Python for the converter and for transformers/accelerate
#   membw                   the streaming-read bandwidth probe (membw.c)
#   models/<key>/           generated checkpoints and their GGUF conversions
#                           (key = the gen-model arguments), reused across runs
# Every step fails loudly: a missing tool is named with the package that
# provides it; nothing falls back silently to something else.

PEERS_CACHE=${PEERS_CACHE:-$HOME/.cache/flextier/peers}
LLAMA_CPP_PY_VERSION=${LLAMA_CPP_PY_VERSION:-0.3.36}
PEERS_JOBS=${PEERS_JOBS:-$(nproc)}
PEERS_PYTHON=${PEERS_PYTHON:-python3}
# The peers' venv: the converter's pinned requirements plus these (accelerate
# for the disk-offload peer, safetensors for the converter's safetensors path).
PEERS_TORCH_INDEX=${PEERS_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PEERS_PIP_EXTRA=${PEERS_PIP_EXTRA:-"accelerate==1.10.1 safetensors"}

# FlexTier's weight formats and the llama.cpp types that match them (same
# bits per weight: q8_0 and q8 8.5, q4_0 and q4 4.5)
declare -A PEERS_LLAMA_FMT=([f32]=f32 [bf16]=bf16 [q8]=q8_0 [q4]=q4_0)
PEERS_QUANT_ARGS=${PEERS_QUANT_ARGS:-}

peers_die() { echo "${PEERS_PROG:-peers}: error: $*" >&2; exit 1; }
peers_log() { echo "${PEERS_PROG:-peers}: $*" >&2; }

# peers_need TOOL "how to get it" ...: fail clearly if a command is missing.
peers_need() {
    while [ $# -ge 2 ]; do
        command -v "$1" >/dev/null 2>&1 || peers_die "'$1' not found: $2"
        shift 2
    done
}

peers_llama_dir() { echo "$PEERS_CACHE/llama.cpp-$LLAMA_CPP_PY_VERSION"; }
peers_llama_bin() { echo "$(peers_llama_dir)/build/bin/$1"; }

# The llama-cpp-python sdist's vendor/llama.cpp in $(peers_llama_dir)/src
# (downloaded once). Serialized with a lock: two scripts may start at once.
peers_llamacpp_src() {
    local d; d=$(peers_llama_dir)
    [ -f "$d/src/CMakeLists.txt" ] && return 0
    peers_need "$PEERS_PYTHON" "install Python 3 (or set PEERS_PYTHON)" tar "apt-get install tar"
    mkdir -p "$d"
    (
        flock 9
        [ -f "$d/src/CMakeLists.txt" ] && exit 0
        tmp=$(mktemp -d "$d/.dl.XXXXXX")
        trap 'rm -rf "$tmp"' EXIT
        peers_log "downloading the llama-cpp-python $LLAMA_CPP_PY_VERSION sdist from PyPI (vendors llama.cpp)"
        "$PEERS_PYTHON" -m pip download --quiet --no-deps --no-binary :all: --dest "$tmp" \
            "llama-cpp-python==$LLAMA_CPP_PY_VERSION" \
            || peers_die "pip download llama-cpp-python==$LLAMA_CPP_PY_VERSION failed (is PyPI reachable?)"
        sd=$(ls "$tmp"/llama_cpp_python-*.tar.gz 2>/dev/null | head -1)
        [ -n "$sd" ] || peers_die "no sdist in $tmp after pip download"
        tar -xzf "$sd" -C "$tmp"
        v=$(ls -d "$tmp"/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | head -1)
        [ -n "$v" ] && [ -f "$v/CMakeLists.txt" ] || peers_die "the sdist has no vendor/llama.cpp"
        # a gitlink file, not a repository: ninja loops ("manifest still dirty") with it
        rm -rf "$v/.git"
        rm -rf "$d/src"
        mv "$v" "$d/src"
    ) 9>"$d/.src.lock"
}

# Build llama.cpp's tools with ninja (-DGGML_NATIVE=ON: for this CPU); a
# stamp marks a finished build, so reruns build nothing.
peers_build_llamacpp() {
    local d; d=$(peers_llama_dir)
    local stamp="$d/build/.flextier-built" t
    if [ ! -f "$stamp" ]; then
        peers_need cmake "apt-get install cmake" ninja "apt-get install ninja-build" c++ "apt-get install g++"
        peers_llamacpp_src
        (
            flock 9
            [ -f "$stamp" ] && exit 0
            peers_log "building llama.cpp in $d/build (-j$PEERS_JOBS; ~10-20 min on 2 cores, once)"
            cmake -S "$d/src" -B "$d/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
                -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >"$d/cmake.log" 2>&1 \
                || peers_die "cmake configure of llama.cpp failed; see $d/cmake.log"
            cmake --build "$d/build" -j "$PEERS_JOBS" --target llama-bench llama-batched-bench \
                llama-quantize llama-perplexity >"$d/build.log" 2>&1 \
                || peers_die "building llama.cpp failed; see $d/build.log"
            touch "$stamp"
        ) 9>"$d/.build.lock"
    fi
    for t in llama-bench llama-batched-bench llama-quantize llama-perplexity; do
        [ -x "$d/build/bin/$t" ] || peers_die "$d/build/bin/$t is missing though $stamp exists: remove $d/build and rerun"
    done
}

# llama-server (the serving peer, scripts/bench/serving.sh) in the same
# build tree: configured once more with LLAMA_BUILD_SERVER=ON (the other
# tools' flags are unchanged, so they are not rebuilt); its own stamp.
peers_build_llama_server() {
    peers_build_llamacpp
    local d; d=$(peers_llama_dir)
    local stamp="$d/build/.flextier-server-built"
    if [ ! -f "$stamp" ]; then
        (
            flock 9
            [ -f "$stamp" ] && exit 0
            peers_log "building llama-server in $d/build (-j$PEERS_JOBS; once)"
            cmake -S "$d/src" -B "$d/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
                -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON >"$d/cmake-server.log" 2>&1 \
                || peers_die "cmake configure of llama.cpp with the server failed; see $d/cmake-server.log"
            cmake --build "$d/build" -j "$PEERS_JOBS" --target llama-server >"$d/build-server.log" 2>&1 \
                || peers_die "building llama-server failed; see $d/build-server.log"
            touch "$stamp"
        ) 9>"$d/.build.lock"
    fi
    [ -x "$d/build/bin/llama-server" ] || peers_die "$d/build/bin/llama-server is missing though $stamp exists"
}

# The Python venv for convert_hf_to_gguf.py (the exact versions its
# requirements files pin; gguf from the vendored gguf-py) and for
# transformers + accelerate. torch: from PyTorch's CPU index when it is
# reachable, else (said loudly) the same version from PyPI, whose Linux
# wheel pulls the CUDA runtime wheels (~3 GB; nothing here uses a GPU).
peers_venv() {
    local v="$PEERS_CACHE/venv"
    local stamp="$v/.flextier-ready"
    PEERS_PY="$v/bin/python"
    [ -f "$stamp" ] && return 0
    peers_llamacpp_src
    local req; req="$(peers_llama_dir)/src/requirements"
    mkdir -p "$PEERS_CACHE"
    (
        flock 9
        [ -f "$stamp" ] && exit 0
        [ -x "$v/bin/python" ] || "$PEERS_PYTHON" -m venv "$v" \
            || peers_die "'$PEERS_PYTHON -m venv' failed (Debian: apt-get install python3-venv)"
        pip=("$v/bin/python" -m pip --disable-pip-version-check -q)
        # requirement lines only (no -r/--extra-index-url, no gguf: vendored)
        reqs=$(cat "$req/requirements-convert_hf_to_gguf.txt" "$req/requirements-convert_legacy_llama.txt" \
               | sed 's/#.*//' | grep -v '^[[:space:]]*-' | grep -v '^[[:space:]]*gguf' | grep -v '^[[:space:]]*$' || true)
        torch_req=$(echo "$reqs" | grep '^torch' | head -1)
        [ -n "$torch_req" ] || peers_die "no torch pin in $req/requirements-convert_hf_to_gguf.txt"
        peers_log "installing $torch_req (CPU build) into $v from $PEERS_TORCH_INDEX"
        if ! "${pip[@]}" install --retries 1 --timeout 20 "$torch_req" --index-url "$PEERS_TORCH_INDEX" 2>"$v/torch-index.log"; then
            peers_log "NOTE: $PEERS_TORCH_INDEX is not reachable from here (see $v/torch-index.log);"
            peers_log "      installing $torch_req from PyPI instead: its wheel pulls the CUDA runtime (~3 GB); CPU only is used"
            "${pip[@]}" install "$torch_req" || peers_die "pip install $torch_req from PyPI failed"
        fi
        # shellcheck disable=SC2086
        others=$(echo "$reqs" | grep -v '^torch' | tr '\n' ' ')
        peers_log "installing $others$PEERS_PIP_EXTRA into $v"
        # shellcheck disable=SC2086
        "${pip[@]}" install $others $PEERS_PIP_EXTRA || peers_die "pip install $others $PEERS_PIP_EXTRA failed"
        touch "$stamp"
    ) 9>"$PEERS_CACHE/.venv.lock"
}

# Versions of what the venv holds, for the report's header.
peers_venv_versions() {
    "$PEERS_PY" -c 'import torch, transformers, accelerate; print("torch %s, transformers %s, accelerate %s" % (torch.__version__, transformers.__version__, accelerate.__version__))'
}

# The streaming-read bandwidth probe, compiled once (-O3 -march=native).
peers_membw() {
    local src; src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/membw.c"
    local bin="$PEERS_CACHE/membw" tmp
    if [ ! -x "$bin" ] || [ "$src" -nt "$bin" ]; then
        peers_need cc "apt-get install gcc"
        mkdir -p "$PEERS_CACHE"
        tmp=$(mktemp "$bin.XXXXXX")
        cc -O3 -march=native -std=gnu11 -pthread -o "$tmp" "$src" || { rm -f "$tmp"; peers_die "compiling $src failed"; }
        mv "$tmp" "$bin"
    fi
    echo "$bin"
}

# peers_gen_model FLEXTIER DIR GEN-MODEL-ARGS...: generate once (reused when
# DIR/.args matches the arguments).
peers_gen_model() {
    local ft=$1 dir=$2; shift 2
    mkdir -p "$(dirname "$dir")"
    (
        flock 9
        if [ -f "$dir/.args" ] && [ "$(cat "$dir/.args")" = "$*" ] && [ -f "$dir/model.safetensors" ]; then
            exit 0
        fi
        rm -rf "$dir"
        peers_log "generating the model: flextier gen-model $*"
        "$ft" gen-model --out "$dir" "$@" >&2 || peers_die "flextier gen-model failed"
        echo "$*" > "$dir/.args"
    ) 9>"$dir.lock"
}

# peers_gguf DIR FMT: DIR/ggml-FMT.gguf for FMT in f32 bf16 q8_0 q4_0
# (f32/bf16 by convert_hf_to_gguf.py, q8_0/q4_0 by llama-quantize from the
# f32 file, as llama.cpp's docs do; from the bf16 file with
# PEERS_QUANT_FROM=bf16: the same quantized values for a bf16 checkpoint,
# every bf16 being exact in f32, without an f32 file twice the checkpoint's
# size on disk). Prints the path.
PEERS_QUANT_FROM=${PEERS_QUANT_FROM:-f32}
peers_gguf() {
    local dir=$1 fmt=$2 out="$1/ggml-$2.gguf" f32="" src
    if [ -f "$out" ]; then echo "$out"; return 0; fi
    src="$(peers_llama_dir)/src"
    case "$PEERS_QUANT_FROM" in f32|bf16) ;; *) peers_die "PEERS_QUANT_FROM must be f32 or bf16" ;; esac
    case "$fmt" in
    f32|bf16) peers_venv ;;
    q8_0|q4_0) f32=$(peers_gguf "$dir" "$PEERS_QUANT_FROM") ;;
    *) peers_die "unknown GGUF format $fmt (f32 bf16 q8_0 q4_0)" ;;
    esac
    (   # one writer per file, even with two scripts running
        flock 9
        [ -f "$out" ] && exit 0
        if [ -z "$f32" ]; then
            peers_log "converting $dir to GGUF $fmt"
            PYTHONPATH="$src/gguf-py" "$PEERS_PY" "$src/convert_hf_to_gguf.py" "$dir" --outtype "$fmt" \
                --outfile "$out.tmp" >"$dir/convert-$fmt.log" 2>&1 \
                || { rm -f "$out.tmp"; peers_die "convert_hf_to_gguf.py --outtype $fmt failed; see $dir/convert-$fmt.log"; }
        else
            peers_log "quantizing to $fmt"
            # shellcheck disable=SC2086
            "$(peers_llama_bin llama-quantize)" $PEERS_QUANT_ARGS "$f32" "$out.tmp" "$fmt" >"$dir/quantize-$fmt.log" 2>&1 \
                || { rm -f "$out.tmp"; peers_die "llama-quantize $fmt failed; see $dir/quantize-$fmt.log"; }
        fi
        mv "$out.tmp" "$out"
    ) 9>"$dir/.gguf-$fmt.lock"
    echo "$out"
}

# Does `flextier bench run` take --weights-dtype? (being added for issue 12)
peers_ft_has_wdtype() {
    local h
    h=$("$1" bench run --help 2>&1) || true
    [[ "$h" == *--weights-dtype* ]]
}

# ------------------------------------------------------------ memory limits
# A child cgroup per run with a hard memory limit that counts page cache
# too: cgroup v2 (memory.max; created under the root, where the memory
# controller can be enabled for children) or, where only v1 is mounted,
# v1 (memory.limit_in_bytes; created under this shell's own memory cgroup,
# so it nests inside whatever already limits us). Root only.
peers_cg_init() {
    [ "$(id -u)" = 0 ] || peers_die "memory-limited runs need root (cgroups, drop_caches)"
    [ -w /proc/sys/vm/drop_caches ] || peers_die "/proc/sys/vm/drop_caches is not writable"
    if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
        PEERS_CG_VER=2
        PEERS_CG_PARENT=/sys/fs/cgroup
        grep -qw memory /sys/fs/cgroup/cgroup.subtree_control \
            || echo +memory > /sys/fs/cgroup/cgroup.subtree_control \
            || peers_die "cannot enable the memory controller in /sys/fs/cgroup/cgroup.subtree_control"
    elif [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
        PEERS_CG_VER=1
        local own; own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup | head -1)
        PEERS_CG_PARENT=/sys/fs/cgroup/memory${own%/}
        [ -f "$PEERS_CG_PARENT/memory.limit_in_bytes" ] || peers_die "cannot find this shell's memory cgroup ($PEERS_CG_PARENT)"
    else
        peers_die "no cgroup memory controller (neither v2 /sys/fs/cgroup/cgroup.controllers nor v1 /sys/fs/cgroup/memory)"
    fi
    PEERS_CG_SEQ=0
}

# peers_cg_run LIMIT_BYTES LOG -- CMD...: drop the page cache, run CMD in a
# fresh child cgroup limited to LIMIT_BYTES (stdout to LOG, stderr to
# LOG.err), remove the cgroup. Sets PEERS_CG_PEAK (bytes, page cache
# included) and PEERS_CG_OOM (OOM kills in the cgroup); returns CMD's status.
peers_cg_run() {
    local limit=$1 log=$2; shift 3
    PEERS_CG_SEQ=$((PEERS_CG_SEQ + 1))
    local cg="$PEERS_CG_PARENT/flextier-peers-$$-$PEERS_CG_SEQ" rc=0
    mkdir "$cg" || peers_die "cannot create cgroup $cg"
    PEERS_CG_DIRS+=("$cg")
    if [ "$PEERS_CG_VER" = 2 ]; then
        echo "$limit" > "$cg/memory.max"
        [ -f "$cg/memory.swap.max" ] && echo 0 > "$cg/memory.swap.max"
    else
        echo "$limit" > "$cg/memory.limit_in_bytes"
        [ -f "$cg/memory.memsw.limit_in_bytes" ] && echo "$limit" > "$cg/memory.memsw.limit_in_bytes" 2>/dev/null || true
    fi
    sync
    echo 3 > /proc/sys/vm/drop_caches
    bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$cg" "$@" > "$log" 2> "$log.err" || rc=$?
    if [ "$PEERS_CG_VER" = 2 ]; then
        PEERS_CG_PEAK=$(cat "$cg/memory.peak" 2>/dev/null || echo 0)
        PEERS_CG_OOM=$(awk '$1 == "oom_kill" {print $2}' "$cg/memory.events" 2>/dev/null || echo 0)
    else
        PEERS_CG_PEAK=$(cat "$cg/memory.max_usage_in_bytes")
        PEERS_CG_OOM=$(awk '$1 == "oom_kill" {print $2}' "$cg/memory.oom_control" 2>/dev/null || echo 0)
    fi
    PEERS_CG_OOM=${PEERS_CG_OOM:-0}
    peers_cg_rmdir "$cg"
    return "$rc"
}

peers_cg_rmdir() {
    local cg=$1 i
    for i in 1 2 3 4 5 6 7 8 9 10; do
        [ -d "$cg" ] || return 0
        rmdir "$cg" 2>/dev/null && return 0
        sleep 0.5
    done
    peers_log "warning: could not remove cgroup $cg (processes still in it?)"
}

# For an EXIT trap: remove every cgroup this script created.
peers_cg_cleanup() {
    local cg
    for cg in "${PEERS_CG_DIRS[@]:-}"; do [ -n "$cg" ] && [ -d "$cg" ] && peers_cg_rmdir "$cg"; done
    return 0
}
PEERS_CG_DIRS=()
