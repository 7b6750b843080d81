#!/usr/bin/env python3
"""Llama 3's forward in numpy (float64) from tessera-llama's --dump-weights file,
or from a Hugging Face LlamaForCausalLM directory: the model's conventions
written down as code. Tessera's names are embed.tok [padded vocab, d] (rows past
the real vocabulary unused), embed.norm, embed.head (absent where tied: the
head is embed.tok), blockL.attn_norm, blockL.qkv ([(H + 2 KV) hd, d]: q's rows,
then k's, then v's, heads contiguous inside each), blockL.o ([d, H hd]),
blockL.ffn_norm, blockL.gate_up ([2 ffn, d]: gate's rows, then up's),
blockL.down ([d, ffn]); every matrix is [out, in] (y = x W^T). RMSNorm is
w (x / sqrt(mean(x^2) + eps)); rotary embeddings rotate the two halves of each
head (rotate-half), with Llama 3's frequency scaling; attention is causal with
head h reading kv head h // (H / KV); the MLP is down(silu(gate x) up x).

As a module: load(path) -> (weights, meta), loss(weights, meta, seqs) with seqs
an int array [B, T + 1]. As a program: numpy_forward.py WEIGHTS_OR_HF_DIR SHARD
VAL_BATCHES SEQS_PER_BATCH [SEQ] prints the mean loss of the evaluation set
tessera-llama --val-data SHARD evaluates (consecutive windows from the start)."""
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    raw = open(path, 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop('__metadata__', {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        b, end = e['data_offsets']
        buf = raw[base + b:base + end]
        if e['dtype'] == 'F32':
            a = np.frombuffer(buf, dtype='<f4')
        elif e['dtype'] == 'BF16':
            a = (np.frombuffer(buf, dtype='<u2').astype(np.uint32) << 16).view(np.float32)
        elif e['dtype'] == 'F16':
            a = np.frombuffer(buf, dtype='<f2')
        else:
            raise ValueError(f'{path}: {name} is {e["dtype"]}')
        out[name] = a.reshape(e['shape']).astype(np.float64)
    return out, meta


def from_hf(directory):
    """A Hugging Face directory as Tessera's names and metadata (the table of
    tools/hf_tables.py, read from llama/hf_table.hpp)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools'))
    import hf_tables
    config = json.load(open(os.path.join(directory, 'config.json')))
    tensors = {}
    index = os.path.join(directory, 'model.safetensors.index.json')
    files = sorted(set(json.load(open(index))['weight_map'].values())) if os.path.exists(index) else ['model.safetensors']
    for f in files:
        tensors.update(read_safetensors(os.path.join(directory, f))[0])
    meta = hf_tables.llama_meta(config)
    return hf_tables.to_tessera('llama', tensors, meta), meta


def load(path):
    return from_hf(path) if os.path.isdir(path) else read_safetensors(path)


def rms(x, w, eps):
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def inverse_frequencies(meta, hd):
    inv = 1.0 / float(meta['rope_theta']) ** (np.arange(0, hd, 2) / hd)
    factor = float(meta.get('rope_factor', 0))
    if factor <= 0:
        return inv
    low, high = float(meta['rope_low_freq_factor']), float(meta['rope_high_freq_factor'])
    old = float(meta['rope_original_positions'])
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, smoothed, scaled)


def rope(x, cos, sin):
    """x [B, heads, T, hd], rotate-half."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def logits(w, meta, tokens):
    """tokens [B, T] -> logits [B, T, vocab] over the real vocabulary."""
    L, H, KV, V = int(meta['layers']), int(meta['heads']), int(meta['kv_heads']), int(meta['vocab'])
    hd, F, eps = int(meta['head_dim']), int(meta['ffn']), float(meta['norm_eps'])
    B, T = tokens.shape
    x = w['embed.tok'][tokens]
    ang = np.arange(T)[:, None] * inverse_frequencies(meta, hd)[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    for l in range(L):
        p = lambda k: w[f'block{l}.{k}']
        h = rms(x, p('attn_norm'), eps)
        qkv = h @ p('qkv').T
        q = qkv[..., :H * hd].reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        k = qkv[..., H * hd:(H + KV) * hd].reshape(B, T, KV, hd).transpose(0, 2, 1, 3)
        v = qkv[..., (H + KV) * hd:].reshape(B, T, KV, hd).transpose(0, 2, 1, 3)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        s = np.where(mask, -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(0, 2, 1, 3).reshape(B, T, H * hd) @ p('o').T
        h = rms(x, p('ffn_norm'), eps)
        gu = h @ p('gate_up').T
        g, u = gu[..., :F], gu[..., F:]
        x = x + (g / (1 + np.exp(-g)) * u) @ p('down').T
    x = rms(x, w['embed.norm'], eps)
    head = w['embed.tok'] if 'embed.head' not in w else w['embed.head']
    return x @ head[:V].T


def loss(w, meta, seqs):
    """Summed next-token cross-entropy of seqs [B, T + 1]."""
    z = logits(w, meta, seqs[:, :-1])
    z = z - z.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1))
    return float((lse - np.take_along_axis(z, seqs[:, 1:][..., None], -1)[..., 0]).sum())


def read_shard(path):
    raw = open(path, 'rb').read()
    magic, version, n = struct.unpack('<3i', raw[:12])
    if (magic, version) == (20240801, 7):
        return np.frombuffer(raw[1024:1024 + 4 * n], dtype='<u4').astype(np.int64)
    assert (magic, version) == (20240520, 1), path
    return np.frombuffer(raw[1024:1024 + 2 * n], dtype='<u2').astype(np.int64)


if __name__ == '__main__':
    weights, meta = load(sys.argv[1])
    toks = read_shard(sys.argv[2])
    batches, per = int(sys.argv[3]), int(sys.argv[4])
    T = int(sys.argv[5]) if len(sys.argv) > 5 else int(meta['seq'])
    windows = len(toks) - T
    seqs = np.stack([toks[(i * T) % windows:(i * T) % windows + T + 1] for i in range(batches * per)])
    print(f'{loss(weights, meta, seqs) / (batches * per * T):.9f}')
