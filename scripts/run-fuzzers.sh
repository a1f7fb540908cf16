#!/usr/bin/env bash
# Run every libFuzzer target in BUILD for SECONDS each, starting from the
# committed seed corpus (copied, so new inputs do not dirty the repo).
# Prints "N passed, N failed"; a crash fails.
set -uo pipefail
build=${1:-build-fuzz}; secs=${2:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
pass=0; fail=0
for bin in "$build"/fuzz/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin"); short=${name#fuzz_}
  work=$(mktemp -d)
  cp -r "$root/fuzz/corpus/$short/." "$work/" 2>/dev/null || true
  echo "fuzz: $name for ${secs}s"
  if "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=0 \
       -artifact_prefix="$work/" "$work" >"$work.log" 2>&1; then
    pass=$((pass+1))
  else
    fail=$((fail+1)); echo "fuzz: $name FAILED"; tail -40 "$work.log"
  fi
  rm -rf "$work" "$work.log"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
