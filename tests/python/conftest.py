"""Shared helpers for the flextier Python tests (run by scripts/test-python.sh)."""
import numpy as np
import pytest

import flextier

ml_dtypes = pytest.importorskip("ml_dtypes")

# (id, numpy dtype) for every element type FlexTier encodes.
DTYPES = [
    ("float32", np.dtype(np.float32)),
    ("float16", np.dtype(np.float16)),
    ("bfloat16", np.dtype(ml_dtypes.bfloat16)),
    ("int8", np.dtype(np.int8)),
    ("uint8", np.dtype(np.uint8)),
    ("int32", np.dtype(np.int32)),
]
FLOAT_DTYPES = DTYPES[:3]


def make_array(dtype, shape=(37, 129), seed=0):
    """Weight-like data: small normal floats, full-range integers."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -(2**20)), min(info.max, 2**20)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype)


def same_bits(a, b):
    """Bitwise equality (NaN-safe, works for bfloat16)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and \
        a.tobytes() == b.tobytes()


def encode_or_skip(array, codec, **kw):
    """encode(), skipping the test when the C library reports the codec
    unsupported (byteplane/q8/q4 land from other branches)."""
    try:
        return flextier.encode(array, codec=codec, **kw)
    except flextier.UnsupportedError as e:
        pytest.skip(f"{codec} unsupported by this build of the C library: {e.detail}")
