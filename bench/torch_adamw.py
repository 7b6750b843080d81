#!/usr/bin/env python3
"""PyTorch's fused AdamW on the same GPU, as the baseline beside
tessera-bench-optim: one flat tensor and 2048 tensors of the same total, fp32
parameters, grads and state; plus torch's own device copy. Prints and
optionally writes JSON (--json FILE). --copy-only: the device copy alone (the
ceiling other benchmarks set their bytes against, e.g. the gpt profile)."""
import argparse
import json

import torch

p = argparse.ArgumentParser()
p.add_argument('--log2-elements', type=int, default=30)
p.add_argument('--iters', type=int, default=20)
p.add_argument('--json')
p.add_argument('--copy-only', action='store_true')
a = p.parse_args()
n = 1 << a.log2_elements
dev = 'cuda'


def median_ms(f, warmup=3, iters=a.iters):
    for _ in range(warmup):
        f()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


res = {'device': torch.cuda.get_device_name(), 'elements': n, 'torch': torch.__version__}
src = torch.rand(2 * n, device=dev)
dst = torch.empty_like(src)
ms = median_ms(lambda: dst.copy_(src))
res['copy_gbs'] = 2 * 2 * n * 4 / (ms * 1e6)
del src, dst
print(f"torch copy: {ms:.3f} ms, {res['copy_gbs']:.1f} GB/s")
for tensors in () if a.copy_only else (1, 2048):
    per = n // tensors
    params = [torch.rand(per, device=dev, requires_grad=True) for _ in range(tensors)]
    for q in params:
        q.grad = torch.rand_like(q)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True)
    ms = median_ms(opt.step)
    gbs = 28 * n / (ms * 1e6)
    res[f'adamw_{tensors}'] = {'ms': ms, 'gbs': gbs, 'ratio': gbs / res['copy_gbs']}
    print(f"torch fused AdamW, {tensors} tensor(s): {ms:.3f} ms, {gbs:.1f} GB/s, {100 * gbs / res['copy_gbs']:.1f}% of copy")
    del params, opt
    torch.cuda.empty_cache()
if a.json:
    with open(a.json, 'w') as f:
        json.dump(res, f, indent=2)
