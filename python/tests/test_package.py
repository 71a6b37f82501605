"""The kvfabric Python package against real nodes (run by tests/python_package.rs,
which starts two secured `kvfabric node` processes with a tenants file and
passes their addresses in the environment). Plain unittest: no pytest needed.

    KVF_NODE_A, KVF_NODE_B   gRPC addresses of the two nodes (one cluster)
    KVF_CERTS                `kvfabric certs init` directory (tenants acme, globex)
    KVF_EXPECT_KEYS          hex keys the Rust chain gives for the same input
"""

import os
import socket
import threading
import time
import unittest

import numpy as np

import kvfabric

A = os.environ["KVF_NODE_A"]
B = os.environ["KVF_NODE_B"]
CERTS = os.environ["KVF_CERTS"]
LAYOUT = kvfabric.Layout(layers=2, kv_heads=2, head_dim=16, dtype="f16", block_tokens=16)


def client(addr, tenant, key=None, timeout_s=5.0):
    return kvfabric.Client(addr, api_key=key or f"key-{tenant}", tls_dir=CERTS,
                           tls_name=tenant, timeout_s=timeout_s)


def chain(namespace=b"py-test"):
    return kvfabric.KeyChain(namespace, kvfabric.model_fingerprint(b"py-model", "llama"), LAYOUT)


def visible(c, keys, n, within_s=15.0):
    """Wait until `c`'s node sees the first `n` keys: a put is announced to
    the cluster's directory asynchronously, so another node sees it shortly
    after the put returns."""
    deadline = time.monotonic() + within_s
    while True:
        got = c.lookup(keys)
        if got >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def blocks(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, LAYOUT.block_bytes, dtype=np.uint8) for _ in range(n)]


class Keys(unittest.TestCase):
    def test_chain_is_the_rust_chain(self):
        fp = kvfabric.model_fingerprint(bytes([7] * 32), "llama")
        c = kvfabric.KeyChain(b"cluster-test", fp, LAYOUT)
        tokens = [(t * 31 + 5) & 0xFFFFFFFF for t in range(3 * 16)]
        got = [k.hex() for k in c.keys(tokens)]
        self.assertEqual(got, os.environ["KVF_EXPECT_KEYS"].split(","))
        self.assertEqual(c.next(None, tokens[:16]).hex(), got[0])
        self.assertEqual(c.next(bytes.fromhex(got[0]), tokens[16:32]).hex(), got[1])

    def test_partial_block_has_no_key_and_bad_input_is_refused(self):
        self.assertEqual(len(chain().keys(list(range(31)))), 1)
        with self.assertRaises(kvfabric.InvalidArgument):
            chain().next(None, [1, 2, 3])
        with self.assertRaises(ValueError):
            kvfabric.KeyChain(b"", b"short", LAYOUT)
        with self.assertRaises(kvfabric.InvalidArgument):
            kvfabric.Layout(layers=0, kv_heads=1, head_dim=1, dtype="f16", block_tokens=1)
        with self.assertRaises(kvfabric.InvalidArgument):
            kvfabric.Layout(layers=1, kv_heads=1, head_dim=1, dtype="f8", block_tokens=1)
        self.assertNotEqual(
            kvfabric.KeyChain(b"n", kvfabric.model_fingerprint(b"m", "a"), LAYOUT).keys(list(range(16))),
            kvfabric.KeyChain(b"n", kvfabric.model_fingerprint(b"m", "a"), kvfabric.Layout(
                2, 2, 16, "f16", 16, order="engine_page")).keys(list(range(16))))


class Cluster(unittest.TestCase):
    def test_put_on_a_get_through_b_with_every_buffer_kind(self):
        keys = chain(b"cross").keys(list(range(4 * 16)))
        data = blocks(4, 1)
        half = LAYOUT.block_bytes // 2
        segs = [
            [data[0]],                                               # numpy
            [memoryview(data[1])[:half], memoryview(data[1])[half:]],  # memoryviews
            [bytearray(data[2].tobytes())],                          # bytearray
            [(data[3].ctypes.data, LAYOUT.block_bytes)],             # (address, nbytes)
        ]
        self.assertEqual(client(A, "acme").put(keys, LAYOUT, segs), [True] * 4)
        self.assertEqual(client(A, "acme").put(keys, LAYOUT, segs), [False] * 4)
        b = client(B, "acme")
        self.assertEqual(visible(b, keys, 4), 4)
        self.assertEqual(b.exists(keys), [True] * 4)
        out = [np.zeros(LAYOUT.block_bytes // 2, np.float16) for _ in keys]
        self.assertEqual(b.get_into(keys, [[o] for o in out]), [True] * 4)
        for o, d in zip(out, data):
            self.assertTrue(np.array_equal(o.view(np.uint8), d))
        t = b.start_get_into(keys[:2], [[np.zeros(LAYOUT.block_bytes, np.uint8)] for _ in range(2)])
        self.assertEqual(t.wait(10.0), [True, True])
        self.assertTrue(t.done())

    def test_torch_tensors_when_torch_is_installed(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed in this venv")
        keys = chain(b"torch").keys(list(range(16)))
        src = torch.arange(LAYOUT.block_bytes // 4, dtype=torch.float32)
        c = client(A, "acme")
        self.assertEqual(c.put(keys, LAYOUT, [[src]]), [True])
        dst = torch.zeros_like(src)
        self.assertEqual(c.get_into(keys, [[dst]]), [True])
        self.assertTrue(torch.equal(src, dst))
        with self.assertRaises(kvfabric.InvalidArgument):
            c.get_into(keys, [[torch.zeros(2 * src.numel())[::2]]])

    def test_a_lookup_counts_the_leading_blocks_only(self):
        keys = chain(b"gap").keys(list(range(3 * 16)))
        c = client(A, "acme")
        c.put([keys[0], keys[2]], LAYOUT, [[d] for d in blocks(2, 2)])
        self.assertEqual(c.lookup(keys), 1)
        self.assertEqual(c.exists(keys), [True, False, True])
        out = [np.zeros(LAYOUT.block_bytes, np.uint8) for _ in keys]
        self.assertEqual(c.get_into(keys, [[o] for o in out]), [True, False, True])

    def test_a_block_of_another_size_is_a_miss_not_bytes(self):
        keys = chain(b"size").keys(list(range(16)))
        c = client(A, "acme")
        c.put(keys, LAYOUT, [[blocks(1, 3)[0]]])
        small = np.zeros(LAYOUT.block_bytes - 2, np.uint8)
        self.assertEqual(c.get_into(keys, [[small]]), [False])
        self.assertFalse(small.any(), "nothing written into the wrong-sized buffer")


class Tenants(unittest.TestCase):
    def test_tenants_never_share_blocks(self):
        keys = chain(b"tenants").keys(list(range(2 * 16)))
        client(A, "acme").put(keys, LAYOUT, [[d] for d in blocks(2, 4)])
        self.assertEqual(visible(client(B, "acme"), keys, 2), 2, "acme sees its blocks through b")
        g = client(B, "globex")
        self.assertEqual(g.lookup(keys), 0)
        self.assertEqual(g.exists(keys), [False, False])
        out = [np.zeros(LAYOUT.block_bytes, np.uint8) for _ in keys]
        self.assertEqual(g.get_into(keys, [[o] for o in out]), [False, False])
        self.assertFalse(any(o.any() for o in out))

    def test_unknown_key_is_auth_error(self):
        c = client(A, "acme", key="not-a-key")
        with self.assertRaises(kvfabric.AuthError):
            c.lookup(chain().keys(list(range(16))))
        with self.assertRaises(kvfabric.AuthError):
            c.get_into(chain().keys(list(range(16))), [[bytearray(LAYOUT.block_bytes)]])

    def test_no_certificate_on_a_secured_node_is_connect_error(self):
        with self.assertRaises(kvfabric.ConnectError):
            kvfabric.Client(A, api_key="key-acme", timeout_s=2.0).node_id()
        with self.assertRaises(kvfabric.InvalidArgument):
            kvfabric.Client(A, tls_dir=CERTS)


class BadInput(unittest.TestCase):
    def test_bad_input_is_refused_before_anything_is_sent(self):
        c = client(A, "acme")
        keys = chain(b"bad").keys(list(range(16)))
        with self.assertRaises(ValueError):
            c.lookup([b"short"])
        with self.assertRaises(kvfabric.InvalidArgument):
            c.put(keys, LAYOUT, [[np.zeros(10, np.uint8)]])
        with self.assertRaises(kvfabric.InvalidArgument):
            c.put(keys, LAYOUT, [[np.zeros(LAYOUT.block_bytes, np.uint8)], [np.zeros(1, np.uint8)]])
        with self.assertRaises(kvfabric.InvalidArgument):
            c.get_into(keys, [[bytes(LAYOUT.block_bytes)]])
        with self.assertRaises(kvfabric.InvalidArgument):
            c.get_into(keys, [[np.zeros(2 * LAYOUT.block_bytes, np.uint8)[::2]]])
        with self.assertRaises(kvfabric.InvalidArgument):
            kvfabric.Client(A, timeout_s=0)
        self.assertEqual(c.exists(keys), [False], "nothing was stored by the refused puts")


class Deadlines(unittest.TestCase):
    def test_a_silent_node_times_out(self):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        conns = []
        stop = threading.Event()

        def accept():
            srv.settimeout(0.2)
            while not stop.is_set():
                try:
                    conns.append(srv.accept()[0])
                except OSError:
                    pass

        threading.Thread(target=accept, daemon=True).start()
        try:
            c = kvfabric.Client("127.0.0.1:%d" % srv.getsockname()[1], timeout_s=1.5)
            t = c.start_get_into(chain().keys(list(range(16))), [[bytearray(LAYOUT.block_bytes)]])
            with self.assertRaises(TimeoutError):
                t.wait(0.3)
            with self.assertRaises(kvfabric.Timeout):
                t.wait(0.0)
            self.assertEqual(t.wait(10.0), [False], "the call's own deadline ends it as a miss")
        finally:
            stop.set()
            srv.close()
            for s in conns:
                s.close()


class Examples(unittest.TestCase):
    def test_quickstart_runs(self):
        import runpy
        here = os.path.dirname(os.path.abspath(__file__))
        runpy.run_path(os.path.join(here, "..", "examples", "quickstart.py"), run_name="__main__")


if __name__ == "__main__":
    unittest.main(verbosity=2)
