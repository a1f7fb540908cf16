#!/usr/bin/env bash
# Before a GPU session, on the development machine (Debian): download the
# packages of the C libraries FlexTier builds against into .gpu-deps/
# (about 18 MB; ignored by git through .git/info/exclude). The GPU machine's
# image has CUDA, CMake, ninja and PyTorch but maybe not these libraries, and
# it cannot download anything: carry the folder there (the device tool's
# `carry: [".gpu-deps"]`), and scripts/gpu-check.sh unpacks it into its build
# folder (dpkg -x, nothing installed system-wide) when pkg-config does not
# find the libraries.
#   scripts/gpu-deps.sh            # then: run scripts/gpu-check.sh there
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/.gpu-deps"
PKGS=(
  liblz4-dev liblz4-1 libzstd-dev libzstd1 libdeflate-dev libdeflate0 libxxhash-dev libxxhash0
  libopenblas-dev libopenblas0 libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
  libjson-c-dev libjson-c5
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libucx-dev libucx0 libibverbs1 ibverbs-providers librdmacm1 libnuma1
  libssl-dev libssl3 libutf8proc-dev libutf8proc2
  pkgconf pkgconf-bin libpkgconf3
)
mkdir -p "$dir"
cd "$dir"
rm -f ./*.deb
if ! apt-get download "${PKGS[@]}" 2>/dev/null; then
  apt-get update -qq
  apt-get download "${PKGS[@]}"
fi
exclude="$(git -C "$root" rev-parse --git-path info/exclude)"
case "$exclude" in /*) ;; *) exclude="$root/$exclude" ;; esac
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-deps/' "$exclude" 2>/dev/null || echo '/.gpu-deps/' >> "$exclude"
echo "gpu-deps: $(ls "$dir"/*.deb | wc -l) packages, $(du -sh "$dir" | cut -f1) in $dir (carry it: .gpu-deps)"
