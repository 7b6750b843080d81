#!/usr/bin/env python3
"""tessera-mlp-lm's model in numpy, from its weights file alone (the README's
"The reference model" states the conventions): the loss of step STEP's batch.
  numpy_forward.py WEIGHTS.safetensors DATA_FILE --tokens N [--seed S] [--step K]
WEIGHTS is a --dump-weights file (or tessera-consolidate's output); DATA_FILE
the trainer's --data."""
import argparse
import struct
import json

import numpy as np
from safetensors.numpy import load_file

M = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)


def batch(data, seed, step, mb, tokens, ctx):
    """Global tokens 0..tokens-1 of micro-batch mb of step `step`: contexts (oldest byte first) and targets."""
    base = splitmix64((splitmix64(seed ^ 0x51ED270B27D4A3C5) + step) & M) * 31
    pos = [ctx + splitmix64((base + mb * 1000003 + j) & M) % (len(data) - ctx) for j in range(tokens)]
    return np.array([list(data[p - ctx:p]) for p in pos]), np.array([data[p] for p in pos])


def loss(w, contexts, targets, layers):
    x = np.concatenate([w["embed.table"][contexts[:, k]] for k in range(contexts.shape[1])], axis=1).astype(np.float64)
    for l in range(layers):
        h = x @ w[f"block{l}.w1"].T + w[f"block{l}.b1"]          # weights are (out, in), row-major
        g = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))  # GELU, tanh form
        x = x + g @ w[f"block{l}.w2"].T + w[f"block{l}.b2"]     # residual
    logits = x @ w["head.w"].T + w["head.b"]
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(targets)), targets].mean())  # mean cross-entropy over the batch, nats


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("weights"), ap.add_argument("data")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1), ap.add_argument("--step", type=int, default=0)
    a = ap.parse_args()
    raw = open(a.weights, "rb").read()
    meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]]).get("__metadata__", {})
    w = {k: v.astype(np.float64) for k, v in load_file(a.weights).items()}
    ctx, layers = int(meta["ctx"]), int(meta["layers"])
    data = open(a.data, "rb").read()
    c, t = batch(data, a.seed, a.step, 0, a.tokens, ctx)
    print(f"{loss(w, c, t, layers):.6f}")
