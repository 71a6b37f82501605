"""Processes of the vLLM connector test (tests/vllm/test_connector.py) and of
`kvfabric bench vllm` (benches/peers/vllm_bench.py): kvfabric nodes, vLLM
OpenAI servers started through Python, every address loopback, every process
in its own group and killed when the script exits."""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

log = logging.getLogger("vllm-test")
_LIVE: list["Proc"] = []


class HarnessError(RuntimeError):
    """A process of the test did not start, answer or stop as it should."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout_s: float, proc: "Proc") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc.check_alive()
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise HarnessError(f"{proc.name}: port {port} not open after {timeout_s:.0f} s\n{proc.tail()}")


class Proc:
    """A child process (and its children) in its own process group."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: Optional[dict[str, str]] = None):
        self.name, self.cmd, self.log_path = name, cmd, log_path
        self.env = {**os.environ, **(env or {})}
        self.popen: Optional[subprocess.Popen] = None

    def start(self) -> "Proc":
        with open(self.log_path, "ab") as out:
            self.popen = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                          start_new_session=True)
        _LIVE.append(self)
        log.info("%s started (pid %d), log %s", self.name, self.popen.pid, self.log_path)
        return self

    def check_alive(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            raise HarnessError(f"{self.name} exited\n{self.tail()}")

    def kill(self, sig: int = signal.SIGKILL, grace_s: float = 10.0) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
            except ProcessLookupError:
                pass
        if self in _LIVE:
            _LIVE.remove(self)
        self.popen = None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@atexit.register
def _kill_all() -> None:
    for p in list(_LIVE):
        p.kill(signal.SIGKILL, grace_s=5)


def http_json(url: str, body: Optional[dict] = None, timeout_s: float = 120.0) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.load(r)


def http_text(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read().decode()


@dataclass
class NodeSpec:
    id: str
    grpc: int
    http: int
    transfer: int

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    def peer(self) -> str:
        return f"{self.id}=127.0.0.1:{self.grpc}=127.0.0.1:{self.transfer}"


class Node:
    """A `kvfabric node` with a RAM tier and optionally a disk tier."""

    def __init__(self, binary: str, spec: NodeSpec, peers: list[NodeSpec], workdir: Path,
                 tenants_file: Optional[Path], ram: str, disk_mib: int = 0):
        self.spec, self.workdir = spec, workdir
        self.disk_path = workdir / f"{spec.id}.data" if disk_mib else None
        cmd = [binary, "node", "--node-id", spec.id, "--grpc-listen", spec.addr,
               "--http-listen", f"127.0.0.1:{spec.http}", "--transfer-listen", f"127.0.0.1:{spec.transfer}",
               "--transfer-transport", "tcp", "--peers", ",".join(p.peer() for p in peers),
               "--ram-capacity", ram]
        if tenants_file is not None:
            cmd += ["--tenants-file", str(tenants_file)]
        if self.disk_path is not None:
            cmd += ["--disk-path", str(self.disk_path), "--disk-capacity", f"{disk_mib}MiB"]
        self.proc = Proc(f"node {spec.id}", cmd, workdir / f"node-{spec.id}.log", {"KVFABRIC_LOG": "info"})

    def start(self) -> "Node":
        self.proc.start()
        wait_port(self.spec.grpc, 30, self.proc)
        wait_port(self.spec.http, 30, self.proc)
        return self

    def kill(self) -> None:
        self.proc.kill(signal.SIGKILL)

    def restart(self) -> None:
        self.kill()
        if self.disk_path is not None:
            self.disk_path.unlink(missing_ok=True)
            index = Path(str(self.disk_path) + ".index")
            subprocess.run(["rm", "-rf", str(index)], check=True)
        self.start()


@dataclass
class Answer:
    text: str
    prompt_tokens: int
    cached_tokens: int
    # Time to the first text chunk.
    ttft_s: float
    # The generated token ids.
    token_ids: list[int]


class VllmServer:
    """A vLLM OpenAI server on the CPU backend: with the kvfabric connector of
    `node` (under `api_key`), or with the KV transfer config `kv`, or (neither
    given) its own prefix cache only."""

    def __init__(self, python: str, model: str, name: str, workdir: Path, node: Optional[str] = None,
                 api_key: Optional[str] = None, extra_env: Optional[dict[str, str]] = None,
                 kv: Optional[dict] = None):
        self.name, self.port = name, free_port()
        if kv is None and node is not None:
            kv = {"kv_connector": "KvfabricConnector", "kv_connector_module_path": "kvfabric.vllm",
                  "kv_role": "kv_both",
                  "kv_connector_extra_config": {"node": node, "api_key": api_key, "timeout_s": 5.0}}
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", "float32", "--enforce-eager", "--enable-prefix-caching",
               "--enable-prompt-tokens-details", "--max-model-len", "4096"]
        if kv is not None:
            cmd += ["--kv-transfer-config", json.dumps(kv)]
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               **(extra_env or {})}
        self.proc = Proc(f"vllm {name}", cmd, workdir / f"vllm-{name}.log", env)

    def start(self) -> "VllmServer":
        self.proc.start()
        return self

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.proc.check_alive()
            try:
                http_json(f"http://127.0.0.1:{self.port}/v1/models", timeout_s=2)
                log.info("%s ready on port %d", self.proc.name, self.port)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(0.5)
        raise HarnessError(f"{self.proc.name} not ready after {timeout_s:.0f} s\n{self.proc.tail()}")

    def complete(self, prompt: Union[str, list[int]], salt: Optional[str] = None,
                 max_tokens: int = 24) -> Answer:
        """Greedy completion of a text or of token ids, streamed: TTFT is the
        first generated chunk's arrival."""
        body: dict = {"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                      "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
        if salt is not None:
            body["cache_salt"] = salt
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        t = time.monotonic()
        ttft, text, ids, usage = None, [], [], None
        try:
            with urllib.request.urlopen(req, timeout=180) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    for choice in chunk.get("choices") or []:
                        if choice.get("text") or choice.get("token_ids"):
                            ttft = ttft if ttft is not None else time.monotonic() - t
                            text.append(choice.get("text") or "")
                            ids.extend(choice.get("token_ids") or [])
                    usage = chunk.get("usage") or usage
        except urllib.error.HTTPError as e:
            raise HarnessError(f"{self.proc.name}: HTTP {e.code}: {e.read()[:500]!r}") from e
        if usage is None:
            raise HarnessError(f"{self.proc.name}: the stream carried no usage")
        details = usage.get("prompt_tokens_details") or {}
        return Answer("".join(text), usage["prompt_tokens"], details.get("cached_tokens") or 0,
                      ttft if ttft is not None else time.monotonic() - t, ids)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in http_text(f"http://127.0.0.1:{self.port}/metrics").splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def stop(self) -> None:
        self.proc.kill(signal.SIGTERM, grace_s=15)
