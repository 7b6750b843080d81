#!/usr/bin/env python3
"""GPT-2 in PyTorch, the independent implementation tessera-gpt is held to.

The same architecture (fused qkv with bias, causal attention, tanh GELU, pre-LN,
the head tied to the token table, the vocabulary padded in the table and the
padded rows never given probability; the head's product runs over the whole
padded table, as nanoGPT's vocab_size 50304 does, and the padded columns are
dropped before the softmax), AdamW (0.9, 0.95, eps 1e-8, decay on 2-D
weights only), global-norm clipping, linear warm-up then a cosine to --min-lr,
fp32 master weights with bf16 autocast (--precision bf16) or strict fp32 (no
TF32).

--weights FILE starts from tessera-gpt's --dump-weights (with --steps 0: its
initial weights) and --text FILE takes the very batches tessera-gpt draws
(sequence g of step s starts at window hash(seed, s, g) mod windows: the
sampler of models/include/trainer_kit/tokens.hpp, re-implemented here), so the two
loss curves can be compared step by step. Without --weights it initialises as
GPT-2 and trains on random tokens (the speed issue's setting).

Prints one JSON line per step ({"step", "loss", "grad_norm", "lr", "ms",
"tokens_per_s"}) and a summary ({"summary": true, "tokens_per_s", "peak_bytes"}).

With --fsdp2, under torchrun (one process per GPU): PyTorch FSDP2, the peer of
tessera-gpt's fsdp2 wrapper at N GPUs: fully_shard on every block and on the
root (ZeRO-3), bf16 parameters and fp32 gradient reduction under --precision
bf16 (MixedPrecisionPolicy, in place of autocast), --batch sequences per GPU,
each rank its own random tokens; tokens/s are per GPU (rank 0 prints).
  python3 -m torch.distributed.run --nproc-per-node 2 bench/torch_gpt2.py --fsdp2 --model gpt2 --batch 32 --compile
"""
import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9e3779b97f4a7c15) & M64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & M64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def window(seed, step, g, windows):
    h = splitmix64((splitmix64((splitmix64(seed ^ 0x243f6a8885a308d3) + step) & M64)) ^ g)
    return h % windows


def scheduled_lr(t, lr, min_lr, warmup, steps):
    if warmup > 0 and t <= warmup:
        return lr * t / warmup
    span = max(1, steps - warmup)
    progress = min(1.0, (t - warmup) / span)
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - min_lr)


def load_safetensors(path):
    """tessera-gpt's --dump-weights file: tensors and metadata (examples/gpt/numpy_forward.py reads it)."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'examples', 'gpt'))
    from numpy_forward import load
    w, meta = load(path)
    return {k: torch.from_numpy(v.astype(np.float32)) for k, v in w.items()}, meta


class Block(torch.nn.Module):
    """One pre-LN block; a module of its own so that FSDP2 can shard it."""

    def __init__(self, heads, d, attention):
        super().__init__()
        self.heads, self.d, self.attention = heads, d, attention
        P = torch.nn.Parameter
        self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b = P(torch.ones(d)), P(torch.zeros(d)), P(torch.ones(d)), P(torch.zeros(d))
        self.qkv_w, self.qkv_b = P(torch.zeros(3 * d, d)), P(torch.zeros(3 * d))
        self.proj_w, self.proj_b = P(torch.zeros(d, d)), P(torch.zeros(d))
        self.fc_w, self.fc_b = P(torch.zeros(4 * d, d)), P(torch.zeros(4 * d))
        self.fc_proj_w, self.fc_proj_b = P(torch.zeros(d, 4 * d)), P(torch.zeros(d))

    def forward(self, x):
        B, T, d = x.shape
        H, b = self.heads, self
        h = F.layer_norm(x, (d,), b.ln1_w, b.ln1_b, 1e-5)
        q, k, v = F.linear(h, b.qkv_w, b.qkv_b).split(d, dim=2)
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
        if self.attention == 'sdpa':
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(d // H)
            s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1), float('-inf'))
            a = torch.softmax(s.float(), dim=-1).to(v.dtype) @ v
        x = x + F.linear(a.transpose(1, 2).reshape(B, T, d), b.proj_w, b.proj_b)
        h = F.layer_norm(x, (d,), b.ln2_w, b.ln2_b, 1e-5)
        return x + F.linear(F.gelu(F.linear(h, b.fc_w, b.fc_b), approximate='tanh'), b.fc_proj_w, b.fc_proj_b)


class GPT(torch.nn.Module):
    def __init__(self, layers, heads, d, vocab, positions, attention):
        super().__init__()
        self.layers, self.heads, self.d, self.vocab, self.attention = layers, heads, d, vocab, attention
        pv = (vocab + 127) // 128 * 128
        P = torch.nn.Parameter
        self.wte = P(torch.zeros(pv, d))
        self.wpe = P(torch.zeros(positions, d))
        self.lnf_w, self.lnf_b = P(torch.ones(d)), P(torch.zeros(d))
        self.blocks = torch.nn.ModuleList(Block(heads, d, attention) for _ in range(layers))

    def names(self):
        """(tessera-gpt's name, parameter) pairs."""
        yield 'embed.wte', self.wte
        yield 'embed.wpe', self.wpe
        yield 'embed.ln_f.w', self.lnf_w
        yield 'embed.ln_f.b', self.lnf_b
        for l, b in enumerate(self.blocks):
            for k, p in [('ln_1.w', b.ln1_w), ('ln_1.b', b.ln1_b), ('qkv.w', b.qkv_w), ('qkv.b', b.qkv_b),
                         ('proj.w', b.proj_w), ('proj.b', b.proj_b), ('ln_2.w', b.ln2_w), ('ln_2.b', b.ln2_b),
                         ('fc.w', b.fc_w), ('fc.b', b.fc_b), ('fc_proj.w', b.fc_proj_w), ('fc_proj.b', b.fc_proj_b)]:
                yield f'block{l}.{k}', p

    def gpt2_init(self, gen):
        with torch.no_grad():
            for name, p in self.names():
                if name.endswith(('.b', 'ln_1.w', 'ln_2.w', 'ln_f.w')):
                    continue
                std = 0.02 / math.sqrt(2 * self.layers) if 'proj.w' in name else 0.02
                p.normal_(0, std, generator=gen)
            self.wte[self.vocab:].zero_()

    def forward(self, idx, targets):
        B, T = idx.shape
        d = self.d
        x = self.wte[idx] + self.wpe[:T]
        for b in self.blocks:
            x = b(x)
        x = F.layer_norm(x, (d,), self.lnf_w, self.lnf_b, 1e-5)
        # The head over the whole padded table, as nanoGPT runs it (vocab_size 50304): an aligned width keeps
        # cuBLAS on its fast kernels (over wte[:50257] it fell to kernels several times slower, which made this
        # peer weaker than the field's torch.compile baseline). The padded columns are then left out of the
        # softmax, so the function is tessera-gpt's (padded tokens never given probability).
        logits = F.linear(x, self.wte)[..., :self.vocab]
        return F.cross_entropy(logits.float().reshape(-1, self.vocab), targets.reshape(-1), reduction='sum')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--weights')
    ap.add_argument('--text')
    ap.add_argument('--model', choices=['gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl'])
    ap.add_argument('--layers', type=int, default=2)
    ap.add_argument('--heads', type=int, default=4)
    ap.add_argument('--d', type=int, default=64)
    ap.add_argument('--vocab', type=int, default=256)
    ap.add_argument('--seq', type=int, default=32)
    ap.add_argument('--batch', type=int, default=4, help='sequences per step (the global batch)')
    ap.add_argument('--micro', type=int, default=0, help='sequences per micro-batch (0: the whole batch)')
    ap.add_argument('--steps', type=int, default=50)
    ap.add_argument('--lr', type=float, default=6e-4)
    ap.add_argument('--min-lr', type=float, default=0.0)
    ap.add_argument('--warmup', type=int, default=0)
    ap.add_argument('--clip', type=float, default=1.0)
    ap.add_argument('--weight-decay', type=float, default=0.1)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--precision', choices=['fp32', 'bf16'], default='bf16')
    ap.add_argument('--attention', choices=['math', 'sdpa'], default='sdpa')
    ap.add_argument('--compile', action='store_true')
    ap.add_argument('--profile-last', action='store_true',
                    help='profile the last step only (cudaProfilerStart/Stop, process-wide: autograd launches the '
                         'backward from threads of its own, which an NVTX range would miss); ncu --profile-from-start off')
    ap.add_argument('--fsdp2', action='store_true', help='PyTorch FSDP2 over the torchrun processes (--batch per GPU)')
    a = ap.parse_args()
    rank, world = 0, 1
    if a.fsdp2:
        torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', 0)))
        torch.distributed.init_process_group('nccl')
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if a.weights or a.text:
            ap.error('--fsdp2 measures speed on random tokens: no --weights or --text')
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.model:
        a.layers, a.heads, a.d = {'gpt2': (12, 12, 768), 'gpt2-medium': (24, 16, 1024), 'gpt2-large': (36, 20, 1280),
                                  'gpt2-xl': (48, 25, 1600)}[a.model]
        a.vocab = 50257
    positions = 1024 if a.model else a.seq
    dev = 'cuda'
    meta = {}
    if a.weights:
        w, meta = load_safetensors(a.weights)
        a.layers, a.heads, a.d, a.vocab = int(meta['layers']), int(meta['heads']), int(meta['d']), int(meta['vocab'])
        positions = int(meta['max_seq'])
    model = GPT(a.layers, a.heads, a.d, a.vocab, positions, a.attention)
    if a.weights:
        with torch.no_grad():
            for name, p in model.names():
                p.copy_(w[name])
    else:
        model.gpt2_init(torch.Generator().manual_seed(a.seed))
    model.to(dev)
    autocast = a.precision == 'bf16'
    if a.fsdp2:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if autocast else torch.float32, reduce_dtype=torch.float32)
        for b in model.blocks:
            fully_shard(b, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        autocast = False  # the policy casts the parameters
        torch.manual_seed(1 + rank)
    decay = [p for n, p in model.names() if p.dim() == 2]
    rest = [p for n, p in model.names() if p.dim() != 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': a.weight_decay}, {'params': rest, 'weight_decay': 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if a.compile else model
    T, G = a.seq, a.batch
    micro = a.micro or G
    if a.text:
        toks = torch.from_numpy(np.frombuffer(open(a.text, 'rb').read(), dtype=np.uint8).astype(np.int64))
        windows = len(toks) - T
    else:
        gen = torch.Generator(device=dev).manual_seed(a.seed + rank)  # each rank its own batch
    times = []
    torch.cuda.reset_peak_memory_stats()
    for step in range(a.steps):
        torch.cuda.synchronize()
        marked = a.profile_last and step + 1 == a.steps
        if marked:
            torch.cuda.profiler.start()
        t0 = time.perf_counter()
        if a.text:
            seqs = torch.stack([toks[w:w + T + 1] for w in (window(a.seed, step, g, windows) for g in range(G))]).to(dev)
        else:
            seqs = torch.randint(0, a.vocab, (G, T + 1), device=dev, generator=gen)
        loss_sum = torch.zeros((), device=dev)
        for m0 in range(0, G, micro):
            s = seqs[m0:m0 + micro]
            with torch.autocast('cuda', dtype=torch.bfloat16, enabled=autocast):
                loss = fwd(s[:, :-1], s[:, 1:])
            (loss / (G * T)).backward()
            loss_sum += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip if a.clip > 0 else float('inf'))
        norm = norm.full_tensor() if hasattr(norm, 'full_tensor') else norm  # FSDP2: a replicated DTensor
        lr = scheduled_lr(step + 1, a.lr, a.min_lr, a.warmup, a.steps)
        for g in opt.param_groups:
            g['lr'] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_v = loss_sum.item() / (G * T)
        dt = time.perf_counter() - t0
        if marked:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        if step >= 5:
            times.append(dt)
        if rank == 0:
            print(json.dumps({'step': step, 'loss': loss_v, 'grad_norm': float(norm), 'lr': lr, 'ms': dt * 1e3,
                              'tokens_per_s': G * T / dt}), flush=True)
    tps = G * T * len(times) / sum(times) if times else 0.0  # per GPU under --fsdp2
    if rank == 0:
        print(json.dumps({'summary': True, 'tokens_per_s': tps, 'peak_bytes': torch.cuda.max_memory_allocated(),
                          'precision': a.precision, 'attention': a.attention, 'compile': a.compile,
                          'fsdp2': a.fsdp2, 'world': world,
                          'params': sum(p.numel() for p in model.parameters())}), flush=True)  # DTensors: global sizes
    if a.fsdp2:
        torch.distributed.destroy_process_group()


if __name__ == '__main__':
    main()
