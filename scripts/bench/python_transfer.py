#!/usr/bin/env python3
"""Python read_tensor vs the C CLI's `flextier bench transfer`, same node,
same run (issue 7's benchmark; not a test).

Starts a memory node (`python -m flextier serve`, loopback, free port)
unless --uri is given, then alternates, --rounds times:
  - `flextier bench transfer URI --size S -c CODEC --depth D --iters N
     --no-perftest --json` (the C client: write phase, then read phase);
  - the same read phase from Python: N read_tensor_async(key, out=buf) with
    D in flight into preallocated arrays (D=1: plain read_tensor(out=)).
Prints the median logical read GB/s of each and Python/C in percent.

  build-py/venv/bin/python scripts/bench/python_transfer.py --cli build/flextier
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

import flextier


def python_read_phase(st, keys, outs, depth, iters):
    t0 = time.perf_counter()
    if depth == 1:
        for i in range(iters):
            st.read_tensor(keys[0], out=outs[0])
    else:
        reqs = [None] * depth
        for i in range(iters + depth):
            slot = i % depth
            if reqs[slot] is not None:
                reqs[slot].wait()
                reqs[slot] = None
            if i < iters:
                reqs[slot] = st.read_tensor_async(keys[slot], out=outs[slot])
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default="build/flextier", help="path of the C CLI binary")
    ap.add_argument("--uri", help="memory node URI (default: start one)")
    ap.add_argument("--size", default="64M")
    ap.add_argument("-c", "--codec", default="raw")
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    size = flextier.parse_size(a.size)

    node = None
    uri = a.uri
    if uri is None:
        node = subprocess.Popen([sys.executable, "-m", "flextier", "serve", "--listen",
                                 "127.0.0.1:0", "--capacity", str(4 * size * (a.depth + 1))],
                                stdout=subprocess.PIPE, text=True)
        uri = "ucx://" + node.stdout.readline().strip().rsplit(" ", 1)[1]
    try:
        rng = np.random.default_rng(0)
        import ml_dtypes
        n = size // 2
        src = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        c_rates, py_rates = [], []
        with flextier.Store(uri, queue_depth=max(a.depth, 1)) as st:
            keys = [f"pybench/{i}" for i in range(a.depth)]
            for k in keys:
                st.write_tensor(k, src, codec=None if a.codec == "raw" else a.codec)
            outs = [np.empty_like(src) for _ in keys]
            for r in range(a.rounds):
                out = subprocess.run([a.cli, "bench", "transfer", uri, "--size", a.size, "-c",
                                      a.codec, "--depth", str(a.depth), "--iters",
                                      str(a.iters), "--no-perftest", "--json"],
                                     check=True, capture_output=True, text=True).stdout
                c_rates.append(json.loads(out)["read_logical_gbs"])
                dt = python_read_phase(st, keys, outs, a.depth, a.iters)
                py_rates.append(size * a.iters / dt / 1e9)
            assert outs[0].tobytes() == src.tobytes() or a.codec in ("q8", "q4")
            for k in keys:
                st.delete(k)
        c_med, py_med = statistics.median(c_rates), statistics.median(py_rates)
        print(f"read {a.size} bf16, codec {a.codec}, depth {a.depth}, {a.iters} iters, "
              f"{a.rounds} rounds (medians; noisy shared machine)")
        print(f"  C CLI bench transfer : {c_med:.3f} GB/s  {['%.3f' % x for x in c_rates]}")
        print(f"  Python read_tensor   : {py_med:.3f} GB/s  {['%.3f' % x for x in py_rates]}")
        print(f"  Python / C           : {100 * py_med / c_med:.1f} %")
    finally:
        if node is not None:
            node.terminate()
            node.wait(10)


if __name__ == "__main__":
    main()
