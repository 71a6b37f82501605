"""Type stubs of kvfabric's native module (the Rust crate `kvfabric-python`).

Every call that touches the network releases the GIL. Buffers are anything
with the buffer protocol (numpy arrays, memoryview, bytearray, a CPU torch
tensor through ``t.numpy()``), or a ``(address, nbytes)`` tuple for memory
the caller owns and keeps alive (a torch tensor's ``data_ptr()``).
"""

from typing import Optional, Sequence, Tuple, Union

Buffer = Union[memoryview, bytearray, "numpy.ndarray", "torch.Tensor", Tuple[int, int]]
# One block's bytes, in order, as one or more segments (e.g. one page per layer).
Segments = Sequence[Buffer]

class KvfabricError(Exception):
    """Base of every error kvfabric raises."""

class ConnectError(KvfabricError):
    """The node cannot be reached (refused, TLS mismatch, timed out connecting)."""

class AuthError(KvfabricError):
    """The node refused this caller: unknown API key, or a certificate it does not admit."""

# Defined in kvfabric._errors (two bases); re-exported by kvfabric.
class InvalidArgument(KvfabricError, ValueError):
    """A key, layout or buffer the call cannot use (wrong length, wrong size...)."""

class NodeError(KvfabricError):
    """The node answered a call with an error (its gRPC status and reason)."""

class Timeout(KvfabricError, TimeoutError):
    """The call ran past its deadline."""

class Layout:
    """Shape of one block's bytes. `order` is 'layer_kv_token_head' (the bundled
    engine's) or 'engine_page' (another engine's page format, moved as opaque
    bytes; vLLM's). `dtype`: 'f32', 'f16' or 'bf16'."""
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: str,
                 block_tokens: int, order: str = "layer_kv_token_head") -> None: ...
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    block_tokens: int
    order: str
    @property
    def block_bytes(self) -> int: ...
    @property
    def layer_bytes(self) -> int: ...

def model_fingerprint(weights_id: bytes, architecture: str) -> bytes:
    """32 bytes naming a model's KV: a content hash (or any stable id) of its
    weights and its architecture description."""

class KeyChain:
    """Block keys: blake3 chain over namespace, model fingerprint, layout,
    parent key and the block's tokens (the bundled engine's chain)."""
    def __init__(self, namespace: bytes, model: bytes, layout: Layout) -> None: ...
    @property
    def block_tokens(self) -> int: ...
    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        """Keys (32 bytes each) of every full block of `tokens`, in order."""
    def next(self, parent: Optional[bytes], tokens: Sequence[int]) -> bytes: ...

class Transfer:
    """A batch in flight (start_get_into / start_put). Holds the buffers until it ends."""
    def done(self) -> bool: ...
    def wait(self, timeout_s: Optional[float] = None) -> list[bool]:
        """Per block: True when it was loaded (get) / newly stored (put).
        Raises Timeout if it has not ended in `timeout_s`."""

class Client:
    """A client of one kvfabric node (its gRPC CacheService; the node reads
    remote holders itself). `tls_dir`: a directory from `kvfabric certs init
    --tools NAME` (or `--tenants NAME`);
    `tls_name`: the certificate's name in it (`<name>.crt`, `<name>.key`
    beside `ca.crt`); `api_key`: the tenant's key when the node has a
    tenants file."""
    def __init__(self, addr: str, api_key: Optional[str] = None,
                 tls_dir: Optional[str] = None, tls_name: Optional[str] = None,
                 timeout_s: float = 5.0) -> None: ...
    @property
    def addr(self) -> str: ...
    def node_id(self) -> str:
        """The node's id (a round trip: raises ConnectError / AuthError)."""
    def lookup(self, keys: Sequence[bytes]) -> int:
        """How many leading keys some node of the cluster holds."""
    def exists(self, keys: Sequence[bytes]) -> list[bool]: ...
    def get_into(self, keys: Sequence[bytes], buffers: Sequence[Segments]) -> list[bool]:
        """Read each block into its segments (sum of their lengths == block
        bytes). False: a miss, or a block that failed its checksum (its
        segments may be partly written; recompute them)."""
    def put(self, keys: Sequence[bytes], layout: Layout, buffers: Sequence[Segments],
            owner: Optional[str] = None) -> list[bool]:
        """Store each block from its segments (sum of lengths == layout.block_bytes,
        else InvalidArgument). True: stored, False: already present. Any block
        that fails raises after the batch ends. `owner`: a trusted caller's
        tenant to count the blocks to."""
    def start_get_into(self, keys: Sequence[bytes], buffers: Sequence[Segments]) -> Transfer: ...
    def start_put(self, keys: Sequence[bytes], layout: Layout, buffers: Sequence[Segments],
                  owner: Optional[str] = None) -> Transfer: ...

class EmbeddedNode:
    """A kvfabric node inside this process (single-host use): RAM tier of
    `ram_mib`, gRPC on `grpc_addr` ('127.0.0.1:0' picks a port); `peers`:
    static peers `id=grpc_host:port=transfer_host:port` to join."""
    def __init__(self, ram_mib: int = 1024, grpc_addr: str = "127.0.0.1:0",
                 http_addr: str = "127.0.0.1:0", node_id: str = "embedded",
                 peers: Optional[Sequence[str]] = None,
                 transfer_addr: str = "127.0.0.1:0") -> None: ...
    @property
    def addr(self) -> str: ...
    @property
    def http_addr(self) -> str: ...
    def client(self, api_key: Optional[str] = None, timeout_s: float = 5.0) -> Client: ...
    def stop(self) -> None: ...
