"""The vLLM connector's metrics. The worker records one row per load or save
batch (``KvfabricStats``); vLLM ships them to its front end, which turns them
into Prometheus series on its own ``/metrics`` (``KvfabricPromMetrics``),
labelled with vLLM's per-engine labels plus ``op`` (load / save).

Stable names:
  kvfabric_vllm_hit_tokens_total        tokens loaded from kvfabric
  kvfabric_vllm_transfer_bytes_total    bytes moved, by op
  kvfabric_vllm_transfer_blocks_total   blocks asked for, by op
  kvfabric_vllm_failed_blocks_total     blocks that failed (load: recomputed), by op
  kvfabric_vllm_transfer_seconds        latency of one batch, by op (histogram)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

OPS = ("load", "save")
_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]


@dataclass
class KvfabricStats(KVConnectorStats):
    """Rows of {op, seconds, blocks, bytes, failed, tokens}; serializable."""

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data = {"rows": []}

    def record(self, op: str, seconds: float, blocks: int, nbytes: int, failed: int, tokens: int = 0) -> None:
        self.data["rows"].append(
            {"op": op, "seconds": seconds, "blocks": blocks, "bytes": nbytes, "failed": failed, "tokens": tokens}
        )

    def is_empty(self) -> bool:
        return not self.data.get("rows")

    def aggregate(self, other: KVConnectorStats) -> "KvfabricStats":
        if not other.is_empty():
            self.data["rows"].extend(other.data.get("rows", []))
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {}
        for op in OPS:
            rows = [r for r in self.data["rows"] if r["op"] == op]
            if not rows:
                continue
            out[f"{op}_batches"] = len(rows)
            out[f"{op}_blocks"] = sum(r["blocks"] for r in rows)
            out[f"{op}_failed_blocks"] = sum(r["failed"] for r in rows)
            out[f"{op}_MiB"] = round(sum(r["bytes"] for r in rows) / 2**20, 2)
            out[f"{op}_avg_ms"] = round(1e3 * sum(r["seconds"] for r in rows) / len(rows), 2)
        hit = sum(r["tokens"] for r in self.data["rows"])
        if hit:
            out["hit_tokens"] = hit
        return out


class KvfabricPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config: Any, metric_types: dict, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        op_labels = labelnames + ["op"]
        self._hit = self._counter_cls(
            name="kvfabric_vllm_hit_tokens_total",
            documentation="Prompt tokens whose KV was loaded from kvfabric.",
            labelnames=labelnames,
        )
        self._bytes = self._counter_cls(
            name="kvfabric_vllm_transfer_bytes_total",
            documentation="Bytes moved between vLLM and kvfabric, by op (load, save).",
            labelnames=op_labels,
        )
        self._blocks = self._counter_cls(
            name="kvfabric_vllm_transfer_blocks_total",
            documentation="Blocks asked of kvfabric, by op.",
            labelnames=op_labels,
        )
        self._failed = self._counter_cls(
            name="kvfabric_vllm_failed_blocks_total",
            documentation="Blocks whose load or save failed, by op (failed loads are recomputed).",
            labelnames=op_labels,
        )
        self._seconds = self._histogram_cls(
            name="kvfabric_vllm_transfer_seconds",
            documentation="Latency of one load or save batch, by op.",
            buckets=_BUCKETS,
            labelnames=op_labels,
        )
        # Every series exists from the start (at 0), so dashboards see them.
        for labels in per_engine_labelvalues.values():
            self._hit.labels(*labels)
            for op in OPS:
                for metric in (self._bytes, self._blocks, self._failed, self._seconds):
                    metric.labels(*labels, op)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        rows = (transfer_stats_data or {}).get("rows", [])
        labels = self.per_engine_labelvalues[engine_idx]
        for r in rows:
            op = [*labels, r["op"]]
            self._bytes.labels(*op).inc(r["bytes"])
            self._blocks.labels(*op).inc(r["blocks"])
            self._failed.labels(*op).inc(r["failed"])
            self._seconds.labels(*op).observe(r["seconds"])
            if r["tokens"]:
                self._hit.labels(*labels).inc(r["tokens"])
