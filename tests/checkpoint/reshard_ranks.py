#!/usr/bin/env python3
"""A checkpoint written at one world size (and strategy, communicator) loads at
another: the run that saves after k steps and the run that loads it and goes
on to 2k must reproduce the loss curve and final weights of an uninterrupted
2k-step run at the loading world size, within TOL (relative).

Usage: reshard_ranks.py MPIEXEC TRAINER TOL SAVE_NP "SAVE FLAGS" LOAD_NP "LOAD FLAGS" [COMMON FLAGS...]
e.g. on two GPUs: 8 ranks sharing them (MPI staged) -> 2 ranks with NCCL, and the reverse."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

mpiexec, trainer, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
save_np, save_flags, load_np, load_flags = sys.argv[4], shlex.split(sys.argv[5]), sys.argv[6], shlex.split(sys.argv[7])
common = sys.argv[8:] + ['--json', '--log-every', '1']
STEPS = 4


def run(np_, flags):
    cmd = [mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', str(np_), trainer] + common + flags
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        sys.exit(f'FAIL {" ".join(cmd)} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}')
    lines = [json.loads(l) for l in res.stdout.splitlines() if l.startswith('{')]
    summary = [l for l in lines if l.get('summary')]
    assert summary and summary[0]['world'] == int(np_), f'{cmd}: world size {summary}'
    return {l['step']: l['loss'] for l in lines if 'step' in l and not l.get('summary')}


work = tempfile.mkdtemp(prefix='tessera-reshard-')
try:
    ref = run(load_np, load_flags + ['--steps', str(2 * STEPS), '--dump-weights', f'{work}/ref.safetensors'])
    run(save_np, save_flags + ['--steps', str(STEPS), '--save', f'{work}/ckpt'])
    if 'fsdp2' in save_flags:  # per-parameter row shards: every piece a rank wrote is whole rows
        ckpt = os.path.join(work, 'ckpt', sorted(d for d in os.listdir(f'{work}/ckpt') if d.startswith('step'))[-1])
        with open(os.path.join(ckpt, 'index.json')) as f:
            index = json.load(f)
        assert index['wrapper'] == 'fsdp2', index['wrapper']
        for name, t in index['tensors'].items():
            row = int(np.prod(t['shape'][1:])) if len(t['shape']) >= 2 else 1
            for p in t['pieces']:
                assert p['begin'] % row == 0 and p['count'] % row == 0, f'{name}: piece {p["begin"]}+{p["count"]} cuts a row of {row}'
    if '--shard-group' in save_flags:  # a mesh: replica group 0 wrote one file per shard-group rank, once
        ckpt = os.path.join(work, 'ckpt', sorted(d for d in os.listdir(f'{work}/ckpt') if d.startswith('step'))[-1])
        with open(os.path.join(ckpt, 'index.json')) as f:
            index = json.load(f)
        S = int(save_flags[save_flags.index('--shard-group') + 1])
        files = sorted(f for f in os.listdir(ckpt) if f.startswith('rank-'))
        assert index['world'] == S and len(files) == S, f'mesh with shard group {S}: world {index["world"]}, files {files}'
    cont = run(load_np, load_flags + ['--steps', str(2 * STEPS), '--load', f'{work}/ckpt',
                                      '--dump-weights', f'{work}/cont.safetensors'])
    assert min(cont) == STEPS, f'resumed run starts at step {min(cont)}, not {STEPS}'
    loss = max(abs(cont[s] - ref[s]) / abs(ref[s]) for s in range(STEPS, 2 * STEPS))
    a, b = load_file(f'{work}/ref.safetensors'), load_file(f'{work}/cont.safetensors')
    assert set(a) == set(b), f'tensors differ: {sorted(set(a) ^ set(b))}'
    weights = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]) / np.maximum(1.0, np.abs(a[k])))) for k in a)
    ok = loss <= tol and weights <= tol
    print(f'{"ok  " if ok else "FAIL"} saved at {save_np} ranks ({" ".join(save_flags)}), loaded at {load_np} '
          f'({" ".join(load_flags)}): worst loss difference {loss:.2e}, weights {weights:.2e} (tolerance {tol:g}); '
          f'losses {[round(cont[s], 5) for s in sorted(cont)]}')
    sys.exit(0 if ok else 1)
finally:
    shutil.rmtree(work, ignore_errors=True)
