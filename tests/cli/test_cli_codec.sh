#!/usr/bin/env bash
# CLI behaviour of `flextier codec` and `flextier bench codec`: round trips,
# safetensors input, usage errors (exit 2), runtime errors (exit 1), atomic
# output. Prints "N passed, N failed".
set -u
bin=$1
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
pass=0; fail=0
ok()   { pass=$((pass+1)); echo "ok   $1"; }
bad()  { fail=$((fail+1)); echo "FAIL $1"; }
expect_rc() { # want name cmd...
  local want=$1 name=$2; shift 2
  "$@" >"$work/out.txt" 2>"$work/err.txt"; local rc=$?
  if [ "$rc" -eq "$want" ]; then ok "$name"; else bad "$name (rc $rc, want $want): $(head -c 300 "$work/err.txt")"; fi
}

python3 - "$work" <<'PY'
import json, math, random, struct, sys
w = sys.argv[1]
random.seed(3)
vals = [random.gauss(0, 0.02) for _ in range(3 * 1000)]
def bf16(v):
    u = struct.unpack("<I", struct.pack("<f", v))[0]
    return (u + 0x7fff + ((u >> 16) & 1)) >> 16
raw = b"".join(struct.pack("<H", bf16(v)) for v in vals)
open(w + "/t.bf16", "wb").write(raw)
f32 = b"".join(struct.pack("<f", v) for v in vals[:1000])
hdr = {"w.bf16": {"dtype": "BF16", "shape": [3, 1000], "data_offsets": [0, len(raw)]},
       "w.f32": {"dtype": "F32", "shape": [10, 100], "data_offsets": [len(raw), len(raw) + len(f32)]},
       "__metadata__": {"format": "pt"}}
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(w + "/m.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + raw + f32)
open(w + "/t.f32", "wb").write(f32)
PY

codecs="raw lz4 zstd deflate bp-zstd bp-lz4 bp-deflate"
for c in $codecs; do
  if "$bin" codec encode -c "$c" --dtype bf16 --shape 3,1000 "$work/t.bf16" "$work/t.$c" 2>"$work/err.txt" &&
     "$bin" codec decode "$work/t.$c" "$work/t.$c.out" && cmp -s "$work/t.bf16" "$work/t.$c.out"; then
    ok "round trip $c"
  else bad "round trip $c: $(head -c 300 "$work/err.txt")"; fi
done
for c in q8 q4; do
  if "$bin" codec encode -c "$c" --group-size 32 --dtype bf16 --shape 3,1000 "$work/t.bf16" "$work/t.$c" 2>"$work/err.txt" &&
     "$bin" codec decode --dtype f32 "$work/t.$c" "$work/t.$c.out" &&
     [ "$(stat -c %s "$work/t.$c.out")" -eq 12000 ]; then ok "lossy $c decodes to f32"; else bad "lossy $c: $(head -c 300 "$work/err.txt")"; fi
done
# frame info
"$bin" codec info "$work/t.zstd" > "$work/info.txt" 2>&1
grep -q "bf16 \[3, 1000\]" "$work/info.txt" && grep -q "codec:      zstd" "$work/info.txt" && ok "info" || bad "info: $(cat "$work/info.txt")"
"$bin" codec info --json "$work/t.q4" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["codec"]=="q4" and d["shape"]==[3,1000] and d["group_size"]==32' && ok "info --json" || bad "info --json"
# stdin/stdout
"$bin" codec encode -c lz4 --dtype bf16 - - < "$work/t.bf16" | "$bin" codec decode - - | cmp -s - "$work/t.bf16" && ok "pipes" || bad "pipes"
# safetensors input
"$bin" codec encode -c bp --tensor w.bf16 "$work/m.safetensors" "$work/st.ftf" 2>/dev/null &&
  "$bin" codec decode "$work/st.ftf" "$work/st.out" && cmp -s "$work/st.out" "$work/t.bf16" && ok "--tensor bf16" || bad "--tensor bf16"
"$bin" codec encode -c zstd --tensor w.f32 "$work/m.safetensors" "$work/st2.ftf" 2>/dev/null &&
  "$bin" codec info "$work/st2.ftf" | grep -q "f32 \[10, 100\]" && ok "--tensor f32 shape" || bad "--tensor f32 shape"
expect_rc 1 "--tensor missing name" "$bin" codec encode -c zstd --tensor nope "$work/m.safetensors" "$work/x.ftf"
grep -q "no tensor 'nope'" "$work/err.txt" && ok "missing tensor message" || bad "missing tensor message: $(cat "$work/err.txt")"
# usage errors exit 2
expect_rc 2 "no args" "$bin"
expect_rc 2 "unknown command" "$bin" frobnicate
expect_rc 2 "codec no sub" "$bin" codec
expect_rc 2 "unknown codec" "$bin" codec encode -c snappy --dtype bf16 "$work/t.bf16" "$work/x"
expect_rc 2 "missing dtype" "$bin" codec encode -c zstd "$work/t.bf16" "$work/x"
expect_rc 2 "bad shape" "$bin" codec encode -c zstd --dtype bf16 --shape 3,x "$work/t.bf16" "$work/x"
expect_rc 2 "bad level" "$bin" codec encode -c zstd -l 99 --dtype bf16 "$work/t.bf16" "$work/x"
expect_rc 2 "unknown option" "$bin" codec encode --frob -c zstd --dtype bf16 "$work/t.bf16" "$work/x"
expect_rc 2 "bench unknown" "$bin" bench nothing
expect_rc 0 "help" "$bin" --help
expect_rc 0 "codec help" "$bin" codec --help
# runtime errors exit 1, and leave no output behind
expect_rc 1 "shape mismatch" "$bin" codec encode -c zstd --dtype bf16 --shape 3,999 "$work/t.bf16" "$work/x"
expect_rc 1 "missing input" "$bin" codec decode "$work/does-not-exist" "$work/x"
head -c 100 "$work/t.zstd" > "$work/trunc.ftf"
expect_rc 1 "truncated frame" "$bin" codec decode "$work/trunc.ftf" "$work/x"
grep -q "corrupt" "$work/err.txt" && ok "truncated message" || bad "truncated message: $(cat "$work/err.txt")"
cp "$work/t.zstd" "$work/flip.ftf"
printf '\x55' | dd of="$work/flip.ftf" bs=1 seek=300 conv=notrunc 2>/dev/null
expect_rc 1 "bit flip" "$bin" codec decode "$work/flip.ftf" "$work/x"
[ ! -e "$work/x" ] && ! ls "$work"/x.tmp* >/dev/null 2>&1 && ok "no output left on failure" || bad "output left behind"
expect_rc 1 "info on garbage" "$bin" codec info "$work/t.bf16"
# bench prints a row per codec, json parses
"$bin" bench codec --size 64K -c raw,zstd,q4 --iters 1 --no-ref --json > "$work/b.json" 2>"$work/err.txt" &&
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert [r["codec"] for r in d["rows"]]==["raw","zstd","q4"] and d["rows"][2]["ratio"]>3.4' "$work/b.json" &&
  ok "bench --json" || bad "bench --json: $(cat "$work/err.txt")"
"$bin" bench codec "$work/m.safetensors" --tensor w.bf16 -c zstd --iters 1 --no-ref > "$work/b.txt" 2>&1 &&
  grep -q "^zstd " "$work/b.txt" && ok "bench --tensor" || bad "bench --tensor: $(cat "$work/b.txt")"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
