#!/usr/bin/env python3
"""GPT-2's forward in numpy (float64) from tessera-gpt's --dump-weights file
alone: the model's conventions written down as code. Names are
embed.wte [padded vocab, d] (rows past the real vocabulary unused), embed.wpe,
embed.ln_f.{w,b}, blockL.{ln_1,ln_2}.{w,b}, blockL.qkv.{w,b} ([3d, d], rows
q | k | v, heads contiguous inside each), blockL.proj, blockL.fc ([4d, d]),
blockL.fc_proj ([d, 4d]); every matrix is [out, in] (y = x W^T + b); the head
is the token table, tied.

As a module: load(path) -> (weights, meta), loss(weights, meta, seqs) with seqs
an int array [B, T + 1]. As a program: numpy_forward.py WEIGHTS SHARD
VAL_BATCHES SEQS_PER_BATCH prints the mean loss of the evaluation set
tessera-gpt --val-data SHARD evaluates (consecutive windows from the start)."""
import json
import struct
import sys

import numpy as np


def load(path):
    raw = open(path, 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop('__metadata__', {})
    base = 8 + n
    w = {}
    for name, e in header.items():
        assert e['dtype'] == 'F32', f'{name}: {e["dtype"]}'
        b, end = e['data_offsets']
        w[name] = np.frombuffer(raw[base + b:base + end], dtype='<f4').reshape(e['shape']).astype(np.float64)
    return w, meta


def layernorm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def logits(w, meta, tokens):
    """tokens [B, T] -> logits [B, T, vocab] over the real vocabulary."""
    L, H, V = int(meta['layers']), int(meta['heads']), int(meta['vocab'])
    B, T = tokens.shape
    x = w['embed.wte'][tokens] + w['embed.wpe'][:T]
    d = x.shape[-1]
    hd = d // H
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    for l in range(L):
        p = lambda k: w[f'block{l}.{k}']
        h = layernorm(x, p('ln_1.w'), p('ln_1.b'))
        qkv = h @ p('qkv.w').T + p('qkv.b')
        q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(B, T, H, hd).transpose(0, 2, 1, 3) for i in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        s = np.where(mask, -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(0, 2, 1, 3).reshape(B, T, d) @ p('proj.w').T + p('proj.b')
        h = layernorm(x, p('ln_2.w'), p('ln_2.b'))
        x = x + gelu(h @ p('fc.w').T + p('fc.b')) @ p('fc_proj.w').T + p('fc_proj.b')
    x = layernorm(x, w['embed.ln_f.w'], w['embed.ln_f.b'])
    return x @ w['embed.wte'][:V].T


def loss(w, meta, seqs):
    """Summed next-token cross-entropy of seqs [B, T + 1]."""
    z = logits(w, meta, seqs[:, :-1])
    z = z - z.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1))
    tgt = seqs[:, 1:]
    return float((lse - np.take_along_axis(z, tgt[..., None], -1)[..., 0]).sum())


def read_shard(path):
    raw = open(path, 'rb').read()
    magic, version, n = struct.unpack('<3i', raw[:12])
    assert magic == 20240520 and version == 1, path
    return np.frombuffer(raw[1024:1024 + 2 * n], dtype='<u2').astype(np.int64)


if __name__ == '__main__':
    weights, meta = load(sys.argv[1])
    toks = read_shard(sys.argv[2])
    batches, per = int(sys.argv[3]), int(sys.argv[4])
    T = int(meta['seq'])
    windows = len(toks) - T
    seqs = np.stack([toks[(i * T) % windows:(i * T) % windows + T + 1] for i in range(batches * per)])
    print(f'{loss(weights, meta, seqs) / (batches * per * T):.9f}')
