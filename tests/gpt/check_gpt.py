#!/usr/bin/env python3
"""tessera-gpt end to end on the host backend:
1. a numpy forward (float64, examples/gpt/numpy_forward.py) from --dump-weights
   alone reproduces the trainer's validation loss (fp32, 2 ranks, sharded,
   a vocabulary padded from 300 to 384);
2. a checkpoint resumes bit-exact across world sizes and wrappers (3 steps
   + 3 steps on other ranks = 6 steps in one run: the same dumped weights),
   and refuses a resume that would change the global batch, or cross between
   --deterministic and not, or change a deterministic run's --batch;
3. tools/text_to_shard.py makes a shard the trainer reads, and --sample prints text;
4. bad input ends with one 'tessera:' line and exit 2 on every rank.

Usage: check_gpt.py MPIEXEC TRAINER NUMPY_FORWARD TEXT_TO_SHARD"""
import json
import os
import shutil
import shlex
import struct
import subprocess
import sys
import tempfile

import numpy as np

mpiexec, trainer, numpy_forward, text_to_shard = sys.argv[1:5]
env = dict(os.environ, OPENBLAS_NUM_THREADS='1')
sys.path.insert(0, os.path.dirname(numpy_forward))
import numpy_forward as ref  # noqa: E402

tmp = tempfile.mkdtemp(prefix='tessera-gpt-check-')
failures = []


def run(np_, args, expect_rc=0):
    cmd = [mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', str(np_), trainer] + args
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if expect_rc is not None and res.returncode != expect_rc:
        sys.exit(f'{shlex.join(cmd)} exited {res.returncode}, expected {expect_rc}:\n{res.stdout}\n{res.stderr}')
    return res


def summary(res):
    return [json.loads(l) for l in res.stdout.splitlines() if l.startswith('{') and '"summary"' in l][0]


def write_shard(path, tokens, magic=20240520, version=1, count=None):
    with open(path, 'wb') as f:
        f.write(struct.pack('<256i', magic, version, len(tokens) if count is None else count, *([0] * 253)))
        f.write(np.asarray(tokens, dtype='<u2').tobytes())


rng = np.random.default_rng(5)
shard = os.path.join(tmp, 'train.bin')
# A learnable stream over 300 tokens: a repeated random walk, so the loss falls.
walk = np.cumsum(rng.integers(-3, 4, 6000)) % 300
write_shard(shard, walk)
small = ['--layers', '2', '--heads', '4', '--d', '32', '--seq', '16', '--vocab', '300', '--batch', '2',
         '--lr', '3e-3', '--data', shard]

# 1. numpy forward = the trainer's validation loss, from the weights file alone.
dump = os.path.join(tmp, 'w.safetensors')
res = run(2, small + ['--steps', '3', '--val-data', shard, '--val-batches', '2', '--dump-weights', dump, '--json',
                      '--wrapper', 'fsdp', '--strategy', 'optim_grads_params'])
got = summary(res)['val_loss']
w, meta = ref.load(dump)
assert w['embed.wte'].shape == (384, 32), w['embed.wte'].shape
T = int(meta['seq'])
windows = len(walk) - T
seqs = np.stack([walk[(i * T) % windows:(i * T) % windows + T + 1] for i in range(2 * 2 * 2)])
want = ref.loss(w, meta, seqs) / (8 * T)
rel = abs(got - want) / want
print(f'numpy forward: trainer {got:.9f}, numpy {want:.9f}, relative {rel:.1e}')
if rel > 1e-6:
    failures.append(f'numpy forward differs: {rel:.2e}')
if not np.all(w['embed.wte'][300:] == 0):
    failures.append('padded rows of the token table are not zero after training')

# 2. Resume across world sizes and wrappers: 3 + 3 steps = 6 steps (a constant
# learning rate: the cosine schedule's length is --steps, which differs).
small += ['--min-lr', '3e-3']
full = os.path.join(tmp, 'full.safetensors')
run(1, small + ['--steps', '6', '--dump-weights', full, '--batch', '4', '--wrapper', 'ddp', '--strategy', 'no_shard'])
ck = os.path.join(tmp, 'ck')
run(2, small + ['--steps', '3', '--save', ck, '--wrapper', 'fsdp2', '--strategy', 'optim_grads_params'])
resumed = os.path.join(tmp, 'resumed.safetensors')
run(4, small + ['--steps', '6', '--load', ck, '--dump-weights', resumed, '--batch', '1', '--wrapper', 'fsdp',
                '--strategy', 'optim'])
a, _ = ref.load(full)
b, _ = ref.load(resumed)
worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
print(f'resume 2 ranks fsdp2 -> 4 ranks fsdp/optim against 6 steps on one rank: largest weight difference {worst:.2e}')
if worst > 1e-4:  # sums in another order at another world size, through six Adam steps
    failures.append(f'resharded resume: weights differ by {worst:.2e}')
# The same world and wrapper: bit for bit.
same = os.path.join(tmp, 'same.safetensors')
run(2, small + ['--steps', '6', '--dump-weights', same, '--wrapper', 'fsdp2', '--strategy', 'optim_grads_params'])
again = os.path.join(tmp, 'again.safetensors')
run(2, small + ['--steps', '6', '--load', ck, '--dump-weights', again, '--wrapper', 'fsdp2', '--strategy',
                'optim_grads_params'])
if open(same, 'rb').read() != open(again, 'rb').read():
    failures.append('a resume on the same ranks and wrapper is not bit-exact')
else:
    print('resume on the same 2 ranks, fsdp2: bit-exact')
res = run(2, small + ['--steps', '3', '--load', ck, '--batch', '2'])
if 'nothing to train' not in res.stdout:
    failures.append('a --load at or past --steps does not say that nothing is trained')
res = run(2, small + ['--steps', '6', '--load', ck, '--batch', '3'], expect_rc=None)
if res.returncode == 0 or 'global batches of 4 sequences' not in res.stderr:
    failures.append(f'a resume with another global batch was not refused: {res.stderr[-300:]}')
# A deterministic run's bits depend on its micro-batch: it resumes only from a
# deterministic checkpoint of the same --batch, and a plain run not from one
# (each global batch of 4 sequences, so only the determinism differs). Found
# after MPI started, so every rank prints it and the job ends (mpi_main).
dck = os.path.join(tmp, 'dck')
run(1, small + ['--steps', '3', '--save', dck, '--deterministic', '--accum', '2', '--batch', '2'])
for np_, args, ck_, want in [
        (2, ['--deterministic', '--accum', '2', '--batch', '2'], ck, 'written without --deterministic'),
        (2, ['--batch', '2'], dck, 'written with --deterministic --batch 2'),
        (1, ['--deterministic', '--accum', '4', '--batch', '1'], dck, 'written with --deterministic --batch 2')]:
    res = run(np_, small + ['--steps', '6', '--load', ck_] + args, expect_rc=None)
    if res.returncode == 0 or want not in res.stderr or 'resume it the same way' not in res.stderr:
        failures.append(f'{np_} ranks {shlex.join(args)} resumed from {os.path.basename(ck_)} (exit {res.returncode}), '
                        f'expected "{want}": {res.stderr[-300:]}')
res = run(2, small + ['--steps', '6', '--load', dck, '--deterministic', '--accum', '2', '--batch', '2'])
print('deterministic resume: refused across determinism and micro-batch, accepted at the same --batch on 2 ranks')
# --dump-weights is written after the run: a path that cannot take the file is
# refused before the first step, on every rank, not after the run is spent.
for bad_path, want in [(tmp, 'is a directory'), (os.path.join(tmp, 'none', 'w.safetensors'), 'cannot create a file')]:
    res = run(2, small + ['--steps', '6', '--dump-weights', bad_path], expect_rc=None)
    said = [l for l in res.stderr.splitlines() if l.startswith('tessera:') and want in l]
    if res.returncode == 0 or len(said) != 2 or any(l.startswith('step') for l in res.stdout.splitlines()):
        failures.append(f'--dump-weights {bad_path}: expected "{want}" on both ranks before any step '
                        f'(exit {res.returncode}):\n{res.stdout[-300:]}\n{res.stderr[-600:]}')

# 3. Text to shard, training on it, and a sample.
text = os.path.join(tmp, 'text.txt')
with open(text, 'w') as f:
    f.write('the quick brown fox jumps over the lazy dog. ' * 200)
tshard = os.path.join(tmp, 'text.bin')
subprocess.run([sys.executable, text_to_shard, tshard, text], check=True, capture_output=True)
res = run(1, ['--layers', '1', '--heads', '2', '--d', '32', '--seq', '16', '--batch', '4', '--steps', '40',
              '--lr', '1e-2', '--data', tshard, '--sample', '40', '--log-every', '39'])
line = [l for l in res.stdout.splitlines() if l.startswith('sample')]
print(line[0] if line else res.stdout)
if not line or '|>' not in line[0]:
    failures.append('--sample printed no sample')

# 4. Bad input: one 'tessera:' line per rank naming the problem, exit 2.
bad_magic = os.path.join(tmp, 'magic.bin')
write_shard(bad_magic, walk, magic=1234)
bad_version = os.path.join(tmp, 'version.bin')
write_shard(bad_version, walk, version=3)
short = os.path.join(tmp, 'short.bin')
write_shard(short, walk[:100], count=200)
cases = [
    (['--heads', '5', '--d', '32'], 'does not divide --d'),
    (['--seq', '64', '--max-seq', '32'], 'position table'),
    (small + ['--vocab', '256'], 'is not below the vocabulary size 256'),
    (small + ['--data', bad_magic], 'is not a token shard'),
    (small + ['--data', bad_version], 'token shard version 3'),
    (small + ['--data', short], 'its header promises 200 16-bit tokens'),
    (small + ['--data', os.path.join(tmp, 'none-*.bin')], 'no file matches it'),
    (small + ['--val-data', os.path.join(tmp, 'noval-*.bin')], '--val-data ' + os.path.join(tmp, 'noval-*.bin')),
    (small + ['--val-data', short], "'" + short + "' holds 200 bytes of tokens; its header promises 200"),
    (['--model', 'gpt3'], 'gpt3'),
    (['--val-every', '5'], '--val-every needs --val-data'),
    (['--timeout', 'nan'], '--timeout nan'),
    (['--attention', 'flash'], '--attention chooses the CUDA net'),
    (['--cuda-graphs', 'on'], '--cuda-graphs on needs --backend cuda'),
    (['--cuda-graphs', 'maybe'], '--cuda-graphs'),
    (['--keep-gelu'], '--keep-gelu keeps the CUDA net'),
    (['--backend', 'cuda', '--deterministic', '--heads', '2', '--d', '30'], 'multiple of 4 up to 2048, not 30'),
    (['--outer', 'optim'], '--outer optim needs a mesh'),
    (['--shard-group', 'two'], '--shard-group two is not a positive number'),
    (['--fp8-recipe', 'delayed'], "--fp8-recipe sets --precision fp8's scales"),
    (['--precision', 'fp8', '--fp8-recipe', 'late'], '--fp8-recipe'),
    (['--precision', 'fp8', '--backend', 'cuda'], '--precision fp8 runs on the host backend so far'),
]
for args, part in cases:
    res = run(2, args, expect_rc=None)
    lines = [l for l in res.stderr.splitlines() if l.startswith('tessera')]  # (mpirun adds its own banner)
    ok = res.returncode == 2 and len(lines) == 2 and all(l.startswith('tessera:') and part in l for l in lines)
    print(f'{"ok" if ok else "FAIL"}: {shlex.join(args[-2:])} -> exit {res.returncode}: {lines[:1]}')
    if not ok:
        failures.append(f'{args}: exit {res.returncode}, stderr {res.stderr!r}')

shutil.rmtree(tmp, ignore_errors=True)
if failures:
    sys.exit('FAIL:\n  ' + '\n  '.join(failures))
print('all checks passed')
