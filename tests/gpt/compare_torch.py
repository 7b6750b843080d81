#!/usr/bin/env python3
"""tessera-gpt against bench/torch_gpt2.py on the GPU: both start from
tessera-gpt's initial weights (--steps 0 --dump-weights) and take the same
batches of the same text, and their loss curves are compared step by step
(worst and mean relative difference printed; the limit is bf16 rounding for
bf16, 1e-4 for fp32).

Usage: compare_torch.py TRAINER TORCH_GPT2 TEXT PRECISION STEPS [TRAINER FLAGS...]"""
import json
import os
import subprocess
import sys
import tempfile

trainer, torch_gpt2, text, precision, steps = sys.argv[1:6]
extra = sys.argv[6:]
tmp = tempfile.mkdtemp(prefix='tessera-gpt-torch-')
init = os.path.join(tmp, 'init.safetensors')
model = ['--layers', '4', '--heads', '4', '--d', '256', '--seq', '128', '--batch', '8', '--lr', '1e-3', '--warmup', '5',
         '--min-lr', '1e-4', '--clip', '1.0', '--seed', '3']
common = model + ['--data', text, '--text', '--precision', precision]
subprocess.run([trainer, '--backend', 'cuda', '--steps', '0', '--dump-weights', init] + common, check=True,
               capture_output=True)
res = subprocess.run([trainer, '--backend', 'cuda', '--steps', steps, '--log-every', '1', '--json'] + common + extra,
                     check=True, capture_output=True, text=True)
ours = {j['step']: j['loss'] for j in map(json.loads, (l for l in res.stdout.splitlines() if l.startswith('{')))
        if 'step' in j}
res = subprocess.run([sys.executable, torch_gpt2, '--weights', init, '--text', text, '--seq', '128', '--batch', '8',
                      '--steps', steps, '--lr', '1e-3', '--warmup', '5', '--min-lr', '1e-4', '--clip', '1.0',
                      '--seed', '3', '--precision', precision, '--attention', 'math'],
                     check=True, capture_output=True, text=True)
theirs = {j['step']: j['loss'] for j in map(json.loads, (l for l in res.stdout.splitlines() if l.startswith('{')))
          if 'step' in j}
rels = []
for s in sorted(ours):
    rel = abs(ours[s] - theirs[s]) / abs(theirs[s])
    rels.append(rel)
    if s % 10 == 0 or s == max(ours):
        print(f'step {s:3d}  tessera {ours[s]:.6f}  torch {theirs[s]:.6f}  rel {rel:.2e}')
limit = 1e-4 if precision == 'fp32' else 2e-2
print(f'{precision}: {len(rels)} steps, worst relative difference {max(rels):.2e}, mean {sum(rels) / len(rels):.2e} '
      f'(limit {limit:.0e}); loss {ours[0]:.4f} -> {ours[max(ours)]:.4f}')
sys.exit(0 if max(rels) <= limit else 1)
