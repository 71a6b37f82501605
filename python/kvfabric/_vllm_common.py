"""Pieces of the vLLM connector both of its sides use: its configuration, the
block layout and model fingerprint that key its blocks, per-cache_salt
namespaces, and the metadata the scheduler side hands the worker side.

Everything here is computed from the ``VllmConfig`` and ``KVCacheConfig`` vLLM
gives both sides, so the scheduler (which looks keys up) and the worker (which
moves the blocks) agree on every key without talking to each other.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from kvfabric import Client, KeyChain, Layout, model_fingerprint

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

# Under vLLM's logger, so its handlers format and filter the connector's lines.
logger = logging.getLogger("vllm.kvfabric")

# Namespace of blocks without a cache_salt; a salted request's namespace is
# this, a NUL and the salt, so no salt (nor the absence of one) can name
# another's chain.
BASE_NAMESPACE = b"vllm"

_DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}


class ConnectorConfigError(ValueError):
    """The connector's kv_transfer_config (or the model it serves) is one it
    cannot work with; the message says which setting and why."""


@dataclass(frozen=True)
class ConnectorConfig:
    """``kv_connector_extra_config`` of the connector."""

    node: str
    api_key: Optional[str] = None
    # A secured cluster: the directory of `kvfabric certs init --tools NAME`
    # (or `--tenants NAME`) and NAME, the certificate's name in it.
    tls_dir: Optional[str] = None
    tls_name: Optional[str] = None
    # Deadline of one call to the node (lookups, starting a transfer).
    timeout_s: float = 5.0
    # Past this, an unfinished load is logged as late (it still holds its
    # blocks until the node's own deadline ends it).
    load_timeout_s: float = 30.0
    # Save the KV of generated tokens too (not only the prompt's).
    save_decode: bool = True

    @staticmethod
    def from_extra(extra: dict[str, Any]) -> "ConnectorConfig":
        known = set(ConnectorConfig.__dataclass_fields__)
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ConnectorConfigError(
                f"kv_connector_extra_config: unknown keys {unknown}; known: {sorted(known)}"
            )
        node = extra.get("node")
        if not isinstance(node, str) or not node:
            raise ConnectorConfigError(
                'kv_connector_extra_config needs "node": the kvfabric node\'s gRPC address, '
                'e.g. "127.0.0.1:50051"'
            )
        try:
            timeout_s = float(extra.get("timeout_s", 5.0))
            load_timeout_s = float(extra.get("load_timeout_s", 30.0))
        except (TypeError, ValueError) as e:
            raise ConnectorConfigError(f"kv_connector_extra_config: timeouts are seconds: {e}") from e
        if timeout_s <= 0 or load_timeout_s <= 0:
            raise ConnectorConfigError("kv_connector_extra_config: timeouts must be positive")
        return ConnectorConfig(
            node=node,
            api_key=extra.get("api_key") or None,
            tls_dir=extra.get("tls_dir") or None,
            tls_name=extra.get("tls_name") or None,
            timeout_s=timeout_s,
            load_timeout_s=load_timeout_s,
            save_decode=bool(extra.get("save_decode", True)),
        )

    def client(self) -> Client:
        return Client(self.node, api_key=self.api_key, tls_dir=self.tls_dir, tls_name=self.tls_name,
                      timeout_s=self.timeout_s)


class Backoff:
    """After a failed call to the node, skip calls for `pause_s`: a down or
    hung node then costs vLLM's step loop one deadline, not one per step."""

    def __init__(self, what: str, pause_s: float = 5.0):
        self._what, self._pause_s = what, pause_s
        self._until = 0.0

    def ready(self) -> bool:
        return time.monotonic() >= self._until

    def failed(self, e: BaseException) -> None:
        if self.ready():
            logger.warning("kvfabric %s failed (%s: %s); skipping it for %.0f s",
                           self._what, type(e).__name__, e, self._pause_s)
        self._until = time.monotonic() + self._pause_s

    def ok(self) -> None:
        self._until = 0.0


@dataclass(frozen=True)
class ModelKeys:
    """What keys this vLLM instance's blocks: the layout, the model
    fingerprint, and a KeyChain per namespace (built on first use)."""

    layout: Layout
    fingerprint: bytes
    layer_names: tuple[str, ...]
    chains: dict[bytes, KeyChain] = field(default_factory=dict, compare=False)

    @property
    def block_tokens(self) -> int:
        return self.layout.block_tokens

    def chain(self, cache_salt: Optional[str]) -> KeyChain:
        ns = namespace(cache_salt)
        chain = self.chains.get(ns)
        if chain is None:
            chain = KeyChain(ns, self.fingerprint, self.layout)
            self.chains[ns] = chain
        return chain


def namespace(cache_salt: Optional[str]) -> bytes:
    """The key namespace of a request: its cache_salt's own, or the base one."""
    if cache_salt is None:
        return BASE_NAMESPACE
    return BASE_NAMESPACE + b"\x00salt\x00" + cache_salt.encode("utf-8")


def model_keys(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig") -> ModelKeys:
    """Layout and fingerprint of this instance's KV (same on both sides)."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ConnectorConfigError(
            f"KvfabricConnector supports models with one KV cache group; this one has {len(groups)}"
        )
    spec = groups[0].kv_cache_spec
    for attr in ("num_kv_heads", "head_size", "dtype", "block_size"):
        if not hasattr(spec, attr):
            raise ConnectorConfigError(
                f"KvfabricConnector needs an attention KV cache; got {type(spec).__name__}"
            )
    dtype = _DTYPES.get(str(spec.dtype))
    if dtype is None:
        raise ConnectorConfigError(f"KV cache dtype {spec.dtype} is not one of f32, f16, bf16")
    layout = Layout(
        layers=len(groups[0].layer_names),
        kv_heads=int(spec.num_kv_heads),
        head_dim=int(spec.head_size),
        dtype=dtype,
        block_tokens=int(spec.block_size),
        order="engine_page",
    )
    return ModelKeys(
        layout=layout,
        fingerprint=fingerprint(vllm_config, dtype),
        layer_names=tuple(groups[0].layer_names),
    )


def fingerprint(vllm_config: "VllmConfig", kv_dtype: str) -> bytes:
    """The model's identity: its name or path, revision and quantization name
    the weights; its config (JSON, sorted keys), compute dtype and KV dtype
    the architecture."""
    mc = vllm_config.model_config
    weights = "\x00".join(
        str(x) for x in (mc.model, getattr(mc, "revision", None), getattr(mc, "quantization", None))
    )
    weights_id = hashlib.sha256(weights.encode("utf-8")).digest()
    hf_config = getattr(mc, "hf_config", None)
    config_json = hf_config.to_json_string(use_diff=False) if hf_config is not None else ""
    arch = f"vllm-engine-page;dtype={mc.dtype};kv={kv_dtype};config={config_json}"
    return model_fingerprint(weights_id, arch)


@dataclass
class LoadSpec:
    """Read `keys` into vLLM blocks `block_ids` (same length, in order).
    `unplanned`: vLLM allocated a load the scheduler side cannot match to
    keys; the worker reports it failed at once (vLLM recomputes it all)."""

    req_id: str
    keys: list[bytes]
    block_ids: list[int]
    unplanned: bool = False


@dataclass
class SaveSpec:
    """Store vLLM blocks `block_ids` under `keys` (same length, in order)."""

    req_id: str
    keys: list[bytes]
    block_ids: list[int]


@dataclass
class KvfabricConnectorMetadata(KVConnectorMetadata):
    """One step's work, scheduler -> worker."""

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)
