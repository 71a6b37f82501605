"""What a fast (fixed-width) code could get from f16 KV blocks, against
the entropy bounds: the analysis behind docs/BENCHMARKS.md's "decode at
0.5x memcpy" entry (issue #22).

Input: the f16.bin that `kvfabric bench kv --dump-dir DIR` writes (the
engine's own f16 blocks of SmolLM2-135M: 30 layers, K then V, each
[64 tokens][192 channels]). Needs numpy.

    python3 benches/tools/kv_entropy.py DIR/f16.bin

Prints, in bits per element and as the block ratio they allow (16 bits
over the coded bits; sign and the 10 mantissa bits stay raw, 11 bits,
except for the first line, which codes the whole high byte):
  - the high byte's order-0 entropy per segment (the shipped codec's model),
  - the exponent's entropy given its channel (a context model's bound),
  - patched frame of reference per channel group of 64 tokens (width b for
    max - exponent, an escape code, 11 bits per exception, a byte of header),
  - the same with a radix per group in place of a power of two.
"""

import math
import sys

import numpy as np

LAYERS, TOKENS, CHANNELS = 30, 64, 192


def entropy(x, n=0):
    c = np.bincount(x.ravel(), minlength=n)
    p = c[c > 0] / c.sum()
    return float(-(p * np.log2(p)).sum())


def main(path):
    raw = np.fromfile(path, dtype=np.uint16)
    per_block = LAYERS * 2 * TOKENS * CHANNELS
    nb = raw.size // per_block
    a = raw[: nb * per_block].reshape(nb, LAYERS, 2, TOKENS, CHANNELS)
    n = a.size
    hi = (a >> 8).astype(np.int64)
    exp = ((a >> 10) & 31).astype(np.int64)
    ratio = lambda coded_bits, raw_bits: 16 / (raw_bits + coded_bits)

    seg = sum(entropy(hi[b, l, k]) * hi[b, l, k].size
              for b in range(nb) for l in range(LAYERS) for k in range(2)) / n
    print(f"blocks {nb}")
    print(f"high byte, order 0 per segment: {seg:.3f} bits -> {ratio(seg, 8):.4f}")
    chan = sum(entropy(exp[:, l, k, :, c], 32) * exp[:, l, k, :, c].size
               for l in range(LAYERS) for k in range(2) for c in range(CHANNELS)) / n
    print(f"exponent given its channel: {chan:.3f} bits -> {ratio(chan, 11):.4f}")

    groups = exp.transpose(0, 1, 2, 4, 3).reshape(-1, TOKENS)
    d = groups.max(axis=1, keepdims=True) - groups
    exc_bits, header_bits = 5 + 6, 8
    pfor = []
    for width in range(1, 6):
        exceptions = (d >= (1 << width) - 1).sum(axis=1)
        pfor.append(width * TOKENS + exceptions * exc_bits + header_bits)
    best = np.stack(pfor, 1).min(1).sum() / n
    print(f"patched frame of reference, best width per group: {best:.3f} bits -> {ratio(best, 11):.4f}")
    radix = []
    for r in range(2, 17):
        exceptions = (d >= r - 1).sum(axis=1)
        radix.append(TOKENS * math.log2(r) + exceptions * exc_bits + header_bits)
    best = np.stack(radix, 1).min(1).sum() / n
    print(f"radix per group, best radix: {best:.3f} bits -> {ratio(best, 11):.4f}")


if __name__ == "__main__":
    main(sys.argv[1])
