#!/usr/bin/env bash
# The one script a session with an NVIDIA GPU runs to verify the CUDA backend
# (docs/cuda.md, "Verifying on a GPU"):
#   1. configure + build with CUDA (Release, -Werror; CMAKE_CUDA_ARCHITECTURES
#      $CUDA_ARCH, default 90 for H100/H200)
#   2. the CUDA tests: ctest -R cuda -V (codec, kernels, forward, CLI)
#   3. compute-sanitizer memcheck over the kernel tests, where the machine's
#      runtime allows it
#   4. benchmark: the built-in Llama scaled to ~1.1B parameters with random
#      bf16 weights (flextier gen-model), prefill and decode tok/s at batch 1
#      and 64, side by side with Hugging Face transformers (PyTorch) on the
#      same GPU and weights (scripts/bench/hf_generate.py; torch and
#      transformers are pip-installed if missing, and without them, e.g. with
#      no network, that row says why and the rest still runs), and the
#      offload rows: weights in pinned host memory streamed over PCIe, raw
#      bf16 vs q4.
# Everything lands in $OUT (or ./gpu-out), at most 8 files: summary.md (the
# tables, also printed at the end), results.json, env.txt, build.log,
# tests.log, sanitizer.log, bench.log, hf.log. Each step runs under
# `timeout`; steps that would pass the deadline ($DEADLINE seconds, default
# 460) are skipped and reported. It never reads stdin.
#
# The C libraries: when pkg-config does not find them (the GPU machine's
# image has CUDA and Python but maybe not liblz4, OpenBLAS, UCX, ...), the
# packages in .gpu-deps/ (made by scripts/gpu-deps.sh on the development
# machine and carried along) are unpacked into $BUILD/deps-root and used
# from there (FT_GPU_FORCE_DEPS=1 forces that path, to test it).
#
# Environment: OUT, BUILD (build-gpu), JOBS (nproc), CUDA_ARCH (90),
# DEADLINE (460), MODEL (an existing model dir instead of generating one),
# SKIP_HF=1, SKIP_BENCH=1, SKIP_SANITIZER=1;
# FT_GPU_CHECK_FAKE=1: a dry run of this script without a GPU (FT_CUDA=FAKE
# build, CPU emulation, a tiny model, no transformers).
#   scripts/gpu-check.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fake="${FT_GPU_CHECK_FAKE:-0}"
out="${OUT:-$root/gpu-out}"
build="${BUILD:-$([ "$fake" = 1 ] && echo build-gpu-fake || echo build-gpu)}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
jobs="${JOBS:-$(nproc)}"
arch="${CUDA_ARCH:-90}"
deadline="${DEADLINE:-460}"
work="$build/gpu-work"
mkdir -p "$out" "$work"
rm -f "$work"/*.json
t0=$(date +%s)
bin="$build/flextier"
steps_tsv="$work/steps.tsv"
: > "$steps_tsv"

elapsed() { echo $(( $(date +%s) - t0 )); }
left() { echo $(( deadline - $(elapsed) )); }

# step NAME TIMEOUT LOG CMD...: run CMD under timeout, appending to LOG;
# record ok / FAILED (rc) / TIMEOUT / skipped with its seconds.
step() {
    local name="$1" secs="$2" log="$3"
    shift 3
    local l
    l=$(left)
    if [ "$l" -lt 15 ]; then
        printf '%s\tskipped (deadline)\t0\n' "$name" >> "$steps_tsv"
        echo "== $name: skipped, $(elapsed) s used of the $deadline s deadline" | tee -a "$log"
        return 99
    fi
    [ "$secs" -gt "$l" ] && secs=$l
    echo "== $name (timeout ${secs} s)" | tee -a "$log"
    local s=$(date +%s)
    timeout -k 10 "$secs" "$@" >> "$log" 2>&1 < /dev/null
    local rc=$?
    local d=$(( $(date +%s) - s ))
    local res="ok"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then res="TIMEOUT after ${secs} s"
    elif [ $rc -ne 0 ]; then res="FAILED (exit $rc)"; fi
    printf '%s\t%s\t%s\n' "$name" "$res" "$d" >> "$steps_tsv"
    echo "   $name: $res in $d s" | tee -a "$log"
    return $rc
}

# ------------------------------------------------------------ environment
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "git: $(git -C "$root" log --oneline -1 2>/dev/null || echo '?')"
    echo "mode: $([ "$fake" = 1 ] && echo 'FAKE (CPU emulation, no GPU)' || echo 'CUDA')"
    echo "host: $(uname -srm), $(nproc) CPUs"
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
        --format=csv 2>&1 || echo "nvidia-smi: not available"
    echo "nvcc: $(timeout 20 nvcc --version 2>/dev/null | tail -2 | tr '\n' ' ' || echo none)"
    echo "cmake: $(cmake --version 2>/dev/null | head -1)"
    echo "ninja: $(ninja --version 2>/dev/null || echo none)"
    echo "cc: $(cc --version 2>/dev/null | head -1)"
    echo "python3: $(python3 --version 2>&1)"
    timeout 60 python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

# ------------------------------------------------- C library dependencies
pcs="liblz4 libzstd libdeflate libxxhash openblas json-c libpcre2-8 libutf8proc ucx libcrypto"
cmake_extra=()
if [ "${FT_GPU_FORCE_DEPS:-0}" = 1 ] || ! command -v pkg-config > /dev/null || ! pkg-config --exists $pcs 2> /dev/null; then
    if ls "$root"/.gpu-deps/*.deb > /dev/null 2>&1; then
        droot="$build/deps-root"
        rm -rf "$droot"
        mkdir -p "$droot"
        for d in "$root"/.gpu-deps/*.deb; do
            if command -v dpkg > /dev/null; then
                dpkg -x "$d" "$droot"
            else                                    # no dpkg: a .deb is an ar archive
                m=$(ar t "$d" | grep '^data\.tar')
                ar p "$d" "$m" | tar -x -C "$droot" $(case "$m" in *.xz) echo -J ;; *.zst) echo --zstd ;; *.gz) echo -z ;; esac)
            fi
        done
        lib="$droot/usr/lib/x86_64-linux-gnu"
        # some Debian .pc files name /usr/lib (libdeflate, libzstd) where the
        # library lies in the multiarch folder: point them there
        sed -i -E 's#^libdir=(/usr|\$\{prefix\}|\$\{exec_prefix\})/lib/?$#libdir=\1/lib/x86_64-linux-gnu#' \
            "$lib"/pkgconfig/*.pc
        export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$lib/openblas-pthread/pkgconfig:$droot/usr/share/pkgconfig"
        export PKG_CONFIG_PATH="$PKG_CONFIG_LIBDIR"
        export PKG_CONFIG_SYSROOT_DIR="$droot"
        export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
        export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export UCX_MODULE_DIR="$lib/ucx"
        pkgc="$(command -v pkg-config || echo "$droot/usr/bin/pkgconf")"
        cmake_extra+=("-DPKG_CONFIG_EXECUTABLE=$pkgc")
        echo "C libraries: from .gpu-deps ($(ls "$root"/.gpu-deps/*.deb | wc -l) packages unpacked in $droot)" | tee -a "$out/env.txt"
    else
        echo "C libraries: pkg-config finds no '$pcs' and there is no .gpu-deps/: run scripts/gpu-deps.sh on the" \
             "development machine and carry .gpu-deps (the build below will fail)" | tee -a "$out/env.txt"
    fi
fi

# ------------------------------------------------------------------ build
gen=(-G Ninja)
command -v ninja > /dev/null || gen=(-G "Unix Makefiles")
cuda_opt=(-DFT_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch")
[ "$fake" = 1 ] && cuda_opt=(-DFT_CUDA=FAKE)
: > "$out/build.log"
build_ok=0
if step configure 120 "$out/build.log" cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DFT_WERROR=ON "${cuda_opt[@]}" "${cmake_extra[@]}" &&
   step build 420 "$out/build.log" cmake --build "$build" -j "$jobs" -- $([ "${gen[1]}" = Ninja ] && echo "-k 0" || echo -k); then
    build_ok=1
elif [ -x "$bin" ] && { [ -f "$build/libflextier-cuda.so" ] || [ "$fake" = 1 ]; }; then
    # keep going past one failing file (a compiler's new warning in a test,
    # say): the GPU time is better spent on what did build; the failure
    # stays in the steps table and in the exit status
    build_ok=1
    build_partial=1
fi

# ------------------------------------------- the benchmark model (background)
: > "$out/bench.log"
: > "$out/hf.log"
model="${MODEL:-$build/llama-1b}"
if [ "$fake" = 1 ]; then
    model="${MODEL:-$build/llama-tiny}"
    shape=(--hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 96 --vocab 320)
    P=16; G=8; GS=4; BIG=8
else
    shape=(--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 32000 --max-pos 2048)
    P=128; G=128; GS=32; BIG=64
fi
bench=0
[ $build_ok = 1 ] && [ "${SKIP_BENCH:-0}" != 1 ] && bench=1
gen_pid=""
if [ $bench = 1 ] && [ ! -f "$model/config.json" ]; then
    # ~1.1B random weights take ~40-80 s of one core: generated while the
    # tests run
    gen_s=$(date +%s)
    timeout -k 10 240 "$bin" gen-model --arch llama --out "$model" "${shape[@]}" --seed 1 --dtype bf16 \
        > "$work/gen-model.log" 2>&1 < /dev/null &
    gen_pid=$!
fi

# ------------------------------------------------------------------ tests
: > "$out/tests.log"
tests_ok=0
if [ $build_ok = 1 ]; then
    step "tests (ctest -R cuda)" 300 "$out/tests.log" \
        bash -c "cd '$build' && ctest -R cuda -V --timeout 280" && tests_ok=1
else
    printf 'tests (ctest -R cuda)\tnot run (no build)\t0\n' >> "$steps_tsv"
fi

# compute-sanitizer memcheck over the kernel tests: right after failing
# tests (to diagnose), else after the benchmark with the time left.
: > "$out/sanitizer.log"
sanitize() {
    if [ $build_ok != 1 ] || [ "$fake" = 1 ] || [ "${SKIP_SANITIZER:-0}" = 1 ]; then return; fi
    if ! command -v compute-sanitizer > /dev/null; then
        echo "compute-sanitizer not found" >> "$out/sanitizer.log"
        printf 'compute-sanitizer\tnot available\t0\n' >> "$steps_tsv"
        return
    fi
    local cs=(compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20)
    step "memcheck test_cuda_kernels" 90 "$out/sanitizer.log" "${cs[@]}" "$build/tests/cuda/test_cuda_kernels"
    step "memcheck test_cuda_codec gpu_q" 90 "$out/sanitizer.log" env FT_TEST_DATA="$root/tests/data" \
        "${cs[@]}" "$build/tests/cuda/test_cuda_codec" gpu_q
    step "memcheck test_cuda_forward fwd_streamed" 120 "$out/sanitizer.log" env FT_TEST_DATA="$root/tests/data" \
        "${cs[@]}" "$build/tests/cuda/test_cuda_forward" fwd_streamed
}
[ $tests_ok = 1 ] || sanitize

# -------------------------------------------------------------- benchmark
if [ -n "$gen_pid" ]; then
    wait "$gen_pid"
    rc=$?
    cat "$work/gen-model.log" >> "$out/bench.log"
    res=ok
    [ $rc -ne 0 ] && res="FAILED (exit $rc)"
    printf 'gen-model (during the tests)\t%s\t%s\n' "$res" $(( $(date +%s) - gen_s )) >> "$steps_tsv"
fi
if [ $bench = 1 ]; then
    if [ -f "$model/config.json" ]; then
        # our resident rows, then transformers, then the offload rows
        for b in 1 "$BIG"; do
            step "flextier cuda batch $b" 150 "$out/bench.log" bash -c \
                "'$bin' bench run --model '$model' --batch $b --prompt-len $P --gen-len $G --device cuda --json \
                 > '$work/ft_resident_b$b.json'"
        done
        if [ "$fake" != 1 ] && [ "${SKIP_HF:-0}" != 1 ]; then
            if ! timeout 60 python3 -c 'import torch, transformers' > /dev/null 2>&1; then
                # usually there already; without a network this fails fast
                step "pip install torch transformers" 90 "$out/hf.log" python3 -m pip install -q --retries 0 \
                    --timeout 5 torch transformers
            fi
            step "transformers batch 1,$BIG" 300 "$out/hf.log" env PYTHONUNBUFFERED=1 python3 \
                "$root/scripts/bench/hf_generate.py" --model "$model" --batch "1,$BIG" --prompt-len $P --gen-len $G \
                --json "$work/hf.json"
        else
            why="skipped ($([ "$fake" = 1 ] && echo 'FAKE dry run' || echo 'SKIP_HF=1'))"
            echo "transformers: $why" >> "$out/hf.log"
            printf '{"error": "%s"}\n' "$why" > "$work/hf.json"
        fi
        for c in none q4 disk-q4; do
            # disk-q4: the disk tier through the offloading scheduler (ft_cuda_layer_source)
            pol="--policy w=0,100 --compress-weights $c"
            [ "$c" = disk-q4 ] && pol="--policy w=0,0,100 --disk-dir '$work/disk' --compress-weights q4"
            for b in 1 "$BIG"; do
                step "flextier cuda streamed $c batch $b" 150 "$out/bench.log" bash -c \
                    "'$bin' bench run --model '$model' --batch $b --prompt-len $P --gen-len $GS --device cuda \
                     $pol --json > '$work/ft_stream_${c}_b$b.json'"
            done
        done
    fi
fi
[ $tests_ok = 1 ] && sanitize

# ---------------------------------------------------------------- summary
export FT_GC_WORK="$work" FT_GC_OUT="$out" FT_GC_MODEL="$model" FT_GC_FAKE="$fake" FT_GC_P="$P" FT_GC_G="$G" \
       FT_GC_GS="$GS" FT_GC_ELAPSED="$(elapsed)"
if ! timeout 60 python3 - <<'PYEOF'
import glob, json, os

work, out = os.environ["FT_GC_WORK"], os.environ["FT_GC_OUT"]
fake = os.environ["FT_GC_FAKE"] == "1"
P, G, GS = os.environ["FT_GC_P"], os.environ["FT_GC_G"], os.environ["FT_GC_GS"]

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as e:  # missing or cut short: the step failed
        return {"error": f"{os.path.basename(path)}: {e}"}

steps = []
with open(os.path.join(work, "steps.tsv")) as f:
    for line in f:
        p = line.rstrip("\n").split("\t")
        if len(p) == 3:
            steps.append({"step": p[0], "result": p[1], "seconds": int(p[2])})
env = open(os.path.join(out, "env.txt")).read()
cfg = {}
try:
    cfg = json.load(open(os.path.join(os.environ["FT_GC_MODEL"], "config.json")))
except Exception:
    pass
ft = {os.path.basename(p)[:-5]: load(p) for p in sorted(glob.glob(os.path.join(work, "ft_*.json")))}
hf = load(os.path.join(work, "hf.json")) if os.path.exists(os.path.join(work, "hf.json")) else {"error": "not run"}

def fmt(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"

L = []
L.append("# FlexTier GPU check" + (" (FAKE dry run: CPU emulation, numbers meaningless)" if fake else ""))
L.append("")
L.append("```")
L.append(env.strip())
L.append("```")
L.append("")
L.append("## Steps")
L.append("")
L.append("| step | result | seconds |")
L.append("|---|---|---|")
for s in steps:
    L.append(f"| {s['step']} | {s['result']} | {s['seconds']} |")
L.append("")
nparams = None
if cfg:
    h, f_, l, v = cfg.get("hidden_size"), cfg.get("intermediate_size"), cfg.get("num_hidden_layers"), cfg.get("vocab_size")
    nh, nkv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    try:
        hd = h // nh
        per_layer = h * h * 2 + 2 * h * nkv * hd + 3 * h * f_ + 2 * h
        nparams = l * per_layer + 2 * v * h + h
    except Exception:
        pass
L.append(f"## Benchmark: Llama, hidden {cfg.get('hidden_size')}, {cfg.get('num_hidden_layers')} layers, "
         f"{cfg.get('num_attention_heads')} heads / {cfg.get('num_key_value_heads')} KV, ffn {cfg.get('intermediate_size')}, "
         f"vocab {cfg.get('vocab_size')}" +
         ((f" ({nparams/1e9:.2f}B parameters)" if nparams >= 1e8 else f" ({nparams/1e6:.2f}M parameters)") if nparams else "") +
         f", random bf16 weights; prompt {P}, greedy, EOS ignored")
L.append("")
L.append("| engine | weights | batch | new tokens | prefill tok/s | decode tok/s | decode vs transformers |")
L.append("|---|---|---|---|---|---|---|")
hf_rows = {r.get("batch"): r for r in hf.get("rows", [])}
rows = []
for b in sorted({int(k.split("_b")[-1]) for k in ft if k.startswith("ft_resident_b")}):
    r = ft.get(f"ft_resident_b{b}", {})
    h_ = hf_rows.get(b, {})
    ratio = (r.get("decode_tok_s") / h_["decode_tok_s"]) if r.get("decode_tok_s") and h_.get("decode_tok_s") else None
    rows.append(("flextier --device cuda", "device, bf16", b, G, r, ratio))
for b in sorted(hf_rows):
    h_ = hf_rows[b]
    rows.append((f"transformers {hf.get('transformers', '')} (torch {hf.get('torch', '')}, {hf.get('attn_implementation', '')})",
                 "device, bf16", b, G, h_, None))
for name, w, b, g, r, ratio in rows:
    if r.get("error"):
        L.append(f"| {name} | {w} | {b} | {g} | error: {r['error'][:80]} | | |")
    else:
        L.append(f"| {name} | {w} | {b} | {g} | {fmt(r.get('prefill_tok_s'))} | {fmt(r.get('decode_tok_s'))} | "
                 f"{'' if ratio is None else f'{ratio:.2f}x'} |")
if hf.get("error"):
    L.append("")
    L.append(f"transformers: {hf['error']}")
L.append("")
L.append(f"## Offloading: weights in pinned host memory, streamed over PCIe layer by layer ({GS} new tokens)")
L.append("")
L.append("| weights on the host | batch | copied over PCIe per forward pass | prefill tok/s | decode tok/s | "
         "copies busy / compute idle / overlap efficiency |")
L.append("|---|---|---|---|---|---|")
labels = {"none": "raw bf16", "q4": "q4 (group 64), decoded on the GPU",
          "disk-q4": "q4 on the disk tier, streamed by the scheduler, decoded on the GPU"}
for c in ("none", "q4", "disk-q4"):
    for k in sorted(k for k in ft if k.startswith(f"ft_stream_{c}_b")):
        r = ft[k]
        b = k.split("_b")[-1]
        if r.get("error"):
            L.append(f"| {c} | {b} | error: {r['error'][:80]} | | | |")
            continue
        per_pass = r.get("host_weight_bytes")
        fw, stall, cp = r.get("forward_s"), r.get("stall_s"), r.get("copy_s")
        # overlap efficiency: the busier stream (copies, or compute = the
        # time it did not stand idle) over the forward calls' wall time
        hidden = (f"{cp:.3f} s / {stall:.3f} s of {fw:.3f} s / "
                  f"{100 * min(max(cp, fw - min(stall, fw)) / fw, 1):.0f}%") if fw and cp is not None else "-"
        L.append(f"| {labels[c]} | {b} | "
                 f"{fmt(per_pass / 2**20 if per_pass else None, 2)} MiB | {fmt(r.get('prefill_tok_s'))} | "
                 f"{fmt(r.get('decode_tok_s'))} | {hidden} |")
L.append("")
L.append(f"Total time: {os.environ['FT_GC_ELAPSED']} s.")
text = "\n".join(L) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
json.dump({"steps": steps, "env": env, "model_config": cfg, "flextier": ft, "transformers": hf},
          open(os.path.join(out, "results.json"), "w"), indent=1)
print(text)
PYEOF
then
    echo "summary: python3 failed; raw step results:"
    cat "$steps_tsv"
fi
failed=$(grep -cv -P '\tok\t' "$steps_tsv" || true)
echo "== gpu-check: $(grep -cP '\tok\t' "$steps_tsv") steps ok, $failed not ok, $(elapsed) s; results in $out"
[ "$tests_ok" = 1 ] && [ "$build_ok" = 1 ] && [ "${build_partial:-0}" = 0 ]
