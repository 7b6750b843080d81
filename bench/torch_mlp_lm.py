#!/usr/bin/env python3
"""PyTorch baseline for tessera-bench-train: the same byte-level MLP language
model (embedding of ctx bytes, residual GELU-MLP blocks of width 4d, a 256-way
head), fp32 parameters, bf16 autocast, fused AdamW, gradient clipping, on one
GPU. Prints ms/step and tokens/s (median of timed steps after warm-up) for
eager mode and, with --compile, torch.compile; --json writes them.

With --fsdp2, under torchrun (one process per GPU): PyTorch FSDP2, the peer of
Tessera's fsdp2 wrapper: fully_shard on every block and on the root (ZeRO-3,
reshard_after_forward=True), bf16 parameters and fp32 gradient reduction
(MixedPrecisionPolicy), --tokens per GPU; tokens/s are per GPU (rank 0 prints).

Usage: torch_mlp_lm.py [--layers 8 --d 4096 --ctx 8 --tokens 8192] [--compile] [--json FILE]
       python3 -m torch.distributed.run --nproc-per-node 2 torch_mlp_lm.py --fsdp2 [...]"""
import argparse
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w1 = nn.Linear(d, 4 * d)
        self.w2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.w2(F.gelu(self.w1(x), approximate='tanh'))


class MlpLm(nn.Module):
    def __init__(self, layers, d, ctx):
        super().__init__()
        self.table = nn.Embedding(256, d // ctx)
        self.blocks = nn.ModuleList([Block(d) for _ in range(layers)])
        self.head = nn.Linear(d, 256)
        self.d = d

    def forward(self, ctx_bytes, targets):
        x = self.table(ctx_bytes).reshape(-1, self.d)
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.head(x).float(), targets)


def run(args, compiled):
    torch.manual_seed(0)
    dev = 'cuda'
    model = MlpLm(args.layers, args.d, args.ctx).to(dev)
    autocast = not args.fsdp2
    if args.fsdp2:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for b in model.blocks:
            fully_shard(b, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        torch.manual_seed(1 + torch.distributed.get_rank())  # each rank its own batch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_fn = torch.compile(model) if compiled else model
    ctx = torch.randint(0, 256, (args.tokens, args.ctx), device=dev)
    tgt = torch.randint(0, 256, (args.tokens,), device=dev)
    times = []
    torch.cuda.reset_peak_memory_stats()
    for i in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast('cuda', dtype=torch.bfloat16, enabled=autocast):
            loss = step_fn(ctx, tgt)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    ms = times[len(times) // 2]
    mode = ('FSDP2 ' if args.fsdp2 else '') + ('torch.compile' if compiled else 'eager')
    return {'mode': mode, 'ms': ms, 'tokens_per_s': args.tokens / (ms * 1e-3),
            'peak_bytes': torch.cuda.max_memory_allocated(), 'loss': float(loss)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--layers', type=int, default=8)
    p.add_argument('--d', type=int, default=4096)
    p.add_argument('--ctx', type=int, default=8)
    p.add_argument('--tokens', type=int, default=8192)
    p.add_argument('--steps', type=int, default=10)
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--clip', type=float, default=1.0)
    p.add_argument('--compile', action='store_true')
    p.add_argument('--fsdp2', action='store_true', help='PyTorch FSDP2 over the torchrun processes')
    p.add_argument('--json')
    args = p.parse_args()
    rank, world = 0, 1
    if args.fsdp2:
        torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', 0)))
        torch.distributed.init_process_group('nccl')
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    params = 256 * (args.d // args.ctx) + args.layers * (8 * args.d * args.d + 5 * args.d) + 256 * args.d + 256
    out = {'torch': torch.__version__, 'device': torch.cuda.get_device_name(), 'layers': args.layers, 'd': args.d,
           'ctx': args.ctx, 'tokens': args.tokens, 'params': params, 'clip': args.clip, 'world': world, 'results': []}
    for compiled in ([False, True] if args.compile else [False]):
        r = run(args, compiled)
        out['results'].append(r)
        if rank == 0:
            per = ' per GPU' if world > 1 else ''
            print(f"torch {r['mode']:14s} {world} GPU{'s' if world > 1 else ''} layers {args.layers} d {args.d} tokens "
                  f"{args.tokens}{per}: {r['ms']:8.3f} ms/step {r['tokens_per_s']:12.0f} tokens/s{per}  peak "
                  f"{r['peak_bytes'] / 2**20:9.1f} MiB", flush=True)
    if args.json and rank == 0:
        with open(args.json, 'w') as f:
            json.dump(out, f, indent=2)
    if args.fsdp2:
        torch.distributed.destroy_process_group()


if __name__ == '__main__':
    main()
