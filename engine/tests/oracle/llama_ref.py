"""Independent numpy reference of a GGUF Llama forward pass (test oracle).

Reads the model with the PyPI `gguf` package, dequantizes every tensor with
`gguf.quants.dequantize`, and runs the textbook Llama forward in float64
(RMSNorm, llama.cpp "normal" rope on adjacent pairs, GQA softmax attention,
SwiGLU, tied embeddings). Shares no code with the Rust engine.

The engine stores K and V as f16 (its default), bf16 or f32: they are
computed, then rounded once (to nearest, ties to even) when stored. The
oracle does the same with `kv_dtype`: K (after rope) and V are rounded to
f32 (the engine computes them in f32) and then to the KV dtype, and the
attention reads the rounded values.

stdin: {"model": path, "prompts": [[ids...], ...], "steps": n,
        "kv_dtype": "f16" | "bf16" | "f32" (default "f32")}
stdout: {"logits": [[...last-position logits of each prompt...]],
         "greedy": [[n greedy tokens of the first prompt], [1 token], ...]}
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(r, key):
    f = r.fields[key]
    v = f.parts[f.data[0]]
    return v.tolist()[0] if len(v) == 1 else v


def round_kv(x, dtype):
    """The engine's store of a K or V value: f32, then the KV dtype (RNE)."""
    x32 = x.astype(np.float32)
    if dtype == "f16":
        return x32.astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        b = x32.view(np.uint32).astype(np.uint64)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return b.view(np.float32).astype(np.float64)
    if dtype == "f32":
        return x32.astype(np.float64)
    raise ValueError(f"kv_dtype {dtype!r}")


def main():
    req = json.load(sys.stdin)
    kv_dtype = req.get("kv_dtype", "f32")
    r = GGUFReader(req["model"])
    L = field(r, "llama.block_count")
    nh = field(r, "llama.attention.head_count")
    nkv = field(r, "llama.attention.head_count_kv")
    base = field(r, "llama.rope.freq_base")
    eps = field(r, "llama.attention.layer_norm_rms_epsilon")
    W = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        shape = [int(x) for x in reversed(t.shape)]
        W[t.name] = a.reshape(shape)
    emb = W["token_embd.weight"]
    out_w = W.get("output.weight", emb)
    hidden = emb.shape[1]
    hd = hidden // nh

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x, n):  # x [T, n*hd]; adjacent pairs rotate
        T = x.shape[0]
        x = x.reshape(T, n, hd // 2, 2)
        pos = np.arange(T, dtype=np.float64)[:, None]
        inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = pos * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0], x[..., 1]
        return np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(T, n * hd)

    def forward(ids):
        x = emb[ids]
        T = len(ids)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for l in range(L):
            p = f"blk.{l}."
            h = norm(x, W[p + "attn_norm.weight"])
            q = rope(h @ W[p + "attn_q.weight"].T, nh).reshape(T, nh, hd)
            k = rope(h @ W[p + "attn_k.weight"].T, nkv).reshape(T, nkv, hd)
            v = (h @ W[p + "attn_v.weight"].T).reshape(T, nkv, hd)
            k, v = round_kv(k, kv_dtype), round_kv(v, kv_dtype)
            o = np.zeros((T, nh, hd))
            for head in range(nh):
                kh = head // (nh // nkv)
                s = q[:, head, :] @ k[:, kh, :].T / np.sqrt(hd) + mask
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                s /= s.sum(axis=-1, keepdims=True)
                o[:, head, :] = s @ v[:, kh, :]
            x = x + o.reshape(T, hidden) @ W[p + "attn_output.weight"].T
            h = norm(x, W[p + "ffn_norm.weight"])
            g = h @ W[p + "ffn_gate.weight"].T
            u = h @ W[p + "ffn_up.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ W[p + "ffn_down.weight"].T
        return norm(x[-1], W["output_norm.weight"]) @ out_w.T

    logits, greedy = [], []
    for i, ids in enumerate(req["prompts"]):
        ids = list(ids)
        first = forward(ids)
        logits.append(first.tolist())
        toks = [int(np.argmax(first))]
        steps = req.get("steps", 0) if i == 0 else 1
        for _ in range(steps - 1):
            toks.append(int(np.argmax(forward(ids + toks))))
        greedy.append(toks[: req.get("steps", 0)])
    json.dump({"logits": logits, "greedy": greedy}, sys.stdout)


if __name__ == "__main__":
    main()
