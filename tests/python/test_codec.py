"""Round trips, zero-copy decoding, frame_info and error mapping."""
import pickle

import numpy as np
import pytest

import flextier
from conftest import DTYPES, FLOAT_DTYPES, encode_or_skip, make_array, ml_dtypes, same_bits

LOSSLESS = ["raw", "lz4", "zstd", "deflate", "byteplane", "byteplane-lz4", "byteplane-deflate"]


@pytest.mark.parametrize("codec", LOSSLESS)
@pytest.mark.parametrize("name,dtype", DTYPES, ids=[d[0] for d in DTYPES])
def test_roundtrip_lossless(codec, name, dtype):
    a = make_array(dtype, (3, 37, 129), seed=hash((codec, name)) & 0xFFFF)
    frame = encode_or_skip(a, codec)
    assert isinstance(frame, bytes)
    info = flextier.frame_info(frame)
    assert info["dtype"] == name and info["shape"] == a.shape
    assert info["frame_size"] == len(frame) and info["raw_size"] == a.nbytes
    assert not info["lossy"]
    # byteplane on an integer dtype falls back to its entropy stage
    base = codec.split("-")[0]
    assert info["codec"] == base or (base == "byteplane" and dtype.kind in "iu")
    b = flextier.decode(frame)
    assert same_bits(a, b)


@pytest.mark.parametrize("codec", ["zstd", "lz4", "raw", "deflate"])
@pytest.mark.parametrize("shape", [(), (0,), (0, 5), (1,), (7,), (2, 1, 3, 1, 2, 1, 2, 3),
                                   (300_000,)], ids=str)
def test_shapes(codec, shape):
    a = make_array(np.float32, shape, seed=3)
    frame = flextier.encode(a, codec=codec, chunk_size=4096)
    info = flextier.frame_info(frame)
    assert info["shape"] == shape
    assert info["n_chunks"] >= (a.nbytes + 4095) // 4096
    b = flextier.decode(frame)
    assert b.shape == shape and same_bits(a, b)


def test_params_recorded():
    a = make_array(np.float16, (64, 64))
    f = flextier.encode(a, codec="zstd", level=7, chunk_size=8192, threads=1)
    info = flextier.frame_info(f)
    assert (info["codec"], info["level"], info["chunk_size"]) == ("zstd", 7, 8192)
    assert info["n_chunks"] == a.nbytes // 8192
    assert same_bits(flextier.decode(f, threads=2), a)


@pytest.mark.parametrize("codec,bits", [("q8", 8), ("q4", 4)])
@pytest.mark.parametrize("group_dim", [-1, 0])
@pytest.mark.parametrize("name,dtype", FLOAT_DTYPES, ids=[d[0] for d in FLOAT_DTYPES])
def test_roundtrip_lossy(codec, bits, group_dim, name, dtype):
    a = make_array(dtype, (96, 130), seed=bits)
    frame = encode_or_skip(a, codec, group_size=64, group_dim=group_dim)
    info = flextier.frame_info(frame)
    assert info["lossy"] and info["codec"] == codec and info["group_size"] == 64
    assert info["group_dim"] == (group_dim % a.ndim)
    b = flextier.decode(frame)
    assert b.dtype == a.dtype and b.shape == a.shape
    x, y = a.astype(np.float32), b.astype(np.float32)
    # Per group: |x - y| <= scale/2 plus fp16 rounding of min/scale and the
    # output dtype's rounding. Bounded here with the tensor's range (every
    # group's range is smaller), which still catches a wrong layout.
    rng_ = float(x.max() - x.min())
    out_eps = {np.float32: 0.0, np.float16: 2.0**-11, ml_dtypes.bfloat16: 2.0**-8}[dtype.type]
    tol = rng_ / (2**bits - 1) / 2 + rng_ * 2.0**-10 + np.abs(x) * (2.0**-10 + out_eps) + 1e-6
    assert np.all(np.abs(x - y) <= tol)
    if bits == 8:
        assert frame_size_ratio(frame, a) < 0.75


def frame_size_ratio(frame, a):
    return len(frame) / a.nbytes


@pytest.mark.parametrize("codec", ["q8", "q4"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32])
def test_lossy_rejects_integers(codec, dtype):
    with pytest.raises(flextier.Error) as ei:
        flextier.encode(make_array(dtype), codec=codec)
    assert ei.value.status in (flextier.Status.UNSUPPORTED, flextier.Status.INVALID_ARG)


# ---------------------------------------------------------------- dtypes


def test_decode_converts_floats():
    a = make_array(np.float32, (1000,))
    f = flextier.encode(a)
    assert same_bits(flextier.decode(f, dtype="bfloat16"), a.astype(ml_dtypes.bfloat16))
    assert same_bits(flextier.decode(f, dtype=np.float16), a.astype(np.float16))
    h = a.astype(np.float16)
    assert same_bits(flextier.decode(flextier.encode(h), dtype="f32"), h.astype(np.float32))


def test_dtype_names():
    assert flextier.dtypes() == ("float32", "float16", "bfloat16", "int8", "uint8", "int32")
    for name, dt in DTYPES:
        assert flextier._dtype_code(dt) == flextier._dtype_code(name)


def test_buffer_protocol_inputs():
    import array
    ar = array.array("f", [1.0, 2.5, -3.0])
    f = flextier.encode(ar)
    assert flextier.frame_info(f)["dtype"] == "float32"
    assert flextier.decode(f).tolist() == [1.0, 2.5, -3.0]
    raw = bytes(range(256)) * 10
    f = flextier.encode(raw, codec="lz4")
    assert flextier.frame_info(f)["dtype"] == "uint8"
    assert flextier.decode(f).tobytes() == raw
    # memoryview with a shape; frames from bytearray / memoryview / uint8 arrays
    m = memoryview(np.arange(12, dtype=np.int32).tobytes()).cast("i", (3, 4))
    f = flextier.encode(m)
    for src in (f, bytearray(f), memoryview(f), np.frombuffer(f, np.uint8)):
        assert same_bits(flextier.decode(src), np.arange(12, dtype=np.int32).reshape(3, 4))


def test_dlpack_producer():
    class Producer:   # only __dlpack__, no buffer protocol
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    a = make_array(np.float16, (9, 11))
    assert same_bits(flextier.decode(flextier.encode(Producer(a))), a)


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32):
        t = (torch.randn(17, 33) * 20).to(dt)
        f = flextier.encode(t)
        out = torch.empty_like(t)
        r = flextier.decode(f, out=out)
        assert r is out and torch.equal(out, t)
    t = torch.randn(4, 4).t()
    with pytest.raises(flextier.InvalidArgumentError):
        flextier.encode(t)


# ------------------------------------------------------------- zero copy


@pytest.mark.parametrize("name,dtype", DTYPES, ids=[d[0] for d in DTYPES])
def test_decode_into_out_is_zero_copy(name, dtype):
    a = make_array(dtype, (50, 70))
    f = flextier.encode(a)
    out = np.zeros_like(a)
    addr = out.ctypes.data
    r = flextier.decode(f, out=out)
    assert r is out and out.ctypes.data == addr
    assert same_bits(out, a)


def test_decode_into_a_window_of_a_larger_buffer():
    a = make_array(np.float32, (64, 32))
    f = flextier.encode(a)
    big = np.full(10_000, 7.0, dtype=np.float32)
    window = big[1000:1000 + a.size].reshape(a.shape)     # contiguous view
    r = flextier.decode(f, out=window)
    assert r is window and np.shares_memory(r, big)
    assert same_bits(big[1000:1000 + a.size].reshape(a.shape), a)
    assert np.all(big[:1000] == 7.0) and np.all(big[1000 + a.size:] == 7.0)


def test_decode_into_raw_bytes():
    a = make_array(ml_dtypes.bfloat16, (33, 65))
    f = flextier.encode(a)
    ba = bytearray(a.nbytes)
    assert flextier.decode(f, out=ba, dtype="bfloat16") is ba
    assert bytes(ba) == a.tobytes()
    u8 = np.empty(a.nbytes * 2, dtype=np.uint8)        # converted to float32 bytes
    flextier.decode(f, out=u8, dtype=np.float32)
    assert same_bits(u8.view(np.float32).reshape(a.shape), a.astype(np.float32))


def test_decode_with_conversion_into_out():
    a = make_array(np.float32, (8, 300))
    out = np.empty(a.shape, dtype=ml_dtypes.bfloat16)
    r = flextier.decode(flextier.encode(a, codec="lz4"), out=out)
    assert r is out and same_bits(out, a.astype(ml_dtypes.bfloat16))


# ---------------------------------------------------------------- errors


def _frame():
    return flextier.encode(make_array(np.float32, (256, 256)), codec="zstd")


def test_corrupt_payload_maps_to_corrupt_error():
    f = bytearray(_frame())
    f[-100] ^= 0x10
    with pytest.raises(flextier.CorruptError) as ei:
        flextier.decode(f)
    e = ei.value
    assert isinstance(e, flextier.Error) and isinstance(e, ValueError)
    assert e.status == flextier.Status.CORRUPT == -3
    assert e.status_name == "FT_ERR_CORRUPT"
    assert e.detail and e.detail in str(e)


@pytest.mark.parametrize("cut", [0, 10, 63, 64, 100, -1])
def test_truncated_frames(cut):
    f = _frame()
    with pytest.raises(flextier.CorruptError):
        flextier.decode(f[:cut])
    with pytest.raises(flextier.CorruptError):
        flextier.frame_info(f[:cut])


def test_header_corruption_and_garbage():
    f = bytearray(_frame())
    for pos in (0, 5, 20, 40, 70):
        g = bytearray(f)
        g[pos] ^= 0x01
        # a changed version field reads as a newer format: UNSUPPORTED
        expect = flextier.UnsupportedError if pos == 5 else flextier.CorruptError
        with pytest.raises(expect):
            flextier.frame_info(g)
        with pytest.raises(expect):
            flextier.decode(g)
    with pytest.raises(flextier.CorruptError):
        flextier.decode(b"\0" * 4096)


def test_partial_header_for_streaming():
    f = _frame()
    hs = flextier.frame_info(f)["header_size"]
    info = flextier.frame_info(f[:hs], partial=True)
    assert info["frame_size"] == len(f)
    with pytest.raises(flextier.CorruptError):
        flextier.frame_info(f[:hs])


def test_argument_errors():
    a = make_array(np.float32, (16, 16))
    f = flextier.encode(a)
    cases = [
        lambda: flextier.encode(a, codec="nope"),
        lambda: flextier.encode(a, level=99),
        lambda: flextier.encode(a, codec="deflate", level=13),
        lambda: flextier.encode(a, chunk_size=100),
        lambda: flextier.encode(a, threads=-1),
        lambda: flextier.encode(a[:, ::2]),                     # not contiguous
        lambda: flextier.encode(np.zeros((1,) * 9, np.float32)),  # > 8 dims
        lambda: flextier.decode(f, out=np.empty((16, 15), np.float32)),
        lambda: flextier.decode(f, out=np.empty((16, 16), np.int32)),
        lambda: flextier.decode(f, out=bytes(1024)),             # read-only
        lambda: flextier.decode(f, out=np.zeros((16, 16), np.float32)[:, :8]),
        lambda: flextier.decode(f, out=np.empty((16, 16), np.float32), dtype="f16"),
        lambda: flextier.decode(flextier.encode(a.astype(np.int32)), dtype=np.float32),
    ]
    ro = np.empty((16, 16), np.float32)
    ro.flags.writeable = False
    cases.append(lambda: flextier.decode(f, out=ro))
    for i, case in enumerate(cases):
        with pytest.raises(flextier.InvalidArgumentError) as ei:
            case()
        assert isinstance(ei.value, ValueError), i
        assert ei.value.status == flextier.Status.INVALID_ARG, i


def test_unsupported_dtypes():
    for bad in (np.zeros(4, np.float64), np.zeros(4, np.int64), np.zeros(4, np.bool_),
                np.zeros(4, np.uint16)):
        with pytest.raises(flextier.UnsupportedError) as ei:
            flextier.encode(bad)
        assert ei.value.status == flextier.Status.UNSUPPORTED
    with pytest.raises(flextier.UnsupportedError):
        flextier.decode(_frame(), dtype="float64")


def test_error_classes_and_pickle():
    assert issubclass(flextier.NotFoundError, KeyError)
    assert issubclass(flextier.NetworkError, ConnectionError)
    assert issubclass(flextier.RequestTimeoutError, TimeoutError)
    e = flextier._make_error(-6, "key 'w0' not found")
    assert type(e) is flextier.NotFoundError and str(e).startswith("key 'w0' not found")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is flextier.NotFoundError and (e2.status, e2.detail) == (-6, e.detail)
    assert type(flextier._make_error(-99, "")) is flextier.Error
    assert flextier._make_error(-99).status_name == "FT_STATUS_-99"
