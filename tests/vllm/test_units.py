"""The vLLM connector's two sides against an embedded kvfabric node, without
vLLM servers (seconds): lookups never offer the whole prompt and skip vLLM's
own prefix, salts never share, loads land in the right blocks byte for byte,
misses are reported block by block, saves hold a finished request's blocks
until they end, and bad configuration is a typed error. Run by the vLLM
venv's python (tests/vllm_connector.rs runs it before test_connector.py)."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import torch

import kvfabric
from kvfabric._vllm_common import ConnectorConfig, ConnectorConfigError, LoadSpec, ModelKeys, namespace
from kvfabric._vllm_scheduler import SchedulerSide
from kvfabric._vllm_worker import KvCacheLayoutError, WorkerSide

BS = 16
LAYERS, HEADS, DIM, NUM_BLOCKS = 2, 1, 8, 12
LAYOUT = kvfabric.Layout(layers=LAYERS, kv_heads=HEADS, head_dim=DIM, dtype="f32", block_tokens=BS,
                         order="engine_page")


def model_keys() -> ModelKeys:
    return ModelKeys(LAYOUT, kvfabric.model_fingerprint(b"unit-model", "unit"), ("l0", "l1"))


def request(req_id: str, tokens: list[int], salt=None) -> SimpleNamespace:
    return SimpleNamespace(request_id=req_id, num_tokens=len(tokens), all_token_ids=tokens, cache_salt=salt,
                           num_prompt_tokens=len(tokens))


def kv_caches(fill: float | None = None) -> dict[str, torch.Tensor]:
    """CPU-backend shaped caches: [num_blocks, kv_heads, 16, 16] per layer, views of one buffer."""
    page = 2 * DIM * BS
    buf = torch.randn(LAYERS, NUM_BLOCKS, HEADS, page // 16, 16) if fill is None else \
        torch.full((LAYERS, NUM_BLOCKS, HEADS, page // 16, 16), fill)
    return {f"l{i}": buf[i] for i in range(LAYERS)}


def sched_output(new=(), cached=None, finished=()) -> SimpleNamespace:
    cached = cached or SimpleNamespace(req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[])
    sched = {n.req_id: n.scheduled for n in new}
    return SimpleNamespace(preempted_req_ids=set(), scheduled_new_reqs=list(new), scheduled_cached_reqs=cached,
                           num_scheduled_tokens=sched, finished_req_ids=set(finished))


def new_req(req_id: str, block_ids: list[int], computed: int, scheduled: int) -> SimpleNamespace:
    return SimpleNamespace(req_id=req_id, block_ids=(block_ids,), num_computed_tokens=computed, scheduled=scheduled)


def poll(step, want: str):
    """Call `step` until it returns something truthy (at most 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = step()
        if got:
            return got
        time.sleep(0.005)
    raise AssertionError(f"{want} never happened")


def test_config() -> None:
    for bad in ({}, {"node": "x", "nodes": 1}, {"node": "x", "timeout_s": -1}):
        try:
            ConnectorConfig.from_extra(bad)
        except ConnectorConfigError:
            continue
        raise AssertionError(f"{bad} accepted")
    assert len({namespace(None), namespace(""), namespace("a"), namespace("b")}) == 4


def test_save_then_load(node: kvfabric.EmbeddedNode) -> None:
    cfg = ConnectorConfig(node=node.addr)
    keys = model_keys()
    sched, src = SchedulerSide(cfg, keys), WorkerSide(cfg, keys, NUM_BLOCKS)
    caches = kv_caches()
    src.register_kv_caches(caches)
    tokens = list(range(100, 100 + 4 * BS + 5))  # 4 full blocks and 5 tokens
    r = request("r1", tokens)
    assert sched.get_num_new_matched_tokens(r, 0) == (0, False)  # nothing stored yet
    sched.update_state_after_alloc(r, None, 0)
    meta = sched.build_connector_meta(sched_output([new_req("r1", [3, 4, 5, 6, 7], 0, len(tokens))]))
    assert [s.block_ids for s in meta.saves] == [[3, 4, 5, 6]], meta.saves
    src.wait_for_save(meta)
    assert sched.request_finished(r, [3, 4, 5, 6, 7]) == (True, None)  # saves may run: hold the blocks
    assert poll(lambda: src.get_finished({"r1"})[0], "the finished request's saves ending") == {"r1"}

    # A fresh worker loads them: vLLM has one block locally, kvfabric the next three.
    dst_sched, dst = SchedulerSide(cfg, keys), WorkerSide(cfg, keys, NUM_BLOCKS)
    dst_caches = kv_caches(fill=0.0)
    dst.register_kv_caches(dst_caches)
    r2 = request("r2", tokens)
    assert dst_sched.get_num_new_matched_tokens(r2, BS) == (3 * BS, True)
    blocks = SimpleNamespace(get_block_ids=lambda: ([9, 1, 2, 8, 10],))
    dst_sched.update_state_after_alloc(r2, blocks, 3 * BS)
    meta = dst_sched.build_connector_meta(sched_output())
    assert [(s.block_ids, len(s.keys)) for s in meta.loads] == [([1, 2, 8], 3)], meta.loads
    dst.start_load_kv(meta)
    assert poll(lambda: dst.get_finished(set())[1], "the load ending") == {"r2"}
    assert dst.take_load_errors() == set()
    for src_b, dst_b in ((4, 1), (5, 2), (6, 8)):
        for name in caches:
            assert torch.equal(caches[name][src_b], dst_caches[name][dst_b]), (name, src_b, dst_b)
    # The whole prompt is never offered: 4 full blocks of 4*16 tokens -> 3.
    whole = request("r3", tokens[: 4 * BS])
    assert dst_sched.get_num_new_matched_tokens(whole, 0) == (3 * BS, True)
    # Another salt sees nothing.
    assert dst_sched.get_num_new_matched_tokens(request("r4", tokens, salt="s"), 0) == (0, False)


def test_missing_blocks_reported(node: kvfabric.EmbeddedNode) -> None:
    cfg = ConnectorConfig(node=node.addr)
    keys = model_keys()
    w = WorkerSide(cfg, keys, NUM_BLOCKS)
    w.register_kv_caches(kv_caches())
    chain = keys.chain(None)
    unknown = chain.keys(list(range(7000, 7000 + 2 * BS)))
    meta = SimpleNamespace(loads=[LoadSpec("m", unknown, [5, 6])])
    w.start_load_kv(meta)
    assert poll(lambda: w.get_finished(set())[1], "the load ending") == {"m"}
    assert w.take_load_errors() == {5, 6}


def test_unplanned_load_fails_whole(node: kvfabric.EmbeddedNode) -> None:
    """A load vLLM allocated that the scheduler side did not plan ends at once
    as a failed receive (vLLM recomputes), never a request left waiting."""
    cfg = ConnectorConfig(node=node.addr)
    keys = model_keys()
    sched, w = SchedulerSide(cfg, keys), WorkerSide(cfg, keys, NUM_BLOCKS)
    w.register_kv_caches(kv_caches())
    r = request("u", list(range(3 * BS)))
    sched.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3],)), 2 * BS)
    meta = sched.build_connector_meta(sched_output())
    assert [(s.req_id, s.unplanned) for s in meta.loads] == [("u", True)], meta.loads
    w.start_load_kv(meta)
    assert w.get_finished(set()) == (set(), {"u"}, {"u"})


def test_layout_checked() -> None:
    w = WorkerSide(ConnectorConfig(node="127.0.0.1:1"), model_keys(), NUM_BLOCKS)
    try:
        w.register_kv_caches({"l0": torch.zeros(NUM_BLOCKS, 3, 7), "l1": torch.zeros(NUM_BLOCKS, 3, 7)})
    except KvCacheLayoutError:
        return
    raise AssertionError("a cache of the wrong page size was accepted")


def main() -> int:
    node = kvfabric.EmbeddedNode(ram_mib=64)
    cases = [("config", test_config), ("layout", test_layout_checked),
             ("save_then_load", lambda: test_save_then_load(node)),
             ("missing_blocks", lambda: test_missing_blocks_reported(node)),
             ("unplanned_load", lambda: test_unplanned_load_fails_whole(node))]
    failed = 0
    for name, case in cases:
        try:
            case()
            print(f"ok   unit {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is printed
            failed += 1
            print(f"FAIL unit {name}: {type(e).__name__}: {e}", flush=True)
    node.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
