#!/usr/bin/env bash
# The main job on a built-in default. Today: synthetic bf16 weights through
# every codec (encode, decode, verify) with the benchmark table.
set -euo pipefail
build=${1:-build}
bin="$build/flextier"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 - "$work/w.bf16" <<'PY'
import math, random, struct, sys
random.seed(0)
n = 1 << 20
out = bytearray()
for r in range(n // 1024):
    s = 0.02 * math.exp(0.25 * random.gauss(0, 1))
    vals = [random.gauss(0, s) for _ in range(1024)]
    for v in vals:
        u = struct.unpack("<I", struct.pack("<f", v))[0]
        u = (u + 0x7fff + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", u)
open(sys.argv[1], "wb").write(out)
PY
for c in raw lz4 zstd deflate; do
  "$bin" codec encode -c "$c" --dtype bf16 --shape 1024,1024 "$work/w.bf16" "$work/w.$c"
  "$bin" codec decode "$work/w.$c" "$work/w.$c.out"
  cmp -s "$work/w.bf16" "$work/w.$c.out" && echo "  $c: round trip exact"
done
