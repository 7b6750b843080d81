#!/usr/bin/env python3
"""tessera-mlp-lm, tessera-gpt and tessera-llama --deterministic give the same bits at any world size,
strategy and wrapper: for one precision, every valid strategy x wrapper at
1, 2, 3, 4 and 6 ranks (gradient accumulation and clipping on) dumps
byte-identical weights (compared with cmp) and prints identical loss and
gradient-norm lines, and so do meshes (HSDP, HFSDP). A run saved at 4 ranks and resumed at 2 and at 3 (under
other strategies) continues with the bits of the uninterrupted run. The
default (float) path on the same tokens differs across world sizes, so the
comparison would catch a float sum; and the deterministic curve matches the
default one within the precision's tolerance.

Under fp8 (tessera-gpt and tessera-llama: "fp8" or "fp8:delayed", the
recipe) the same holds: a micro-batch's casts depend on it alone (current) or
on amaxes all-reduced over the ranks and kept in the checkpoint (delayed).

Usage: check_determinism.py MPIEXEC TRAINER fp32|bf16|fp8|fp8:delayed [TRAINER FLAGS...]
(the model's flags follow the trainer's name: tessera-gpt takes a 2-layer GPT
of width 32 over the default text, 12 micro-batches of 2 sequences, or the
shape TESSERA_DET_GPT_SHAPE gives, e.g. "--layers 2 --heads 2 --d 128 --seq 80")
(e.g. --backend cuda; TESSERA_DET_WORLDS="1 2 3 4 6" picks the world sizes)"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

mpiexec, trainer, precision, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
trainer = os.path.abspath(trainer)  # one run works in another directory
# So does a file the flags name: --data / --val-data (a file or a glob) made absolute for it.
extra = [os.path.abspath(v) if i and extra[i - 1] in ('--data', '--val-data') else v for i, v in enumerate(extra)]
env = dict(os.environ, OPENBLAS_NUM_THREADS='1')
STEPS = 6
name = os.path.basename(trainer)
gpt = 'gpt' in name or 'llama' in name  # the sequence models: --batch, --accum, a cosine schedule
precision, _, recipe = precision.partition(':')
run_flags = (['--steps', str(STEPS), '--log-every', '1', '--clip', '0.3', '--precision', precision, '--json'] +
             (['--fp8-recipe', recipe] if recipe else []) + extra)
if gpt:
    # TESSERA_DET_GPT_SHAPE: another shape (e.g. head dimension 64 for the GPU's flash kernels).
    default_shape = ('--layers 2 --heads 4 --kv-heads 2 --d 32 --ffn 48 --seq 16' if 'llama' in name
                     else '--layers 2 --heads 2 --d 32 --seq 16')
    shape = os.environ.get('TESSERA_DET_GPT_SHAPE', default_shape).split()
    common = shape + ['--batch', '2', '--lr', '3e-3'] + run_flags
    det = ['--deterministic', '--accum', '12']  # 12 micro-batches: every world size below divides them
    # The default path on the same sequences: 12 micro-batches at 1 rank, 4 a rank at 3.
    float_at = {1: ['--accum', '12'], 3: ['--accum', '4']}
    split_error = 'tessera: --deterministic: 12 micro-batches (--accum) do not split evenly over 5 ranks'
else:
    common = ['--layers', '2', '--d', '32', '--ctx', '4', '--tokens', '480'] + run_flags
    det = ['--deterministic', '--micro-tokens', '40']  # 12 micro-batches: every world size below divides them
    float_at = {1: [], 3: []}  # one micro-batch per step, split over the ranks
    split_error = 'tessera: --deterministic: 12 micro-batches of 40 tokens do not split evenly over 5 ranks'

combos = [('ddp', 'no_shard'), ('ddp', 'optim'), ('ddp', 'optim_grads'), ('fsdp', 'no_shard'), ('fsdp', 'optim'),
          ('fsdp', 'optim_grads'), ('fsdp', 'optim_grads_params'), ('fsdp2', 'optim_grads_params')]
worlds = [int(w) for w in os.environ.get('TESSERA_DET_WORLDS', '1 2 3 4 6').split()]
work = tempfile.mkdtemp(prefix='tessera-det-')


def run(np_, flags, dump):
    cmd = [mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', str(np_), trainer] + common + flags
    if dump:
        cmd += ['--dump-weights', dump]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        sys.exit(f'{" ".join(cmd)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}')
    lines = [json.loads(l) for l in res.stdout.splitlines() if l.startswith('{')]
    steps = [(l['step'], l['loss'], l['grad_norm'], l['skipped']) for l in lines if 'step' in l and not l.get('summary')]
    return steps, ' '.join(cmd)


def same_bytes(a, b):
    return subprocess.run(['cmp', '-s', a, b]).returncode == 0


failures = []
ref_dump, ref_lines, ref_cmd = None, None, None
for wrapper, strategy in combos:
    for np_ in worlds:
        dump = f'{work}/{wrapper}-{strategy}-np{np_}.safetensors'
        lines, cmd = run(np_, det + ['--wrapper', wrapper, '--strategy', strategy], dump)
        if ref_dump is None:
            ref_dump, ref_lines, ref_cmd = dump, lines, cmd
            clipped = sum(1 for _, _, g, _ in lines if g > 0.3)
            print(f'reference: {cmd}\n  losses {[round(l, 6) for _, l, _, _ in lines]}, clipped in {clipped} of {STEPS}')
            if clipped == 0:
                failures.append('the reference run never clipped: the test would not cover the norm')
            continue
        ok_w, ok_l = same_bytes(ref_dump, dump), lines == ref_lines
        print(f'{"ok  " if ok_w and ok_l else "FAIL"} {wrapper:5s} {strategy:18s} np{np_}: weights '
              f'{"identical" if ok_w else "DIFFER"}, loss lines {"identical" if ok_l else "DIFFER"}')
        if not (ok_w and ok_l):
            failures.append(f'{cmd}\n  differs from {ref_cmd}: lines {lines} against {ref_lines}')

# Meshes (HSDP, HFSDP): R replica groups x S ranks, the same bits.
meshes = [(4, ['--shard-group', '2', '--wrapper', 'fsdp', '--strategy', 'optim_grads_params']),
          (4, ['--shard-group', '2', '--outer', 'optim', '--wrapper', 'fsdp', '--strategy', 'optim_grads_params']),
          (6, ['--shard-group', '3', '--wrapper', 'ddp', '--strategy', 'optim_grads']),
          (6, ['--shard-group', '2', '--wrapper', 'fsdp2', '--strategy', 'optim_grads_params'])]
for np_, flags in meshes:
    if np_ not in worlds:
        continue
    dump = f'{work}/mesh-np{np_}.safetensors'
    lines, cmd = run(np_, det + flags, dump)
    ok_w, ok_l = same_bytes(ref_dump, dump), lines == ref_lines
    print(f'{"ok  " if ok_w and ok_l else "FAIL"} np{np_} {" ".join(flags)}: weights {"identical" if ok_w else "DIFFER"}, '
          f'loss lines {"identical" if ok_l else "DIFFER"}')
    if not (ok_w and ok_l):
        failures.append(f'{cmd}\n  differs from {ref_cmd}')

# Save at 4 ranks, resume at 2 and 3 under other strategies: the uninterrupted bits.
half = STEPS // 2
ck = f'{work}/ck'
if gpt:  # its cosine schedule spans --steps: the whole run, checkpointed halfway
    run(4, det + ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--save', ck, '--save-every', str(half)], None)
    ck_half = os.path.join(ck, f'step-{half:09d}')
else:
    run(4, det + ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--save', ck, '--steps', str(half)], None)
    ck_half = ck
for np_, wrapper, strategy in [(2, 'ddp', 'optim_grads'), (3, 'fsdp2', 'optim_grads_params')]:
    dump = f'{work}/resumed-np{np_}.safetensors'
    lines, cmd = run(np_, det + ['--wrapper', wrapper, '--strategy', strategy, '--load', ck_half], dump)
    ok_w, ok_l = same_bytes(ref_dump, dump), lines == ref_lines[half:]
    print(f'{"ok  " if ok_w and ok_l else "FAIL"} saved at np4 (fsdp optim_grads_params), resumed at np{np_} '
          f'({wrapper} {strategy}): weights {"identical" if ok_w else "DIFFER"}, '
          f'loss lines {"identical" if ok_l else "DIFFER"}')
    if not (ok_w and ok_l):
        failures.append(f'resume: {cmd}: lines {lines} against {ref_lines[half:]}')

# The float path on the same tokens (one micro-batch per step, split over the
# ranks) differs across world sizes: what the checks above would catch.
fl = ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params']
a_lines, _ = run(1, fl + float_at[1], f'{work}/float-np1.safetensors')
b_lines, _ = run(3, fl + float_at[3], f'{work}/float-np3.safetensors')
if same_bytes(f'{work}/float-np1.safetensors', f'{work}/float-np3.safetensors'):
    failures.append('the float path gave identical bytes at 1 and 3 ranks: the comparison shows nothing')
else:
    print('ok   the float path differs between 1 and 3 ranks (as a float sum does)')
# ... while its curve matches the deterministic one within the precision's tolerance.
tol = 1e-4 if precision == 'fp32' else 2e-3
worst = max(abs(a[1] - b[1]) / abs(a[1]) for a, b in zip(a_lines, ref_lines))
print(f'{"ok  " if worst <= tol else "FAIL"} deterministic against default loss curve: worst relative difference '
      f'{worst:.2e} (tolerance {tol:.0e})')
if worst > tol:
    failures.append(f'deterministic curve {ref_lines} against default {a_lines}')

# A world size that does not divide the micro-batches is one clear error.
cmd = [mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', '5', trainer] + common + det
res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=work)  # its trace files go there
if res.returncode == 0 or split_error not in res.stderr:
    failures.append(f'{" ".join(cmd)}: exit {res.returncode}, expected the split error:\n{res.stderr}')
else:
    print('ok   5 ranks for 12 micro-batches: ' + next(l for l in res.stderr.splitlines() if l.startswith('tessera:')))

shutil.rmtree(work, ignore_errors=True)
if failures:
    sys.exit('FAIL:\n' + '\n'.join(failures))
