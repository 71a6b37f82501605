"""The vLLM connector's worker side: moves whole vLLM blocks between vLLM's
KV cache tensors and the kvfabric node, zero-copy.

A kvfabric block is one vLLM block's page in every layer, in layer order, as
opaque bytes (``Layout(order='engine_page')``): the segments of a block are
(address, length) views straight into vLLM's tensors, which the node reads
from (put) and writes into (get). A load that fails, misses, times out or
fails its checksum is reported to vLLM block by block, and vLLM recomputes
from the first such block: a bad load costs time, never a wrong token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from kvfabric import Client, KvfabricError

from ._vllm_common import Backoff, ConnectorConfig, KvfabricConnectorMetadata, ModelKeys, logger
from ._vllm_metrics import KvfabricStats

if TYPE_CHECKING:
    import torch

    from kvfabric import Transfer

Segment = tuple[int, int]


class KvCacheLayoutError(ValueError):
    """vLLM's KV cache tensors are not the shape the connector can move."""


@dataclass
class _LayerPages:
    """Where one layer's page of block b lies: for each of `parts` (K and V
    where the engine keeps them apart, else one) base + i*part_stride +
    b*block_stride, `page` bytes long."""

    base: int
    block_stride: int
    part_stride: int
    parts: int
    page: int

    def segments(self, block: int) -> list[Segment]:
        at = self.base + block * self.block_stride
        return [(at + i * self.part_stride, self.page) for i in range(self.parts)]


@dataclass
class _Load:
    req_id: str
    transfer: "Transfer"
    block_ids: list[int]
    started: float
    warned: bool = False


@dataclass
class _Save:
    transfer: "Transfer"
    blocks: int
    started: float


@dataclass
class _ReqSaves:
    pending: list[_Save] = field(default_factory=list)
    finished: bool = False


def layer_pages(t: "torch.Tensor", num_blocks: int) -> _LayerPages:
    """How blocks lie in one layer's tensor: the dimension of size num_blocks
    is the block's; the dimensions after it must be contiguous (the page);
    those before it (at most one: K/V) are parts."""
    if t.device.type != "cpu":
        raise KvCacheLayoutError(
            f"KV cache on {t.device}: this build moves host memory only (the CPU backend)"
        )
    shape, strides, esz = list(t.shape), list(t.stride()), t.element_size()
    dims = [i for i, n in enumerate(shape) if n == num_blocks]
    if not dims or dims[0] > 1:
        raise KvCacheLayoutError(f"no block dimension of size {num_blocks} in KV tensor {shape}")
    d = dims[0]
    page_elems = 1
    for n in shape[d + 1:]:
        page_elems *= n
    inner = t.select(d, 0) if d == 0 else t.select(0, 0).select(0, 0)
    if not inner.is_contiguous() or strides[d] < page_elems:
        raise KvCacheLayoutError(f"KV tensor {shape} strides {strides}: a block's page is not contiguous")
    parts = shape[0] if d == 1 else 1
    part_stride = strides[0] * esz if d == 1 else 0
    return _LayerPages(t.data_ptr(), strides[d] * esz, part_stride, parts, page_elems * esz)


class WorkerSide:
    def __init__(self, cfg: ConnectorConfig, keys: ModelKeys, num_blocks: int,
                 client: Optional[Client] = None):
        self._cfg = cfg
        self._keys = keys
        self._num_blocks = num_blocks
        self._client = client if client is not None else cfg.client()
        self._layers: list[_LayerPages] = []
        self._loads: dict[str, _Load] = {}
        self._saves: dict[str, _ReqSaves] = {}
        self._load_errors: set[int] = set()
        # Loads that ended without a transfer (could not start).
        self._loads_ended: set[str] = set()
        # Loads failed as a whole (unplanned): vLLM recomputes the request.
        self._failed_recving: set[str] = set()
        self._stats = KvfabricStats()
        self._node_calls = Backoff("save")

    # ---- setup -----------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        missing = [n for n in self._keys.layer_names if n not in kv_caches]
        if missing:
            raise KvCacheLayoutError(f"KV caches lack layers {missing[:3]}...")
        self._layers = [layer_pages(kv_caches[n], self._num_blocks) for n in self._keys.layer_names]
        block_bytes = sum(p.page * p.parts for p in self._layers)
        if block_bytes != self._keys.layout.block_bytes:
            raise KvCacheLayoutError(
                f"a vLLM block is {block_bytes} bytes over {len(self._layers)} layers, "
                f"the layout says {self._keys.layout.block_bytes} (padded pages?)"
            )
        logger.info("kvfabric: %d layers, %d blocks of %d tokens, %d bytes a block, node %s",
                    len(self._layers), self._num_blocks, self._keys.block_tokens, block_bytes,
                    self._cfg.node)

    def _segments(self, block: int) -> list[Segment]:
        if not 0 < block < self._num_blocks:
            raise IndexError(f"vLLM block {block} outside 1..{self._num_blocks - 1}")
        return [s for layer in self._layers for s in layer.segments(block)]

    # ---- loads -----------------------------------------------------------

    def start_load_kv(self, meta: KvfabricConnectorMetadata) -> None:
        for spec in meta.loads:
            now = time.monotonic()
            if spec.unplanned:
                self._failed_recving.add(spec.req_id)
                self._loads_ended.add(spec.req_id)
                continue
            try:
                buffers = [self._segments(b) for b in spec.block_ids]
                t = self._client.start_get_into(spec.keys, buffers)
            except (KvfabricError, IndexError) as e:
                logger.warning("kvfabric load of request %s not started (%s): %s",
                               spec.req_id, type(e).__name__, e)
                self._load_errors.update(spec.block_ids)
                self._stats.record("load", time.monotonic() - now, len(spec.keys), 0, len(spec.keys))
                self._loads_ended.add(spec.req_id)
                continue
            self._loads[spec.req_id] = _Load(spec.req_id, t, spec.block_ids, now)

    def _finish_loads(self) -> set[str]:
        done, self._loads_ended = self._loads_ended, set()
        for req_id, load in list(self._loads.items()):
            if not load.transfer.done():
                self._warn_late(load)
                continue
            del self._loads[req_id]
            done.add(req_id)
            try:
                ok = load.transfer.wait(0)
            except KvfabricError as e:
                logger.warning("kvfabric load of request %s failed (%s): %s", req_id, type(e).__name__, e)
                ok = [False] * len(load.block_ids)
            failed = [b for b, good in zip(load.block_ids, ok) if not good]
            if failed:
                logger.warning("kvfabric load of request %s: %d of %d blocks failed; vLLM recomputes them",
                               req_id, len(failed), len(load.block_ids))
                self._load_errors.update(failed)
            loaded = len(load.block_ids) - len(failed)
            self._stats.record("load", time.monotonic() - load.started, len(load.block_ids),
                               loaded * self._keys.layout.block_bytes, len(failed),
                               tokens=loaded * self._keys.block_tokens)
        return done

    def _warn_late(self, load: _Load) -> None:
        if not load.warned and time.monotonic() - load.started > self._cfg.load_timeout_s:
            load.warned = True
            logger.warning("kvfabric load of request %s still running after %.0f s; its blocks stay "
                           "reserved until the node ends it", load.req_id, self._cfg.load_timeout_s)

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    # ---- saves -----------------------------------------------------------

    def wait_for_save(self, meta: KvfabricConnectorMetadata) -> None:
        """Start the puts of the blocks this step completed (the forward has
        written them); the blocks stay allocated until the puts end."""
        for spec in meta.saves:
            self._saves.setdefault(spec.req_id, _ReqSaves())
        if not meta.saves or not self._node_calls.ready():
            # (A node that failed a moment ago: these blocks go unsaved, a future miss.)
            return
        keys = [k for s in meta.saves for k in s.keys]
        blocks = [b for s in meta.saves for b in s.block_ids]
        owners = [s.req_id for s in meta.saves for _ in s.keys]
        now = time.monotonic()
        try:
            present = self._client.exists(keys)
        except KvfabricError as e:
            self._node_calls.failed(e)
            return
        self._node_calls.ok()
        by_req: dict[str, tuple[list[bytes], list[int]]] = {}
        for k, b, r, p in zip(keys, blocks, owners, present):
            if not p:
                ks, bs = by_req.setdefault(r, ([], []))
                ks.append(k)
                bs.append(b)
        for req_id, (ks, bs) in by_req.items():
            try:
                t = self._client.start_put(ks, self._keys.layout, [self._segments(b) for b in bs])
            except (KvfabricError, IndexError) as e:
                self._node_calls.failed(e)
                self._stats.record("save", time.monotonic() - now, len(ks), 0, len(ks))
                continue
            self._saves[req_id].pending.append(_Save(t, len(ks), now))

    def _reap_saves(self, block: bool = False, only: Optional[set[str]] = None) -> None:
        for req_id, rs in self._saves.items():
            if only is not None and req_id not in only:
                continue
            still = []
            for s in rs.pending:
                if not block and not s.transfer.done():
                    still.append(s)
                    continue
                self._end_save(req_id, s)
            rs.pending = still

    def _end_save(self, req_id: str, s: _Save) -> None:
        try:
            ok = s.transfer.wait(None)
            failed = 0
        except KvfabricError as e:
            logger.warning("kvfabric save of request %s failed (%s): %s", req_id, type(e).__name__, e)
            ok, failed = [], s.blocks
        stored = sum(1 for x in ok if x)
        self._stats.record("save", time.monotonic() - s.started, s.blocks,
                           stored * self._keys.layout.block_bytes, failed)

    def handle_preemptions(self, meta: KvfabricConnectorMetadata) -> None:
        """A preempted request's blocks are about to be reused: its puts must end first."""
        if meta.preempted:
            self._reap_saves(block=True, only=meta.preempted)

    # ---- completion ------------------------------------------------------

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str], set[str]]:
        """(requests whose saves ended after they finished, requests whose
        loads ended, those of them whose load failed as a whole)."""
        recving = self._finish_loads()
        failed, self._failed_recving = self._failed_recving & recving, self._failed_recving - recving
        self._reap_saves()
        sending: set[str] = set()
        for req_id in finished_req_ids:
            if req_id in self._saves:
                self._saves[req_id].finished = True
        for req_id, rs in list(self._saves.items()):
            if rs.finished and not rs.pending:
                sending.add(req_id)
                del self._saves[req_id]
        return sending, recving, failed

    def take_stats(self) -> Optional[KvfabricStats]:
        if self._stats.is_empty():
            return None
        stats, self._stats = self._stats, KvfabricStats()
        return stats

    def shutdown(self, grace_s: float = 10.0) -> None:
        deadline = time.monotonic() + grace_s
        for rs in self._saves.values():
            for s in rs.pending:
                try:
                    s.transfer.wait(max(0.0, deadline - time.monotonic()))
                except KvfabricError:
                    pass
        self._client.close()

