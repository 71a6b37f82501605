"""kvfabric from Python in one file: an embedded node, block keys, a put and a
zero-copy get into numpy arrays. Run it with the venv the wheel is installed
in (bash scripts/python-build.sh VENV):

    VENV/bin/python python/examples/quickstart.py
"""

import numpy as np

import kvfabric

# A node inside this process (a RAM tier of 64 MiB, gRPC on a free loopback port).
node = kvfabric.EmbeddedNode(ram_mib=64)
client = node.client()

# What a block is: 2 layers x 2 KV heads x 64 dims x 16 tokens of f16 KV.
layout = kvfabric.Layout(layers=2, kv_heads=2, head_dim=64, dtype="f16", block_tokens=16)
model = kvfabric.model_fingerprint(b"my-model-weights-id", "llama-2x2x64")
chain = kvfabric.KeyChain(b"tenant-or-cache-salt", model, layout)

prompt = list(range(1000, 1040))  # 40 tokens: two full blocks and a partial one
keys = chain.keys(prompt)
assert len(keys) == 2

# Store two blocks; each block may be given as several segments (one per layer here).
kv = [np.random.default_rng(i).standard_normal(layout.block_bytes // 2).astype(np.float16) for i in range(2)]
per_layer = [[b[: b.size // 2], b[b.size // 2 :]] for b in kv]
print("stored:", client.put(keys, layout, per_layer))          # [True, True]

# Another engine computing the same prompt gets the same keys, and reads them back.
print("cached prefix blocks:", client.lookup(chain.keys(prompt + [7, 8, 9])))  # 2
out = [np.empty_like(b) for b in kv]
print("loaded:", client.get_into(keys, [[o] for o in out]))    # [True, True]
assert all(np.array_equal(a, b) for a, b in zip(kv, out))

# Batches can run in the background while the caller computes.
pending = client.start_get_into(keys, [[o] for o in out])
print("background load:", pending.wait(timeout_s=5.0))

try:
    client.lookup([b"not a key"])
except kvfabric.InvalidArgument as e:   # also a ValueError
    print("refused:", e)
node.stop()
