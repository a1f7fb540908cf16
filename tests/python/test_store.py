"""flextier.Store over mem:, file:DIR and a memory node started by the test."""
import gc
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import flextier
from conftest import (DTYPES, MemoryNode, gil_probe, make_array, ml_dtypes, same_bits)


@pytest.fixture(params=["mem", "file", "ucx"])
def store(request, tmp_path):
    if request.param == "mem":
        uri = "mem:"
    elif request.param == "file":
        uri = f"file:{tmp_path / 'tier'}"
    else:
        uri = request.getfixturevalue("memory_node").uri
    st = flextier.Store(uri, queue_depth=4)
    yield st
    if not st.closed:
        for k in st.list():
            st.delete(k)
        st.close()


@pytest.mark.parametrize("codec", [None, "lz4", "zstd", "q8"])
@pytest.mark.parametrize("name,dtype", DTYPES, ids=[d[0] for d in DTYPES])
def test_write_read_roundtrip(store, codec, name, dtype):
    a = make_array(dtype, (33, 70), seed=7)
    key = f"t/{name}/{codec}"
    if codec == "q8" and dtype.kind in "iu":
        with pytest.raises(flextier.Error):
            store.write_tensor(key, a, codec=codec)
        return
    store.write_tensor(key, a, codec=codec)
    st = store.stat(key)
    assert st["dtype"] == name and st["shape"] == a.shape and st["raw_bytes"] == a.nbytes
    assert st["codec"] == (codec or "raw")
    b = store.read_tensor(key)
    assert b.dtype == a.dtype and b.shape == a.shape
    if codec == "q8":
        x, y = a.astype(np.float32), b.astype(np.float32)
        assert np.max(np.abs(x - y)) <= float(x.max() - x.min()) / 255 + 1e-3
    else:
        assert same_bits(a, b)
    assert key in store and key in store.list()


def test_read_into_out_is_zero_copy(store):
    a = make_array(ml_dtypes.bfloat16, (128, 64))
    store.write_tensor("w", a, codec="zstd")
    out = np.empty_like(a)
    addr = out.ctypes.data
    r = store.read_tensor("w", out=out)
    assert r is out and out.ctypes.data == addr and same_bits(out, a)
    # converted on the way: bf16 -> f32, into a window of a larger buffer
    big = np.zeros(a.size + 100, np.float32)
    win = big[50:50 + a.size].reshape(a.shape)
    assert store.read_tensor("w", out=win) is win
    assert np.shares_memory(win, big) and same_bits(win, a.astype(np.float32))
    assert np.all(big[:50] == 0) and np.all(big[-50:] == 0)
    # new array: the library's buffer, not a copy (owned by .base)
    b = store.read_tensor("w", dtype="float32")
    assert b.base is not None and b.flags.writeable
    assert same_bits(b, a.astype(np.float32))


def test_errors(store):
    a = make_array(np.float32, (16, 16))
    store.write_tensor("k", a)
    with pytest.raises(flextier.NotFoundError) as ei:
        store.read_tensor("missing")
    assert isinstance(ei.value, KeyError) and ei.value.status == flextier.Status.NOT_FOUND
    with pytest.raises(flextier.NotFoundError):
        store.delete("missing")
    with pytest.raises(flextier.NotFoundError):
        store.stat("missing")
    assert "missing" not in store
    with pytest.raises(flextier.InvalidArgumentError):
        store.write_tensor("bad key", a)                  # space not allowed
    with pytest.raises(flextier.InvalidArgumentError):
        store.write_tensor("", a)
    with pytest.raises(flextier.Error) as ei:             # out too small
        store.read_tensor("k", out=np.empty(10, np.float32))
    assert ei.value.status in (flextier.Status.BUFFER_SMALL, flextier.Status.INVALID_ARG)
    with pytest.raises(flextier.InvalidArgumentError):   # out too large
        store.read_tensor("k", out=np.empty(1000, np.float32))
    with pytest.raises(flextier.Error):
        store.read_tensor("k", out=np.empty((16, 16), np.int32))
    store.delete("k")
    assert "k" not in store


def test_async_requests(store):
    arrays = {f"layer{i}/w": make_array(np.float16, (64, 96), seed=i) for i in range(12)}
    reqs = [store.write_tensor_async(k, a, codec="lz4") for k, a in arrays.items()]
    assert all(r.wait(timeout=60) is None for r in reqs)
    assert all(r.done() for r in reqs)
    outs = {k: np.empty_like(a) for k, a in arrays.items()}
    reads = {k: store.read_tensor_async(k, out=outs[k]) for k in arrays}
    fresh = {k: store.read_tensor_async(k) for k in arrays}
    for k, a in arrays.items():
        assert reads[k].result() is outs[k] and same_bits(outs[k], a)
        assert same_bits(fresh[k].wait(), a)
        assert same_bits(fresh[k].wait(), a)       # second wait: same value
    bad = store.read_tensor_async("nope")
    with pytest.raises(flextier.NotFoundError):
        bad.wait()
    assert isinstance(bad.exception(), flextier.NotFoundError)
    # dropped without waiting: must neither crash nor leak the source
    for i in range(8):
        store.write_tensor_async(f"drop{i}", make_array(np.int8, (1000,)))
    gc.collect()
    assert len([k for k in store.list() if k.startswith("drop")]) == 8


def test_close_waits_for_requests_and_context_manager(tmp_path):
    with flextier.Store(f"file:{tmp_path}") as st:
        a = make_array(np.float32, (256, 256))
        reqs = [st.write_tensor_async(f"x{i}", a, codec="zstd") for i in range(6)]
    assert st.closed
    for r in reqs:          # outcome kept after close
        assert r.wait() is None
    with pytest.raises(flextier.InvalidArgumentError):
        st.read_tensor("x0")
    st.close()              # idempotent
    with flextier.Store(f"file:{tmp_path}") as st2:
        assert st2.list() == [f"x{i}" for i in range(6)]
        assert same_bits(st2.read_tensor("x3"), a)


def test_many_threads_one_store(store):
    def work(i):
        a = make_array(np.int32, (50, 10 + i % 7), seed=i)
        store.write_tensor(f"th{i}", a, codec="zstd")
        return same_bits(store.read_tensor(f"th{i}"), a)

    with ThreadPoolExecutor(8) as ex:
        assert all(ex.map(work, range(64)))


def test_gil_released_during_store_read(store):
    a = make_array(np.float32, (4 << 20,), seed=9)                # 16 MiB
    store.write_tensor("big", a, codec="zstd")
    out = np.empty_like(a)
    assert gil_probe(lambda: store.read_tensor("big", out=out)) > 0
    assert same_bits(out, a)


def test_refcounts_stable_store():
    st = flextier.Store("mem:")
    a = make_array(np.float32, (32, 32))
    out = np.empty_like(a)
    st.write_tensor("a", a)
    before = [sys.getrefcount(o) for o in (a, out, st)]
    for _ in range(300):
        st.write_tensor("a", a, codec="lz4")
        st.read_tensor("a")
        st.read_tensor("a", out=out)
        st.read_tensor_async("a", out=out).wait()
        st.write_tensor_async("a", a).wait()
        try:
            st.read_tensor("zz")
        except flextier.NotFoundError:
            pass
    gc.collect()
    assert [sys.getrefcount(o) for o in (a, out, st)] == before
    st.close()


def test_frames_and_stats(memory_node):
    with flextier.Store(memory_node.uri) as st:
        a = make_array(np.float16, (300, 200))
        f = flextier.encode(a, codec="zstd")
        st.put_frame("frame/a", f)
        g = st.get_frame("frame/a")
        assert bytes(g) == f and same_bits(flextier.decode(g), a)
        assert same_bits(st.read_tensor("frame/a"), a)
        s = st.stats()
        assert s["capacity"] > 0 and s["tensors"] >= 1 and s["puts"] >= 1
        with pytest.raises(flextier.CorruptError):
            st.put_frame("frame/bad", f[:-5])
        st.delete("frame/a")


def test_auth(tmp_path):
    tf = tmp_path / "token"
    tf.write_text("s3cret-token-0123456789")
    tf.chmod(0o600)   # the node refuses a token file others can read
    node = MemoryNode(capacity="16M", token_file=tf)
    try:
        with flextier.Store(node.uri, token="s3cret-token-0123456789") as st:
            st.write_tensor("a", np.arange(10, dtype=np.int32))
        with flextier.Store(node.uri, token_file=str(tf)) as st:
            assert st.read_tensor("a").tolist() == list(range(10))
        for kw in ({"token": "wrong"}, {}):
            with pytest.raises(flextier.AuthError) as ei:
                flextier.Store(node.uri, **kw).list()
            assert ei.value.status == flextier.Status.AUTH
            assert isinstance(ei.value, PermissionError)
    finally:
        node.stop()


def test_serve_refuses_public_address_without_token():
    import subprocess
    cmd = [sys.executable, "-m", "flextier", "serve", "--listen", "0.0.0.0:0", "--capacity", "1M"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "--insecure" in (r.stderr + r.stdout)
    p = subprocess.Popen(cmd + ["--insecure"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        line = p.stdout.readline()
        assert "listening on 0.0.0.0:" in line
    finally:
        p.terminate()
        p.wait(10)
        p.stdout.close()
        p.stderr.close()


def test_node_gone(tmp_path):
    node = MemoryNode(capacity="16M")
    st = flextier.Store(node.uri, timeout_ms=3000)
    try:
        st.write_tensor("a", np.zeros(100, np.float32))
        node.stop()
        with pytest.raises(flextier.Error) as ei:
            st.read_tensor("a")
        assert ei.value.status in (flextier.Status.NET, flextier.Status.TIMEOUT,
                                   flextier.Status.PROTOCOL)
    finally:
        node.stop()
        st.close()


def test_state_dict_offload(memory_node):
    """The docs/python.md example with NumPy arrays (torch below if present)."""
    rng = np.random.default_rng(0)
    state = {f"layers.{i}.{n}": (rng.standard_normal((64, 64)) * 0.02).astype(ml_dtypes.bfloat16)
             for i in range(4) for n in ("q_proj.weight", "k_proj.weight")}
    with flextier.Store(memory_node.uri) as st:
        reqs = [st.write_tensor_async(f"model/{k}", v, codec="zstd") for k, v in state.items()]
        for r in reqs:
            r.wait()
        restored = {k: np.empty_like(v) for k, v in state.items()}
        reqs = [st.read_tensor_async(f"model/{k}", out=restored[k]) for k in state]
        for r in reqs:
            r.wait()
        assert all(same_bits(restored[k], state[k]) for k in state)
        for k in st.list():
            if k.startswith("model/"):
                st.delete(k)


def test_torch_state_dict(memory_node):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8)).to(torch.bfloat16)
    sd = model.state_dict()
    with flextier.Store(memory_node.uri) as st:
        for r in [st.write_tensor_async(f"m/{k}", v, codec="zstd") for k, v in sd.items()]:
            r.wait()
        new = {k: torch.empty_like(v) for k, v in sd.items()}
        for r in [st.read_tensor_async(f"m/{k}", out=new[k]) for k in sd]:
            r.wait()
        assert all(torch.equal(new[k], sd[k]) for k in sd)


def test_close_while_other_threads_use_it(tmp_path):
    """close() from one thread while others call in and wait on requests:
    no crash, calls either complete or raise InvalidArgumentError."""
    st = flextier.Store("mem:", queue_depth=2)
    a = make_array(np.float32, (128, 128))
    st.write_tensor("a", a)
    stop = threading.Event()
    errors = []

    def user():
        while not stop.is_set():
            try:
                r = st.read_tensor_async("a")
                assert same_bits(r.wait(), a)
                assert same_bits(st.read_tensor("a"), a)
            except flextier.InvalidArgumentError:
                return                        # closed under us: expected
            except Exception as e:            # pragma: no cover - a failure
                errors.append(e)
                return

    threads = [threading.Thread(target=user) for _ in range(4)]
    for t in threads:
        t.start()
    import time
    time.sleep(0.2)
    st.close()
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors and st.closed


def test_request_timeout_and_exception():
    st = flextier.Store("mem:", queue_depth=1)
    big = make_array(np.float32, (1 << 20,))
    r = st.write_tensor_async("big", big, codec="zstd", level=19)   # slow on purpose
    try:
        r.wait(timeout=0)
    except flextier.RequestTimeoutError as e:
        assert isinstance(e, TimeoutError) and not r.done()
    assert r.exception() is None and r.done()       # waits, then succeeds
    assert r.result(timeout=0) is None
    st.close()


def test_parse_size_finite_only():
    """Sizes are finite numbers of bytes (issue 21: --capacity nan read as 2^63)."""
    assert flextier.parse_size("64M") == 64 << 20
    assert flextier.parse_size(4096) == 4096
    for bad in ["nan", "NaN", "inf", "-inf", "infinity", "-1", "1e400", -5, "x"]:
        with pytest.raises(flextier.InvalidArgumentError):
            flextier.parse_size(bad)
