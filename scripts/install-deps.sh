#!/usr/bin/env bash
# Install the Debian packages FlexTier builds and tests with. Idempotent and
# non-interactive: does nothing when everything is already installed.
# Usage: scripts/install-deps.sh [--check]   (--check: only report missing)
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  liblz4-dev libzstd-dev libdeflate-dev libxxhash-dev zlib1g-dev zstd lz4
  libucx-dev ucx-utils libssl-dev
  libopenblas-dev libjson-c-dev libpcre2-dev libutf8proc-dev
  # the HTTP server (flextier server) and the line editor of flextier chat
  libmicrohttpd-dev libedit-dev
  # what a static link of libmicrohttpd pulls in (pkg-config --static: gnutls -> libunistring)
  libunistring-dev
  iproute2 python3 python3-venv python3-dev
  # the pipeline's MPI mode (mpirun -n S flextier run --pipeline mpi)
  libopenmpi-dev openmpi-bin
  # public-domain texts for `make finetune-demo` and scripts/bench/perplexity.sh:
  # the World English Bible (read with diatheke) and the King James Bible
  diatheke sword-text-web bible-kjv
  # the aarch64 (BlueField Arm cores) cross build and its tests under
  # qemu-user (make test-aarch64): Debian's cross toolchain and the
  # multiarch :arm64 libraries
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
  liblz4-dev:arm64 libzstd-dev:arm64 libdeflate-dev:arm64 libxxhash-dev:arm64 zlib1g-dev:arm64
  libucx-dev:arm64 libopenblas-dev:arm64 libjson-c-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libssl-dev:arm64
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "missing packages: ${missing[*]}"
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# :arm64 packages need the architecture enabled (multiarch)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
