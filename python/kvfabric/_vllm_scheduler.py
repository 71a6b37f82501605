"""The vLLM connector's scheduler side: asks the node how much of a prompt's
prefix the cluster holds, plans the loads into the blocks vLLM allocates, and
plans the saves of every block a step completes.

Loads are asynchronous (vLLM keeps the request waiting for its KV while the
worker reads it, between steps and beside other requests' compute); saves run
after the step that computed the blocks, and a finished request's blocks stay
allocated until its saves have ended (``request_finished`` returns True).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from kvfabric import Client, KvfabricError

from ._vllm_common import (
    Backoff,
    ConnectorConfig,
    KvfabricConnectorMetadata,
    LoadSpec,
    ModelKeys,
    SaveSpec,
    logger,
)

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request


@dataclass
class _Planned:
    """A load get_num_new_matched_tokens found: keys of the blocks past vLLM's
    own prefix cache, the first block they go to, and the cluster's hit."""

    keys: list[bytes]
    first_block: int
    held_blocks: int


@dataclass
class _Tracked:
    """A request the scheduler runs: its blocks and what has been saved."""

    request: "Request"
    block_ids: list[int] = field(default_factory=list)
    # Leading blocks known to be in the cluster (found there, or saved).
    saved_blocks: int = 0
    # Keys of the request's leading full blocks, extended as they fill.
    keys: list[bytes] = field(default_factory=list)
    saves_scheduled: bool = False


class SchedulerSide:
    def __init__(self, cfg: ConnectorConfig, keys: ModelKeys, client: Optional[Client] = None):
        self._cfg = cfg
        self._keys = keys
        self._client = client if client is not None else cfg.client()
        self._planned: dict[str, _Planned] = {}
        self._loads: list[LoadSpec] = []
        self._tracked: dict[str, _Tracked] = {}
        self._lookups = Backoff("lookup")
        # Loads in flight: request -> (first block index, target block ids).
        self._loading: dict[str, tuple[int, list[int]]] = {}

    @property
    def block_tokens(self) -> int:
        return self._keys.block_tokens

    # ---- lookup ----------------------------------------------------------

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        bs = self.block_tokens
        # vLLM must compute at least the last token: never offer the whole prompt.
        max_blocks = (request.num_tokens - 1) // bs
        local_blocks = num_computed_tokens // bs
        self._planned.pop(request.request_id, None)
        if max_blocks <= local_blocks:
            return 0, False
        if not self._lookups.ready():
            return 0, False
        tokens = list(request.all_token_ids[: max_blocks * bs])
        keys = self._keys.chain(request.cache_salt).keys(tokens)
        try:
            held = self._client.lookup(keys)
        except KvfabricError as e:
            self._lookups.failed(e)
            return 0, False
        self._lookups.ok()
        if held <= local_blocks:
            return 0, False
        self._planned[request.request_id] = _Planned(keys[local_blocks:held], local_blocks, held)
        logger.debug("request %s: %d blocks local, cluster holds %d of %d",
                     request.request_id, local_blocks, held, max_blocks)
        return (held - local_blocks) * bs, True

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        req_id = request.request_id
        tracked = self._tracked.get(req_id)
        if tracked is None:
            tracked = _Tracked(request)
            self._tracked[req_id] = tracked
        planned = self._planned.pop(req_id, None)
        if num_external_tokens == 0:
            return
        targets = self._targets(req_id, planned, blocks, num_external_tokens)
        if planned is None or targets is None:
            # vLLM waits for this load: it must end, as a failure it recomputes.
            self._loads.append(LoadSpec(req_id, [], [], unplanned=True))
            return
        self._loads.append(LoadSpec(req_id, planned.keys, targets))
        self._loading[req_id] = (planned.first_block, targets)
        tracked.saved_blocks = max(tracked.saved_blocks, planned.held_blocks)

    def _targets(self, req_id: str, planned: Optional[_Planned], blocks: "KVCacheBlocks",
                 num_external_tokens: int) -> Optional[list[int]]:
        """The blocks vLLM allocated for the planned load, or None (logged)
        when they do not match it (never seen: vLLM takes block-aligned hits
        whole)."""
        want = len(planned.keys) * self.block_tokens if planned is not None else 0
        if planned is None or num_external_tokens != want:
            logger.error("request %s: vLLM allocated %d external tokens, kvfabric planned %d; recomputing",
                         req_id, num_external_tokens, want)
            return None
        block_ids = blocks.get_block_ids()[0]
        targets = list(block_ids[planned.first_block: planned.first_block + len(planned.keys)])
        if len(targets) != len(planned.keys):
            logger.error("request %s: %d blocks allocated for %d loads; recomputing",
                         req_id, len(targets), len(planned.keys))
            return None
        return targets

    def update_connector_output(self, invalid_block_ids: set[int], finished_recving: set[str]) -> None:
        """A block that failed to load is recomputed by vLLM: save it again."""
        for req_id, (first, targets) in list(self._loading.items()):
            bad = [i for i, b in enumerate(targets) if b in invalid_block_ids]
            tracked = self._tracked.get(req_id)
            if bad and tracked is not None:
                tracked.saved_blocks = min(tracked.saved_blocks, first + bad[0])
            if req_id in finished_recving:
                del self._loading[req_id]

    # ---- per step --------------------------------------------------------

    def build_connector_meta(self, out: "SchedulerOutput") -> KvfabricConnectorMetadata:
        meta = KvfabricConnectorMetadata(loads=self._loads)
        self._loads = []
        for req_id in out.preempted_req_ids or ():
            tracked = self._tracked.get(req_id)
            if tracked is not None:
                tracked.block_ids = []
            meta.preempted.add(req_id)
        for new in out.scheduled_new_reqs:
            tracked = self._tracked.get(new.req_id)
            if tracked is None:
                continue
            tracked.block_ids = list(new.block_ids[0])
            done = new.num_computed_tokens + out.num_scheduled_tokens.get(new.req_id, 0)
            self._plan_save(meta, tracked, done)
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                tracked.block_ids.extend(new_ids[0])
            done = cached.num_computed_tokens[i] + out.num_scheduled_tokens.get(req_id, 0)
            self._plan_save(meta, tracked, done)
        return meta

    def _plan_save(self, meta: KvfabricConnectorMetadata, tracked: _Tracked, computed: int) -> None:
        """Save the full blocks whose KV this step completes."""
        request = tracked.request
        bs = self.block_tokens
        limit = request.num_tokens if self._cfg.save_decode else request.num_prompt_tokens
        full = min(computed, limit) // bs
        full = min(full, len(tracked.block_ids))
        if full <= tracked.saved_blocks:
            return
        self._extend_keys(tracked, full)
        first = tracked.saved_blocks
        meta.saves.append(SaveSpec(request.request_id, tracked.keys[first:full], tracked.block_ids[first:full]))
        tracked.saved_blocks = full
        tracked.saves_scheduled = True

    def _extend_keys(self, tracked: _Tracked, blocks: int) -> None:
        bs = self.block_tokens
        have = len(tracked.keys)
        if have >= blocks:
            return
        chain = self._keys.chain(tracked.request.cache_salt)
        tokens = tracked.request.all_token_ids
        parent = tracked.keys[-1] if tracked.keys else None
        for b in range(have, blocks):
            parent = chain.next(parent, list(tokens[b * bs:(b + 1) * bs]))
            tracked.keys.append(parent)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, Optional[dict[str, Any]]]:
        """True when saves of this request may still be running: vLLM then
        frees its blocks once the worker reports them ended."""
        self._planned.pop(request.request_id, None)
        self._loading.pop(request.request_id, None)
        tracked = self._tracked.pop(request.request_id, None)
        return (tracked is not None and tracked.saves_scheduled), None

    def close(self) -> None:
        self._client.close()
