"""The vLLM connector against real vLLM CPU servers and a two-node kvfabric
cluster (issue 46). Plain Python, run by the vLLM venv's interpreter; driven
by tests/vllm_connector.rs (cargo test), or by hand:

    python tests/vllm/test_connector.py --kvfabric target/debug/kvfabric \
        --model ~/.cache/kvfabric/models/smollm2-135m-hf [--workdir DIR]

Two nodes, a (a 96 MiB RAM tier over a disk tier, so older blocks sit on
disk where they can be corrupted) and b, read one tenants file. vLLM A (tenant t1)
saves into a; vLLM B (tenant t1, a fresh process) reads through b. Each case
uses its own prompt (~1500 tokens, 11 full 128-token blocks) and compares
against A's cold answer:

  reuse    B answers with cached_tokens >= 1280 loaded through kvfabric, same text
  salts    a different cache_salt gets nothing, the same salt gets the blocks
  corrupt  bytes flipped in a's disk tier: B's load fails its checksum, B
           recomputes (failed load blocks counted), same text
  kill     a is SIGKILLed while B loads: no failed request, same text
  tenants  vLLM C under tenant t2 gets none of t1's blocks (cached_tokens 0)

Each fails on a connector that skips what it covers: ignoring cache_salt or
the api_key shares blocks; ignoring a failed load leaves garbage KV (wrong
text) or a failed request.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches" / "peers"))
from vllm_harness import Answer, HarnessError, Node, NodeSpec, VllmServer, free_port  # noqa: E402

log = logging.getLogger("vllm-test")
BLOCK = 128
MIN_CACHED = 1280
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
KEYS = {"t1": "kvf-test-key-tenant-one", "t2": "kvf-test-key-tenant-two"}


class CaseFailed(AssertionError):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise CaseFailed(what)


def prompt(seed: int) -> str:
    """~1500 tokens, distinct from its first block on for each seed."""
    head = f"Case {seed}: you are a careful assistant. Summarize the following log of run {seed * 7919}.\n"
    body = " ".join(f"{WORDS[(i * 7 + seed) % 26]}{(i + seed) % 13}" for i in range(470))
    return head + body + "\nSummary:"


class Cluster:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args, self.workdir = args, workdir
        tenants = workdir / "tenants.toml"
        tenants.write_text("".join(
            f'[[tenants]]\nname = "{t}"\napi_keys = ["{hash_key(args.kvfabric, k)}"]\n' for t, k in KEYS.items()
        ))
        specs = [NodeSpec(i, free_port(), free_port(), free_port()) for i in ("a", "b")]
        self.a = Node(args.kvfabric, specs[0], specs, workdir, tenants, ram="96MiB", disk_mib=512)
        self.b = Node(args.kvfabric, specs[1], specs, workdir, tenants, ram="1GiB")
        self.vllm_a: Optional[VllmServer] = None
        self.vllm_b: Optional[VllmServer] = None

    def start(self) -> None:
        self.a.start()
        self.b.start()
        self.vllm_a = self.server("A", self.a, "t1").start()
        self.vllm_b = self.server("B", self.b, "t1").start()
        self.vllm_a.wait_ready()
        self.vllm_b.wait_ready()

    def server(self, name: str, node: Node, tenant: str) -> VllmServer:
        return VllmServer(self.args.python, self.args.model, name, self.workdir, node.spec.addr, KEYS[tenant])


def hash_key(binary: str, key: str) -> str:
    out = subprocess.run([binary, "tenants", "hash-key"], input=key, capture_output=True, text=True,
                         check=True, timeout=30)
    return out.stdout.strip().splitlines()[-1]


def wait_metric(server: VllmServer, name: str, at_least: float, timeout_s: float = 30.0, **labels: str) -> float:
    deadline = time.monotonic() + timeout_s
    value = server.metric(name, **labels)
    while value < at_least and time.monotonic() < deadline:
        time.sleep(0.25)
        value = server.metric(name, **labels)
    return value


def cold_and_saved(c: Cluster, p: str, salt: Optional[str] = None, server: Optional[VllmServer] = None) -> Answer:
    """A (or `server`) answers `p`, its first sight of it, and saves its blocks."""
    server = server or c.vllm_a
    assert server is not None
    before = server.metric("kvfabric_vllm_transfer_blocks_total", op="save")
    cold = server.complete(p, salt=salt)
    check(cold.cached_tokens == 0, f"{server.name}'s first answer had {cold.cached_tokens} cached tokens")
    want = before + (cold.prompt_tokens // BLOCK)
    got = wait_metric(server, "kvfabric_vllm_transfer_blocks_total", want, op="save")
    check(got >= want, f"{server.name} saved {got - before} blocks of a {cold.prompt_tokens}-token prompt")
    return cold


def case_reuse(c: Cluster) -> str:
    assert c.vllm_b is not None
    cold = cold_and_saved(c, prompt(1))
    hits0 = c.vllm_b.metric("kvfabric_vllm_hit_tokens_total")
    warm = c.vllm_b.complete(prompt(1))
    check(warm.cached_tokens >= MIN_CACHED, f"B: cached_tokens {warm.cached_tokens} < {MIN_CACHED}")
    check(warm.text == cold.text, f"B's text differs: {warm.text!r} vs cold {cold.text!r}")
    hits = wait_metric(c.vllm_b, "kvfabric_vllm_hit_tokens_total", hits0 + MIN_CACHED) - hits0
    check(hits >= MIN_CACHED, f"B loaded {hits} tokens through kvfabric")
    return (f"prompt {cold.prompt_tokens} tokens: B cached_tokens {warm.cached_tokens} "
            f"({hits:.0f} loaded through kvfabric), TTFT cold A {cold.ttft_s:.2f} s, "
            f"warm B {warm.ttft_s:.2f} s, same text")


def case_salts(c: Cluster) -> str:
    assert c.vllm_b is not None
    p = prompt(2)
    cold = cold_and_saved(c, p, salt="salt-one")
    other = c.vllm_b.complete(p, salt="salt-two")
    check(other.cached_tokens == 0, f"salt-two got {other.cached_tokens} cached tokens of salt-one's prompt")
    check(other.text == cold.text, "salt-two's text differs from the cold one")
    same = c.vllm_b.complete(p, salt="salt-one")
    check(same.cached_tokens >= MIN_CACHED, f"salt-one on B: cached_tokens {same.cached_tokens}")
    check(same.text == cold.text, "salt-one's text on B differs")
    return (f"other salt cached 0 (TTFT {other.ttft_s:.2f} s), same salt cached {same.cached_tokens} "
            f"(TTFT {same.ttft_s:.2f} s)")


def corrupt_file(path: Path, step: int = 4096) -> int:
    """Flip one byte in every `step` bytes of the file; returns how many."""
    n = 0
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        for off in range(0, size, step):
            f.seek(off)
            b = f.read(1)
            if not b:
                break
            f.seek(off)
            f.write(bytes([b[0] ^ 0x5A]))
            n += 1
        f.flush()
        os.fsync(f.fileno())
    return n


def failed_loads(server: VllmServer) -> float:
    return server.metric("kvfabric_vllm_failed_blocks_total", op="load")


def case_corrupt(c: Cluster) -> str:
    assert c.vllm_b is not None and c.a.disk_path is not None
    p = prompt(3)
    cold = cold_and_saved(c, p)
    # Another prompt's blocks push p's out of a's RAM tier (96 MiB: one
    # prompt's 11 blocks of 5.6 MiB fit, two do not) onto its disk tier.
    cold_and_saved(c, prompt(30))
    time.sleep(1.0)
    flipped = corrupt_file(c.a.disk_path)
    failed0 = failed_loads(c.vllm_b)
    warm = c.vllm_b.complete(p)
    check(warm.text == cold.text, f"B's text after a corrupt load differs: {warm.text!r} vs {cold.text!r}")
    failed = wait_metric(c.vllm_b, "kvfabric_vllm_failed_blocks_total", failed0 + 1, op="load") - failed0
    check(failed >= 1, "no load failed: the corrupt blocks were not read (or not reported)")
    return f"{flipped} bytes flipped on a's disk; B: {failed:.0f} blocks failed and recomputed, same text"


def case_kill(c: Cluster) -> str:
    """SIGKILL the holder while B loads; retried at other delays when the kill
    missed the load (it then proves nothing)."""
    assert c.vllm_b is not None
    notes = []
    for attempt, delay in enumerate((0.15, 0.05, 0.4, 0.0)):
        p = prompt(40 + attempt)
        cold = cold_and_saved(c, p)
        failed0 = failed_loads(c.vllm_b)
        result: dict[str, object] = {}
        t = threading.Thread(target=_answer_into, args=(c.vllm_b.complete, p, result))
        t.start()
        time.sleep(delay)
        c.a.kill()
        t.join(180)
        c.a.restart()
        check(not t.is_alive(), "B did not answer within 180 s of the holder's death")
        if "error" in result:
            raise CaseFailed(f"B's request failed when the holder died: {result['error']}")
        warm = result["answer"]
        assert isinstance(warm, Answer)
        check(warm.text == cold.text, f"B's text differs after the holder died: {warm.text!r}")
        failed = wait_metric(c.vllm_b, "kvfabric_vllm_failed_blocks_total", failed0 + 1, 5, op="load") - failed0
        notes.append(f"kill at {delay:.2f} s: cached {warm.cached_tokens}, {failed:.0f} blocks failed")
        if failed >= 1:
            return "; ".join(notes) + ", same text"
    raise CaseFailed("the holder's death never hit a load: " + "; ".join(notes))


def _answer_into(complete: Callable[[str], Answer], p: str, result: dict) -> None:
    try:
        result["answer"] = complete(p)
    except Exception as e:  # noqa: BLE001 - reported by the case
        result["error"] = repr(e)


def case_tenants(c: Cluster) -> str:
    assert c.vllm_a is not None and c.vllm_b is not None
    p = prompt(5)
    cold = cold_and_saved(c, p, server=c.vllm_b)  # t1's blocks, saved into node b
    c.vllm_a.stop()  # room for C
    other = c.server("C", c.b, "t2").start()
    other.wait_ready()
    ans = other.complete(p)
    check(ans.cached_tokens == 0, f"tenant t2 got {ans.cached_tokens} cached tokens of t1's prompt")
    check(ans.text == cold.text, "t2's text differs from t1's")
    hits = other.metric("kvfabric_vllm_hit_tokens_total")
    check(hits == 0, f"tenant t2 loaded {hits} tokens through kvfabric")
    return "t2 on a t1 prompt: cached 0, same text"


CASES = [("reuse", case_reuse), ("salts", case_salts), ("corrupt", case_corrupt),
         ("kill", case_kill), ("tenants", case_tenants)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvfabric", required=True, help="the kvfabric binary")
    ap.add_argument("--model", required=True, help="HF model directory (scripts/vllm-model.sh)")
    ap.add_argument("--python", default=sys.executable, help="the vLLM venv's python")
    ap.add_argument("--workdir", help="logs and data (default: a temporary directory)")
    ap.add_argument("--only", help="comma-separated case names")
    args = ap.parse_args()
    # SIGTERM exits through atexit, which kills every process the test started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kvfabric-vllm-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    c = Cluster(args, workdir)
    c.start()
    log.info("cluster and vLLM servers up in %.0f s (logs in %s)", time.monotonic() - started, workdir)
    only = set(args.only.split(",")) if args.only else None
    failures = 0
    for name, case in CASES:
        if only is not None and name not in only:
            continue
        t = time.monotonic()
        try:
            print(f"ok   {name}: {case(c)} ({time.monotonic() - t:.1f} s)", flush=True)
        except (CaseFailed, HarnessError) as e:
            failures += 1
            print(f"FAIL {name}: {e}", flush=True)
    print(f"{'FAILED' if failures else 'passed'}: {failures} failed, {time.monotonic() - started:.0f} s, "
          f"logs in {workdir}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
