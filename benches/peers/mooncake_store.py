"""Mooncake Store as the peer of `kvfabric bench store` / `bench cluster`.

One client process of the pair the bench starts beside `mooncake_master`
(both on loopback, metadata on the master's own HTTP metadata server):

- role "holder": mounts a segment big enough for the blocks, puts them into it
  (`batch_put_from` from a registered buffer, `threads` threads), gets them back
  (`batch_get_into`, the local get: the blocks are in this process's own
  segment), prints one JSON line, then keeps the segment mounted until its stdin
  closes.
- role "reader": mounts no segment (so every block lies in the holder's), gets
  every block (`batch_get_into` into a registered buffer, `threads` threads: the
  remote get), then one block at a time (`get_into`: the single-block latency),
  checks the bytes and prints one JSON line.

The job is one JSON line on stdin. Every figure is GB/s (1e9 bytes/s) or us.
"""

import ctypes
import json
import mmap
import sys
import threading
import time

from mooncake.store import MooncakeDistributedStore


def block_byte(i, j):
    return (i * 31 + j * 7) & 0xFF


def pattern(i, size):
    # Cheap distinct blocks: a 256-byte row repeated, different per block.
    row = bytes(block_byte(i, j) for j in range(256))
    return (row * (size // 256 + 1))[:size]


def region(size):
    """An anonymous mapping, faulted in, and its address."""
    mm = mmap.mmap(-1, size)
    mm.write(b"\x01" * size)
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    return mm, ptr


def setup(job, segment_bytes, buffer_bytes):
    store = MooncakeDistributedStore()
    rc = store.setup(
        job["hostname"],
        job["metadata"],
        segment_bytes,
        buffer_bytes,
        "tcp",
        "",
        job["master"],
    )
    if rc != 0:
        raise RuntimeError(f"setup failed: {rc}")
    return store


def timed(threads, work):
    """Run work(t) on `threads` threads; seconds of the whole."""
    errors = []

    def run(t):
        try:
            work(t)
        except Exception as e:  # noqa: BLE001 - reported, not swallowed
            errors.append(repr(e))

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    secs = time.perf_counter() - start
    if errors:
        raise RuntimeError(errors[0])
    return secs


def chunks(items, size):
    return [items[i : i + size] for i in range(0, len(items), size)]


def get_all(store, keys, dst_ptr, size, threads, batch):
    """batch_get_into of every key; thread t reads into its own slots."""

    def work(t):
        mine = keys[t::threads]
        base = dst_ptr + t * batch * size
        for part in chunks(mine, batch):
            ptrs = [base + k * size for k in range(len(part))]
            got = store.batch_get_into(part, ptrs, [size] * len(part))
            bad = [g for g in got if g != size]
            if bad:
                raise RuntimeError(f"batch_get_into returned {bad[0]}")

    return timed(threads, work)


def put_all(store, keys, src_ptr, size, threads, batch):
    def work(t):
        idx = list(range(t, len(keys), threads))
        for part in chunks(idx, batch):
            ks = [keys[i] for i in part]
            ptrs = [src_ptr + i * size for i in part]
            rcs = store.batch_put_from(ks, ptrs, [size] * len(part))
            bad = [r for r in rcs if r != 0]
            if bad:
                raise RuntimeError(f"batch_put_from returned {bad[0]}")

    return timed(threads, work)


def holder(job):
    n, size, threads, batch = job["blocks"], job["block_bytes"], job["threads"], job["batch"]
    rounds = job["rounds"]
    # Room for two rounds of puts (a round's keys are removed after the next's).
    store = setup(job, 2 * n * size + (64 << 20), 16 << 20)
    src, src_ptr = region(n * size)
    for i in range(n):
        src[i * size : (i + 1) * size] = pattern(i, size)
    dst, dst_ptr = region(threads * batch * size)
    for mm_ptr, mm in ((src_ptr, src), (dst_ptr, dst)):
        if store.register_buffer(mm_ptr, len(mm)) != 0:
            raise RuntimeError("register_buffer failed")
    put_best = get_best = 0.0
    keys = []
    for r in range(rounds):
        old = keys
        keys = [f"kvf-r{r}-{i}" for i in range(n)]
        put_best = max(put_best, n * size / put_all(store, keys, src_ptr, size, threads, batch) / 1e9)
        for k in old:
            store.remove(k, True)
        get_best = max(get_best, n * size / get_all(store, keys, dst_ptr, size, threads, batch) / 1e9)
    check(dst, keys, size, threads, batch)
    print(json.dumps({
        "role": "holder",
        "put_gbps": put_best,
        "local_get_gbps": get_best,
        "keys_prefix": f"kvf-r{rounds - 1}-",
    }), flush=True)
    sys.stdin.read()  # hold the segment until the bench closes our stdin
    store.close()


def check(dst, keys, size, threads, batch):
    """Thread 0's last batch lies in its first slots: compare one block."""
    mine = list(range(0, len(keys), threads))
    first = chunks(mine, batch)[-1][0]
    if dst[:size] != pattern(first, size):
        raise RuntimeError(f"block {first} came back with other bytes")


def reader(job):
    n, size, threads, batch = job["blocks"], job["block_bytes"], job["threads"], job["batch"]
    store = setup(job, 0, 16 << 20)
    dst, dst_ptr = region(threads * batch * size)
    if store.register_buffer(dst_ptr, len(dst)) != 0:
        raise RuntimeError("register_buffer failed")
    keys = [job["keys_prefix"] + str(i) for i in range(n)]
    get_all(store, keys, dst_ptr, size, threads, batch)  # warm-up: connections
    best = max(n * size / get_all(store, keys, dst_ptr, size, threads, batch) / 1e9
               for _ in range(job["rounds"]))
    check(dst, keys, size, threads, batch)
    lat = []
    for it in range(job["latency_iters"] + 20):
        i = it % n
        t = time.perf_counter()
        got = store.get_into(keys[i], dst_ptr, size)
        us = (time.perf_counter() - t) * 1e6
        if got != size:
            raise RuntimeError(f"get_into returned {got}")
        if it >= 20:
            lat.append(us)
    if dst[:size] != pattern(i, size):
        raise RuntimeError(f"block {i} came back with other bytes")
    lat.sort()
    pct = lambda p: lat[round((len(lat) - 1) * p)]  # noqa: E731
    print(json.dumps({
        "role": "reader",
        "remote_get_gbps": best,
        "single_get_p50_us": pct(0.5),
        "single_get_p99_us": pct(0.99),
    }), flush=True)
    store.close()


def main():
    job = json.loads(sys.stdin.readline())
    {"holder": holder, "reader": reader}[job["role"]](job)


if __name__ == "__main__":
    main()
