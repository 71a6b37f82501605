"""kvfabric as a vLLM KV connector (vLLM's v1 ``KVConnectorBase_V1``).

Load it with::

    vllm serve MODEL --enable-prefix-caching --kv-transfer-config '{
        "kv_connector": "KvfabricConnector",
        "kv_connector_module_path": "kvfabric.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"node": "127.0.0.1:50051",
                                      "api_key": "...", "tls_dir": "..."}}'

The scheduler side asks the node (``Client.lookup``) how many of a prompt's
full blocks, past those vLLM's own prefix cache has, some node of the cluster
holds; vLLM then waits while the worker side reads them into the blocks it
allocated (``Client.start_get_into``), and computes the rest. Every block a
step completes is stored (``Client.start_put``) after that step, and a
finished request's blocks stay allocated until its puts end.

Blocks are keyed by ``KeyChain(namespace, model fingerprint, layout)``: the
namespace is the request's ``cache_salt`` (distinct salts never share), the
fingerprint the model's name, revision, config and dtypes, the layout the KV
cache's shape. The node scopes keys by the tenant of ``api_key``, so two
instances under different tenants never share either.

kvfabric is a cache: a block that fails to load is a miss, and vLLM
recomputes it. The connector therefore runs vLLM with
``kv_load_failure_policy = "recompute"`` (it sets it, with a warning, when the
config says ``"fail"``, vLLM's default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)

from ._vllm_common import (
    ConnectorConfig,
    ConnectorConfigError,
    KvfabricConnectorMetadata,
    logger,
    model_keys,
)
from ._vllm_metrics import KvfabricPromMetrics, KvfabricStats
from ._vllm_scheduler import SchedulerSide
from ._vllm_worker import KvCacheLayoutError, WorkerSide

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = [
    "KvfabricConnector",
    "KvfabricConnectorMetadata",
    "ConnectorConfig",
    "ConnectorConfigError",
    "KvCacheLayoutError",
]


class KvfabricConnector(KVConnectorBase_V1):
    """vLLM KV connector backed by a kvfabric node (and through it, its cluster)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: Optional["KVCacheConfig"] = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if kv_cache_config is None:
            raise ConnectorConfigError("KvfabricConnector needs vLLM's KVCacheConfig (vLLM >= 0.11)")
        ktc = self._kv_transfer_config
        cfg = ConnectorConfig.from_extra(dict(ktc.kv_connector_extra_config or {}))
        if ktc.kv_load_failure_policy != "recompute":
            logger.warning("kvfabric: kv_load_failure_policy %r -> 'recompute' (a block that fails "
                           "to load is a cache miss, recomputed, never a failed request)",
                           ktc.kv_load_failure_policy)
            ktc.kv_load_failure_policy = "recompute"
        keys = model_keys(vllm_config, kv_cache_config)
        self._scheduler: Optional[SchedulerSide] = None
        self._worker: Optional[WorkerSide] = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(cfg, keys)
        else:
            self._worker = WorkerSide(cfg, keys, kv_cache_config.num_blocks)
        logger.info("kvfabric connector (%s) on node %s, %d layers, %d-token blocks",
                    role.name.lower(), cfg.node, keys.layout.layers, keys.block_tokens)

    @property
    def requires_kv_delivery(self) -> bool:
        # A dropped save is a future miss, never a wrong answer.
        return False

    def _sched(self) -> SchedulerSide:
        if self._scheduler is None:
            raise RuntimeError("KvfabricConnector: scheduler-side call on the worker side")
        return self._scheduler

    def _work(self) -> WorkerSide:
        if self._worker is None:
            raise RuntimeError("KvfabricConnector: worker-side call on the scheduler side")
        return self._worker

    def _meta(self) -> KvfabricConnectorMetadata:
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvfabricConnectorMetadata):
            raise TypeError(f"KvfabricConnector got {type(meta).__name__} metadata")
        return meta

    # ---- scheduler side ---------------------------------------------------

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._sched().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        self._sched().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        return self._sched().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: "KVConnectorOutput"):
        self._sched().update_connector_output(
            set(connector_output.invalid_block_ids or ()), set(connector_output.finished_recving or ())
        )

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._sched().request_finished(request, block_ids)

    # ---- worker side ------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]):
        self._work().register_kv_caches(kv_caches)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata):
        if isinstance(kv_connector_metadata, KvfabricConnectorMetadata):
            self._work().handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        self._work().start_load_kv(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads are asynchronous: a request computes only after its load has
        # ended (get_finished), so no layer ever waits here.
        return

    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor",
                      attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        # A kvfabric block holds every layer's page: it is stored once the
        # step has written all layers (wait_for_save).
        return

    def wait_for_save(self):
        self._work().wait_for_save(self._meta())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        sending, recving, _ = self._work().get_finished(finished_req_ids)
        return sending or None, recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending, recving, failed = self._work().get_finished(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving,
                                          failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._work().take_load_errors()

    def get_kv_connector_stats(self) -> Optional[KvfabricStats]:
        return self._worker.take_stats() if self._worker is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KvfabricStats:
        return KvfabricStats(data=data) if data is not None else KvfabricStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: dict, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> KvfabricPromMetrics:
        return KvfabricPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.close()
