"""Shared helpers for the flextier Python tests (run by scripts/test-python.sh)."""
import sys
import threading
import time

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


def gil_probe(call, attempts=6):
    """Run call() on this thread while a second Python thread ticks a counter
    every ~0.5 ms (sleeping in between, so it needs the GIL only to tick).

    The switch interval is raised to 30 s: a thread that holds the GIL is
    then never forced to give it up, so the ticker can advance while call()
    runs only if call() itself releases the GIL. The outcome is therefore
    exact, not a timing threshold: 0 ticks if the GIL is held throughout,
    > 0 if it is released (given that the ticker gets scheduled at all
    during call(), hence a few attempts on a loaded machine). Returns the
    largest tick count seen over the attempts."""
    state = {"ticks": 0, "stop": False}

    def ticker():
        while not state["stop"]:
            time.sleep(0.0005)
            state["ticks"] += 1

    old = sys.getswitchinterval()
    th = threading.Thread(target=ticker, daemon=True)
    th.start()
    best = 0
    try:
        time.sleep(0.01)
        sys.setswitchinterval(30.0)
        for _ in range(attempts):
            c0 = state["ticks"]
            call()
            best = max(best, state["ticks"] - c0)
            time.sleep(0.002)    # let the ticker run between attempts
            if best > 0:
                break
    finally:
        sys.setswitchinterval(old)
        state["stop"] = True
        th.join()
    return best


def busy_python(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _die_with_parent():
    """In the child: SIGTERM when the test process dies (Linux), so that a
    crashed or killed pytest leaves no memory node behind."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except Exception:
        pass


class MemoryNode:
    """A memory node (`python -m flextier serve`) in a child process on a
    free loopback port; stop() terminates it (SIGTERM, then SIGKILL)."""

    def __init__(self, capacity="256M", token_file=None):
        import os
        import select
        import subprocess
        cmd = [sys.executable, "-m", "flextier", "serve", "--listen", "127.0.0.1:0",
               "--capacity", str(capacity)]
        if token_file:
            cmd += ["--token-file", str(token_file)]
        env = dict(os.environ, FLEXTIER_LOG=os.environ.get("FLEXTIER_LOG", "error"))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r:
                line = self.proc.stdout.readline()
                break
        if "listening on " not in line:
            self.stop()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"memory node did not start: {line!r} {err[-2000:]}")
        self.address = line.strip().rsplit(" ", 1)[1]
        self.uri = "ucx://" + self.address

    def stop(self):
        import subprocess
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            if f:
                f.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def memory_node():
    node = MemoryNode()
    try:
        yield node
    finally:
        node.stop()
