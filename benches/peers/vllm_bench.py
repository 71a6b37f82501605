"""Driver of `kvfabric bench vllm` (issue 46): the agentic trace of `bench
agentic` through two vLLM CPU servers, once per mode, each mode on fresh
servers (and a fresh store where it has one):

  vllm      each server's own prefix cache only
  kvfabric  kvfabric.vllm.KvfabricConnector, one kvfabric node per server, one cluster
  mooncake  vLLM's MooncakeStoreConnector, one mooncake_master (TCP, loopback)
  lmcache   vLLM's LMCacheConnectorV1, where LMCache is installed (refused where
            it is not, or where the server does not start with it)

Reads on stdin the trace as token ids: {"system": [..], "users": [[[..]..]..],
"routes": [[server of turn t of session s]..]}. Turn t of every session is sent
before turn t+1 of any, one request at a time, each prompt the system prompt,
the session's segments and its earlier answers (the answers of this mode). Prints
one JSON line: {"modes": {name: {"status", "reason"?, "records", "load_bytes",
"load_bytes_note"?}}}; figures are assembled by the Rust side.

Run with the vLLM venv's python, from anywhere (vllm_harness.py sits beside it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_harness import HarnessError, Node, NodeSpec, Proc, VllmServer, free_port, wait_port  # noqa: E402

log = logging.getLogger("vllm-bench")
SERVERS = 2


def warm_up(servers: list[VllmServer]) -> None:
    """One short request per server first (under one block: nothing cached or
    saved), so no turn pays a fresh server's first-request costs."""
    for s in servers:
        s.complete(list(range(1000, 1064)), max_tokens=2)


def run_trace(servers: list[VllmServer], trace: dict, answer_tokens: int) -> list[dict]:
    """Every turn, in order, routed as the trace says; one record per request."""
    sessions = len(trace["users"])
    turns = len(trace["users"][0]) if sessions else 0
    answers: list[list[list[int]]] = [[] for _ in range(sessions)]
    records = []
    for t in range(turns):
        for s in range(sessions):
            prompt = list(trace["system"])
            for k in range(t + 1):
                if k > 0:
                    prompt += answers[s][k - 1]
                prompt += trace["users"][s][k]
            server = trace["routes"][s][t]
            a = servers[server].complete(prompt, max_tokens=answer_tokens)
            answers[s].append(a.token_ids)
            records.append({"session": s, "turn": t, "server": server, "prompt": prompt,
                            "answer": a.token_ids, "prompt_tokens": a.prompt_tokens,
                            "cached_tokens": a.cached_tokens, "ttft_ms": a.ttft_s * 1000.0})
            log.info("session %d turn %d on %d: %d prompt tokens, %d cached, TTFT %.0f ms", s, t, server,
                     a.prompt_tokens, a.cached_tokens, a.ttft_s * 1000.0)
    return records


class Mode:
    """One mode's processes: its store (if any) and its two vLLM servers."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args, self.workdir = args, workdir
        self.stores: list[Proc] = []
        self.servers: list[VllmServer] = []
        self.load_note: Optional[str] = None

    def server(self, name: str, kv: Optional[dict] = None, env: Optional[dict] = None) -> VllmServer:
        return VllmServer(self.args.python, self.args.model, name, self.workdir, extra_env=env, kv=kv)

    def start_servers(self) -> None:
        for s in self.servers:
            s.start()
        for s in self.servers:
            s.wait_ready(self.args.start_timeout_s)

    def load_bytes(self) -> Optional[float]:
        return None

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        for p in self.stores:
            p.kill(signal.SIGTERM, grace_s=10)


class LocalOnly(Mode):
    def setup(self) -> None:
        self.servers = [self.server(f"vllm-{i}") for i in range(SERVERS)]
        self.load_note = "no external store: nothing is loaded"

    def load_bytes(self) -> Optional[float]:
        return 0.0


class Kvfabric(Mode):
    def setup(self) -> None:
        specs = [NodeSpec(f"n{i}", free_port(), free_port(), free_port()) for i in range(SERVERS)]
        # Single-tenant nodes (no tenants file, no API key).
        for sp in specs:
            n = Node(self.args.kvfabric, sp, specs, self.workdir, None, ram=self.args.node_ram)
            n.start()
            self.stores.append(n.proc)
        kv = lambda sp: {"kv_connector": "KvfabricConnector", "kv_connector_module_path": "kvfabric.vllm",  # noqa: E731
                         "kv_role": "kv_both", "kv_connector_extra_config": {"node": sp.addr, "timeout_s": 5.0}}
        self.servers = [self.server(f"kvfabric-{i}", kv(sp)) for i, sp in enumerate(specs)]

    def load_bytes(self) -> Optional[float]:
        return sum(s.metric("kvfabric_vllm_transfer_bytes_total", op="load") for s in self.servers)


class Mooncake(Mode):
    def setup(self) -> None:
        master = Path(self.args.python).parent / "mooncake_master"
        if not master.exists():
            raise Refused(f"{master} not found (mooncake-transfer-engine-non-cuda is not in the venv)")
        rpc = free_port()
        proc = Proc("mooncake_master", [str(master), "--rpc_address", "127.0.0.1", "--rpc_port", str(rpc),
                                        "--metrics_port", str(free_port()),
                                        "--enable_http_metadata_server=false",
                                        # Its 5 s default lease expires under a read on this slow CPU.
                                        "--default_kv_lease_ttl", "60000"],
                    self.workdir / "mooncake_master.log")
        proc.start()
        self.stores.append(proc)
        wait_port(rpc, 30, proc)
        cfg = self.workdir / "mooncake.json"
        cfg.write_text(json.dumps({"metadata_server": "P2PHANDSHAKE", "master_server_address": f"127.0.0.1:{rpc}",
                                   "protocol": "tcp", "device_name": "",
                                   "global_segment_size": self.args.mooncake_segment,
                                   "local_buffer_size": "256MB"}))
        # A failed load recomputes, as kvfabric's connector does (vLLM's default fails the request).
        kv = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute"}
        env = {"MOONCAKE_CONFIG_PATH": str(cfg)}
        self.servers = [self.server(f"mooncake-{i}", kv, env) for i in range(SERVERS)]
        self.load_note = "MooncakeStoreConnector exposes no byte counter of its loads"


class LmCache(Mode):
    def setup(self) -> None:
        if importlib.util.find_spec("lmcache") is None:
            raise Refused("LMCache is not installed in the vLLM venv (not installed by this bench)")
        kv = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
        env = {"LMCACHE_LOCAL_CPU": "True", "LMCACHE_MAX_LOCAL_CPU_SIZE": "2"}
        self.servers = [self.server(f"lmcache-{i}", kv, env) for i in range(SERVERS)]
        self.load_note = "LMCache's load bytes are not read by this bench"
        self.refuse_on_start = True


class Refused(RuntimeError):
    """The mode cannot run here (a missing package, a backend that refuses CPU)."""


MODES: dict[str, Callable[[argparse.Namespace, Path], Mode]] = {
    "vllm": LocalOnly, "kvfabric": Kvfabric, "mooncake": Mooncake, "lmcache": LmCache}


def run_mode(name: str, args: argparse.Namespace, trace: dict, root: Path) -> dict:
    workdir = root / name
    workdir.mkdir(parents=True, exist_ok=True)
    mode = MODES[name](args, workdir)
    started = time.monotonic()
    try:
        mode.setup()
        try:
            mode.start_servers()
        except HarnessError as e:
            if getattr(mode, "refuse_on_start", False):
                raise Refused(f"the vLLM server did not start with it: {str(e)[-600:]}") from e
            raise
        warm_up(mode.servers)
        records = run_trace(mode.servers, trace, args.answer_tokens)
        # Counters are updated as loads finish; the trace is over by now.
        out = {"status": "ok", "records": records, "load_bytes": mode.load_bytes(),
               "wall_s": time.monotonic() - started}
        if mode.load_note is not None:
            out["load_bytes_note"] = mode.load_note
        return out
    except Refused as e:
        return {"status": "refused", "reason": str(e)}
    except (HarnessError, OSError, KeyError, ValueError) as e:
        return {"status": "failed", "reason": f"{type(e).__name__}: {str(e)[-1500:]}", "logs": str(workdir)}
    finally:
        mode.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvfabric", required=True, help="the kvfabric binary (its `node`)")
    ap.add_argument("--python", default=sys.executable, help="the vLLM venv's python")
    ap.add_argument("--model", required=True, help="the HF model directory (scripts/vllm-model.sh)")
    ap.add_argument("--modes", default="vllm,kvfabric,mooncake,lmcache")
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--node-ram", default="2GiB")
    ap.add_argument("--mooncake-segment", default="2GB")
    ap.add_argument("--start-timeout-s", type=float, default=300.0)
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    # SIGTERM (the bench's time limit) exits through atexit, which kills every process started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    trace = json.load(sys.stdin)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="kvfabric-bench-vllm-"))
    modes = {}
    for name in [m.strip() for m in args.modes.split(",") if m.strip()]:
        if name not in MODES:
            modes[name] = {"status": "failed", "reason": f"unknown mode {name!r}"}
            continue
        log.info("mode %s", name)
        modes[name] = run_mode(name, args, trace, root)
        log.info("mode %s: %s", name, modes[name]["status"])
    print(json.dumps({"modes": modes, "workdir": str(root)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
