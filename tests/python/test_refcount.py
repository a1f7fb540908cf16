"""No reference or memory leaks over many calls, including error paths."""
import gc
import sys
import tracemalloc

import numpy as np

import flextier
from conftest import make_array, ml_dtypes


def test_refcounts_stable():
    a = make_array(np.float32, (64, 64))
    b = make_array(ml_dtypes.bfloat16, (64, 64))
    f = flextier.encode(a)
    out = np.empty_like(a)
    bad = bytearray(f)
    bad[-10] ^= 1
    objs = (a, b, f, out, bad)
    before = [sys.getrefcount(o) for o in objs]
    for _ in range(500):
        flextier.encode(a, codec="lz4")
        flextier.encode(b)
        flextier.decode(f)
        flextier.decode(f, out=out)
        flextier.frame_info(f)
        try:
            flextier.decode(bad)
        except flextier.CorruptError:
            pass
        try:
            flextier.decode(f, out=bad)
        except flextier.InvalidArgumentError:
            pass
    gc.collect()
    assert [sys.getrefcount(o) for o in objs] == before


def test_memory_bounded():
    a = make_array(np.float16, (128, 256))
    f = flextier.encode(a)
    bad = f[:-1]

    def round_():
        g = flextier.encode(a, codec="zstd")
        flextier.decode(g)
        flextier.decode(f, dtype=np.float32)
        try:
            flextier.decode(bad)
        except flextier.CorruptError:
            pass
        try:
            flextier.encode(a, codec="nope")
        except flextier.InvalidArgumentError:
            pass

    for _ in range(50):
        round_()
    gc.collect()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        for _ in range(1000):
            round_()
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 1000 rounds allocate ~250 MB in total; what stays must be tiny.
    assert end - start < 256 * 1024, (start, end)
