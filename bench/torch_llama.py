#!/usr/bin/env python3
"""Llama 3 in plain PyTorch: the peer of tessera-llama's speed, and an independent
implementation its curve is held to.

The architecture of transformers' LlamaForCausalLM (RMSNorm, rotate-half rotary
embeddings with Llama 3's frequency scaling, grouped-query attention through
F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), SwiGLU, no
biases, a tied or untied head), AdamW (0.9, 0.95, eps 1e-8, decay on 2-D
weights only) fused, global-norm clipping, linear warm-up then a cosine to
--min-lr, fp32 master weights with bf16 autocast (--precision bf16) or strict
fp32; --compile runs torch.compile(model), as a plain PyTorch user would.

--weights FILE starts from tessera-llama's --dump-weights (with --steps 0: its
initial weights); without it the model initialises N(0, 0.02). --text FILE
trains on the file's bytes, on the batches tessera-llama --text draws; without
it on random tokens (the speed setting). Prints one JSON line per step ({"step",
"loss", "grad_norm", "lr", "ms", "tokens_per_s"}) and a summary ({"summary":
true, "tokens_per_s", "peak_bytes"})."""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'examples', 'llama'))

PRESETS = {'llama3.2-1b': (16, 32, 8, 2048, 8192, 32.0, True), 'llama3.2-3b': (28, 24, 8, 3072, 8192, 32.0, True),
           'llama3.1-8b': (32, 32, 8, 4096, 14336, 8.0, False)}


def inverse_frequencies(hd, theta, factor, low=1.0, high=4.0, old=8192):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    if factor <= 0:
        return inv
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


class Llama(torch.nn.Module):
    def __init__(self, layers, heads, kv, d, ffn, vocab, tied, theta, factor, eps=1e-5, **rope):
        super().__init__()
        self.H, self.KV, self.hd, self.vocab, self.eps, self.tied = heads, kv, d // heads, vocab, eps, tied
        pv = (vocab + 127) // 128 * 128
        P = torch.nn.Parameter
        self.tok = P(torch.zeros(pv, d))
        self.norm = P(torch.ones(d))
        self.head = self.tok if tied else P(torch.zeros(pv, d))
        q, k = heads * self.hd, kv * self.hd
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.attn_norm, b.ffn_norm = P(torch.ones(d)), P(torch.ones(d))
            b.qkv, b.o = P(torch.zeros(q + 2 * k, d)), P(torch.zeros(d, q))
            b.gate_up, b.down = P(torch.zeros(2 * ffn, d)), P(torch.zeros(d, ffn))
            self.blocks.append(b)
        self.register_buffer('inv_freq', inverse_frequencies(self.hd, theta, factor, **rope), persistent=False)

    def names(self):
        yield 'embed.tok', self.tok
        yield 'embed.norm', self.norm
        if not self.tied:
            yield 'embed.head', self.head
        for l, b in enumerate(self.blocks):
            for k in ('attn_norm', 'qkv', 'o', 'ffn_norm', 'gate_up', 'down'):
                yield f'block{l}.{k}', getattr(b, k)

    def init(self, gen):
        with torch.no_grad():
            for name, p in self.names():
                if p.dim() == 2:
                    p.normal_(0, 0.02, generator=gen)
            self.tok[self.vocab:].zero_()
            self.head[self.vocab:].zero_()

    def rms(self, x, w):
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def forward(self, idx, targets):
        B, T = idx.shape
        ang = torch.arange(T, device=idx.device, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
        x = self.tok[idx]
        q_dim, k_dim, half = self.H * self.hd, self.KV * self.hd, self.hd // 2
        rot = lambda t: t * cos.to(t.dtype) + torch.cat([-t[..., half:], t[..., :half]], -1) * sin.to(t.dtype)
        for b in self.blocks:
            qkv = F.linear(self.rms(x, b.attn_norm), b.qkv)
            q = qkv[..., :q_dim].view(B, T, self.H, self.hd).transpose(1, 2)
            k = qkv[..., q_dim:q_dim + k_dim].view(B, T, self.KV, self.hd).transpose(1, 2)
            v = qkv[..., q_dim + k_dim:].view(B, T, self.KV, self.hd).transpose(1, 2)
            a = F.scaled_dot_product_attention(rot(q), rot(k), v, is_causal=True, enable_gqa=self.KV != self.H)
            x = x + F.linear(a.transpose(1, 2).reshape(B, T, q_dim), b.o)
            g, u = F.linear(self.rms(x, b.ffn_norm), b.gate_up).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, b.down)
        # The head over the whole padded table (an aligned width), the padded columns left out of the softmax.
        logits = F.linear(self.rms(x, self.norm), self.head)[..., :self.vocab]
        return F.cross_entropy(logits.float().reshape(-1, self.vocab), targets.reshape(-1), reduction='sum')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--weights')
    ap.add_argument('--model', choices=list(PRESETS))
    ap.add_argument('--layers', type=int, default=2)
    ap.add_argument('--heads', type=int, default=4)
    ap.add_argument('--kv-heads', type=int, default=2)
    ap.add_argument('--d', type=int, default=64)
    ap.add_argument('--ffn', type=int, default=176)
    ap.add_argument('--vocab', type=int, default=256)
    ap.add_argument('--seq', type=int, default=32)
    ap.add_argument('--batch', type=int, default=4)
    ap.add_argument('--steps', type=int, default=20)
    ap.add_argument('--lr', type=float, default=3e-4)
    ap.add_argument('--min-lr', type=float, default=3e-5)
    ap.add_argument('--warmup', type=int, default=0)
    ap.add_argument('--clip', type=float, default=1.0)
    ap.add_argument('--weight-decay', type=float, default=0.1)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--precision', choices=['fp32', 'bf16'], default='bf16')
    ap.add_argument('--text', help="train on this file's bytes, on the very batches tessera-llama --text draws "
                                   "(its sampler: bench/torch_gpt2.py's window)")
    ap.add_argument('--compile', action='store_true')
    ap.add_argument('--profile', metavar='FILE',
                    help="the last step under torch.profiler: its CUDA kernels' table into FILE (slows that step)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = dict(layers=a.layers, heads=a.heads, kv=a.kv_heads, d=a.d, ffn=a.ffn, vocab=a.vocab, tied=False,
               theta=500000.0, factor=0.0)
    if a.model:
        L, H, KV, D, FF, factor, tied = PRESETS[a.model]
        cfg.update(layers=L, heads=H, kv=KV, d=D, ffn=FF, vocab=128256, tied=tied, factor=factor)
    w = None
    if a.weights:
        from safetensors.numpy import load_file
        from safetensors import safe_open
        w = load_file(a.weights)
        with safe_open(a.weights, 'np') as f:
            meta = f.metadata()
        cfg.update(layers=int(meta['layers']), heads=int(meta['heads']), kv=int(meta['kv_heads']), d=int(meta['d']),
                   ffn=int(meta['ffn']), vocab=int(meta['vocab']), tied=meta['tie_embeddings'] == 'true',
                   theta=float(meta['rope_theta']), factor=float(meta['rope_factor']), eps=float(meta['norm_eps']),
                   low=float(meta['rope_low_freq_factor']), high=float(meta['rope_high_freq_factor']),
                   old=int(meta['rope_original_positions']))
    model = Llama(**cfg)
    if w is not None:
        with torch.no_grad():
            for name, p in model.names():
                p.copy_(torch.from_numpy(w[name]))
    else:
        model.init(torch.Generator().manual_seed(a.seed))
    dev = 'cuda'
    model.to(dev)
    params = dict(model.names())
    decay = [p for p in params.values() if p.dim() == 2]
    rest = [p for p in params.values() if p.dim() != 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': a.weight_decay}, {'params': rest, 'weight_decay': 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if a.compile else model
    T, G = a.seq, a.batch
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    if a.text:
        from torch_gpt2 import window  # the trainers' sampler, written once for the Python peers
        toks = torch.from_numpy(np.frombuffer(open(a.text, 'rb').read(), dtype=np.uint8).astype(np.int64))
        windows = len(toks) - T
    times = []
    torch.cuda.reset_peak_memory_stats()
    prof = None
    for step in range(a.steps):
        torch.cuda.synchronize()
        if a.profile and step == a.steps - 1:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        t0 = time.perf_counter()
        if a.text:
            seqs = torch.stack([toks[w:w + T + 1] for w in (window(a.seed, step, g, windows) for g in range(G))]).to(dev)
        else:
            seqs = torch.randint(0, cfg['vocab'], (G, T + 1), device=dev, generator=gen)
        with torch.autocast('cuda', dtype=torch.bfloat16, enabled=a.precision == 'bf16'):
            loss = fwd(seqs[:, :-1], seqs[:, 1:])
        (loss / (G * T)).backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), a.clip if a.clip > 0 else float('inf'))
        t = step + 1
        lr = a.lr * t / a.warmup if a.warmup and t <= a.warmup else a.min_lr + 0.5 * (
            1 + math.cos(math.pi * min(1.0, (t - a.warmup) / max(1, a.steps - a.warmup)))) * (a.lr - a.min_lr)
        for g in opt.param_groups:
            g['lr'] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_v = loss.item() / (G * T)
        dt = time.perf_counter() - t0
        if prof is not None:
            torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            with open(a.profile, 'w') as f:
                f.write(prof.key_averages().table(sort_by='cuda_time_total', row_limit=40, max_name_column_width=90))
            prof = None
        if step >= 5:
            times.append(dt)
        print(json.dumps({'step': step, 'loss': loss_v, 'grad_norm': float(norm), 'lr': lr, 'ms': dt * 1e3,
                          'tokens_per_s': G * T / dt}), flush=True)
    tps = G * T * len(times) / sum(times) if times else 0.0
    print(json.dumps({'summary': True, 'tokens_per_s': tps, 'peak_bytes': torch.cuda.max_memory_allocated(),
                      'precision': a.precision, 'compile': a.compile,
                      'params': sum(p.numel() for p in params.values())}), flush=True)


if __name__ == '__main__':
    main()
