#!/usr/bin/env python3
"""The reference model's conventions, checked: examples/mlp_lm/numpy_forward.py,
which knows only the README's description and a --dump-weights file, gives
the loss the trainer logged for the same step's batch on the same weights.

Usage: check_numpy_forward.py MPIEXEC TRAINER NUMPY_FORWARD"""
import json
import os
import subprocess
import sys
import tempfile

mpiexec, trainer, forward = sys.argv[1:4]
work = tempfile.mkdtemp(prefix='tessera-numpy-forward-')
data = os.path.join(work, 'text.txt')
with open(data, 'w') as f:
    f.write('The cat sees the red ball today. A dog likes an open window! My sister paints the long road.\n' * 300)
K, tokens, seed = 12, 200, 7
failed = False
for np_, flags in [('2', ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params']),
                   ('3', ['--wrapper', 'fsdp2', '--strategy', 'optim_grads_params', '--layers', '1'])]:
    common = [trainer, '--layers', '2', '--d', '32', '--ctx', '4', '--tokens', str(tokens), '--data', data,
              '--seed', str(seed), '--lr', '1e-2'] + flags
    run = [mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', np_]
    w = os.path.join(work, f'w{np_}.safetensors')
    subprocess.run(run + common + ['--steps', str(K), '--dump-weights', w], check=True, capture_output=True, timeout=300)
    out = subprocess.run(run + common + ['--steps', str(K + 1), '--json', '--log-every', '1'], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    logged = [json.loads(l)['loss'] for l in out.splitlines() if l.startswith('{') and '"step"' in l][-1]
    got = float(subprocess.run([sys.executable, forward, w, data, '--tokens', str(tokens), '--seed', str(seed),
                                '--step', str(K)], check=True, capture_output=True, text=True).stdout)
    rel = abs(got - logged) / logged
    ok = rel <= 1e-4
    failed |= not ok
    print(f'{"ok  " if ok else "FAIL"} {np_} ranks {" ".join(flags)}: trainer logged {logged:.6f} at step {K}, '
          f'numpy forward {got:.6f} (relative {rel:.1e}, tolerance 1e-4)')
sys.exit(1 if failed else 0)
