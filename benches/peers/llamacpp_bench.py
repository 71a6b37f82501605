"""llama.cpp peer of `kvfabric bench engine`, through PyPI llama-cpp-python.

Reads one JSON object on stdin (written by benches/src/engine/peers.rs):
  {"model": PATH, "threads": N, "repeats": R, "decode_steps": S,
   "prefill": {"512": [ids], "2048": [ids]}, "decode_prompts": [[ids] x 8]}
and prints one JSON line on stdout with the same four rates kvfabric reports:
  prefill512_tps / prefill2048_tps: one llama_decode of the whole prompt (logits
    for its last token), best of R, memory cleared between repeats;
  decode1_tps: after a 128-token prompt, S single-token llama_decode steps
    (logits every step), tokens / wall time, best of R (prompt recomputed);
  decode8_tps: 8 sequences (seq ids 0..7 of one context, unified KV), a
    1024-token batch for their prompts, then S steps each a llama_batch of 8
    tokens (one per sequence, logits for all 8), aggregate 8*S / wall time,
    best of R.
The tokens fed during decode are the prompt's own tokens (prompt[s % len]),
exactly as kvfabric's bench feeds them, so no sampling is timed on either side.
Everything uses llama.cpp's low-level C API (llama_batch), n_threads and
n_threads_batch = N, one context per figure sized for it, llama.cpp's default
n_ubatch (512) and flash-attention setting. llama.cpp's log goes to stderr.
"use_extra_bufts" (default true) sets the model's extra weight buffer types
(repacked / AMX kernels); the Rust side turns it off only after a crash.
"""

import ctypes
import json
import sys
import time

import llama_cpp as lc


def fail(message: str) -> None:
    print(json.dumps({"error": message}), flush=True)
    sys.exit(2)


class Peer:
    def __init__(self, model_path: str, threads: int, extra_bufts: bool):
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = extra_bufts
        self.model = lc.llama_model_load_from_file(model_path.encode(), params)
        if not self.model:
            fail(f"llama.cpp could not load {model_path}")
        self.threads = threads
        self.last_params = None

    def context(self, n_ctx: int, n_batch: int, n_seq: int):
        params = lc.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_seq_max = n_seq
        params.kv_unified = True
        params.n_threads = self.threads
        params.n_threads_batch = self.threads
        params.no_perf = True
        ctx = lc.llama_init_from_model(self.model, params)
        if not ctx:
            fail(f"llama.cpp could not create a context (n_ctx {n_ctx}, n_seq {n_seq})")
        self.last_params = params
        return ctx

    @staticmethod
    def fill(batch, seqs):
        """seqs: list of (seq_id, tokens, start_pos, logits_last_only)."""
        n = 0
        for seq_id, tokens, start, last_only in seqs:
            for j, tok in enumerate(tokens):
                batch.token[n] = tok
                batch.pos[n] = start + j
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq_id
                batch.logits[n] = 1 if (not last_only or j == len(tokens) - 1) else 0
                n += 1
        batch.n_tokens = n

    @staticmethod
    def decode(ctx, batch) -> None:
        rc = lc.llama_decode(ctx, batch)
        if rc != 0:
            fail(f"llama_decode returned {rc}")
        lc.llama_synchronize(ctx)

    def prefill(self, tokens, repeats: int) -> float:
        n = len(tokens)
        ctx = self.context(n, n, 1)
        batch = lc.llama_batch_init(n, 0, 1)
        best = float("inf")
        try:
            for _ in range(max(1, repeats)):
                lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
                self.fill(batch, [(0, tokens, 0, True)])
                t = time.perf_counter()
                self.decode(ctx, batch)
                best = min(best, time.perf_counter() - t)
        finally:
            lc.llama_batch_free(batch)
            lc.llama_free(ctx)
        return n / best

    def decode_rate(self, prompts, steps: int, repeats: int) -> float:
        seqs = len(prompts)
        prompt_len = len(prompts[0])
        per_seq = prompt_len + steps
        ctx = self.context(seqs * per_seq, max(seqs * prompt_len, seqs), seqs)
        batch = lc.llama_batch_init(max(seqs * prompt_len, seqs), 0, 1)
        best = float("inf")
        try:
            for _ in range(max(1, repeats)):
                lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
                self.fill(batch, [(i, p, 0, True) for i, p in enumerate(prompts)])
                self.decode(ctx, batch)
                t = time.perf_counter()
                for s in range(steps):
                    self.fill(batch, [(i, [p[s % prompt_len]], prompt_len + s, False) for i, p in enumerate(prompts)])
                    self.decode(ctx, batch)
                best = min(best, time.perf_counter() - t)
        finally:
            lc.llama_batch_free(batch)
            lc.llama_free(ctx)
        return seqs * steps / best


def main() -> None:
    job = json.load(sys.stdin)
    threads = int(job["threads"])
    repeats = int(job["repeats"])
    steps = int(job["decode_steps"])
    prompts = job["decode_prompts"]
    extra_bufts = bool(job.get("use_extra_bufts", True))
    peer = Peer(job["model"], threads, extra_bufts)
    out = {
        "prefill512_tps": peer.prefill(job["prefill"]["512"], repeats),
        "prefill2048_tps": peer.prefill(job["prefill"]["2048"], repeats),
        "decode1_tps": peer.decode_rate(prompts[:1], steps, repeats),
        "decode8_tps": peer.decode_rate(prompts[:8], steps, repeats),
    }
    params = peer.last_params
    out.update({
        "llama_cpp_python": lc.__version__,
        "threads": threads,
        "use_extra_bufts": extra_bufts,
        "n_ubatch": int(params.n_ubatch),
        "flash_attn_type": int(params.flash_attn_type),
        "system_info": lc.llama_print_system_info().decode(errors="replace").strip(),
    })
    lc.llama_model_free(peer.model)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
