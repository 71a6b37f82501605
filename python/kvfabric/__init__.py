"""kvfabric for Python: a client of a kvfabric node, the block-key chain every
engine shares, an embedded node for single-host use, and a vLLM KV connector
(``kvfabric.vllm``). See docs/PYTHON.md.

    import numpy as np, kvfabric
    node = kvfabric.EmbeddedNode(ram_mib=256)
    layout = kvfabric.Layout(layers=2, kv_heads=1, head_dim=64, dtype="f32",
                             block_tokens=16, order="engine_page")
    chain = kvfabric.KeyChain(b"my-tenant", kvfabric.model_fingerprint(b"my-model", "llama"), layout)
    keys = chain.keys(list(range(32)))                      # two full blocks
    blocks = [np.full(layout.block_bytes, i, np.uint8) for i in range(2)]
    client = node.client()
    client.put(keys, layout, [[b] for b in blocks])         # -> [True, True]
    out = [np.zeros(layout.block_bytes, np.uint8) for _ in keys]
    client.get_into(keys, [[o] for o in out])               # -> [True, True]
"""

from kvfabric._native import (
    Client,
    EmbeddedNode,
    KeyChain,
    Layout,
    Transfer,
    __version__,
    model_fingerprint,
)
from kvfabric._errors import (
    AuthError,
    ConnectError,
    InvalidArgument,
    KvfabricError,
    NodeError,
    Timeout,
)

__all__ = [
    "Client",
    "EmbeddedNode",
    "KeyChain",
    "Layout",
    "Transfer",
    "model_fingerprint",
    "KvfabricError",
    "ConnectError",
    "AuthError",
    "NodeError",
    "InvalidArgument",
    "Timeout",
    "__version__",
]
